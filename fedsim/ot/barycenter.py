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

Exact OT between the support and an atom of its size (uniform weights: DaDiL's mini-batches) is an assignment
(:func:`~fedsim.ot.wasserstein.assignment`), kept as its permutation (:class:`Assignment`): n_B pi_k X_k is the
gather s X_k[cols], s = n_B * (1/n) in the atoms' dtype, the one value of the dense n_B pi_k, so the product is
the dense one bit for bit (its other terms are exact zeros), and <C_k, pi_k> is summed over the dense plan's
array, so the stopping rule sees the same bits. The costs are ``ot.dist``'s operations with each row's squared
norm computed once (:func:`squared_distances`). A term with alpha_k = 0 adds exact zeros to the support and to the
loss: the iterations skip that atom, and its plan is solved once, from the last iteration's support, when the final
update carries a gradient (d X_B / d alpha_k = n_B pi_k X_k). ``threads`` > 1 solves the atoms of an iteration in
that many threads: scipy's assignment releases the GIL (K = 5 solves of n = 500 took 38 ms in two threads against
64 ms in one on a 2-core machine with a core to spare), but with every core busy (a protocol runs two trials on two
cores) the threads only add their overhead, so the default is one. tools/ot_reference.py holds the dense
transcription these plans are tested and timed against.
"""

from __future__ import annotations

import contextlib
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple, Optional

import ot
import torch

from fedsim.ot.simplex import check_finite, renormalized, rounding_tolerance
from fedsim.ot.wasserstein import (
    WEIGHT_TOL,
    assignment,
    check_cost,
    check_pair,
    check_samples,
    check_weights,
    is_assignment,
    transport_plan,
)


@dataclass(frozen=True)
class Assignment:
    """n_B pi_k of an assignment plan as its permutation: support point i takes atom row ``cols[i]`` with the
    weight ``scale`` (0-dim, n_B * (1/n) in the cost's dtype: the one nonzero value of the dense n_B pi_k);
    ``unit``: the scale is exactly 1 (n_B = n where n * (1/n) rounds to 1)."""

    cols: torch.Tensor
    scale: torch.Tensor
    unit: bool

    @classmethod
    def exact(cls, cost: torch.Tensor, n_b: int) -> "Assignment":
        """n_B pi for the exact OT of the square ``cost`` between uniform weights (``assignment``)."""
        scale = n_b * torch.full((), 1.0 / cost.shape[0], dtype=cost.dtype, device=cost.device)
        return cls(assignment(cost), scale, bool(scale == 1))

    def __matmul__(self, x: torch.Tensor) -> torch.Tensor:
        """n_B pi_k x: row i is scale * x[cols[i]], the dense product's value (its other terms are exact zeros;
        a unit scale is left out, x * 1 being x)."""
        rows = x.index_select(0, self.cols)
        return rows if self.unit else self.scale * rows

    def dense(self) -> torch.Tensor:
        """The (n_B, n) matrix n_B pi_k."""
        plan = torch.zeros(len(self.cols), len(self.cols), dtype=self.scale.dtype, device=self.cols.device)
        plan[torch.arange(len(self.cols), device=self.cols.device), self.cols] = self.scale
        return plan

    def inner(self, cost: torch.Tensor) -> torch.Tensor:
        """sum(n_B pi_k * cost), reduced over the dense product's array (zeros off the assignment: ``cost`` is
        finite) so that its rounding is the dense sum's."""
        rows = torch.arange(len(self.cols), device=cost.device)
        terms = torch.zeros_like(cost)
        terms[rows, self.cols] = self.scale * cost[rows, self.cols]
        return torch.sum(terms)


class Support(NamedTuple):
    """The barycenter's support (detached) and its rows' squared norms."""

    x: torch.Tensor
    y: Optional[torch.Tensor]
    x2: torch.Tensor
    y2: Optional[torch.Tensor]


