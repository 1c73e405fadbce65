"""Domain losses: gradient reversal, DANN, MMD, CORAL on tiny shifted samples."""

import math

import pytest
import torch
from torch.nn import functional as F

from fedsim.losses import (
    CORALLoss,
    DANNLoss,
    DomainLoss,
    GradientReversalLayer,
    MMDLoss,
    dann_schedule,
    gaussian_mmd2,
    grad_reverse,
)


def gaussian(n, d=4, shift=0.0, seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=generator) * scale + shift


@pytest.mark.parametrize("coefficient", [1.0, 0.3, 0.0])
def test_gradient_reversal_is_identity_forward_and_scales_minus_lambda_backward(coefficient):
    x = torch.randn(5, 3, requires_grad=True)
    upstream = torch.randn(5, 3)
    y = grad_reverse(x, coefficient)
    assert torch.equal(y, x)
    y.backward(upstream)
    assert torch.allclose(x.grad, -coefficient * upstream)
    layer = GradientReversalLayer(2.0)
    x.grad = None
    layer(x).sum().backward()
    assert torch.allclose(x.grad, torch.full_like(x, -2.0))


def test_dann_schedule_ramps_from_zero_to_one():
    assert dann_schedule(0.0) == 0.0
    assert dann_schedule(0.5) == pytest.approx(2 / (1 + math.exp(-5)) - 1)
    assert 0.999 < dann_schedule(1.0) < 1.0
    assert dann_schedule(2.0) == dann_schedule(1.0)  # progress is clipped to [0, 1]


def test_mmd_is_near_zero_for_one_distribution_and_positive_for_shifted_ones():
    loss = MMDLoss()
    same = float(loss(gaussian(200, seed=1), gaussian(200, seed=2)))
    shifted = float(loss(gaussian(200, seed=1), gaussian(200, shift=1.5, seed=2)))
    assert abs(same) < 0.01
    assert shifted > 0.1
    assert shifted > 20 * abs(same)


def test_mmd_is_symmetric_and_takes_fixed_bandwidths():
    a, b = gaussian(50, seed=3), gaussian(70, shift=0.7, seed=4)
    for loss in (MMDLoss(), MMDLoss(bandwidths=(0.5, 2.0))):
        assert float(loss(a, b)) == pytest.approx(float(loss(b, a)), rel=1e-5)
    assert float(gaussian_mmd2(a, b, bandwidths=[1.0])) != pytest.approx(float(gaussian_mmd2(a, b, bandwidths=[5.0])))
    with pytest.raises(ValueError):
        MMDLoss(bandwidths=(0.0,))


def test_mmd_gradient_pulls_the_source_toward_the_target():
    source = gaussian(64, seed=5).requires_grad_(True)
    target = gaussian(64, shift=2.0, seed=6)
    MMDLoss()(source, target).backward()
    assert torch.isfinite(source.grad).all()
    assert source.grad.mean() < 0  # descending moves the source up, toward the target's mean


def test_coral_is_zero_for_equal_covariances_and_positive_otherwise():
    loss = CORALLoss()
    x = gaussian(100, seed=7)
    assert float(loss(x, x + 3.0)) == pytest.approx(0.0, abs=1e-10)  # a mean shift leaves covariance unchanged
    assert float(loss(x, gaussian(100, seed=8, scale=3.0))) > 0.5
    assert float(loss(x, 2 * x)) == pytest.approx(float(loss(2 * x, x)))


def test_losses_reject_mismatched_features():
    for loss in (MMDLoss(), CORALLoss(), DANNLoss(4)):
        with pytest.raises(ValueError):
            loss(torch.zeros(8, 4), torch.zeros(8, 3))
    with pytest.raises(ValueError):
        MMDLoss()(torch.zeros(1, 4), torch.zeros(8, 4))


def test_dann_discriminator_learns_to_separate_separated_features():
    torch.manual_seed(0)
    loss = DANNLoss(4, hidden=16)
    optimizer = torch.optim.SGD(loss.parameters(), lr=0.1, momentum=0.9)
    source, target = gaussian(128, seed=9, shift=2.0), gaussian(128, seed=10, shift=-2.0)
    assert loss.last_metrics == {}
    for _ in range(50):
        optimizer.zero_grad()
        term, value = loss.objective(source, target, 1.0)
        term.backward()
        optimizer.step()
    assert loss.last_metrics["discriminator_accuracy"] > 0.9
    assert float(value.detach()) < math.log(2) / 2


def test_dann_reverses_and_scales_the_gradient_reaching_the_features():
    torch.manual_seed(1)
    loss = DANNLoss(4, hidden=8)
    source = gaussian(10, seed=11).requires_grad_(True)
    target = gaussian(12, seed=12, shift=1.0).requires_grad_(True)
    term, value = loss.objective(source, target, 0.25)
    assert term is value  # the weight acts only through the reversal
    term.backward()
    grad_source, grad_target = source.grad.clone(), target.grad.clone()
    disc_grads = [p.grad.clone() for p in loss.discriminator.parameters()]
    # the same loss without reversal, computed by hand
    source.grad = target.grad = None
    loss.discriminator.zero_grad()
    logits_s, logits_t = loss.discriminator(source), loss.discriminator(target)
    plain = 0.5 * (
        F.binary_cross_entropy_with_logits(logits_s, torch.ones(10))
        + F.binary_cross_entropy_with_logits(logits_t, torch.zeros(12))
    )
    assert float(plain.detach()) == pytest.approx(float(value.detach()))
    plain.backward()
    assert torch.allclose(grad_source, -0.25 * source.grad, atol=1e-7)
    assert torch.allclose(grad_target, -0.25 * target.grad, atol=1e-7)
    for reversed_, direct in zip(disc_grads, (p.grad for p in loss.discriminator.parameters())):
        assert torch.allclose(reversed_, direct)  # the discriminator itself sees the unreversed, unscaled loss


def test_weighted_objective_of_distance_losses():
    source, target = gaussian(20, seed=13).requires_grad_(True), gaussian(20, seed=14, shift=1.0)
    for loss in (MMDLoss(), CORALLoss()):
        assert isinstance(loss, DomainLoss)
        term, value = loss.objective(source, target, 0.5)
        assert float(term.detach()) == pytest.approx(0.5 * float(value.detach()))


def test_dann_lr_factor_is_ganins_annealing():
    from fedsim.losses.domain import dann_lr_factor

    assert dann_lr_factor(0.0) == 1.0
    assert dann_lr_factor(1.0) == pytest.approx(1 / 11**0.75)
    assert dann_lr_factor(0.3) == pytest.approx(1 / (1 + 10 * 0.3) ** 0.75)
    assert dann_lr_factor(2.0) == dann_lr_factor(1.0) and dann_lr_factor(-1.0) == 1.0  # progress clipped to [0, 1]
