"""Record-level privacy of FedDANN: the target's rows clipped and noised on the target (local DP), their accounting,
and the sources' DP-SGD over the model and the discriminator (the per-record domain term, per-example gradients)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.losses.dann import DANNLoss
from fedsim.methods.alignment.objective import AlignmentModules, PrivateAlignmentObjective
from fedsim.privacy.dpsgd import per_example_gradients
from fedsim.privacy.rows import RowsPlan, privatize_rows, rows_epsilon, rows_noise_multiplier, rows_plan

RECORD = ["privacy.unit=record", "privacy.clip=1.0", "privacy.delta=1e-5"]


def test_rows_are_clipped_to_C_and_get_noise_of_std_2zC():
    rows = np.array([[3.0, 4.0], [0.3, 0.4]])  # norms 5 and 0.5
    exact = privatize_rows(rows, RowsPlan(clip=1.0, noise_multiplier=0.0, releases=1), np.random.default_rng(0))
    np.testing.assert_allclose(exact, [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)
    many = np.zeros((20000, 8))
    noised = privatize_rows(many, RowsPlan(clip=0.5, noise_multiplier=1.5, releases=1), np.random.default_rng(1))
    assert noised.dtype == np.float32
    assert noised.std() == pytest.approx(2 * 1.5 * 0.5, rel=0.02)


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_rows_epsilon_is_dp_accountings_for_R_gaussian_releases(kind):
    from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant() if kind == "rdp" else PLDAccountant()
    expected = accountant.compose(SelfComposedDpEvent(GaussianDpEvent(3.0), 10)).get_epsilon(1e-5)
    assert rows_epsilon(3.0, 10, 1e-5, kind) == pytest.approx(expected, rel=1e-6)
    assert rows_epsilon(3.0, 0, 1e-5, kind) == 0.0


def test_the_rows_noise_multiplier_is_the_smallest_that_keeps_the_budget(toy_overrides):
    z = rows_noise_multiplier(10, 8.0, 1e-5)
    assert 0.97 * 8 <= rows_epsilon(z, 10, 1e-5) <= 8 and rows_epsilon(0.97 * z, 10, 1e-5) > 8
    config = load_config(
        None, toy_overrides + ["method.name=feddann", "privacy.epsilon=8", *RECORD, "privacy.stage_clip={features: 7}"]
    )
    plan = rows_plan(config, "features")
    assert (plan.clip, plan.releases) == (7.0, config.run.rounds)
    assert plan.noise_multiplier == pytest.approx(rows_noise_multiplier(config.run.rounds, 8.0, 1e-5))
    assert rows_plan(config, "other").clip == 1.0  # privacy.clip where stage_clip does not name the stage
    client_level = load_config(None, toy_overrides + ["privacy.epsilon=8", "privacy.delta=1e-5", "privacy.clip=1"])
    assert rows_plan(client_level, "features") is None


def test_the_per_record_dann_term_has_the_reversal_layers_value_and_gradients():
    torch.manual_seed(0)
    loss = DANNLoss(6, hidden=8).double()
    source = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randn(7, 6, dtype=torch.float64)
    reference, _ = loss.objective(source, target, 0.3)
    reference.backward()
    expected = {"source": source.grad.clone(), **{n: p.grad.clone() for n, p in loss.named_parameters()}}
    loss.zero_grad()
    source.grad = None
    value = loss.per_record_objective(source, target, 0.3)
    value.backward()
    assert value.item() == pytest.approx(reference.item(), abs=1e-12)
    torch.testing.assert_close(source.grad, expected["source"])  # -0.3 x the discriminator's gradient
    for name, p in loss.named_parameters():
        torch.testing.assert_close(p.grad, expected[name])


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 6), nn.Tanh())
        self.top = nn.Linear(6, 3)

    def features(self, x):
        return self.body(x)

    def head(self, f):
        return self.top(f)


def test_per_example_gradients_reach_the_model_and_the_discriminator():
    torch.manual_seed(0)
    modules = AlignmentModules(_Net().double(), DANNLoss(6, hidden=5).double())
    target = torch.randn(9, 6, dtype=torch.float64)
    optimizer = torch.optim.SGD(modules.parameters(), lr=0.1)
    for group in optimizer.param_groups:
        group["initial_lr"] = 0.1
    objective = PrivateAlignmentObjective(target, torch.Generator().manual_seed(2), lambda s: (0.4, 1.0), 4, optimizer)
    objective.before_step(1)
    assert len(objective.batch) == 4 and objective.weight == 0.4
    x, y = torch.randn(3, 4, dtype=torch.float64), torch.tensor([0, 2, 1])
    grads, losses = per_example_gradients(modules, x, y, objective)
    assert {n for n in grads} == {n for n, _ in modules.named_parameters()}
    assert any(n.startswith("domain_loss.discriminator") for n in grads)
    for i in range(len(x)):
        modules.zero_grad()
        single = objective(modules, x[i : i + 1], y[i : i + 1])
        single.backward()
        assert losses[i].item() == pytest.approx(single.item(), abs=1e-10)
        for name, p in modules.named_parameters():
            torch.testing.assert_close(grads[name][i], p.grad, atol=1e-10, rtol=0)


def test_a_feddann_run_under_record_privacy_spends_its_budget_on_every_client(toy_overrides):
    overrides = toy_overrides + [
        "method.name=feddann",
        "method.target_batch=32",
        "run.backend=local",
        "privacy.epsilon=8",
        *RECORD,
        "privacy.stage_clip={features: 5}",
    ]
    config = load_config(None, overrides)
    result = run_experiment(config, None)
    federation = build_federation(config.data)
    clients = result.summary["privacy_epsilon_clients"]
    assert set(clients) == {str(c) for c in federation.client_ids}  # the sources' DP-SGD and the target's rows
    assert all(0.97 * 8 <= eps <= 8 for eps in clients.values())
    assert result.summary["privacy_epsilon"] == max(clients.values())
    z_rows = rows_noise_multiplier(config.run.rounds, 8.0, 1e-5)
    target = str(federation.target_ids[0])
    assert result.summary["privacy_noise_multipliers"][target] == pytest.approx(z_rows)
    assert all(math.isfinite(v) for v in result.summary["source_accuracy"].values())
    again = run_experiment(load_config(None, overrides), None)
    assert again.summary["target_accuracy"] == result.summary["target_accuracy"]  # the seed fixes the noise
