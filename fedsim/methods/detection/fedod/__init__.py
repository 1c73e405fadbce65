"""FedOD (Su et al. 2022) and the parts it alone uses: its parameters and the multi-teacher distillation loss."""

from fedsim.methods.detection.fedod.method import FedOD

__all__ = ["FedOD"]
