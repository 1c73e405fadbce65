"""fedsim.ot: Wasserstein distances, labeled barycenters, simplex projection (POT-backed)."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch

from fedsim.errors import UserError
from fedsim.methods.dictionary import learning as dil
from fedsim.ot.barycenter import labeled_barycenter
from fedsim.ot.simplex import project_simplex, renormalized
from fedsim.ot.wasserstein import joint_cost, relative_label_weight, transport_plan, wasserstein_distance

f64 = torch.float64


def _rand(seed, n, d, c=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=f64)
    if c is None:
        return x
    return x, torch.softmax(torch.randn(n, c, generator=g, dtype=f64), dim=1)


def _uniform(n):
    return np.full(n, 1.0 / n)


# ---------------------------------------------------------------- distances
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_emd_matches_pot_features_only(seed):
    xs, xt = _rand(seed, 12, 3), _rand(seed + 100, 9, 3) + 0.5
    expected = ot.emd2(_uniform(12), _uniform(9), ot.dist(xs.numpy(), xt.numpy()))
    got = wasserstein_distance(xs, xt)
    assert got.dim() == 0
    assert float(got) == pytest.approx(expected, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
def test_emd_matches_pot_with_labels(beta):
    (xs, ys), (xt, yt) = _rand(3, 10, 4, 3), _rand(4, 14, 4, 3)
    cost = ot.dist(xs.numpy(), xt.numpy()) + beta * ot.dist(ys.numpy(), yt.numpy())
    expected = ot.emd2(_uniform(10), _uniform(14), cost)
    assert float(wasserstein_distance(xs, xt, ys, yt, beta=beta)) == pytest.approx(expected, rel=1e-10)
    assert torch.allclose(joint_cost(xs, xt, ys, yt, beta=beta), torch.from_numpy(cost))


def test_emd_matches_pot_with_weights():
    xs, xt = _rand(5, 8, 2), _rand(6, 6, 2)
    a = np.random.default_rng(0).dirichlet(np.ones(8))
    b = np.random.default_rng(1).dirichlet(np.ones(6))
    expected = ot.emd2(a, b, ot.dist(xs.numpy(), xt.numpy()))
    got = wasserstein_distance(xs, xt, a=torch.from_numpy(a), b=torch.from_numpy(b))
    assert float(got) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("solver", ["emd", "sinkhorn", "sinkhorn_log"])
def test_identical_distributions_and_symmetry(solver):
    (xs, ys), (xt, yt) = _rand(7, 15, 3, 4), _rand(8, 15, 3, 4)
    if solver == "emd":
        assert float(wasserstein_distance(xs, xs, ys, ys)) == pytest.approx(0.0, abs=1e-12)
    d_st = wasserstein_distance(xs, xt, ys, yt, solver=solver, reg=0.05)
    d_ts = wasserstein_distance(xt, xs, yt, ys, solver=solver, reg=0.05)
    assert float(d_st) == pytest.approx(float(d_ts), rel=1e-6)


@pytest.mark.parametrize("solver", ["sinkhorn", "sinkhorn_log"])
def test_sinkhorn_close_to_emd(solver):
    (xs, ys), (xt, yt) = _rand(9, 20, 2, 3), _rand(10, 25, 2, 3)
    exact = float(wasserstein_distance(xs, xt, ys, yt))
    values = [
        float(wasserstein_distance(xs, xt, ys, yt, solver=solver, reg=r, max_iter=3000)) for r in (0.05, 0.01, 0.005)
    ]
    assert all(np.isfinite(values))
    assert values[-1] == pytest.approx(exact, rel=0.08)
    assert values[0] > values[1] > values[2] >= exact - 1e-6  # entropic bias shrinks with reg, stays >= optimum


def test_dtype_kept_and_gradient_flows_float32():
    xs = _rand(11, 10, 3).float().requires_grad_()
    xt = _rand(12, 10, 3).float()
    for solver in ("emd", "sinkhorn"):
        w = wasserstein_distance(xs, xt, solver=solver, reg=0.05)
        assert w.dtype == torch.float32
        (grad,) = torch.autograd.grad(w, xs)
        assert grad.dtype == torch.float32 and torch.isfinite(grad).all()


def test_transport_plan_marginals():
    cost = joint_cost(_rand(13, 7, 2), _rand(14, 5, 2))
    for solver in ("emd", "sinkhorn", "sinkhorn_log"):
        plan = transport_plan(cost, solver=solver, reg=0.05)
        assert not plan.requires_grad
        assert torch.allclose(plan.sum(1), torch.full((7,), 1 / 7, dtype=f64), atol=1e-6)
        assert torch.allclose(plan.sum(0), torch.full((5,), 1 / 5, dtype=f64), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_square_uniform_emd_is_solved_as_an_assignment_with_pots_plan(seed):
    """Equal sizes and uniform weights: the exact plan is POT's network-simplex plan, a permutation / n."""
    (xs, ys), (xt, yt) = _rand(seed, 40, 5, 3), _rand(seed + 10, 40, 5, 3)
    cost = joint_cost(xs, xt, ys, yt, beta=2.0)
    plan = transport_plan(cost)
    pot_plan = ot.emd(_uniform(40), _uniform(40), cost.numpy())
    assert np.array_equal(plan.numpy() > 0, pot_plan > 0)
    assert plan.numpy() == pytest.approx(pot_plan, abs=1e-15)
    assert float(wasserstein_distance(xs, xt, ys, yt, beta=2.0)) == pytest.approx(
        ot.emd2(_uniform(40), _uniform(40), cost.numpy()), rel=1e-12
    )


