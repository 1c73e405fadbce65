"""Free-support Wasserstein barycenter of labeled empirical distributions.

Fixed-point iterations of Cuturi & Doucet (ICML 2014, "Fast Computation of
Wasserstein Barycenters", Alg. 2 with uniform support weights; POT's
``ot.lp.free_support_barycenter``), with labels carried along as in DaDiL
(Montesuma et al., 2023, Alg. 1 / Eq. 7):

    pi_k = OT plan between (X_B, Y_B) and atom k under the joint cost
    X_B <- sum_k alpha_k n_B pi_k X_k,     Y_B <- sum_k alpha_k n_B pi_k Y_k.

Plans are detached; the result is differentiable w.r.t. the atoms and alpha
through the final update, which is what DaDiL's gradient step needs.
``beta=None`` weighs the label term of pi_k's cost by the largest feature cost
between the current support and atom k, recomputed at every iteration (the rule
of the DaDiL authors' ``wasserstein_barycenter`` when no label weight is given).
"""

from __future__ import annotations

from typing import Optional

import torch

from fedsim.ot.simplex import check_finite, renormalized, rounding_tolerance
from fedsim.ot.wasserstein import WEIGHT_TOL, check_samples, check_weights, joint_cost, transport_plan


def _check_atoms(atoms_x, atoms_y, alpha):
    if len(atoms_x) == 0:
        raise ValueError("labeled_barycenter needs at least one atom")
    for k, x in enumerate(atoms_x):
        check_samples(x, f"atoms_x[{k}]")
        if x.shape[1] != atoms_x[0].shape[1]:
            raise ValueError(
                f"feature dimensions differ: atoms_x[{k}] has {x.shape[1]} columns, "
                f"atoms_x[0] has {atoms_x[0].shape[1]}"
            )
    if atoms_y is not None:
        if len(atoms_y) != len(atoms_x):
            raise ValueError(f"got {len(atoms_x)} feature atoms but {len(atoms_y)} label atoms")
        for k, (x, y) in enumerate(zip(atoms_x, atoms_y)):
            check_samples(y, f"atoms_y[{k}]")
            if y.shape[0] != x.shape[0] or y.shape[1] != atoms_y[0].shape[1]:
                raise ValueError(
                    f"atoms_y[{k}] has shape {tuple(y.shape)}; expected "
                    f"({x.shape[0]}, {atoms_y[0].shape[1]}) to match atoms_x[{k}] and atoms_y[0]"
                )
    if not isinstance(alpha, torch.Tensor) or alpha.dim() != 1 or alpha.shape[0] != len(atoms_x):
        shape = tuple(alpha.shape) if isinstance(alpha, torch.Tensor) else type(alpha).__name__
        raise ValueError(f"alpha must be a 1-D tensor with one weight per atom ({len(atoms_x)}), got {shape}")
    check_finite(alpha.detach(), "alpha")
    tol = max(WEIGHT_TOL, rounding_tolerance(alpha.dtype)) if alpha.is_floating_point() else WEIGHT_TOL
    check_weights(alpha.detach(), len(atoms_x), atoms_x[0], "alpha", tol=tol)


def _normalized(alpha: torch.Tensor) -> torch.Tensor:
    """``alpha`` renormalized in float64 when its sum misses 1 by more than the ``WEIGHT_TOL`` that weights are
    used within as they are (those keep their bits and their exact gradient); only computed float32 weights get
    this far (``rounding_tolerance``)."""
    if not alpha.is_floating_point():
        return alpha
    gap = abs(float(alpha.detach().to(torch.float64).sum()) - 1.0)
    return renormalized(alpha) if gap > WEIGHT_TOL else alpha


def _initial_support(atoms_x, atoms_y, n_support, init):
    """Default init: the first atom's points (rows resampled evenly when n_support differs)."""
    if init is not None:
        xb, yb = init if isinstance(init, (tuple, list)) else (init, None)
        check_samples(xb, "init features")
        if xb.shape[1] != atoms_x[0].shape[1]:
            raise ValueError(f"init has {xb.shape[1]} feature columns, atoms have {atoms_x[0].shape[1]}")
        if atoms_y is not None and yb is None:
            yb = torch.full(
                (xb.shape[0], atoms_y[0].shape[1]),
                1.0 / atoms_y[0].shape[1],
                dtype=atoms_y[0].dtype,
                device=atoms_y[0].device,
            )
        if yb is not None and atoms_y is not None and tuple(yb.shape) != (xb.shape[0], atoms_y[0].shape[1]):
            raise ValueError(
                f"init labels have shape {tuple(yb.shape)}, expected ({xb.shape[0]}, {atoms_y[0].shape[1]})"
            )
        return xb.detach(), (yb.detach() if atoms_y is not None else None)
    n0 = atoms_x[0].shape[0]
    n_b = n0 if n_support is None else int(n_support)
    if n_b < 1:
        raise ValueError(f"n_support must be >= 1, got {n_support}")
    idx = torch.arange(n_b, device=atoms_x[0].device) * n0 // n_b
    yb = atoms_y[0].detach()[idx] if atoms_y is not None else None
    return atoms_x[0].detach()[idx], yb


