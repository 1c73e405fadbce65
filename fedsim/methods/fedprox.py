"""FedProx (Li et al., MLSys 2020, Eq. 2): FedAvg with a proximal term.

Each source client minimizes  F_k(w) + mu/2 ||w - w_global||^2  locally; the
server aggregation is FedAvg's weighted mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedsim.messages import Instruction
from fedsim.methods.fedavg import FedAvg
from fedsim.registry import METHODS


@METHODS.register("fedprox")
class FedProx(FedAvg):
    @dataclass(frozen=True)
    class Params:
        mu: float = 0.01  # proximal coefficient (the paper's mu; 0 recovers FedAvg)

    def local_objective(self, instruction: Instruction):
        mu = self.params.mu
        if mu == 0:
            return None
        anchors = None

        def proximal(model: torch.nn.Module) -> torch.Tensor:
            nonlocal anchors
            if anchors is None:
                anchors = {
                    name: torch.tensor(instruction.tensors[name]).to(p.device) for name, p in model.named_parameters()
                }
            return 0.5 * mu * sum(((p - anchors[name]) ** 2).sum() for name, p in model.named_parameters())

        return proximal
