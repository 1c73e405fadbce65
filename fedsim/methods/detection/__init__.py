"""Federated object detection: FedOD (Su et al. 2022) and its baselines FedAvg, FedBN and FedRep on a detector,
with what they share, the roles and base stage (:mod:`.base`), detector training (:mod:`.training`) and the
predictor families' evaluation (:mod:`.evaluation`). They need torchvision (the ``detection`` extra)."""

from fedsim.methods.detection.fedavg_det import FedAvgDetection
from fedsim.methods.detection.fedbn_det import FedBNDetection
from fedsim.methods.detection.fedod import FedOD
from fedsim.methods.detection.fedrep_det import FedRepDetection

__all__ = ["FedAvgDetection", "FedBNDetection", "FedOD", "FedRepDetection"]
