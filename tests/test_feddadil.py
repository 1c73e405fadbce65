"""FedDaDiL and centralized DaDiL: one class-balanced atom batch per round written back into its rows, random
aggregation, a fresh client optimizer, alpha stays private, the encoder stage standardizes from client sums,
DaDiL's alphas live in the server state, both backends agree."""

import numpy as np
import pytest
import torch
from conftest import RecordingExecutor, write_image_domains

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.normalization import feature_stats, mean_std
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError
from fedsim.methods.common.training import load_numpy
from fedsim.methods.dictionary import learning as dil
from fedsim.methods.dictionary import predictors, sampling
from fedsim.methods.dictionary.dadil import DaDiL
from fedsim.methods.dictionary.feddadil import FedDaDiL
from fedsim.ot.barycenter import labeled_barycenter
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
                    inner = alpha.numpy()[(alpha.numpy() > 0) & (alpha.numpy() < 1)]  # a vertex's 0 and 1 are common
                    assert not inner.size or not np.isin(inner, np.asarray(tensor)).all()


def _round_with_batch(overrides, rnd=1):
    """Run dictionary round ``rnd`` (after rounds 1..rnd-1); return the server, executor, the state before it and
    the atom rows it exchanged (the server's draw, a function of the seed and the round)."""
    server, executor, federation = _server(overrides)
    for earlier in range(1, rnd):
        server.run_round(earlier, evaluate=False)
    before = {k: np.array(v) for k, v in server.state.items() if k.startswith("atoms")}
    _, rows = server.method.atom_batch(rnd, before)
    metrics = server.run_round(rnd, evaluate=False)
    return server, executor, federation, before, rows, metrics


def _written_back(before, rows, version):
    x, logits = before["atoms_x"].copy(), before["atoms_logits"].copy()
    where = (np.arange(len(x))[:, None], rows)
    x[where], logits[where] = version
    return x, logits


def test_every_client_receives_the_same_class_balanced_atom_rows(toy_overrides):
    server, executor, federation, before, rows, _ = _round_with_batch(toy_overrides + SMALL)
    instructions, _ = executor.calls[-1]
    assert set(instructions) == set(federation.client_ids)
    assert len({id(ins.tensors) for ins in instructions.values()}) == 1  # one payload, serialized once
    sent = next(iter(instructions.values())).tensors
    k, classes, per_class = 5, federation.num_classes, 20 // federation.num_classes
    assert rows.shape == (k, classes * per_class) and sent["atoms_x"].shape == (k, classes * per_class, 8)
    where = (np.arange(k)[:, None], rows)
    np.testing.assert_array_equal(sent["atoms_x"], before["atoms_x"][where])
    np.testing.assert_array_equal(sent["atoms_logits"], before["atoms_logits"][where])
    for atom in sent["atoms_logits"]:  # class-balanced by the atoms' hard labels
        np.testing.assert_array_equal(np.bincount(atom.argmax(-1), minlength=classes), [per_class] * classes)


@pytest.mark.parametrize("rnd", [1, 2])
def test_random_aggregation_writes_one_clients_version_into_the_batch_rows_only(toy_overrides, rnd):
    server, executor, _, before, rows, _ = _round_with_batch(toy_overrides + SMALL, rnd)
    _, replies = executor.calls[-1]
    after = server.state["atoms_x"], server.state["atoms_logits"]
    outside = np.ones(after[0].shape[:2], bool)
    outside[np.arange(len(rows))[:, None], rows] = False
    assert outside.any()
    for new, old in zip(after, (before["atoms_x"], before["atoms_logits"])):
        np.testing.assert_array_equal(new[outside], old[outside])
    matches = [
        cid
        for cid, r in replies.items()
        if all(
            np.array_equal(a, b)
            for a, b in zip(after, _written_back(before, rows, (r.tensors["atoms_x"], r.tensors["atoms_logits"])))
        )
    ]
    assert len(matches) == 1


