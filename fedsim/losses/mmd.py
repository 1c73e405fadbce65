"""Multi-kernel Gaussian maximum mean discrepancy.

MMD^2 between samples X (m) and Y (n) under a kernel k, unbiased estimate
(Gretton et al., JMLR 2012, Eq. 3):

    1/(m(m-1)) sum_{i!=j} k(x_i, x_j) + 1/(n(n-1)) sum_{i!=j} k(y_i, y_j) - 2/(mn) sum_{i,j} k(x_i, y_j)

with k the mean of Gaussian kernels exp(-||a - b||^2 / (2 s_u^2)) over several
bandwidths s_u, as in DAN (Long et al., ICML 2015, Eq. 2-3, equal kernel
weights). Bandwidths are either fixed or ``s_u^2 = multiplier_u * median``
with ``median`` the median squared distance between all distinct pooled
points (the median heuristic, Gretton et al. 2012, Sec. 8), detached from the
graph so that it is a kernel choice, not something the encoder can move.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from fedsim.losses.domain import DomainLoss, check_features

DEFAULT_MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)


def median_squared_distance(sq_distances: torch.Tensor) -> torch.Tensor:
    """Median of the off-diagonal entries of a square matrix of squared distances (detached, > 0)."""
    n = sq_distances.shape[0]
    off_diagonal = sq_distances.detach()[~torch.eye(n, dtype=torch.bool, device=sq_distances.device)]
    return off_diagonal.median().clamp_min(1e-12)


def gaussian_mmd2(
    source: torch.Tensor,
    target: torch.Tensor,
    bandwidths: Optional[Sequence[float]] = None,
    multipliers: Sequence[float] = DEFAULT_MULTIPLIERS,
) -> torch.Tensor:
    """Unbiased multi-kernel MMD^2 (may be slightly negative when the distributions are equal)."""
    check_features(source, target, minimum=2)
    m = len(source)
    pooled = torch.cat([source, target])
    norms = pooled.pow(2).sum(1)
    sq = (norms.unsqueeze(1) + norms.unsqueeze(0) - 2.0 * pooled @ pooled.T).clamp_min(0.0)  # smooth at 0, unlike cdist
    if bandwidths:
        variances = torch.tensor([float(b) ** 2 for b in bandwidths], dtype=pooled.dtype, device=pooled.device)
    else:
        variances = median_squared_distance(sq) * torch.tensor(
            list(multipliers), dtype=pooled.dtype, device=pooled.device
        )
    kernel = torch.exp(-sq.unsqueeze(0) / (2.0 * variances.view(-1, 1, 1))).mean(0)
    k_ss, k_tt, k_st = kernel[:m, :m], kernel[m:, m:], kernel[:m, m:]
    n = len(target)
    within_s = (k_ss.sum() - k_ss.diagonal().sum()) / (m * (m - 1))
    within_t = (k_tt.sum() - k_tt.diagonal().sum()) / (n * (n - 1))
    return within_s + within_t - 2.0 * k_st.mean()


class MMDLoss(DomainLoss):
    """Multi-kernel Gaussian MMD^2 (DAN). ``bandwidths`` fixed sigmas, or empty for the median heuristic times
    ``multipliers``."""

    def __init__(self, bandwidths: Sequence[float] = (), multipliers: Sequence[float] = DEFAULT_MULTIPLIERS):
        super().__init__()
        self.bandwidths = tuple(float(b) for b in bandwidths)
        self.multipliers = tuple(float(m) for m in multipliers)
        if any(b <= 0 for b in self.bandwidths) or any(m <= 0 for m in self.multipliers):
            raise ValueError(
                f"MMD bandwidths and multipliers must be positive, got {self.bandwidths} and {self.multipliers}"
            )
        if not self.bandwidths and not self.multipliers:
            raise ValueError("MMDLoss needs fixed bandwidths or median-heuristic multipliers")

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return gaussian_mmd2(source, target, self.bandwidths or None, self.multipliers)

    def extra_repr(self) -> str:
        return f"bandwidths={self.bandwidths or 'median heuristic'}, multipliers={self.multipliers}"
