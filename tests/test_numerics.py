"""Computed values are repaired, diverged ones end the run cleanly: float32 simplex weights off by rounding go
through the barycenter; a value that is no longer finite ends `fedsim run` with one line naming the method, round,
client and quantity, exit code 2, the last checkpoint kept (local and Ray backends)."""

import pickle

import numpy as np
import pytest
import torch

from fedsim.errors import NumericalError, UserError, unwrapped
from fedsim.experiments.cli import main
from fedsim.methods.dictionary import learning as dil
from fedsim.methods.fedavg import FedAvg
from fedsim.ot.barycenter import labeled_barycenter
from fedsim.ot.simplex import rounding_tolerance
from fedsim.runtime.checkpoint import CHECKPOINT_FILE, load_checkpoint


def _atoms(seed=0, k=3, n=6, d=3, c=2):
    g = torch.Generator().manual_seed(seed)
    return list(torch.randn(k, n, d, generator=g)), list(torch.softmax(torch.randn(k, n, c, generator=g), -1))


@pytest.mark.parametrize("offset", [1e-4, -1e-4])
def test_float32_weights_off_by_1e_4_give_the_barycenter_of_the_normalized_weights(offset):
    atoms_x, atoms_y = _atoms()
    exact = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    alpha = (exact * (1 + offset)).to(torch.float32).requires_grad_(True)
    assert abs(float(alpha.detach().double().sum()) - 1.0) == pytest.approx(1e-4, rel=1e-2)
    xb, yb = labeled_barycenter(atoms_x, atoms_y, alpha, n_iter=5)
    xe, ye = labeled_barycenter(atoms_x, atoms_y, exact.to(torch.float32), n_iter=5)
    assert torch.allclose(xb, xe, atol=1e-6) and torch.allclose(yb, ye, atol=1e-6)
    assert torch.allclose(yb.sum(1), torch.ones(len(yb)), atol=1e-6)  # label rows stay distributions
    xb.sum().backward()
    assert torch.isfinite(alpha.grad).all() and float(alpha.grad.abs().sum()) > 0


def test_weights_beyond_rounding_are_refused():
    atoms_x, atoms_y = _atoms()
    assert rounding_tolerance(torch.float32) == pytest.approx(1.22e-4, rel=1e-2)
    with pytest.raises(ValueError, match=r"alpha must sum to 1 \(got 1.001\)"):
        labeled_barycenter(atoms_x, atoms_y, torch.tensor([0.501, 0.3, 0.2]))
    with pytest.raises(ValueError, match=r"alpha must sum to 1 \(got 1.0001\)"):  # float64: 1e-5, not 1e-4
        labeled_barycenter([a.double() for a in atoms_x], None, torch.tensor([0.5001, 0.3, 0.2], dtype=torch.float64))
    with pytest.raises(NumericalError, match="alpha is no longer finite"):
        labeled_barycenter(atoms_x, atoms_y, torch.tensor([0.5, float("nan"), 0.5]))


def test_numerical_error_one_line_located_pickled_and_unwrapped():
    exc = NumericalError("alpha", "nan, 0.5", "lower method.lr_alpha").located(method="feddadil", round=3, client=2)
    exc.located(round=9, checkpoint="the checkpoint of round 2 is kept in runs/x")  # set fields stay
    text = "feddadil, round 3, client 2: alpha is no longer finite (nan, 0.5): lower method.lr_alpha"
    assert str(exc) == text + " (the checkpoint of round 2 is kept in runs/x)"
    assert isinstance(exc, UserError) and isinstance(exc, ValueError)
    assert str(pickle.loads(pickle.dumps(exc))) == str(exc)

    class Wrapper(Exception):  # what Ray's RayTaskError does: the remote error under .cause, once per actor
        def __init__(self, cause):
            self.cause = cause

    assert unwrapped(Wrapper(Wrapper(exc))) is exc and unwrapped(exc) is exc


def test_dictionary_step_names_the_quantity_that_diverged():
    atoms = [torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3, 2, requires_grad=True)]
    alpha = torch.tensor([0.5, 0.5], requires_grad=True)
    optimizer = torch.optim.SGD(atoms + [alpha], lr=1e38)
    with pytest.raises(NumericalError, match=r"^the DiL loss is no longer finite \(inf\): .*lower method.lr_atoms"):
        dil.dil_step(optimizer, torch.tensor(float("inf")), atoms, [alpha])
    loss = (atoms[0] * 1e38).sum()  # finite, but a step of lr 1e38 along its gradient overflows float32
    with pytest.raises(NumericalError, match="^atom features is no longer finite"):
        dil.dil_step(optimizer, loss, atoms, [alpha])


def _nan_in_round(round_, client):
    """FedAvg's fit, with a nan in its reply's first tensor on ``client`` in ``round_``."""
    original = FedAvg.fit

    def fit(self, instruction, state, data):
        reply, state = original(self, instruction, state, data)
        if instruction.round == round_ and data.client_id == client:
            name = next(iter(reply.tensors))
            reply.tensors[name] = np.full_like(reply.tensors[name], np.nan)
        return reply, state

    return fit


def _flags(overrides):
    return [flag for item in overrides for flag in ("--set", item)]


def test_a_weight_that_turns_nan_ends_the_run_with_one_line_and_its_checkpoint(
    toy_overrides, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(FedAvg, "fit", _nan_in_round(3, client=2))
    out = tmp_path / "run"
    args = ["run", "-q", "--backend", "local", "--out", str(out), "--rounds", "4", "--set", "run.checkpoint_every=2"]
    assert main(args + _flags(toy_overrides)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("fedsim: error: fedavg, round 3, client 2: tensor '")
    assert "of its fit reply is no longer finite (nan, nan, nan, nan, nan, ...): " in err
    assert err.endswith(
        f"lower the method's learning rate (method.lr or its own rates) (the checkpoint of round 2 is kept in {out})"
    )
    assert load_checkpoint(out)["round"] == 2 and (out / CHECKPOINT_FILE).exists()
    assert not (out / "summary.json").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2  # rounds 1 and 2


def test_a_diverged_run_on_ray_ends_with_the_same_one_line(toy_overrides, tmp_path, ray_cluster, capsys):
    """Real divergence (learning rate 1e30) inside the Ray client actors: the error crosses two actors (client,
    server) and arrives as its own line, without Ray's traceback; no checkpoint yet (round 1)."""
    out = tmp_path / "ray"
    args = ["run", "-q", "--backend", "ray", "--out", str(out), "--rounds", "1"]
    assert main(args + _flags(toy_overrides) + ["--set", "method.lr=1e30"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "ray::" not in err
    assert err.startswith("fedsim: error: fedavg, round 1, client ")
    assert "of its fit reply is no longer finite (" in err
    assert err.endswith(f"(no checkpoint was written yet; {out / 'metrics.jsonl'} holds the rounds before)")
