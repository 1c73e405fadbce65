"""The common interface of domain-adaptation losses (skada style).

A domain loss is a small ``torch.nn.Module`` called as
``loss(source_features, target_features) -> scalar``: it measures how far the
two feature batches are apart (MMD, CORAL) or how well a domain discriminator
tells them apart (DANN). Methods add it to the classification loss through
:meth:`DomainLoss.objective`, so that every loss scales the gradient reaching
the features by the same weight lambda, whichever way it is built.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class DomainLoss(nn.Module):
    """Base class: ``forward(source, target)`` returns the (unweighted) domain loss.

    ``last_metrics`` holds scalar diagnostics of the latest call (for example
    the discriminator accuracy of DANN), for the per-round metrics.
    """

    def __init__(self):
        super().__init__()
        self.last_metrics: dict[str, float] = {}

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def objective(self, source: torch.Tensor, target: torch.Tensor, weight: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(term to add to the task loss, unweighted loss value): here ``weight * loss(source, target)``.

        Either way the features receive ``weight`` times the alignment gradient.
        Adversarial losses override this so that only the features see the
        weight (through gradient reversal) while their discriminator is trained
        with the full loss (Ganin et al., JMLR 2016, Eq. 9-10).
        """
        value = self(source, target)
        return weight * value, value

    per_record: bool = False
    """Whether :meth:`per_record_objective` exists: a loss that couples a batch's source records (MMD's pairs
    k(s_i, s_j)) has no gradient per record for DP-SGD to clip."""

    def per_record_objective(self, source: torch.Tensor, target: torch.Tensor, weight: float) -> torch.Tensor:
        """The term of :meth:`objective` for one source record against a target batch, written for torch.func's
        vmap (no autograd Function, no metrics): DP-SGD's per-example gradients (``privacy.unit=record``)."""
        raise NotImplementedError(f"{type(self).__name__} has no per-record objective")


def check_features(source: torch.Tensor, target: torch.Tensor, minimum: int = 1) -> None:
    if source.dim() != 2 or target.dim() != 2 or source.shape[1] != target.shape[1]:
        raise ValueError(
            f"domain losses take two N x D feature batches of the same D, got {tuple(source.shape)} and "
            f"{tuple(target.shape)}"
        )
    if len(source) < minimum or len(target) < minimum:
        raise ValueError(
            f"domain losses need at least {minimum} sample(s) per domain, got {len(source)} and {len(target)}"
        )


def dann_schedule(progress: float, gamma: float = 10.0) -> float:
    """lambda_p = 2 / (1 + exp(-gamma p)) - 1 for training progress p in [0, 1] (Ganin et al., JMLR 2016, Sec.
    5.2.2)."""
    p = min(max(float(progress), 0.0), 1.0)
    return 2.0 / (1.0 + math.exp(-gamma * p)) - 1.0


def dann_lr_factor(progress: float, alpha: float = 10.0, beta: float = 0.75) -> float:
    """mu_p / mu_0 = 1 / (1 + alpha p)^beta for training progress p in [0, 1] (Ganin et al., JMLR 2016, Sec. 5.2.2:
    alpha = 10, beta = 0.75; the same annealing in Long et al.'s later alignment work, JAN 2017)."""
    p = min(max(float(progress), 0.0), 1.0)
    return 1.0 / (1.0 + alpha * p) ** beta