def squared_norms(x: torch.Tensor) -> torch.Tensor:
    """||x_i||^2 per row, as ``ot.dist`` computes it (``einsum("ij,ij->i")``)."""
    return torch.einsum("ij,ij->i", x, x)


def squared_distances(x, y, x2, y2, nx=None) -> torch.Tensor:
    """``ot.dist(x, y)`` (squared Euclidean: POT's ``euclidean_distances``, operation for operation, so bit for bit)
    from the rows' squared norms ``x2``, ``y2`` (:func:`squared_norms`) computed once for many costs; ``nx``: POT's
    backend of x and y (found when None)."""
    nx = nx or ot.backend.get_backend(x, y)
    c = -2 * nx.dot(x, nx.transpose(y))
    c += x2[:, None]
    c += y2[None, :]
    return nx.maximum(c, 0)


def check_atoms(atoms_x, atoms_y, alpha):
    """Raise ValueError for atoms or weights :func:`labeled_barycenter` cannot take."""
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


def normalized(alpha: torch.Tensor) -> torch.Tensor:
    """``alpha`` renormalized in float64 when its sum misses 1 by more than the ``WEIGHT_TOL`` that weights are
    used within as they are (those keep their bits and their exact gradient); only computed float32 weights get
    this far (``rounding_tolerance``)."""
    if not alpha.is_floating_point():
        return alpha
    gap = abs(float(alpha.detach().to(torch.float64).sum()) - 1.0)
    return renormalized(alpha) if gap > WEIGHT_TOL else alpha


def initial_support(atoms_x, atoms_y, n_support, init):
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
    threads: int = 1,
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
    tolerance, negative or non-finite, it is refused. ``threads``: atoms solved at once in an iteration (module
    docstring).
    """
    alpha, plans = barycenter_plans(atoms_x, atoms_y, alpha, n_support, n_iter, tol, beta, solver, reg, init, threads)
    return _apply(plans, atoms_x, atoms_y, alpha)  # the last update again, differentiable in atoms and alpha


def barycenter_plans(atoms_x, atoms_y, alpha, n_support, n_iter, tol, beta, solver, reg, init, threads=1):
    """(alpha as used, the plans n_B pi_k of the last fixed-point iteration) of :func:`labeled_barycenter`: an
    :class:`Assignment` or a dense matrix per atom, None for an atom with alpha_k = 0 when no gradient is taken."""
    check_atoms(atoms_x, atoms_y, alpha)
    alpha = normalized(alpha)
    if n_iter < 1:
        raise ValueError(f"n_iter must be >= 1, got {n_iter}")
    if beta is not None and beta < 0:
        raise ValueError(f"beta must be >= 0 or None, got {beta}")
    if int(threads) < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    atoms = _Atoms(atoms_x, atoms_y, beta, solver, reg)
    support = atoms.support(*initial_support(atoms_x, atoms_y, n_support, init))
    for k in range(len(atoms.x)):  # every atom against the support, those with alpha_k = 0 included
        atoms.check(k, support)
    active = [k for k, a in enumerate(alpha.detach().tolist()) if a != 0]
    tensors = itertools.chain(atoms_x, atoms_y or (), (alpha,))
    differentiable = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    pool = ThreadPoolExecutor(int(threads)) if int(threads) > 1 else contextlib.nullcontext()
    with pool, torch.no_grad():  # the fixed-point iterations: plans only, no autograd graph
        plans, support = _fixed_point(atoms, support, alpha, active, n_iter, tol, pool)
        missing = [k for k, plan in enumerate(plans) if plan is None] if differentiable else []
        for k, (plan, _) in zip(missing, _solve(atoms, support, missing, pool)):
            plans[k] = plan
    return alpha, plans


def _fixed_point(atoms, support: Support, alpha, active: list, n_iter: int, tol: float, pool):
    """At most ``n_iter`` updates of the support by the atoms in ``active``; returns the last iteration's plans
    (None for the other atoms) and the support they were solved from."""
    plans, solved_from, last_loss = None, support, None
    for _ in range(n_iter):
        solved_from, solved = support, _solve(atoms, support, active, pool)
        plans = [None] * len(atoms.x)
        for k, (plan, _) in zip(active, solved):
            plans[k] = plan
        loss = float(sum(alpha[k] * inner for k, (_, inner) in zip(active, solved)))
        new_x, new_y = _apply(plans, atoms.x, atoms.y, alpha)
        shift = torch.sum((new_x - support.x) ** 2) + (0.0 if new_y is None else torch.sum((new_y - support.y) ** 2))
        if float(shift) < tol or (last_loss is not None and abs(loss - last_loss) < tol):
            break
        last_loss = loss
        support = atoms.support(new_x, new_y)
    return plans, solved_from


def _solve(atoms, support: Support, ks: list, pool) -> list:
    """(plan n_B pi_k, <C_k, pi_k>) for every atom k of ``ks``, in ``pool``'s threads when it has them."""
    if isinstance(pool, ThreadPoolExecutor):
        return list(pool.map(lambda k: atoms.plan(k, support), ks))
    return [atoms.plan(k, support) for k in ks]


