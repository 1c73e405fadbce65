"""FedBN for detection (Li et al., ICLR 2021, Alg. 1): FedAvg that keeps batch norm local.

Every participant keeps the weights, biases and running statistics of every
batch-norm layer of the backbone (the FCOS head uses group norm, which is averaged)
and averages the rest, as in :mod:`fedsim.methods.detection.fedavg_det`. Client i's model M_i
(family ``personal``) is the global model with its own batch norm; ``global`` keeps
w_b's batch norm (used by the unlabeled target, which has none of its own).
"""

from __future__ import annotations

from fedsim.methods.detection.base import uploads_refusal
from fedsim.methods.detection.fedavg_det import FedAvgDetection
from fedsim.models.normalization import bn_keys
from fedsim.registry import METHODS


@METHODS.register("fedbn_det")
class FedBNDetection(FedAvgDetection):
    """FedBN for detection: batch-norm layers stay with each participant."""

    privacy_refusal = uploads_refusal("each client's batch-norm part ('share_personal')")

    personal_keys = staticmethod(bn_keys)