def test_average_aggregation(toy_overrides):
    server, executor, _, before, rows, _ = _round_with_batch(toy_overrides + SMALL + ["method.aggregation=avg"])
    _, replies = executor.calls[-1]
    mean = tuple(np.mean([r.tensors[name] for r in replies.values()], axis=0) for name in ("atoms_x", "atoms_logits"))
    expected = _written_back(before, rows, mean)
    np.testing.assert_allclose(server.state["atoms_x"], expected[0], rtol=1e-6)
    np.testing.assert_allclose(server.state["atoms_logits"], expected[1], rtol=1e-6)


def test_barycentric_aggregation_and_the_full_exchange(toy_overrides):
    server, _, _, before, rows, _ = _round_with_batch(toy_overrides + SMALL + ["method.aggregation=wbary"])
    assert server.state["atoms_x"].shape == before["atoms_x"].shape and np.isfinite(server.state["atoms_x"]).all()
    server, executor, _ = _server(toy_overrides + SMALL + ["method.exchange=full"])
    server.run_round(1, evaluate=False)
    instructions, replies = executor.calls[-1]
    assert next(iter(instructions.values())).tensors["atoms_x"].shape == (5, 40, 8)  # the whole dictionary
    kept = server.state["atoms_x"]
    assert sum(np.array_equal(r.tensors["atoms_x"], kept) for r in replies.values()) == 1


def test_a_clients_optimizer_holds_no_state_at_the_start_of_a_round(toy_overrides, monkeypatch):
    """DaDiLClient.update_joint builds its optimizer on every call: no momentum crosses rounds."""
    built = []
    make = dil.make_optimizer

    def record(*args):
        optimizer = make(*args)
        built.append((optimizer, len(optimizer.state)))
        return optimizer

    monkeypatch.setattr(dil, "make_optimizer", record)
    server, executor, federation = _server(toy_overrides + SMALL)
    server.run_round(1, evaluate=False)
    server.run_round(2, evaluate=False)
    assert len(built) == 2 * len(federation.client_ids)
    assert len({id(optimizer) for optimizer, _ in built}) == len(built)
    assert all(size == 0 for _, size in built)  # empty when the round starts
    assert all(optimizer.state for optimizer, _ in built)  # momentum built up within the round
    for cid in federation.client_ids:
        assert "optimizer" not in executor.host.private_state(cid)


def test_dictionary_round_bytes_are_k_batch_rows_each_way(toy_overrides):
    server, _, federation, _, rows, metrics = _round_with_batch(toy_overrides + SMALL, rnd=2)
    k, m = rows.shape
    per_client = k * m * (8 + federation.num_classes) * 4  # float32 features and label logits
    assert metrics["bytes_sent"] == per_client * len(federation.client_ids)
    assert metrics["bytes_received"] == per_client * len(federation.client_ids)


def test_defaults_are_the_authors(toy_root):
    data = ["data.benchmark=npz", f"data.root={toy_root}", "data.target=dom1"]
    config = load_config(None, data + ["method.name=feddadil"])
    p = config.method.params
    assert (config.run.rounds, config.method.batch_size, config.method.local_epochs, config.method.momentum) == (
        50,
        200,
        5,
        0.9,
    )
    assert (p.num_atoms, p.samples_per_atom, p.exchange, p.aggregation, p.optimizer) == (
        5,
        500,
        "minibatch",
        "random",
        "sgd",
    )
    assert (p.lr_atoms, p.lr_labels or p.lr_atoms, p.lr_alpha) == (
        10.0,
        10.0,
        1e-2,
    )  # lr_atoms: the rule on the sources
    assert (p.classifier_epochs, p.classifier_batch, p.classifier_lr, p.classifier_l2) == (100, 128, 1e-3, 1e-2)
    central = load_config(None, data + ["method.name=dadil"])
    q = central.method.params
    assert (central.run.rounds, central.method.local_epochs, q.num_atoms, q.optimizer, q.lr_atoms, q.lr_alpha) == (
        40,
        1,
        5,
        "adam",
        0.1,
        0.1,
    )


def test_round_metrics_and_both_predictors(toy_overrides):
    server, executor, federation = _server(toy_overrides + SMALL)
    metrics = server.run_round(1, evaluate=True)
    assert metrics["stage"] == "dictionary"
    assert set(metrics["dil_loss"]) == {str(c) for c in federation.client_ids}
    assert metrics["atom_drift"] > 0 and metrics["atom_dispersion"] > 0
    assert set(metrics["client_drift"]) == {str(c) for c in federation.client_ids}
    assert metrics["atom_drift"] == pytest.approx(np.mean(list(metrics["client_drift"].values())))
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


