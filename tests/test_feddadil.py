"""FedDaDiL and centralized DaDiL: alpha stays private, aggregation follows the paper's rule, the encoder
stage standardizes from client sums, DaDiL's alphas live in the server state, both backends agree."""

import numpy as np
import pytest
import torch
from conftest import RecordingExecutor, write_image_domains

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.normalization import feature_stats, mean_std
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError
from fedsim.methods.common import dictionary as dil
from fedsim.methods.common.training import load_numpy
from fedsim.methods.dadil import DaDiL
from fedsim.methods.feddadil import FedDaDiL
from fedsim.runtime import Server

SMALL = ["method.name=feddadil", "method.samples_per_atom=40", "method.batch_size=20", "method.classifier_steps=50"]


def _server(overrides):
    config = load_config(None, overrides)
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    return server, executor, federation


@pytest.fixture(scope="module")
def image_overrides(tmp_path_factory):
    root = write_image_domains(str(tmp_path_factory.mktemp("images")))
    return [
        "data.benchmark=npz",
        f"data.root={root}",
        "data.target=img1",
        f"data.cache_dir={tmp_path_factory.mktemp('cache')}",
        "data.normalization=none",
        "run.progress=false",
        "model.name=cnn",
        "model.hidden=16",
        "method.lr=0.05",
    ]


def test_declared_operations():
    assert FedDaDiL.operations == {"fit", "evaluate", "feature_stats", "dil"}
    assert DaDiL.operations == {"fit", "evaluate", "feature_stats", "upload"}
    assert not FedDaDiL.centralized and DaDiL.centralized


def test_alpha_is_learned_and_never_sent(toy_overrides):
    server, executor, federation = _server(toy_overrides + SMALL)
    before = {cid: executor.host.private_state(cid)["alpha"].clone() for cid in federation.client_ids}
    for rnd in (1, 2):
        server.run_round(rnd, evaluate=True)
    assert executor.operations() == ["dil", "evaluate", "dil", "evaluate"]
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
    server, executor, _ = _server(toy_overrides + SMALL + ["method.aggregation=random"])
    server.run_round(1, evaluate=False)
    instructions, replies = executor.calls[-1]
    kept = server.state["atoms_x"]
    assert kept.shape[1] == 40  # the whole dictionary travels (PyDiL's client update)
    matches = [cid for cid, r in replies.items() if np.array_equal(r.tensors["atoms_x"], kept)]
    assert len(matches) == 1
    # every client got the same payload object (serialized once)
    assert len({id(ins.tensors) for ins in instructions.values()}) == 1


def test_average_aggregation(toy_overrides):
    server, executor, _ = _server(toy_overrides + SMALL + ["method.aggregation=avg"])
    server.run_round(1, evaluate=False)
    _, replies = executor.calls[-1]
    expected = np.mean([r.tensors["atoms_x"] for r in replies.values()], axis=0)
    np.testing.assert_allclose(server.state["atoms_x"], expected, rtol=1e-6)


def test_round_metrics_and_both_predictors(toy_overrides):
    server, executor, federation = _server(toy_overrides + SMALL)
    metrics = server.run_round(1, evaluate=True)
    assert metrics["stage"] == "dictionary"
    assert set(metrics["dil_loss"]) == {str(c) for c in federation.client_ids}
    assert metrics["atom_drift"] > 0 and metrics["atom_dispersion"] > 0
    target = [r for cid, r in executor.calls[-1][1].items() if federation.info(cid).domain == federation.target]
    total = sum(r.metrics["total"] for r in target)
    assert metrics["target_accuracy"] == sum(r.metrics["correct"] for r in target) / total
    assert metrics["target_accuracy_E"] == sum(r.metrics["correct_E"] for r in target) / total


