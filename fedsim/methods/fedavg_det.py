"""FedAvg for detection (McMahan et al., AISTATS 2017, Alg. 1), the FedOD paper's first federated baseline.

After the base stage (w_b on the server's data, see ``_detection_common``), every round
the server host and every labeled client train the global detector for
``client_iters`` steps on their own data and the server replaces it by the
sample-weighted mean of the returned weights. One model for everyone: family ``global``.
"""
from __future__ import annotations

from fedsim.methods._detection_common import FederatedDetection
from fedsim.registry import METHODS


@METHODS.register("fedavg_det")
class FedAvgDetection(FederatedDetection):
    """FedAvg for detection: the server host and the clients average one FCOS detector."""
