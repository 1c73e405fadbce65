"""FedProx (Li et al., MLSys 2020, Eq. 2): FedAvg with a proximal term.

Each source client minimizes  F_k(w) + mu/2 ||w - w_global||^2  locally; the
server aggregation is FedAvg's weighted mean (numpy only: torch is imported by the
client half, in :meth:`FedProx.local_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.errors import UserError
from fedsim.messages import Instruction
from fedsim.methods.fedavg import FedAvg
from fedsim.privacy.exchanges import one_fit
from fedsim.registry import METHODS


@METHODS.register("fedprox")
class FedProx(FedAvg):
    """FedProx (Li et al. 2020): FedAvg plus the proximal term mu/2 ||w - w_global||^2."""

    copes_with_missing_replies = True  # it aggregates the replies that arrive
    privacy_exchanges = staticmethod(one_fit)  # FedAvg's: the proximal term changes no exchange

    server_needs_torch = False
    vectorized_operations = {"fit": "fit_vectorized"}  # the proximal term batched too (proximal_mu)

    @dataclass(frozen=True)
    class Params:
        mu: float = 0.01  # proximal coefficient (the paper's mu; 0 recovers FedAvg)

        def __post_init__(self):
            if self.mu < 0:
                raise UserError(f"method.mu must be 0 or more, got {self.mu}: e.g. --set method.mu=0.01")

    def proximal_mu(self) -> float:
        return self.params.mu

    def local_loss(self, instruction: Instruction):
        import torch

        from fedsim.methods.common.training import classification_loss

        mu = self.params.mu
        if mu == 0:
            return None
        anchors = None

        def proximal_objective(model: torch.nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            nonlocal anchors
            loss = classification_loss(model, xb, yb)
            if anchors is None:
                anchors = {
                    name: torch.tensor(instruction.tensors[name]).to(p.device) for name, p in model.named_parameters()
                }
            return loss + 0.5 * mu * sum(((p - anchors[name]) ** 2).sum() for name, p in model.named_parameters())

        return proximal_objective
