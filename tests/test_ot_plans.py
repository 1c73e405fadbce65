"""fedsim.ot's barycenter plans as permutations: the same plans, values and gradients as the dense reference.

The fast path (:func:`fedsim.ot.barycenter.labeled_barycenter`) keeps an exact plan of equal sizes as its
permutation, builds costs from cached squared norms and skips atoms with alpha_k = 0 in the fixed-point
iterations; :func:`tools.ot_reference.reference_barycenter` is the dense transcription (``joint_cost``,
``transport_plan`` for every atom, dense products). Both must pick the same permutations, ties included, and give
the same bits; on problems without ties the permutations are also POT's network simplex's (``ot.emd``).
"""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch

from fedsim.ot.barycenter import Assignment, barycenter_plans, labeled_barycenter, squared_distances, squared_norms
from fedsim.ot.wasserstein import assignment, assignment_plan, joint_cost, transport_plan
from tools import ot_reference as reference
from tools.ot_reference import reference_barycenter, reference_plans

f32, f64 = torch.float32, torch.float64


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (so that -0.0 and 0.0 differ)."""
    return t.contiguous().view({f32: torch.int32, f64: torch.int64}[t.dtype])


def _problem(seed, k, n, d, c, ties, dtype=f32):
    """K atoms (features, soft labels), a starting support and alpha with zeros; ``ties``: atoms whose rows repeat
    (rows drawn with replacement, as the ``minibatch`` exchange draws them) on an integer grid, and repeated
    support rows, so that many assignments are optimal."""
    g = torch.Generator().manual_seed(seed)
    if ties:
        base = torch.randint(0, 3, (k, n // 2 + 1, d), generator=g).to(dtype)
        rows = torch.randint(0, n // 2 + 1, (k, n), generator=g)
        xs = torch.stack([base[i, rows[i]] for i in range(k)])
        ys = torch.nn.functional.one_hot(rows % c, c).to(dtype)
        init_x = torch.randint(0, 3, (n, d), generator=g).to(dtype)
        init_x[n - n // 2 :] = init_x[: n // 2].clone()
    else:
        xs = torch.randn(k, n, d, generator=g, dtype=dtype)
        ys = torch.softmax(torch.randn(k, n, c, generator=g, dtype=dtype), -1)
        init_x = torch.randn(n, d, generator=g, dtype=dtype)
    init_y = torch.softmax(torch.randn(n, c, generator=g, dtype=dtype), -1)
    alpha = torch.rand(k, generator=g, dtype=f64)
    alpha[torch.arange(k) % 3 == 1] = 0.0  # atoms 1, 4, ...: alpha_k = 0
    alpha = (alpha / alpha.sum()).to(dtype)
    return xs, ys, (init_x, init_y), alpha


def _permutations(plans) -> list:
    return [
        plan.cols.tolist() if isinstance(plan, Assignment) else plan.argmax(1).tolist() if plan is not None else None
        for plan in plans
    ]


# ---------------------------------------------------------------- the pieces, bit for bit
@pytest.mark.parametrize("dtype", [f32, f64])
@pytest.mark.parametrize("n,m,d", [(7, 7, 3), (40, 31, 53), (200, 200, 256)])
def test_squared_distances_are_pots_bits(dtype, n, m, d):
    g = torch.Generator().manual_seed(n + d)
    x, y = torch.randn(n, d, generator=g, dtype=dtype), torch.randn(m, d, generator=g, dtype=dtype)
    y[0] = x[0]  # a zero distance, clipped at 0 alike
    got = squared_distances(x, y, squared_norms(x), squared_norms(y))
    assert torch.equal(_bits(got), _bits(ot.dist(x, y)))


@pytest.mark.parametrize("dtype", [f32, f64])
@pytest.mark.parametrize("n_b", [5, 41, 49, 200, 500])  # 41 (float32) and 49 (float64): n * (1/n) != 1
def test_an_assignment_is_its_dense_plan_bit_for_bit(dtype, n_b):
    """Gather times scale = the dense product; ``inner`` = the dense sum; ``dense()`` = n_B * ``assignment_plan``."""
    g = torch.Generator().manual_seed(n_b)
    cost = joint_cost(torch.randn(n_b, 4, generator=g, dtype=dtype), torch.randn(n_b, 4, generator=g, dtype=dtype))
    x = torch.randn(n_b, 6, generator=g, dtype=dtype)
    dense = n_b * assignment_plan(cost)
    plan = Assignment.exact(cost, n_b)
    assert plan.unit == bool(plan.scale == 1) and torch.equal(plan.cols, assignment(cost))
    assert torch.equal(_bits(plan.dense()), _bits(dense))
    assert torch.equal(_bits(plan @ x), _bits(dense @ x))
    assert torch.equal(_bits(plan.inner(cost / n_b)), _bits(torch.sum(dense * (cost / n_b))))
    assert sorted(plan.cols.tolist()) == list(range(n_b))


@pytest.mark.parametrize("seed", range(6))
def test_the_assignment_is_an_optimal_plan_and_pots_without_ties(seed):
    g = torch.Generator().manual_seed(seed)
    n = 30
    ties = seed % 2 == 1
    xs = torch.randint(0, 2, (n, 3), generator=g).to(f64) if ties else torch.randn(n, 3, generator=g, dtype=f64)
    cost = joint_cost(xs, torch.randn(n, 3, generator=g, dtype=f64) if not ties else xs.flip(0))
    cols = assignment(cost)
    uniform = np.full(n, 1.0 / n)
    optimum = ot.emd2(uniform, uniform, cost.numpy())
    assert float(cost[torch.arange(n), cols].sum()) / n == pytest.approx(optimum, rel=1e-12, abs=1e-14)
    if not ties:
        assert ot.emd(uniform, uniform, cost.numpy()).argmax(1).tolist() == cols.tolist()


# ---------------------------------------------------------------- barycenters against the dense reference
CASES = [
    # (seed, K, n, d, classes, ties, labeled, beta)
    (0, 1, 8, 2, 3, False, True, None),
    (1, 3, 41, 5, 4, False, True, None),  # float32: n_B * (1/n) rounds below 1
    (2, 5, 64, 53, 6, False, True, 1.0),
    (3, 5, 40, 3, 3, True, True, None),
    (4, 3, 40, 2, 2, True, True, 0.5),
    (5, 4, 30, 4, 3, False, False, None),
    (6, 5, 41, 3, 3, True, False, None),
    (7, 5, 200, 53, 29, False, True, None),
]


def _both(case, dtype=f32, **kwargs):
    """(fast, reference): each (plans, X_B, Y_B, gradients w.r.t. atoms_x, atoms_y, alpha) of ``case``."""
    seed, k, n, d, c, ties, labeled, beta = case
    xs, ys, init, alpha = _problem(seed, k, n, d, c, ties, dtype)
    out = []
    for plans_of, bary in ((barycenter_plans, labeled_barycenter), (reference_plans, reference_barycenter)):
        ax, ay, al = xs.clone().requires_grad_(), ys.clone().requires_grad_(), alpha.clone().requires_grad_()
        args = (list(ax), list(ay) if labeled else None, al)
        settings = dict(n_iter=kwargs.get("n_iter", 50), tol=1e-9, beta=beta, init=init if labeled else init[0])
        _, plans = plans_of(*args, None, solver="emd", reg=0.01, **settings)
        xb, yb = bary(
            *args,
            **settings,
            **({"threads": kwargs["threads"]} if "threads" in kwargs and bary is labeled_barycenter else {}),
        )
        loss = (xb**2).sum() + (xb[:, 0] * torch.arange(n, dtype=dtype)).sum() + ((yb**3).sum() if labeled else 0.0)
        grads = torch.autograd.grad(loss, (ax, ay, al) if labeled else (ax, al))
        out.append((_permutations(plans), xb, yb, grads))
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c[0]}-K{c[1]}-n{c[2]}-{'ties' if c[5] else 'free'}")
def test_fast_plans_values_and_gradients_are_the_dense_references(case):
    (perms, xb, yb, grads), (ref_perms, ref_xb, ref_yb, ref_grads) = _both(case)
    assert perms == ref_perms
    assert torch.equal(xb, ref_xb)
    assert (yb is None and ref_yb is None) or torch.equal(yb, ref_yb)
    for grad, ref in zip(grads, ref_grads):
        assert torch.allclose(grad, ref, rtol=0, atol=0)


def test_an_atom_with_alpha_zero_still_gets_its_alpha_gradient():
    """d X_B / d alpha_k = n_B pi_k X_k also when alpha_k = 0: the plan is solved for the final update."""
    (_, _, _, grads), (_, _, _, ref_grads) = _both(CASES[2])
    alpha_grad = grads[-1]
    assert float(alpha_grad[1].abs()) > 0 and float(alpha_grad[4].abs()) > 0
    assert torch.equal(alpha_grad, ref_grads[-1])


def test_without_a_gradient_atoms_with_alpha_zero_are_never_solved():
    xs, ys, init, alpha = _problem(2, 5, 30, 4, 3, False)
    with torch.no_grad():
        _, plans = barycenter_plans(list(xs), list(ys), alpha, None, 20, 1e-9, None, "emd", 0.01, init)
        got = labeled_barycenter(list(xs), list(ys), alpha, n_iter=20, tol=1e-9, beta=None, init=init)
    expected = reference_barycenter(list(xs), list(ys), alpha, n_iter=20, tol=1e-9, beta=None, init=init)
    assert [plan is None for plan in plans] == [False, True, False, False, True]
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("case", [CASES[3], CASES[7]], ids=["ties", "n200"])
def test_threads_give_the_same_plans_and_bits(case):
    (perms, xb, yb, grads), (ref_perms, ref_xb, ref_yb, ref_grads) = _both(case, threads=2)
    assert perms == ref_perms
    assert torch.equal(xb, ref_xb) and torch.equal(yb, ref_yb)
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))


@pytest.mark.parametrize("case", [c for c in CASES if not c[5]], ids=lambda c: f"seed{c[0]}")
def test_without_ties_the_plans_are_pots_network_simplex(case, monkeypatch):
    """The dense reference with POT's ``ot.emd`` (network simplex) as its exact solver: the same permutations."""

    def network_simplex(cost, solver="emd", reg=0.0):
        uniform = np.full(cost.shape[0], 1.0 / cost.shape[0])
        return torch.from_numpy(ot.emd(uniform, uniform, cost.double().numpy(), numItermax=1_000_000)).to(cost.dtype)

    fast = _both(case, dtype=f64)[0]
    monkeypatch.setattr(reference, "transport_plan", network_simplex)
    with_pot = _both(case, dtype=f64)[1]
    assert fast[0] == with_pot[0]
    assert torch.allclose(fast[1], with_pot[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("solver,n_support", [("sinkhorn", None), ("emd", 6)])
def test_dense_plans_still_match_the_reference(solver, n_support):
    """Entropic plans and supports of another size stay dense: the same values as the reference."""
    xs, ys, _, alpha = _problem(9, 3, 10, 2, 3, False, f64)
    kwargs = dict(n_support=n_support, n_iter=5, beta=None, solver=solver, reg=0.2)
    got = labeled_barycenter(list(xs), list(ys), alpha, **kwargs)
    expected = reference_barycenter(list(xs), list(ys), alpha, **kwargs)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert got[0].shape == (n_support or 10, 2)


def test_bad_settings_are_refused_like_the_reference():
    xs, ys, init, alpha = _problem(0, 2, 6, 2, 2, False)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        labeled_barycenter(list(xs), list(ys), alpha, threads=0)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        labeled_barycenter(list(xs), list(ys), alpha, beta=-1.0)
    mixed = [xs[0], xs[1].double()]
    for bary in (labeled_barycenter, reference_barycenter):
        with pytest.raises(ValueError, match="dtype/device mismatch"):
            bary(mixed, None, alpha)
    dense = transport_plan(joint_cost(xs[0], xs[1]))
    assert torch.equal(dense, assignment_plan(joint_cost(xs[0], xs[1])))