def test_uneven_weights_still_go_to_the_network_simplex():
    cost = joint_cost(_rand(3, 6, 2), _rand(4, 6, 2))
    a = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1], dtype=f64)
    plan = transport_plan(cost, a=a)
    assert torch.allclose(plan.sum(1), a) and int((plan > 0).sum()) > 6  # not a permutation: row 0 splits its mass
    assert plan.numpy() == pytest.approx(ot.emd(a.numpy(), _uniform(6), cost.numpy()), abs=1e-15)


def test_gradcheck_wasserstein_emd():
    (xs, ys), (xt, yt) = _rand(15, 6, 2, 3), _rand(16, 5, 2, 3)
    xs.requires_grad_()
    ys.requires_grad_()
    assert torch.autograd.gradcheck(lambda x, y: wasserstein_distance(x, xt, y, yt, beta=0.7), (xs, ys))
    xt.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: wasserstein_distance(xs.detach(), x), (xt,))


# ---------------------------------------------------------------- barycenters
def _same_up_to_permutation(x, y):
    return float(wasserstein_distance(x.detach(), y.detach())) < 1e-12


def test_barycenter_single_atom_is_the_atom():
    x, y = _rand(20, 10, 3, 4)
    init = (_rand(21, 10, 3), torch.full((10, 4), 0.25, dtype=f64))
    xb, yb = labeled_barycenter([x], [y], torch.ones(1, dtype=f64), init=init)
    joint_b, joint = torch.cat([xb, yb], 1), torch.cat([x, y], 1)
    assert _same_up_to_permutation(joint_b, joint)


def test_barycenter_of_translations_is_midpoint():
    x, y = _rand(22, 12, 2, 3)
    shift = torch.tensor([3.0, -1.0], dtype=f64)
    alpha = torch.tensor([0.5, 0.5], dtype=f64)
    xb, yb = labeled_barycenter([x, x + shift], [y, y], alpha)
    assert _same_up_to_permutation(xb, x + shift / 2)
    assert _same_up_to_permutation(torch.cat([xb, yb], 1), torch.cat([x + shift / 2, y], 1))


def test_barycenter_matches_pot_free_support():
    atoms = [_rand(30 + k, 8, 2) + 2.0 * k for k in range(3)]
    alpha = torch.tensor([0.2, 0.3, 0.5], dtype=f64)
    init = _rand(40, 8, 2)
    expected = ot.lp.free_support_barycenter(
        [a.numpy() for a in atoms], [_uniform(8)] * 3, init.numpy(), weights=alpha.numpy(), numItermax=50, stopThr=1e-12
    )
    xb, yb = labeled_barycenter(atoms, None, alpha, init=init, n_iter=50, tol=1e-12)
    assert yb is None
    assert np.allclose(xb.numpy(), expected, atol=1e-8)


def test_barycenter_labels_in_simplex_and_support_size():
    atoms = [_rand(50 + k, 9 + k, 2, 3) for k in range(3)]
    alpha = project_simplex(torch.tensor([0.1, 0.7, 0.4], dtype=f64))
    for solver in ("emd", "sinkhorn"):
        xb, yb = labeled_barycenter(
            [a[0] for a in atoms], [a[1] for a in atoms], alpha, n_support=6, solver=solver, reg=0.05
        )
        assert xb.shape == (6, 2) and yb.shape == (6, 3)
        assert (yb >= -1e-12).all()
        assert torch.allclose(yb.sum(1), torch.ones(6, dtype=f64), atol=1e-6)


