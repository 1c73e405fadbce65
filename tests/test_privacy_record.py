"""Record-level privacy (privacy.unit=record): DP-SGD's per-example gradients, its accounting and calibration, the
group norms that replace batch norm, the runs, the refusals; and client-level privacy's batch-norm variances."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.experiments.cli import main
from fedsim.methods.common.training import classification_loss, make_optimizer
from fedsim.models import build_model
from fedsim.models.normalization import bn_layers
from fedsim.privacy.dpsgd import (
    RecordPlan,
    clipped_sum,
    dp_sgd_epochs,
    per_example_gradients,
    record_epsilon,
    record_plan,
)
from fedsim.privacy.protocol import RUNNING_VARIANCE_FLOOR, clamp_running_variances

RECORD = ["privacy.unit=record", "privacy.clip=1.0"]


def _model(name: str, group_norm: bool) -> nn.Module:
    torch.manual_seed(0)
    return build_model(SimpleNamespace(name=name, hidden=32), (1, 28, 28), 10, group_norm=group_norm).double()


@pytest.mark.parametrize("name", ["lenet5", "cnn"])
def test_per_example_gradients_match_single_example_backward_passes(name):
    model = _model(name, group_norm=True)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, 1, 28, 28, generator=generator, dtype=torch.float64)
    y = torch.tensor([0, 3, 9, 3, 1])
    grads, losses = per_example_gradients(model, x, y, classification_loss)
    for i in range(len(x)):
        model.zero_grad()
        loss = classification_loss(model, x[i : i + 1], y[i : i + 1])
        loss.backward()
        assert losses[i].item() == pytest.approx(loss.item(), abs=1e-6)
        for param_name, p in model.named_parameters():
            torch.testing.assert_close(grads[param_name][i], p.grad, atol=1e-6, rtol=0)


def test_each_gradient_is_clipped_to_C_over_all_parameters():
    grads = {"a": torch.tensor([[3.0, 0.0], [0.3, 0.0]]), "b": torch.tensor([[4.0], [0.4]])}  # norms 5 and 0.5
    summed = clipped_sum(grads, clip=1.0)
    torch.testing.assert_close(summed["a"], torch.tensor([3.0 / 5 + 0.3, 0.0]))
    torch.testing.assert_close(summed["b"], torch.tensor([4.0 / 5 + 0.4]))


def test_batch_norm_is_replaced_by_group_norm_under_record_privacy():
    model = _model("cnn", group_norm=True)
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert not bn_layers(model) and [(m.num_groups, m.num_channels) for m in norms] == [(16, 16), (32, 32)]
    assert len(bn_layers(_model("cnn", group_norm=False))) == 2  # client level and off: the model as declared


def test_a_step_without_clipping_or_noise_is_sgd_on_the_mean_gradient():
    """q = 1 (every record in every batch), a clip no gradient reaches and a vanishing noise: DP-SGD's step is
    SGD's on the batch's mean gradient."""
    x = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = torch.arange(8) % 10
    private, plain = _model("lenet5", True), _model("lenet5", True)
    settings = SimpleNamespace(lr=0.1, momentum=0.0, weight_decay=0.0)
    plan = RecordPlan(8, 1.0, 1, 1, 1, 1e-15, 1e6)  # noise std 1e-9
    dp_sgd_epochs(
        private, x, y, 1, plan, make_optimizer(private, settings), 0, torch.device("cpu"), classification_loss
    )
    optimizer = make_optimizer(plain, settings)
    classification_loss(plain, x, y).backward()
    optimizer.step()
    for (name, p), q in zip(private.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, atol=1e-9, rtol=0, msg=name)


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_epsilon_is_dp_accountings_for_the_sampled_steps(kind):
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    q, z, steps, delta = 32 / 2000, 1.1, 300, 1e-5
    event = SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), steps)
    accountant = RdpAccountant() if kind == "rdp" else PLDAccountant()
    expected = accountant.compose(event).get_epsilon(delta)
    assert record_epsilon(q, z, steps, delta, kind) == pytest.approx(expected, rel=1e-6)


def test_the_noise_multiplier_is_calibrated_to_the_budget(toy_overrides):
    config = load_config(
        None, toy_overrides + ["run.backend=local", "privacy.epsilon=4", "privacy.delta=1e-5", *RECORD]
    )
    plan = record_plan(config, 200)
    per_epoch = math.ceil(200 / 16)
    assert (plan.rate, plan.steps_per_epoch) == (16 / 200, per_epoch)
    assert plan.total_steps == per_epoch * config.method.local_epochs * config.run.rounds
    spent = plan.epsilon(plan.total_steps, 1e-5)
    assert 0.97 * 4 <= spent <= 4
    assert record_epsilon(plan.rate, plan.noise_multiplier * 0.97, plan.total_steps, 1e-5) > 4  # the smallest z
    assert (
        record_plan(
            load_config(None, toy_overrides + ["privacy.epsilon=4", "privacy.delta=1e-5", "privacy.clip=1"]), 200
        )
        is None
    )


def test_a_record_level_run_reports_each_clients_epsilon_and_keeps_its_budget(toy_overrides):
    overrides = toy_overrides + ["run.backend=local", "privacy.epsilon=8", "privacy.delta=1e-5", *RECORD]
    config = load_config(None, overrides)
    result = run_experiment(config, None)
    spent = [m["privacy_epsilon"] for m in result.history]
    assert 0 < spent[0] < spent[1] <= 8 and spent[1] >= 0.97 * 8
    clients = result.summary["privacy_epsilon_clients"]
    assert set(clients) == {str(c) for c in build_federation(config.data).source_ids}
    assert max(clients.values()) == result.summary["privacy_epsilon"]
    assert all(math.isfinite(v) for v in result.summary["source_accuracy"].values())
    assert not any(k.endswith("running_var") for k in result.global_tensors)  # group norms: no running statistics


def test_a_tiny_fedavg_digits_run_under_record_privacy_finishes(tmp_path):
    sets = {
        "data.max_train_per_domain": "64",
        "privacy.unit": "record",
        "privacy.epsilon": "8",
        "privacy.delta": "1e-5",
        "privacy.clip": "1.0",
    }
    flags = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    code = main(["run", "-q", "--rounds", "2", "--backend", "local", "--out", str(tmp_path / "run"), *flags])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 <= summary["target_accuracy"] <= 1 and summary["privacy_epsilon"] <= 8
    assert len(summary["privacy_noise_multipliers"]) == 3


def test_the_readmes_client_level_example_finishes_on_the_default_model(tmp_path):
    """The default model (cnn) has batch norm: its noised running variances are clamped, so the run ends."""
    sets = ["data.max_train_per_domain=200", "privacy.epsilon=8", "privacy.delta=1e-5", "privacy.clip=1.0"]
    flags = [arg for value in sets for arg in ("--set", value)]
    code = main(["run", "-q", "--rounds", "3", "--backend", "local", "--out", str(tmp_path / "run"), *flags])
    assert code == 0


def test_noised_running_variances_are_clamped_to_the_floor():
    tensors = {
        "bn.running_var": np.array([-0.5, 0.0, 2.0], dtype=np.float32),
        "bn.running_mean": np.array([-0.5], dtype=np.float32),
        "bn.num_batches_tracked": np.array(3),
    }
    out = clamp_running_variances(tensors)
    np.testing.assert_array_equal(
        out["bn.running_var"], np.array([RUNNING_VARIANCE_FLOOR, RUNNING_VARIANCE_FLOOR, 2], dtype=np.float32)
    )
    assert out["bn.running_var"].dtype == np.float32
    assert (
        out["bn.running_mean"] is tensors["bn.running_mean"]
        and out["bn.num_batches_tracked"] is tensors["bn.num_batches_tracked"]
    )


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--method", "fedmmd"], "privacy.unit=record cannot apply to method 'fedmmd': its MMD couples a batch's"),
        (["--set", "privacy.stage_clip={fit: 2}"], "privacy.stage_clip names fit: under privacy.unit=record"),
        (["--method", "fada"], "privacy.unit=record cannot apply to method 'fada': its 'features' exchange"),
        (["--method", "feddadil"], "privacy.unit=record cannot apply to method 'feddadil': its 'dil' exchange"),
        (["--method", "fedbn"], "cannot apply to method 'fedbn': its batch-norm layers"),
        (["--set", "resources.vectorize=auto"], "set resources.vectorize=off"),
        (["--set", "privacy.stages=fit"], "which privacy.unit=record does not do"),
        (["--set", "privacy.unit=example"], "privacy.unit must be one of client, record, got 'example'"),
    ],
)
def test_a_refused_record_setting_exits_2_with_one_line(toy_overrides, tmp_path, capsys, flags, expected):
    out = tmp_path / "run"
    sets = [arg for o in toy_overrides + ["privacy.noise_multiplier=1.0", *RECORD] for arg in ("--set", o)]
    code = main(["run", "-q", "--backend", "local", "--out", str(out), *sets, *flags])
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_fedrep_under_record_privacy_plans_its_head_and_representation_epochs(toy_overrides):
    overrides = toy_overrides + [
        "method.name=fedrep",
        "method.head_epochs=2",
        "run.backend=local",
        "privacy.epsilon=8",
        "privacy.delta=1e-5",
        *RECORD,
    ]
    config = load_config(None, overrides)
    result = run_experiment(config, None)
    federation = build_federation(config.data)
    clients = result.summary["privacy_epsilon_clients"]
    assert set(clients) == {str(c) for c in federation.source_ids}
    assert all(0.97 * 8 <= eps <= 8 for eps in clients.values())  # all (2 + 1) epochs of both rounds planned
    cid = federation.source_ids[0]
    plan = record_plan(config, federation.info(cid).num_train, 2 + config.method.local_epochs)
    assert plan.steps_per_round == plan.steps_per_epoch * 3
    assert result.summary["privacy_noise_multipliers"][str(cid)] == pytest.approx(plan.noise_multiplier)
    assert all(math.isfinite(v) for v in result.summary["source_accuracy"].values())