def test_dadil_draws_class_balanced_atom_batches_per_domain(toy_overrides, monkeypatch):
    """The authors' centralized fit: each step every domain draws its own class-balanced atom batch; one Adam
    (whose moments move rows no domain sampled in a step) updates the atoms."""
    server, _, federation = _server(toy_overrides + SMALL + ["method.name=dadil", "method.batch_size=6"])
    drawn = []
    draw = sampling.balanced_atom_rows

    def record(*args, **kwargs):
        drawn.append(draw(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(sampling, "balanced_atom_rows", record)
    before = np.array(server.state["atoms_x"])
    server.run_round(1, evaluate=False)
    assert len(drawn) == (40 // 6) * len(federation.client_ids)  # one epoch of n // n_b steps, one draw per domain
    assert all(rows.shape == (5, 6) for rows in drawn)
    assert not torch.equal(drawn[0], drawn[1])
    sampled = np.zeros(before.shape[:2], bool)
    for rows in drawn:
        sampled[np.arange(5)[:, None], rows.numpy()] = True
    moved = ~np.isclose(server.state["atoms_x"], before).all(-1)
    assert moved[sampled].mean() > 0.5  # rows stay where Adam puts them (an atom whose alpha is 0 gets no gradient)


def test_bad_parameters(toy_overrides, image_overrides, caplog):
    for override, message in (
        ("method.aggregation=median", "random | avg | wbary"),
        ("method.exchange=rows", "minibatch | full"),
        ("method.solver=lp", "sinkhorn"),
        ("method.samples_per_atom=0", "positive"),
    ):
        with pytest.raises(UserError, match=message):
            load_config(None, toy_overrides + SMALL + [override])
    for overrides, message in (
        (toy_overrides + SMALL + ["method.batch_size=500"], "cannot exceed"),
        (image_overrides + SMALL + ["method.encoder_rounds=0"], "needs an encoder"),
    ):
        config = load_config(None, overrides)
        with pytest.raises(UserError, match=message):
            FedDaDiL.check_setting(config, build_federation(config.data))
    config = load_config(None, image_overrides + SMALL + ["method.encoder_rounds=3", "run.rounds=3"])
    with caplog.at_level("WARNING"):
        FedDaDiL.check_setting(config, build_federation(config.data))  # allowed, but said: no dictionary is learned
    assert "no dictionary is learned" in caplog.text


@pytest.mark.parametrize("standardization", ["sources", "none", "all"])
def test_encoder_stage_then_standardized_features(image_overrides, standardization):
    """The encoded features' standardization: by default one mean and std per feature from the sources' sums (the
    target's statistics unused); "none" leaves the encoder's features as they are (the authors' CWRU script);
    "all" pools every client's sums, the target's included."""
    server, executor, federation = _server(
        image_overrides
        + SMALL
        + [
            "method.encoder_rounds=1",
            "method.samples_per_atom=30",
            "method.batch_size=15",
            "method.classifier_steps=20",
            f"method.feature_standardization={standardization}",
        ]
    )
    first = server.run_round(1, evaluate=True)
    assert first["stage"] == "encoder" and set(first["train_loss"]) == {str(c) for c in federation.source_ids}
    encoder_weights = server.state["weights"]
    second = server.run_round(2, evaluate=True)
    assert second["stage"] == "dictionary"
    stats = [] if standardization == "none" else ["feature_stats"]
    assert executor.operations() == ["fit", "evaluate", *stats, "dil", "evaluate"]
    asked = [c for ins, _ in executor.calls if next(iter(ins.values())).operation == "feature_stats" for c in ins]
    pooled_ids = federation.client_ids if standardization == "all" else federation.source_ids
    assert sorted(asked) == ([] if standardization == "none" else sorted(pooled_ids))
    model = executor.host.private_state(federation.client_ids[0])["model"]
    load_numpy(model, encoder_weights)

    def encoded(ids):
        with torch.no_grad():
            train = [load_client_data(server.config.data, federation, c).train.x for c in ids]
            return np.concatenate([model.eval().features(torch.from_numpy(x)).numpy() for x in train])

    dil_payload = next(ins for ins, _ in executor.calls if next(iter(ins.values())).operation == "dil")
    payload = next(iter(dil_payload.values())).tensors
    features = np.concatenate([executor.host.private_state(c)["train_features"].numpy() for c in pooled_ids])
    if standardization == "none":
        assert "feature_mean" not in payload and "feature_std" not in payload
        np.testing.assert_allclose(features, encoded(pooled_ids), rtol=1e-5, atol=1e-6)  # as the encoder gives them
    else:
        mean, std = mean_std(feature_stats(encoded(pooled_ids)))
        np.testing.assert_allclose(payload["feature_mean"], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(payload["feature_std"], std, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(features.mean(0), 0.0, atol=1e-4)  # zero mean over the pooled clients
    assert server.state["atoms_x"].shape == (5, 30, 16)


def test_vector_inputs_learn_on_a_frozen_mlp_encoder(toy_overrides):
    """encoder_rounds > 0 on vectors: FedAvg rounds train the MLP, then the dictionary lives on its
    ``model.hidden`` standardized features and the dictionary rounds never touch the encoder."""
    extra = [
        "method.encoder_rounds=1",
        "method.encoder_epochs=2",
        "method.local_epochs=1",
        "model.hidden=12",
        "run.rounds=3",
    ]
    server, executor, federation = _server(toy_overrides + SMALL + extra)
    assert server.run_round(1, evaluate=False)["stage"] == "encoder"
    encoder_weights = {k: v.copy() for k, v in server.state["weights"].items()}
    for rnd in (2, 3):
        assert server.run_round(rnd, evaluate=rnd == 3)["stage"] == "dictionary"
    assert server.state["atoms_x"].shape[-1] == 12
    assert all(np.array_equal(server.state["weights"][k], v) for k, v in encoder_weights.items())
    features = np.concatenate([executor.host.private_state(c)["train_features"].numpy() for c in federation.source_ids])
    assert features.shape[1] == 12
    epochs = {ins.operation: ins.local.local_epochs for call, _ in executor.calls for ins in call.values()}
    assert epochs["fit"] == 2 and epochs["dil"] == 1  # the encoder's epochs apart from the dictionary's E
    np.testing.assert_allclose(features.mean(0), 0.0, atol=1e-4)  # standardized by the sources' statistics


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
        assert alpha.sum() == pytest.approx(1.0, abs=1e-5) and not np.allclose(alpha, 1 / 5)
        assert evaluations[cid].values["alpha"] == [float(a) for a in alpha]
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
    """`fedsim reproduce feddadil [--quick]`: the dictionary gets the authors' rounds (FedDaDiL 50, DaDiL 40) after
    the encoder's, 5 automatic rounds on digits and 10 MLP rounds on TEP; the quick grid's 3 rounds start with 1."""
    from fedsim.experiments.reproduce_spec import load_spec, shrink, to_sweep
    from fedsim.methods.dictionary.base import DEFAULT_IMAGE_ENCODER_ROUNDS

    for quick in (False, True):
        sweep = to_sweep(shrink(load_spec("feddadil", None), quick, None))
        points = [p for p in sweep.points() if p["spec.variant"].split("@")[0] in ("feddadil", "dadil")]
        configs = [sweep.config_for(p) for p in points]
        seen = {(c.data.benchmark, c.method.name, c.method.params.encoder_rounds, c.run.rounds) for c in configs}
        if quick:
            assert seen == {(b, m, 1, 3) for b in ("tep", "digits") for m in ("feddadil", "dadil")}
        else:
            default = {"feddadil": 50, "dadil": 40}
            assert seen == {("digits", m, -1, r + DEFAULT_IMAGE_ENCODER_ROUNDS) for m, r in default.items()} | {
                ("tep", m, 10, r + 10) for m, r in default.items()
            }


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> torch.nn.Module:
    net = torch.nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype)
    with torch.no_grad():
        net.weight.copy_(weight)
        net.bias.copy_(bias)
    return net.eval()


def test_dadil_e_sums_every_atom_nets_outputs_weighted_by_alpha(monkeypatch):
    k, n, dim, classes = 3, 6, 4, 3
    g = torch.Generator().manual_seed(0)
    atoms_x = torch.randn(k, n, dim, generator=g, dtype=torch.float64)
    atoms_logits = torch.randn(k, n, classes, generator=g, dtype=torch.float64)
    x_test = torch.randn(7, dim, generator=g, dtype=torch.float64)
    weights = torch.randn(k, classes, dim, generator=g, dtype=torch.float64)
    biases = torch.randn(k, classes, generator=g, dtype=torch.float64)
    fitted = []

    def hand_made_net(x, y_soft, p, seed):  # the net of the j-th fit: weights[j], biases[j]
        j = len(fitted) % k
        fitted.append((x, y_soft, seed))
        return _linear(weights[j], biases[j])

    monkeypatch.setattr(predictors, "fit_classifier", hand_made_net)
    p = dil.DictionaryParams()
    outputs = torch.stack([x_test @ weights[j].T + biases[j] for j in range(k)])  # (K, rows, classes)

    alpha = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    scores = predictors.ensemble_scores(atoms_x, atoms_logits, alpha, x_test, p, seed=7)
    # one net per atom, each fit on that atom's rows and soft labels, from seed + k
    assert [seed for _, _, seed in fitted] == [7, 8, 9]
    for j, (x, y_soft, _) in enumerate(fitted):
        assert torch.equal(x, atoms_x[j])
        assert torch.equal(y_soft, torch.softmax(atoms_logits[j], -1))
    expected = 0.5 * outputs[0] + 0.3 * outputs[1] + 0.2 * outputs[2]
    torch.testing.assert_close(scores, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(predictors.predict_ensemble(atoms_x, atoms_logits, alpha, x_test, p, 7), expected.argmax(1))
    # no atom is skipped: all of alpha on atom j gives exactly net j's outputs, for every j
    for j in range(k):
        fitted.clear()
        one_hot = torch.nn.functional.one_hot(torch.tensor(j), k).to(torch.float64)
        torch.testing.assert_close(
            predictors.ensemble_scores(atoms_x, atoms_logits, one_hot, x_test, p, 7), outputs[j], rtol=0, atol=0
        )
        assert len(fitted) == k


def test_dadil_r_trains_on_the_reconstruction(monkeypatch):
    k, n, dim, classes = 3, 12, 4, 3
    g = torch.Generator().manual_seed(1)
    atoms_x = torch.randn(k, n, dim, generator=g) + 3.0 * torch.arange(k, dtype=torch.float32)[:, None, None]
    atoms_logits = 4.0 * torch.randn(k, n, classes, generator=g)
    alpha = torch.tensor([0.5, 0.25, 0.25])
    x_test = torch.randn(5, dim, generator=g)
    net = _linear(torch.randn(classes, dim, generator=g), torch.randn(classes, generator=g))
    trained = []

    def recording_fit(x, y_soft, p, seed):
        trained.append((x.detach().clone(), y_soft.detach().clone(), seed))
        return net

    monkeypatch.setattr(predictors, "fit_classifier", recording_fit)
    p = dil.DictionaryParams()
    predicted = predictors.predict_reconstruction(atoms_x, atoms_logits, alpha, x_test, p, seed=5)

    soft = torch.softmax(atoms_logits, -1)
    init = dil.random_support(soft, alpha, dim, torch.Generator().manual_seed(5))
    xb, yb = labeled_barycenter(
        list(atoms_x),
        list(soft),
        alpha,
        n_iter=p.eval_barycenter_iterations,
        tol=p.barycenter_tol,
        beta=None,
        init=init,
    )
    assert len(trained) == 1
    x, y_soft, seed = trained[0]
    assert seed == 5 and x.shape == (n, dim) and y_soft.shape == (n, classes)
    torch.testing.assert_close(x, xb.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_soft, yb.detach(), rtol=1e-5, atol=1e-5)
    # the reconstruction, not an atom: every atom is far from it (the atoms sit 3 apart along every feature)
    assert all(float((x - atoms_x[j]).abs().max()) > 0.5 for j in range(k))
    assert torch.equal(predicted, net(x_test).argmax(1))
