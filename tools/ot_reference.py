"""The dense reference of the labeled barycenter, for its tests and its benchmark (outside the installed package).

The fixed point of Cuturi & Doucet (ICML 2014, Alg. 2) with DaDiL's labels (Montesuma et al., 2023, Alg. 1 /
Eq. 7) written as the equations read: every iteration builds each C_k with ``joint_cost`` (``ot.dist``), solves
the dense plan n_B pi_k with ``transport_plan`` for every atom, alpha_k = 0 included, and forms
X_B = sum_k alpha_k (n_B pi_k) @ X_k by dense products. :func:`fedsim.ot.barycenter.labeled_barycenter` must
return the same plans and values (tests/test_ot_plans.py); tools/benchmarks/feddadil_ot.py times the two.
"""

from __future__ import annotations

from typing import Optional

import torch

from fedsim.ot.barycenter import check_atoms, initial_support, normalized
from fedsim.ot.wasserstein import joint_cost, transport_plan


def reference_plans(
    atoms_x, atoms_y, alpha, n_support=None, n_iter=10, tol=1e-6, beta=1.0, solver="emd", reg=0.01, init=None
):
    """(alpha as used, the dense plans n_B pi_k of the last iteration) of :func:`reference_barycenter`."""
    check_atoms(atoms_x, atoms_y, alpha)
    alpha = normalized(alpha)
    if n_iter < 1:
        raise ValueError(f"n_iter must be >= 1, got {n_iter}")
    xb, yb = initial_support(atoms_x, atoms_y, n_support, init)
    labeled = atoms_y is not None
    plans, last_loss = None, None
    with torch.no_grad():
        for _ in range(n_iter):
            plans, costs = _plans(xb, yb, atoms_x, atoms_y, beta, solver, reg)
            loss = float(sum(alpha[k] * torch.sum(plan * cost) for k, (plan, cost) in enumerate(zip(plans, costs))))
            new_x, new_y = _apply(plans, atoms_x, atoms_y, alpha)
            shift = torch.sum((new_x - xb) ** 2) + (torch.sum((new_y - yb) ** 2) if labeled else 0.0)
            xb, yb = new_x, new_y
            if float(shift) < tol or (last_loss is not None and abs(loss - last_loss) < tol):
                break
            last_loss = loss
    return alpha, plans


def reference_barycenter(
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
    """(X_B, Y_B) as :func:`fedsim.ot.barycenter.labeled_barycenter` defines them, by dense plans and products;
    differentiable in the atoms and alpha through the final update."""
    alpha, plans = reference_plans(atoms_x, atoms_y, alpha, n_support, n_iter, tol, beta, solver, reg, init)
    return _apply(plans, atoms_x, atoms_y, alpha)


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
    """X_B = sum_k alpha_k P_k X_k (and Y_B likewise when labeled), dense products over every atom."""
    new_x = sum(alpha[k] * (plan @ xk) for k, (plan, xk) in enumerate(zip(plans, atoms_x)))
    new_y = None if atoms_y is None else sum(alpha[k] * (plan @ yk) for k, (plan, yk) in enumerate(zip(plans, atoms_y)))
    return new_x, new_y
