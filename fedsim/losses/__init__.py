"""Domain-adaptation losses as objects: ``loss(source_features, target_features) -> scalar``.

Methods that align features (FedDANN, FedMMD, FADA) differ by the loss object
alone; see :class:`fedsim.losses.domain.DomainLoss` for the interface.
"""

from fedsim.losses.coral import CORALLoss
from fedsim.losses.dann import DANNLoss, DomainDiscriminator, GradientReversal, GradientReversalLayer, grad_reverse
from fedsim.losses.domain import DomainLoss, dann_schedule
from fedsim.losses.mmd import MMDLoss, gaussian_mmd2

__all__ = [
    "CORALLoss",
    "DANNLoss",
    "DomainDiscriminator",
    "DomainLoss",
    "GradientReversal",
    "GradientReversalLayer",
    "MMDLoss",
    "dann_schedule",
    "gaussian_mmd2",
    "grad_reverse",
]
