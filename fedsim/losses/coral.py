"""CORAL: distance between second-order statistics (Sun & Saenko, ECCV-W 2016, Eq. 1).

    loss = ||C_S - C_T||_F^2 / (4 d^2)

with C_S, C_T the (n - 1)-normalized feature covariances of the two batches.
"""

from __future__ import annotations

import torch

from fedsim.losses.domain import DomainLoss, check_features


def covariance(x: torch.Tensor) -> torch.Tensor:
    centered = x - x.mean(0, keepdim=True)
    return centered.T @ centered / (len(x) - 1)


class CORALLoss(DomainLoss):
    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        check_features(source, target, minimum=2)
        d = source.shape[1]
        return (covariance(source) - covariance(target)).pow(2).sum() / (4.0 * d * d)