def labeled_barycenter(
    atoms_x,
    atoms_y,
    alpha: torch.Tensor,
    n_support=None,
    n_iter: int = 10,
    tol: float = 1e-6,
    beta: Optional[float] = 1.0,
    solver: str = "emd",
    reg: float = 0.01,
    init=None,
):
    """Free-support barycenter B(alpha; atoms) of labeled empirical distributions.

    ``atoms_x[k]`` (n_k, d) and ``atoms_y[k]`` (n_k, c) carry uniform weights;
    ``atoms_y=None`` gives the unlabeled barycenter (Y_B is then None). The
    support (uniform weights, n_B = ``n_support`` points) starts at the first
    atom's points or at ``init`` (X_B or (X_B, Y_B)). Each of at most
    ``n_iter`` iterations solves pi_k under ``joint_cost`` (beta, or the per-atom rule when None; solver, reg)
    and applies X_B <- sum_k alpha_k n_B pi_k X_k (same for Y_B); it stops when
    the squared displacement ||dX_B||^2 + ||dY_B||^2 or the change of the barycenter loss
    sum_k alpha_k <C_k, pi_k> falls below ``tol`` (the loss rule is the authors' ``wasserstein_barycenter``'s: with
    exact OT the plans may cycle between ties, where the support keeps moving but the loss does not). Returns
    (X_B, Y_B). ``alpha`` may miss 1 by the rounding of its dtype (``rounding_tolerance``: 1.2e-4 in float32, at
    least ``WEIGHT_TOL`` = 1e-5), beyond 1e-5 it is renormalized in float64 before use; further off than the
    tolerance, negative or non-finite, it is refused.
    """
    _check_atoms(atoms_x, atoms_y, alpha)
    alpha = _normalized(alpha)
    if n_iter < 1:
        raise ValueError(f"n_iter must be >= 1, got {n_iter}")
    xb, yb = _initial_support(atoms_x, atoms_y, n_support, init)
    labeled = atoms_y is not None
    plans, last_loss = None, None
    with torch.no_grad():  # the fixed-point iterations: plans only, no autograd graph
        for _ in range(n_iter):
            plans, costs = _plans(xb, yb, atoms_x, atoms_y, beta, solver, reg)
            loss = float(sum(alpha[k] * torch.sum(plan * cost) for k, (plan, cost) in enumerate(zip(plans, costs))))
            new_x, new_y = _apply(plans, atoms_x, atoms_y, alpha)
            shift = torch.sum((new_x - xb) ** 2) + (torch.sum((new_y - yb) ** 2) if labeled else 0.0)
            xb, yb = new_x, new_y
            if float(shift) < tol or (last_loss is not None and abs(loss - last_loss) < tol):
                break
            last_loss = loss
    return _apply(plans, atoms_x, atoms_y, alpha)  # the last update again, differentiable in atoms and alpha


def _plans(xb, yb, atoms_x, atoms_y, beta, solver, reg) -> tuple[list, list]:
    """Row-stochastic plans n_B * pi_k between the current support and every atom (detached), and the costs C_k
    divided by n_B (so that sum(plan * cost) is <C_k, pi_k>)."""
    n_b = xb.shape[0]
    costs = [_atom_cost(xb, yb, xk, None if atoms_y is None else atoms_y[k], beta) for k, xk in enumerate(atoms_x)]
    return [n_b * transport_plan(cost, solver=solver, reg=reg) for cost in costs], [cost / n_b for cost in costs]


def _atom_cost(xb, yb, xk, yk, beta):
    """Joint cost between the support and one atom; ``beta=None``: label weight = the largest feature cost."""
    xk, yk = xk.detach(), None if yk is None else yk.detach()
    if beta is not None or yk is None:
        return joint_cost(xb, xk, yb, yk, 1.0 if beta is None else beta)
    features = joint_cost(xb, xk)
    return features + features.max() * joint_cost(yb, yk)


def _apply(plans, atoms_x, atoms_y, alpha):
    """X_B = sum_k alpha_k P_k X_k (and Y_B likewise when labeled)."""
    new_x = sum(alpha[k] * (plan @ xk) for k, (plan, xk) in enumerate(zip(plans, atoms_x)))
    new_y = None if atoms_y is None else sum(alpha[k] * (plan @ yk) for k, (plan, yk) in enumerate(zip(plans, atoms_y)))
    return new_x, new_y