def test_gradcheck_barycenter():
    atoms = [_rand(60 + k, 4, 2, 3) for k in range(2)]
    xs = [a[0].clone().requires_grad_() for a in atoms]
    ys = [a[1].clone().requires_grad_() for a in atoms]
    alpha = torch.tensor([0.35, 0.65], dtype=f64, requires_grad=True)

    def bary(al, x0, x1, y0, y1):
        return labeled_barycenter([x0, x1], [y0, y1], al, n_iter=5, beta=0.5)

    assert torch.autograd.gradcheck(bary, (alpha, *xs, *ys))


# ---------------------------------------------------------------- simplex
def _brute_force_projection(v):
    from scipy.optimize import minimize

    res = minimize(
        lambda w: 0.5 * np.sum((w - v) ** 2),
        np.full(len(v), 1 / len(v)),
        jac=lambda w: w - v,
        bounds=[(0, None)] * len(v),
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    return res.x


@pytest.mark.parametrize(
    "v,expected",
    [([0.5, 2.0, -1.0], [0.0, 1.0, 0.0]), ([1.0, 1.0], [0.5, 0.5]), ([0.6, 0.6, 0.0], [0.5, 0.5, 0.0]), ([5.0], [1.0])],
)
def test_project_simplex_known_cases(v, expected):
    got = project_simplex(torch.tensor(v, dtype=f64))
    assert torch.allclose(got, torch.tensor(expected, dtype=f64))


def test_project_simplex_properties_and_brute_force():
    v = torch.randn(6, 5, generator=torch.Generator().manual_seed(70), dtype=f64) * 2
    w = project_simplex(v)
    assert w.shape == v.shape and (w >= 0).all()
    assert torch.allclose(w.sum(1), torch.ones(6, dtype=f64))
    assert torch.allclose(project_simplex(w), w)  # idempotent
    for row, proj in zip(v, w):  # row-wise = projecting each row alone
        assert torch.allclose(project_simplex(row), proj)
        assert np.allclose(proj.numpy(), _brute_force_projection(row.numpy()), atol=1e-6)
    inside = torch.tensor([0.2, 0.3, 0.5], dtype=f64)
    assert torch.allclose(project_simplex(inside), inside)
    assert project_simplex(torch.tensor([0.3, 2.0], dtype=torch.float32)).dtype == torch.float32


# ---------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(xs=torch.zeros(3, 2, dtype=f64), xt=torch.zeros(3, 4, dtype=f64)), "feature dimensions differ"),
        (dict(ys=torch.zeros(3, 2, dtype=f64), yt=torch.zeros(4, 3, dtype=f64)), "label dimensions differ"),
        (dict(ys=torch.zeros(3, 2, dtype=f64)), "both ys and yt"),
        (dict(ys=torch.zeros(5, 2, dtype=f64), yt=torch.zeros(4, 2, dtype=f64)), "label rows"),
        (dict(a=torch.tensor([0.5, 0.2, 0.2], dtype=f64)), "must sum to 1"),
        (dict(b=torch.tensor([0.5, 0.5], dtype=f64)), "length 4"),
        (dict(a=torch.tensor([1.5, -0.25, -0.25], dtype=f64)), "negative"),
        (dict(solver="exact"), "unknown solver"),
        (dict(solver="sinkhorn", reg=0.0), "reg must be positive"),
        (dict(xt=torch.zeros(4, 3, dtype=torch.float32)), "dtype"),
        (dict(xs=torch.zeros(3, dtype=f64)), "2-D"),
    ],
)
def test_wasserstein_bad_inputs(kwargs, match):
    args = dict(xs=torch.zeros(3, 3, dtype=f64), xt=torch.ones(4, 3, dtype=f64))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        wasserstein_distance(**args)


def test_barycenter_and_simplex_bad_inputs():
    x = [torch.zeros(3, 2, dtype=f64)] * 2
    y = [torch.full((3, 2), 0.5, dtype=f64)] * 2
    with pytest.raises(ValueError, match="one weight per atom"):
        labeled_barycenter(x, y, torch.ones(3, dtype=f64) / 3)
    with pytest.raises(ValueError, match="alpha must sum to 1"):
        labeled_barycenter(x, y, torch.tensor([0.6, 0.6], dtype=f64))
    with pytest.raises(ValueError, match="feature dimensions differ"):
        labeled_barycenter([x[0], torch.zeros(3, 5, dtype=f64)], None, torch.tensor([0.5, 0.5], dtype=f64))
    with pytest.raises(ValueError, match="label atoms"):
        labeled_barycenter(x, y[:1], torch.tensor([0.5, 0.5], dtype=f64))
    with pytest.raises(ValueError, match="at least one atom"):
        labeled_barycenter([], [], torch.ones(0, dtype=f64))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        project_simplex(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="empty"):
        project_simplex(torch.zeros(0))