class _Atoms:
    """The atoms of one barycenter (detached), their rows' squared norms and the cost and solver settings."""

    def __init__(self, atoms_x, atoms_y, beta, solver, reg):
        self.x = [x.detach() for x in atoms_x]
        self.y = None if atoms_y is None else [y.detach() for y in atoms_y]
        self.x2 = [squared_norms(x) for x in self.x]
        self.y2 = None if self.y is None else [squared_norms(y) for y in self.y]
        self.beta, self.solver, self.reg = beta, solver, reg
        self.nx = ot.backend.get_backend(*self.x)

    def support(self, x, y) -> Support:
        return Support(x, y, squared_norms(x), None if y is None else squared_norms(y))

    def check(self, k: int, s: Support) -> None:
        """``joint_cost``'s checks of the support against atom k (shapes, dtypes, devices)."""
        if self.beta is None and self.y is not None:
            check_pair(s.x, self.x[k])
            check_pair(s.y, self.y[k])
        else:
            check_pair(s.x, self.x[k], s.y, None if self.y is None else self.y[k])

    def cost(self, k: int, s: Support) -> torch.Tensor:
        """C_k between the support and atom k (``joint_cost``'s; ``beta=None``: label weight = largest feature
        cost), with ``joint_cost``'s checks of the pairs."""
        self.check(k, s)
        labeled = self.y is not None and self.beta != 0
        features = squared_distances(s.x, self.x[k], s.x2, self.x2[k], self.nx)
        if not labeled:
            return features
        labels = squared_distances(s.y, self.y[k], s.y2, self.y2[k], self.nx)
        return features + (features.max() if self.beta is None else self.beta) * labels

    def plan(self, k: int, s: Support):
        """(n_B pi_k, <C_k, pi_k>) between the support and atom k: an :class:`Assignment` for exact OT of equal
        sizes, else ``transport_plan``'s dense plan."""
        cost, n_b = self.cost(k, s), s.x.shape[0]
        if self.solver == "emd" and is_assignment(cost):
            check_cost(cost)
            plan = Assignment.exact(cost, n_b)
            return plan, plan.inner(cost / n_b)
        plan = n_b * transport_plan(cost, solver=self.solver, reg=self.reg)
        return plan, torch.sum(plan * (cost / n_b))


def _apply(plans, atoms_x, atoms_y, alpha):
    """X_B = sum_k alpha_k P_k X_k (and Y_B likewise when labeled), over the atoms with a plan (the others have
    alpha_k = 0 and add exact zeros)."""
    terms = [(k, plan) for k, plan in enumerate(plans) if plan is not None]
    new_x = sum(alpha[k] * (plan @ atoms_x[k]) for k, plan in terms)
    new_y = None if atoms_y is None else sum(alpha[k] * (plan @ atoms_y[k]) for k, plan in terms)
    return new_x, new_y
