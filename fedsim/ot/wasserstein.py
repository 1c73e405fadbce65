"""Wasserstein distances between labeled empirical distributions, on POT.

Ground cost of DaDiL (Montesuma et al., 2023, "Multi-Source Domain Adaptation
through Dataset Dictionary Learning in Wasserstein Space", Eq. 4):

    C_ij = ||x_i - x'_j||^2 + beta * ||y_i - y'_j||^2

(feature term only when labels are absent, e.g. the unlabeled target); ``beta=None``
is the rule of the DaDiL authors' ``JointWassersteinDistance``: beta = max C^X / max C^Y
over the pair, so both terms peak alike (0 when every label cost is 0). The
transport plan is solved by POT (``ot.emd`` / ``ot.sinkhorn``) on a detached
cost; the value <pi*, C> stays differentiable in the samples, which by the
envelope theorem is a (sub)gradient of W_2^2 -- the way DaDiL optimizes atoms.
"""

from __future__ import annotations

import math
from typing import Optional

import ot
import torch
from scipy.optimize import linear_sum_assignment

from fedsim.ot.simplex import check_finite

SOLVERS = ("emd", "sinkhorn", "sinkhorn_log")
_EMD_MAX_ITER = 1_000_000  # POT's default (1e5) can stop early for n ~ 1000
WEIGHT_TOL = 1e-5  # user-given weights: |sum - 1| and negative entries beyond it are refused


