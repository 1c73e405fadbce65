"""FedDaDiL: alpha stays private, aggregation follows the paper's rule, both backends agree."""
import numpy as np
import pytest
import torch

from experiments.run import run_experiment
from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.errors import UserError
from fedsim.methods import _dadil as dil
from fedsim.runtime import Server

from conftest import RecordingExecutor

SMALL = ["method.name=feddadil", "method.samples_per_atom=40", "method.batch_size=20", "method.classifier_steps=50"]




def _server(overrides):
    config = load_config(None, overrides)
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    return Server(config, federation, executor), executor, federation


def test_alpha_is_learned_and_never_sent(toy_overrides):
    server, executor, federation = _server(toy_overrides + SMALL)
    before = {cid: executor.host.private_state(cid)["alpha"].clone() for cid in federation.client_ids}
    for rnd in (1, 2):
        server.run_round(rnd, evaluate=True)
    for cid in federation.client_ids:
        alpha = executor.host.private_state(cid)["alpha"]
        assert torch.isclose(alpha.sum(), torch.tensor(1.0)) and (alpha >= 0).all()
        assert not torch.allclose(alpha, before[cid]), "alpha is trained"
        for _, replies in executor.calls:
            if cid in replies:
                reply = replies[cid]
                assert set(reply.tensors) <= {"atoms_x", "atoms_logits"}
                for tensor in reply.tensors.values():
                    assert tensor.shape != tuple(alpha.shape)
                    assert not np.isin(alpha.numpy(), np.asarray(tensor)).all()


def test_random_aggregation_keeps_one_client_version(toy_overrides):
    server, executor, _ = _server(toy_overrides + SMALL)
    server.run_round(1, evaluate=False)
    instructions, replies = executor.calls[-1]
    idx = server.method.atom_batch(1)
    kept = server.state["atoms_x"][:, idx]
    matches = [cid for cid, r in replies.items() if np.array_equal(r.tensors["atoms_x"], kept)]
    assert len(matches) == 1
    # every client got the same payload object (serialized once)
    assert len({id(ins.tensors) for ins in instructions.values()}) == 1


def test_average_aggregation(toy_overrides):
    server, executor, _ = _server(toy_overrides + SMALL + ["method.aggregation=avg"])
    server.run_round(1, evaluate=False)
    _, replies = executor.calls[-1]
    idx = server.method.atom_batch(1)
    expected = np.mean([r.tensors["atoms_x"] for r in replies.values()], axis=0)
    np.testing.assert_allclose(server.state["atoms_x"][:, idx], expected, rtol=1e-6)


def test_round_metrics_and_both_predictors(toy_overrides):
    server, _, federation = _server(toy_overrides + SMALL)
    metrics = server.run_round(1, evaluate=True)
    assert set(metrics["dil_loss"]) == {str(c) for c in federation.client_ids}
    assert metrics["atom_drift"] > 0
    assert 0 <= metrics["target_accuracy"] <= 1 and 0 <= metrics["target_accuracy_E"] <= 1


def test_atom_drift_is_zero_for_identical_versions():
    x, logits = dil.init_atoms(2, 10, 3, 2, seed=0)
    assert dil.atom_drift([(x, logits), (x.copy(), logits.copy())], dil.DictionaryParams()) == pytest.approx(0.0, abs=1e-5)
    assert dil.atom_drift([(x, logits), (x + 1.0, logits)], dil.DictionaryParams()) > 0


def test_bad_parameters(toy_overrides):
    for override, message in (("method.aggregation=median", "random"), ("method.solver=lp", "sinkhorn"), ("method.batch_size=500", "cannot exceed")):
        with pytest.raises(UserError, match=message):
            _server(toy_overrides + SMALL + [override])


def test_local_and_ray_agree(toy_overrides, ray_cluster, tmp_path):
    results = [run_experiment(load_config(None, toy_overrides + SMALL + [f"run.backend={b}"]), tmp_path / b) for b in ("local", "ray")]
    assert results[0].summary["target_accuracy"] == results[1].summary["target_accuracy"]
    for name, value in results[0].global_tensors.items():
        np.testing.assert_allclose(value, results[1].global_tensors[name], rtol=1e-6, atol=1e-7)