def test_atom_drift_is_zero_for_identical_versions():
    x, logits = dil.init_atoms(2, 10, 3, 2, seed=0)
    p = dil.DictionaryParams()
    assert dil.atom_dispersion([(x, logits), (x.copy(), logits.copy())], p) == pytest.approx(0.0, abs=1e-5)
    assert dil.atom_dispersion([(x, logits), (x + 1.0, logits)], p) > 0
    assert dil.atom_drift([(x.copy(), logits.copy())] * 2, (x, logits), p) == pytest.approx(0.0, abs=1e-5)
    assert dil.atom_drift([(x + 1.0, logits)], (x, logits), p) > dil.atom_drift([(x + 0.5, logits)], (x, logits), p) > 0


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_label_logits_step_with_lr_labels(optimizer):
    """One step on a unit gradient: features move by lr_atoms, label logits by lr_labels (0: lr_atoms), alpha by
    lr_alpha."""
    for lr_labels, expected in ((0.0, 10.0), (0.5, 0.5)):
        p = dil.DictionaryParams(optimizer=optimizer, lr_atoms=10.0, lr_labels=lr_labels, lr_alpha=0.01)
        x, logits, alpha = (torch.zeros(shape, requires_grad=True) for shape in ((2, 3), (2, 4), (2,)))
        opt = dil.make_optimizer(p, 0.9, [x, logits], [alpha])
        (x.sum() + logits.sum() + alpha.sum()).backward()
        opt.step()
        assert torch.allclose(x, torch.full_like(x, -10.0)) and torch.allclose(
            logits, torch.full_like(logits, -expected)
        )
        assert torch.allclose(alpha, torch.full_like(alpha, -0.01))
    with pytest.raises(UserError, match="lr_labels"):
        dil.DictionaryParams(lr_labels=-1.0)


def test_client_optimizer_state_persists_across_rounds(toy_overrides):
    """Adam counts its steps: 4 after two rounds of 2 steps shows the state was carried over (SGD's momentum
    buffers travel the same way)."""
    server, executor, federation = _server(toy_overrides + SMALL + ["method.optimizer=adam"])
    server.run_round(1, evaluate=False)
    server.run_round(2, evaluate=False)
    for cid in federation.client_ids:
        assert (
            executor.host.private_state(cid)["optimizer"]["state"][0]["step"] == 4
        )  # 2 steps a round (40 // 20), two rounds: kept across rounds
        buffers = executor.host.private_state(cid)["optimizer"]["state"]
        assert buffers and all("exp_avg" in b for b in buffers.values())  # Adam's moments


def test_dadil_follows_alg2_per_domain_atom_batches(toy_overrides, monkeypatch):
    """Alg. 2: in one step every domain draws its own atom mini-batch; rows no domain sampled do not change."""
    server, _, federation = _server(toy_overrides + SMALL + ["method.name=dadil", "method.batch_size=5"])
    drawn, steps = [], []
    draw, step = dil.atom_minibatches, dil.step_touched

    def record_draw(*args):
        batches = draw(*args)
        drawn.append(batches[0])
        return batches

    def record_step(optimizer, atoms, touched):
        before = [a.detach().clone() for a in atoms]
        step(optimizer, atoms, touched)
        steps.append((before, [a.detach().clone() for a in atoms], touched.clone(), list(drawn)))
        drawn.clear()

    monkeypatch.setattr(dil, "atom_minibatches", record_draw)
    monkeypatch.setattr(dil, "step_touched", record_step)
    server.run_round(1, evaluate=False)
    assert len(steps) == 40 // 5  # one epoch of n // n_b steps
    for before, after, touched, batches in steps:
        assert len(batches) == len(federation.client_ids)  # one atom mini-batch per domain per step
        assert not torch.equal(batches[0], batches[1])
        assert (~touched).any() and touched.any()
        for old, new in zip(before, after):
            assert torch.equal(old[~touched], new[~touched])
        assert not torch.equal(before[0][touched], after[0][touched])


def test_bad_parameters(toy_overrides, image_overrides, caplog):
    for override, message in (
        ("method.aggregation=median", "random"),
        ("method.solver=lp", "sinkhorn"),
        ("method.samples_per_atom=0", "positive"),
    ):
        with pytest.raises(UserError, match=message):
            load_config(None, toy_overrides + SMALL + [override])
    for overrides, message in (
        (toy_overrides + SMALL + ["method.batch_size=500"], "cannot exceed"),
        (image_overrides + SMALL + ["method.encoder_rounds=0"], "needs an encoder"),
        (toy_overrides + SMALL + ["method.encoder_rounds=2"], "vector inputs have no encoder"),
    ):
        config = load_config(None, overrides)
        with pytest.raises(UserError, match=message):
            FedDaDiL.check_setting(config, build_federation(config.data))
    config = load_config(None, image_overrides + SMALL + ["method.encoder_rounds=3", "run.rounds=3"])
    with caplog.at_level("WARNING"):
        FedDaDiL.check_setting(config, build_federation(config.data))  # allowed, but said: no dictionary is learned
    assert "no dictionary is learned" in caplog.text


