"""Euclidean projection onto the probability simplex.

Sort-based algorithm of Duchi, Shalev-Shwartz, Singer & Chandra (ICML 2008),
"Efficient Projections onto the l1-Ball for Learning in High Dimensions", Fig. 1.
DaDiL (Montesuma et al., 2023) uses it to keep the barycentric coordinates
alpha in the K-simplex after each gradient step (projected gradient descent).
"""

from __future__ import annotations

import torch

from fedsim.errors import NumericalError, first_values

#: machine epsilons of rounding that computed weights may carry (a float32 projection of a large step, K atoms)
ROUNDING_EPSILONS = 1024


def project_simplex(v: torch.Tensor, radius: float = 1.0) -> torch.Tensor:
    """Project ``v`` onto {w : w >= 0, sum(w) = radius} in the Euclidean norm.

    ``v`` is a 1-D tensor (one vector) or a 2-D tensor (each row projected on
    its own). With u = sort(v) descending and rho the largest j such that
    u_j - (sum_{r<=j} u_r - radius) / j > 0, the projection is
    max(v - theta, 0) with theta = (sum_{r<=rho} u_r - radius) / rho
    (Duchi et al. 2008, Fig. 1). The projection is computed in float64 and
    renormalized there to sum to ``radius``, then cast back: a float32 input with
    large entries (a big gradient step) would otherwise come back off the simplex
    by its cancellation error. Dtype and device of ``v`` are kept (integer input
    is cast to the default float dtype). A non-finite entry is a NumericalError (a ValueError).
    """
    v = torch.as_tensor(v)
    if v.dim() not in (1, 2):
        raise ValueError(f"project_simplex expects a 1-D or 2-D tensor, got shape {tuple(v.shape)}")
    if v.shape[-1] == 0:
        raise ValueError("project_simplex got an empty vector: the simplex needs at least one coordinate")
    if radius <= 0:
        raise ValueError(f"project_simplex radius must be positive, got {radius}")
    if not torch.is_floating_point(v):
        v = v.to(torch.get_default_dtype())
    check_finite(v, "the vector to project on the simplex")
    rows = (v.unsqueeze(0) if v.dim() == 1 else v).to(torch.float64)
    u, _ = torch.sort(rows, dim=-1, descending=True)
    css = torch.cumsum(u, dim=-1) - radius
    ind = torch.arange(1, rows.shape[-1] + 1, dtype=rows.dtype, device=rows.device)
    cond = (u - css / ind) > 0  # true on a prefix, always at index 0
    rho = cond.sum(dim=-1, keepdim=True) - 1
    theta = css.gather(-1, rho) / (rho + 1).to(rows.dtype)
    w = torch.clamp(rows - theta, min=0)
    w = (w * (radius / w.sum(dim=-1, keepdim=True))).to(v.dtype)
    return w.squeeze(0) if v.dim() == 1 else w


def check_finite(v: torch.Tensor, what: str) -> None:
    """A NumericalError (a ValueError) naming ``what`` when ``v`` holds nan or inf: values a diverged computation
    produced; the runtime adds the method, round and client."""
    if not bool(torch.isfinite(v).all()):
        raise NumericalError(
            what,
            first_values(v),
            "the computation that produced it diverged (e.g. a gradient step whose learning rate is too high)",
        )


def rounding_tolerance(dtype: torch.dtype) -> float:
    """How far from 1 the sum of computed weights of ``dtype`` may lie from rounding alone: ROUNDING_EPSILONS machine
    epsilons (float32: 1.2e-4, float64: 2.3e-13)."""
    return ROUNDING_EPSILONS * torch.finfo(dtype).eps


def renormalized(w: torch.Tensor) -> torch.Tensor:
    """Weights the code computed (e.g. a float32 projection on the simplex), rescaled in float64 to sum to 1.

    For values whose sum is off by rounding only, not for user input (which ``check_weights`` validates). The value
    is ``w / sum(w)``; the gradient passes through as if it were ``w`` (the step before is unchanged). Non-finite
    weights are a NumericalError; a sum that is not positive (no projection gives one) a ValueError."""
    check_finite(w, "the weights to renormalize")
    total = w.detach().to(torch.float64).sum()
    if not total > 0:
        raise ValueError(f"weights summing to {float(total):.3g} cannot be renormalized: they must sum to about 1")
    exact = (w.detach().to(torch.float64) / total).to(w.dtype)
    return w + (exact - w.detach())
