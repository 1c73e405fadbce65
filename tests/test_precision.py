"""run.precision: bf16 autocast of the clients' forward passes; fp32 untouched; bad values in one line."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.api import run
from fedsim.data.base import ArraySplit
from fedsim.experiments.cli import main
from fedsim.methods.common import precision
from fedsim.methods.common.training import encode_in_chunks, evaluation_sums, train_epochs
from fedsim.optim import SGD


def _split(rows: int = 64, seed: int = 0) -> ArraySplit:
    g = np.random.default_rng(seed)
    return ArraySplit(g.normal(size=(rows, 12)).astype(np.float32), g.integers(0, 3, rows).astype(np.int64))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))


def _train(mode: str | None) -> tuple[float, dict]:
    model = _model()
    optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9)
    if mode is None:
        loss = train_epochs(model, _split(), 2, 16, optimizer, seed=3, device=torch.device("cpu"))
    else:
        with precision.using(mode):
            loss = train_epochs(model, _split(), 2, 16, optimizer, seed=3, device=torch.device("cpu"))
    return loss, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_fp32_is_the_loop_without_autocast_bit_for_bit():
    plain, plain_weights = _train(None)
    fp32, fp32_weights = _train("fp32")
    assert plain == fp32
    for name in plain_weights:
        assert torch.equal(plain_weights[name], fp32_weights[name]), name


def test_bf16_trains_in_float32_weights_close_to_fp32_and_reproducibly():
    fp32, fp32_weights = _train("fp32")
    bf16, bf16_weights = _train("bf16")
    again, again_weights = _train("bf16")
    assert math.isfinite(bf16) and bf16 != fp32 and abs(bf16 - fp32) < 0.02 * fp32
    assert bf16 == again
    for name, value in bf16_weights.items():
        assert value.dtype == torch.float32, name  # autocast leaves the weights (and the optimizer) in float32
        assert torch.equal(value, again_weights[name]), name
        assert torch.allclose(value, fp32_weights[name], atol=0.02), name


def test_encoded_features_and_evaluation_come_back_in_float32_under_bf16():
    model, split = _model(), _split()
    with precision.using("bf16"):
        assert precision.current() == "bf16"
        features = encode_in_chunks(model, split.x, torch.device("cpu"), chunk=16)
        correct, loss = evaluation_sums(model, split, torch.device("cpu"))
    assert precision.current() == "fp32"  # the setting ends with its block
    exact = encode_in_chunks(model, split.x, torch.device("cpu"), chunk=16)
    assert features.dtype == torch.float32 and not torch.equal(features, exact)
    assert torch.allclose(features, exact, atol=0.05)
    assert loss.dtype == torch.float64 and math.isfinite(float(loss))
    assert 0 <= int(correct) <= len(split.y)


def test_autocast_is_nothing_under_fp32_and_bfloat16_under_bf16():
    x = torch.randn(4, 12)
    layer = nn.Linear(12, 3)
    with precision.autocast("cpu"):
        assert layer(x).dtype == torch.float32
    with precision.using("bf16"), precision.autocast("cpu"):
        assert layer(x).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="fp32, bf16"):
        with precision.using("fp16"):
            pass


@pytest.mark.parametrize("method", ["fedavg", "centralized", "fada"])
def test_a_bf16_run_is_finite_close_to_fp32_and_reproducible(toy_overrides, method):
    values = dict(item.split("=", 1) for item in toy_overrides)
    values.update({"method.name": method, "run.tensorboard": "false", "run.checkpoint_every": "0"})
    if method == "fada":
        values.update({"run.rounds": "1", "method.adversarial_steps": "2", "method.disentangle_steps": "2"})
    fp32 = run(set={**values, "run.precision": "fp32"})
    default = run(set=values)
    bf16 = run(set={**values, "run.precision": "bf16"})
    again = run(set={**values, "run.precision": "bf16"})
    assert fp32.summary["target_accuracy"] == default.summary["target_accuracy"]
    for name in fp32.global_tensors:
        np.testing.assert_array_equal(fp32.global_tensors[name], default.global_tensors[name], err_msg=name)
    assert bf16.global_tensors.keys() == fp32.global_tensors.keys()
    changed = False
    for name, value in bf16.global_tensors.items():
        assert np.isfinite(value).all(), name
        np.testing.assert_array_equal(value, again.global_tensors[name], err_msg=name)
        np.testing.assert_allclose(value, fp32.global_tensors[name], atol=0.05, err_msg=name)
        changed = changed or not np.array_equal(value, fp32.global_tensors[name])
    assert changed  # bf16 computed something else than fp32
    assert abs(bf16.summary["target_accuracy"] - fp32.summary["target_accuracy"]) <= 0.1


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--set", "run.precision=fp16"], "run.precision must be 'fp32' or 'bf16', got 'fp16'"),
        (
            ["--method", "fedod", "--benchmark", "scenes", "--set", "run.precision=bf16"],
            "run.precision=bf16 applies to the classification methods",
        ),
    ],
)
def test_a_bad_precision_is_one_line_exit_2(args, expected, toy_overrides, tmp_path, capsys):
    out = tmp_path / "never"
    code = main(["run", "-q", "--backend", "local", "--out", str(out)] + args)
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