def test_encoder_stage_then_standardized_features(image_overrides):
    server, executor, federation = _server(
        image_overrides
        + SMALL
        + [
            "method.encoder_rounds=1",
            "method.samples_per_atom=30",
            "method.batch_size=15",
            "method.classifier_steps=20",
        ]
    )
    first = server.run_round(1, evaluate=True)
    assert first["stage"] == "encoder" and set(first["train_loss"]) == {str(c) for c in federation.source_ids}
    encoder_weights = server.state["weights"]
    second = server.run_round(2, evaluate=True)
    assert second["stage"] == "dictionary"
    assert executor.operations() == ["fit", "evaluate", "feature_stats", "dil", "evaluate"]
    # the shared standardization is the pooled mean/std of every client's encoded training features
    model = executor.host.private_state(federation.client_ids[0])["model"]
    load_numpy(model, encoder_weights)
    with torch.no_grad():
        train = [load_client_data(server.config.data, federation, c).train.x for c in federation.client_ids]
        pooled = np.concatenate([model.eval().features(torch.from_numpy(x)).numpy() for x in train])
    mean, std = mean_std(feature_stats(pooled))
    dil_payload = next(ins for ins, _ in executor.calls if next(iter(ins.values())).operation == "dil")
    payload = next(iter(dil_payload.values())).tensors
    np.testing.assert_allclose(payload["feature_mean"], mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(payload["feature_std"], std, rtol=1e-5, atol=1e-6)
    standardized = np.concatenate(
        [executor.host.private_state(c)["train_features"].numpy() for c in federation.client_ids]
    )
    np.testing.assert_allclose(standardized.mean(0), 0.0, atol=1e-4)
    assert server.state["atoms_x"].shape == (3, 30, 16)


def test_dadil_alphas_live_in_the_server_state(toy_overrides):
    server, executor, federation = _server(toy_overrides + SMALL + ["method.name=dadil"])
    server.run_round(1, evaluate=True)
    assert executor.operations() == ["upload", "evaluate"]
    uploads, evaluations = executor.calls[0][1], executor.calls[1][0]
    for cid in federation.client_ids:
        labeled = federation.info(cid).domain != federation.target
        assert ("y" in uploads[cid].tensors) == labeled  # the target's labels are never uploaded
        assert "train_features" not in executor.host.private_state(cid)  # uploaded: the client keeps no copy
        alpha = server.state["alphas"][cid]
        assert alpha.sum() == pytest.approx(1.0, abs=1e-5) and not np.allclose(alpha, 1 / 3)
        assert evaluations[cid].config["alpha"] == [float(a) for a in alpha]
    assert not any(isinstance(v, dict) for v in vars(server.method).values()), "no per-call state on the method"


def test_local_and_ray_agree(toy_overrides, ray_cluster, tmp_path):
    results = [
        run_experiment(load_config(None, toy_overrides + SMALL + [f"run.backend={b}"]), tmp_path / b)
        for b in ("local", "ray")
    ]
    assert results[0].summary["target_accuracy"] == results[1].summary["target_accuracy"]
    for name, value in results[0].global_tensors.items():
        np.testing.assert_allclose(value, results[1].global_tensors[name], rtol=1e-6, atol=1e-7)


def test_reproduce_grids_reach_the_dictionary_stage():
    """`fedsim reproduce feddadil [--quick]`: on digits the encoder rounds end before the last round (the quick grid
    once ran 3 rounds with 5 encoder rounds: no dictionary at all); TEP keeps the automatic setting (no encoder)."""
    from experiments.reproduce_spec import load_spec, shrink, to_sweep

    for quick, digits_encoder_rounds in ((False, 5), (True, 1)):
        sweep = to_sweep(shrink(load_spec("feddadil", None), quick, None))
        points = [p for p in sweep.points() if p["spec.variant"].split("@")[0] in ("feddadil", "dadil")]
        configs = [sweep.config_for(p) for p in points]
        encoder = {(c.data.benchmark, c.method.params.encoder_rounds, c.run.rounds) for c in configs}
        rounds = 3 if quick else 20  # the plateau rule's 20 (docs/feddadil.md)
        assert encoder == {("tep", -1, rounds), ("digits", digits_encoder_rounds, rounds)}