# ---------------------------------------------------------------- rounding and label weights
def test_a_float32_alpha_off_by_rounding_goes_through_the_barycenter():
    """A computed float32 alpha summing to 0.999969 (what the float32 simplex projection of a large step gave on
    the real Office-Caltech10 SURF files): within float32's rounding tolerance, renormalized in float64 and the
    barycenter runs, its gradient to alpha unchanged; as float64 weights that sum is refused."""
    alpha = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.199969], dtype=torch.float32, requires_grad=True)
    assert float(alpha.detach().sum()) == pytest.approx(0.999969, abs=1e-7)
    g = torch.Generator().manual_seed(0)
    atoms_x = torch.randn(5, 6, 3, generator=g)
    atoms_logits = torch.randn(5, 6, 2, generator=g)
    with pytest.raises(ValueError, match="alpha must sum to 1"):
        labeled_barycenter(list(atoms_x.double()), None, alpha.detach().double())
    direct, _ = labeled_barycenter(list(atoms_x), list(torch.softmax(atoms_logits, -1)), alpha)
    assert torch.isfinite(direct).all() and direct.shape == (6, 3)
    xb, yb = dil.barycenter(atoms_x, atoms_logits, alpha, dil.DictionaryParams())
    assert xb.shape == (6, 3) and torch.isfinite(xb).all() and torch.allclose(yb.sum(1), torch.ones(6))
    xb.sum().backward()
    assert alpha.grad is not None and torch.isfinite(alpha.grad).all()
    fixed = renormalized(alpha.detach())
    assert fixed.dtype == torch.float32 and abs(float(fixed.sum()) - 1.0) < 1e-6


def test_float32_projection_of_large_values_sums_to_one():
    v = torch.tensor([812.25, 790.5, 803.125, 799.0, 811.75], dtype=torch.float32)
    w = project_simplex(v)
    assert w.dtype == torch.float32 and (w >= 0).all()
    assert abs(float(w.sum()) - 1.0) < 1e-6


def test_non_finite_alpha_is_a_clear_error():
    with pytest.raises(ValueError, match="no longer finite.*learning rate"):
        project_simplex(torch.tensor([0.5, float("nan"), 0.5]))
    with pytest.raises(ValueError, match="no longer finite"):
        renormalized(torch.tensor([float("inf"), 0.0]))
    alpha = torch.tensor([0.5, float("nan")])
    with pytest.raises(UserError, match="lr_alpha"):
        dil.project_alpha(alpha)


def test_relative_label_weight_is_max_feature_over_max_label_cost():
    xs, ys = _rand(0, 6, 3, 4)
    xt, yt = _rand(1, 5, 3, 4)
    cx, cy = ot.dist(xs.numpy(), xt.numpy()), ot.dist(ys.numpy(), yt.numpy())
    weight = cx.max() / cy.max()
    assert relative_label_weight(torch.from_numpy(cx), torch.from_numpy(cy)) == pytest.approx(weight)
    assert torch.allclose(joint_cost(xs, xt, ys, yt, beta=None), torch.from_numpy(cx + weight * cy))
    same = torch.zeros(5, 4, dtype=f64)
    assert torch.allclose(joint_cost(xs[:5], xt, same, same, beta=None), torch.from_numpy(cx[:5]))  # no label cost


def test_barycenter_per_atom_label_weight_is_the_atoms_largest_feature_cost():
    """beta=None: atom k's plan weighs the labels by its own largest feature cost to the support (one weight per
    atom, none shared between atoms)."""
    x0, y0 = _rand(0, 4, 2, 3)
    x1, y1 = _rand(1, 4, 2, 3)
    x1 = 10 * x1
    init = _rand(2, 4, 2, 3)
    alpha = torch.tensor([0.5, 0.5], dtype=f64)
    got = labeled_barycenter([x0, x1], [y0, y1], alpha, n_iter=1, beta=None, init=init)
    plans = []
    for xk, yk in ((x0, y0), (x1, y1)):
        features = joint_cost(init[0], xk)
        plans.append(4 * transport_plan(features + features.max() * joint_cost(init[1], yk)))
    expected = 0.5 * plans[0] @ x0 + 0.5 * plans[1] @ x1
    assert torch.allclose(got[0], expected)