def check_samples(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D tensor (n_samples, dim), got shape {tuple(x.shape)}")
    if not torch.is_floating_point(x):
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_pair(xs, xt, ys=None, yt=None) -> None:
    """Validate a (source, target) pair of samples and optional labels."""
    check_samples(xs, "xs")
    check_samples(xt, "xt")
    if xs.shape[1] != xt.shape[1]:
        raise ValueError(f"feature dimensions differ: xs has {xs.shape[1]} columns, xt has {xt.shape[1]}")
    if (ys is None) != (yt is None):
        raise ValueError("labels: give both ys and yt (labeled cost) or neither (feature cost only)")
    tensors = {"xs": xs, "xt": xt}
    if ys is not None:
        check_samples(ys, "ys")
        check_samples(yt, "yt")
        if ys.shape[0] != xs.shape[0] or yt.shape[0] != xt.shape[0]:
            raise ValueError(
                f"label rows differ from sample rows: xs {xs.shape[0]} vs ys {ys.shape[0]}, "
                f"xt {xt.shape[0]} vs yt {yt.shape[0]}"
            )
        if ys.shape[1] != yt.shape[1]:
            raise ValueError(f"label dimensions differ: ys has {ys.shape[1]} columns, yt has {yt.shape[1]}")
        tensors.update(ys=ys, yt=yt)
    kinds = {(t.dtype, t.device) for t in tensors.values()}
    if len(kinds) > 1:
        found = ", ".join(f"{k}: {t.dtype} on {t.device}" for k, t in tensors.items())
        raise ValueError(f"dtype/device mismatch ({found}); convert them to one dtype and device")


def check_weights(w, n: int, like: torch.Tensor, name: str, tol: float = WEIGHT_TOL) -> torch.Tensor:
    """Return ``w`` as a probability vector of length ``n`` (uniform when None), like ``like``; entries below
    ``-tol``, non-finite ones or a sum (in float64) more than ``tol`` from 1 are a ValueError naming ``name``."""
    if w is None:
        return torch.full((n,), 1.0 / n, dtype=like.dtype, device=like.device)
    w = torch.as_tensor(w, dtype=like.dtype, device=like.device)
    if w.dim() != 1 or w.shape[0] != n:
        raise ValueError(f"{name} must be a 1-D weight vector of length {n}, got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"{name} holds non-finite weights ({w.flatten()[:5].tolist()}); weights must be finite")
    if bool((w < -tol).any()):
        raise ValueError(f"{name} has negative weights (min {float(w.min()):.3g}); weights must be >= 0")
    total = float(w.detach().to(torch.float64).sum())
    if abs(total - 1.0) > tol:
        raise ValueError(f"{name} must sum to 1 (got {total:.6g})")
    return w


def _check_solver(solver: str, reg: float) -> None:
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if solver != "emd" and not reg > 0:
        raise ValueError(f"reg must be positive for solver {solver!r}, got {reg}")


def joint_cost(xs: torch.Tensor, xt: torch.Tensor, ys=None, yt=None, beta: Optional[float] = 1.0) -> torch.Tensor:
    """Ground cost C_ij = ||x_i - x'_j||^2 + beta ||y_i - y'_j||^2 (DaDiL, Eq. 4).

    The label term is added only when both ``ys`` and ``yt`` are given; ``beta=None`` weighs it by
    :func:`relative_label_weight`. Differentiable in all inputs; returns an (n_s, n_t) tensor.
    """
    check_pair(xs, xt, ys, yt)
    if beta is not None and beta < 0:
        raise ValueError(f"beta must be >= 0 or None, got {beta}")
    cost = ot.dist(xs, xt, metric="sqeuclidean")
    if ys is None or beta == 0:
        return cost
    labels = ot.dist(ys, yt, metric="sqeuclidean")
    weight = relative_label_weight(cost, labels) if beta is None else beta
    return cost + weight * labels


def relative_label_weight(feature_cost: torch.Tensor, label_cost: torch.Tensor) -> float:
    """max C^X / max C^Y (detached), 0 when every label cost is 0: the DaDiL authors' default label weight."""
    top = float(label_cost.detach().max())
    return float(feature_cost.detach().max()) / top if top > 0 else 0.0


def transport_plan(
    cost: torch.Tensor,
    a=None,
    b=None,
    solver: str = "emd",
    reg: float = 0.01,
    normalize_cost: bool = True,
    max_iter: int = 1000,
) -> torch.Tensor:
    """Optimal plan for ``cost`` between weights a, b (uniform by default), without gradient.

    "emd": exact network simplex (``ot.emd``); with uniform weights on two equal-sized supports (both ``a`` and
    ``b`` None: DaDiL's mini-batches and atoms) the same linear program is an assignment problem, whose optimum
    is a permutation (Birkhoff-von Neumann), solved exactly and in less time by scipy's ``linear_sum_assignment``
    (:func:`assignment_plan`). "sinkhorn" / "sinkhorn_log":
    entropic OT (Cuturi 2013) via ``ot.sinkhorn(..., method=solver)``, on
    C / max(C) when ``normalize_cost`` so ``reg`` is scale-free, at most
    ``max_iter`` Sinkhorn iterations (POT warns if it stops unconverged). The solve runs
    in float64; the plan comes back detached in ``cost``'s dtype and device. A non-finite cost (samples that
    diverged) is a NumericalError, not an error inside the solver.
    """
    _check_solver(solver, reg)
    if cost.dim() != 2 or 0 in cost.shape:
        raise ValueError(f"cost must be a non-empty 2-D matrix, got shape {tuple(cost.shape)}")
    check_cost(cost)
    if solver == "emd" and is_assignment(cost, a, b):
        return assignment_plan(cost)
    a = check_weights(a, cost.shape[0], cost, "a")
    b = check_weights(b, cost.shape[1], cost, "b")
    with torch.no_grad():
        c64, a64, b64 = (t.detach().to(torch.float64) for t in (cost, a, b))
        a64, b64 = a64 / a64.sum(), b64 / b64.sum()
        if solver == "emd":
            plan = ot.emd(a64, b64, c64, numItermax=_EMD_MAX_ITER)
        else:
            scale = c64.max() if normalize_cost else None
            if scale is not None and scale > 0:
                c64 = c64 / scale
            plan = ot.sinkhorn(a64, b64, c64, reg, method=solver, numItermax=max_iter)
    return plan.to(cost.dtype)


def is_assignment(cost: torch.Tensor, a=None, b=None) -> bool:
    """Whether exact OT on ``cost`` is an assignment problem: two supports of equal size, uniform weights (both
    ``a`` and ``b`` None)."""
    return a is None and b is None and cost.shape[0] == cost.shape[1]


def check_cost(cost: torch.Tensor) -> None:
    """A NumericalError when ``cost`` holds nan or inf (points so far apart that their squared distance
    overflows, samples that diverged). A finite sum proves every entry finite in one reduction; only a sum that
    is not finite (an entry that is not, or an overflow of the sum alone) looks at the entries."""
    if not math.isfinite(float(cost.detach().sum())):
        check_finite(cost.detach(), "the transport cost")


def assignment(cost: torch.Tensor) -> torch.Tensor:
    """Columns ``cols`` of an optimal assignment of the square ``cost``: row i goes to column ``cols[i]``.

    scipy's ``linear_sum_assignment`` (shortest augmenting paths, Crouse 2016) on a float64 copy of the detached
    cost; it returns the rows in order, so the columns alone are the permutation. A long tensor on ``cost``'s
    device. Exact OT between two uniform distributions of n points each is this assignment with mass 1/n per
    pair (Birkhoff-von Neumann: the vertices of the transport polytope are permutation matrices / n). Measured
    on a 2-core x86_64 (uniform clouds, d = 53 to 800): 1.5 ms per solve at n = 200 and 11-15 ms at n = 500,
    against 2.1 ms and 18-20 ms for ``ot.emd`` (the network simplex) on the same costs, with the same plans.
    """
    _, cols = linear_sum_assignment(cost.detach().cpu().double().numpy())
    return torch.as_tensor(cols, device=cost.device)


def assignment_plan(cost: torch.Tensor) -> torch.Tensor:
    """Exact OT plan between two uniform distributions of n points each: 1/n on an optimal assignment.

    The same optimum as ``ot.emd`` (a vertex of the transport polytope is a permutation matrix / n); with ties
    the two solvers may pick different optimal plans of equal cost. Detached, in ``cost``'s dtype and device.
    """
    cols = assignment(cost)
    plan = torch.zeros_like(cost, requires_grad=False)
    plan[torch.arange(cost.shape[0], device=cost.device), cols] = 1.0 / cost.shape[0]
    return plan


def wasserstein_distance(
    xs: torch.Tensor,
    xt: torch.Tensor,
    ys=None,
    yt=None,
    a=None,
    b=None,
    beta: Optional[float] = 1.0,
    solver: str = "emd",
    reg: float = 0.01,
    normalize_cost: bool = True,
    max_iter: int = 1000,
) -> torch.Tensor:
    """Squared 2-Wasserstein distance W_2^2 between two (labeled) empirical distributions.

    Value <pi*, C> (DaDiL, Eqs. 3-4) with C = ``joint_cost(xs, xt, ys, yt, beta)``
    and pi* = ``transport_plan`` of the detached cost (envelope theorem), so the
    result is differentiable w.r.t. xs, xt, ys, yt. Weights a, b default to
    uniform; ``reg``, ``normalize_cost`` and ``max_iter`` only matter for the
    Sinkhorn solvers. Returns a 0-dim tensor.
    """
    _check_solver(solver, reg)
    cost = joint_cost(xs, xt, ys, yt, beta)
    plan = transport_plan(cost, a, b, solver=solver, reg=reg, normalize_cost=normalize_cost, max_iter=max_iter)
    return torch.sum(plan * cost)
