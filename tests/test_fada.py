"""FADA (Peng et al., ICLR 2020): stages and switches, attention, losses, label and raw-data privacy, backends."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import LabelGuard, RecordingExecutor, run_until

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError
from fedsim.messages import Instruction, LocalSettings
from fedsim.methods.fada import FADA
from fedsim.methods.fada.attention import apply_deltas, dynamic_attention, gap_statistic, softmax
from fedsim.methods.fada.batches import batch_steps
from fedsim.methods.fada.losses import (
    MINELoss,
    domain_accuracy,
    domain_confusion_loss,
    domain_identifier_loss,
    entropy,
    mine_lower_bound,
    reconstruction_loss,
)
from fedsim.methods.fada.networks import preserved_buffers
from fedsim.runtime import Server
from fedsim.runtime.client_host import HOST_OPERATIONS, torch_threads
from fedsim.seeding import derive_seed

FAST = [
    "method.name=fada",
    "method.target_batch=48",
    "method.gap_samples=48",
    "method.gap_references=2",
    "method.adversarial_steps=3",
    "method.disentangle_steps=3",
]
ADVERSARIAL = ["features", "adversarial", "align"] * 3  # method.adversarial_steps=3 alternations
ALL_STAGES = ["fit", *ADVERSARIAL, "disentangle", "update"]


def guard_target_labels(executor, federation):
    """After the setup stage (standardization): the target's training labels raise when read, from its first
    state on."""
    host = executor.host
    for tid in federation.target_ids:
        data = host._client(tid)
        guarded = dataclasses.replace(data, train=LabelGuard(data.train.x))
        host._data[tid] = guarded
        host._state[tid] = host.method.init_client(guarded)


def instructions(executor, operation):
    """{client id: Instruction} of every exchange of ``operation``, in order."""
    return [ins for ins, _ in executor.calls if next(iter(ins.values())).operation == operation]


def run_rounds(overrides, *extra, rounds=2):
    config = load_config(None, overrides + FAST + list(extra))
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    guard_target_labels(executor, federation)
    history = [server.run_round(r, evaluate=True) for r in range(1, rounds + 1)]
    return config, federation, executor, server, history


@pytest.fixture(scope="module")
def model_three(toy_overrides):
    return run_rounds(toy_overrides)


def test_model_three_runs_every_stage_and_reports_its_metrics(model_three):
    config, federation, executor, server, history = model_three
    assert executor.operations() == (ALL_STAGES + ["evaluate"]) * 2
    # each stage's seed is derived from (seed, round, client, operation); features' and align's also from the
    # step (align's is the inputs of that step's features: fresh target features for each G_t update)
    tid = federation.target_ids[0]
    pairs = list(zip(instructions(executor, "features"), instructions(executor, "align")))
    assert len(pairs) == 6
    for i, (features, align) in enumerate(pairs):
        rnd, step = 1 + i // 3, 1 + i % 3
        seed = derive_seed(derive_seed(config.run.seed, rnd, tid, "features"), step)
        assert features[tid].seed == align[tid].seed == seed
        assert align[tid].round == rnd and align[tid].values == {"step": step}
    for rnd, update in enumerate(instructions(executor, "update"), start=1):
        assert (update[tid].seed, update[tid].round) == (derive_seed(config.run.seed, rnd, tid, "update"), rnd)
        assert update[tid].values == {
            "sources": federation.source_ids,
            "identifiers_won": history[rnd - 1]["mean_domain_identifier_accuracy"] >= 0.99,
        }
    settings = {ins.local for call in executor.calls for ins in call[0].values()}
    assert settings == {LocalSettings.from_method(config.method)}  # every stage's instruction carries them
    # only the last source stage of a round sends the deltas
    for operation, last in (("fit", False), ("adversarial", False), ("disentangle", True)):
        calls = instructions(executor, operation)
        assert [ins.values["send_delta"] for call in calls for ins in call.values()] == [last] * 2 * len(calls)
    sources = {federation.info(c).domain for c in federation.source_ids}
    for metrics in history:
        assert set(metrics["attention"]) == sources and math.isclose(
            sum(metrics["attention"].values()), 1.0, abs_tol=1e-9
        )
        assert np.isfinite(metrics["gap_statistic"]) and set(metrics["gap_gain"]) == sources
        assert set(metrics["mine_estimate"]) == sources and all(
            np.isfinite(v) for v in metrics["mine_estimate"].values()
        )
        assert all(0.0 <= v <= 1.0 for v in metrics["domain_identifier_accuracy"].values())
        assert 0.0 <= metrics["target_accuracy"] <= 1.0 and set(metrics["source_accuracy"]) == sources
        # the paper's FADA by default: no consensus guard judges the round
        assert "consensus_agreement" not in metrics and "guard_kept_alignment" not in metrics
    # attention = softmax of the gap gains (temperature 1)
    gains = np.array([history[-1]["gap_gain"][d] for d in sorted(sources)])
    np.testing.assert_allclose([history[-1]["attention"][d] for d in sorted(sources)], softmax(gains), rtol=1e-9)
    # each client keeps its own model: the server's tensors are the target's, the sources' differ
    host = executor.host
    target_weights = host._state[federation.target_ids[0]]["net"].state_dict()
    for name, value in server.global_tensors().items():
        np.testing.assert_array_equal(value, target_weights[name].numpy())
    source_head = host._state[federation.source_ids[0]]["net"].head.weight.detach().numpy()
    assert not np.allclose(source_head, server.global_tensors()["head.weight"])
    # the target model moved by the attention-weighted deltas
    assert any(
        not np.allclose(v, server.method.init_server()["weights"][k]) for k, v in server.global_tensors().items()
    )


@pytest.mark.parametrize(
    "switch, removed", [("attention", []), ("adversarial", ADVERSARIAL), ("disentangle", ["disentangle"])]
)
def test_each_switch_removes_its_stage(toy_overrides, switch, removed):
    guard = "method.guard=consensus"  # fedsim's addition, asked for: it reports whenever it judges an alignment
    _, federation, executor, _, history = run_rounds(toy_overrides, f"method.{switch}=false", guard, rounds=1)
    assert executor.operations() == [op for op in ALL_STAGES if op not in set(removed)] + ["evaluate"]
    weights = list(history[0]["attention"].values())
    assert math.isclose(sum(weights), 1.0, abs_tol=1e-9)
    if switch == "attention":
        assert weights == [1.0 / len(federation.source_ids)] * len(federation.source_ids)
        assert "gap_statistic" not in history[0] and "gap_gain" not in history[0]
    else:
        assert "gap_statistic" in history[0]
    assert ("mine_estimate" in history[0]) == (switch != "disentangle")
    assert ("domain_identifier_accuracy" in history[0]) == (switch != "adversarial")
    # the consensus guard only judges an alignment: without the adversarial stage it is inert and reports nothing
    assert ("guard_kept_alignment" in history[0]) == ("consensus_agreement" in history[0]) == (switch != "adversarial")
    if switch != "adversarial":
        assert 0.0 <= history[0]["consensus_agreement"] <= 1.0 and history[0]["guard_kept_alignment"] in (0.0, 1.0)


def test_target_training_operations_never_read_labels(model_three, toy_overrides):
    config, federation, executor, server, _ = model_three
    tid = federation.target_ids[0]
    guarded = executor.host._data[tid]
    with pytest.raises(AssertionError, match="labels were read"):
        guarded.train.y  # the guard is live: model_three ran every target operation through it without tripping
    target_ops = {operation for _, cid, operation, _ in executor.log if cid == tid} - set(HOST_OPERATIONS)
    assert target_ops == {"features", "align", "update", "evaluate"}
    method = server.method
    state = executor.host._state[tid]
    for operation in ("fit", "adversarial", "disentangle"):  # the labeled stages refuse the target by its role
        with pytest.raises(ValueError, match="source clients only"):
            getattr(method, operation)(Instruction(operation, server.state["weights"], round=1, seed=1), state, guarded)


def _raw_rows(data):
    arrays = [data.train.x, data.test.x]
    rows = set()
    for array in arrays:
        for row in np.asarray(array, dtype=np.float32).reshape(len(array), -1):
            rows.add(row.tobytes())
    return rows


def test_no_raw_input_or_label_crosses_the_wire_in_any_stage(model_three):
    config, federation, executor, _, _ = model_three
    clients = {cid: load_client_data(config.data, federation, cid) for cid in federation.client_ids}
    raw_rows = set().union(*(_raw_rows(d) for d in clients.values()))
    width = clients[0].train.x.reshape(len(clients[0].train.x), -1).shape[1]
    labels = [d.test.y for d in clients.values()] + [d.train.y for d in clients.values() if d.train.y is not None]
    messages = [t for ins, reps in executor.calls for t in [*ins.values(), *reps.values()]]
    checked = 0
    for message in messages:
        for name, tensor in message.tensors.items():
            tensor = np.asarray(tensor)
            assert not any(tensor.shape == y.shape and np.array_equal(tensor, y) for y in labels), (
                f"{name} carries labels"
            )
            if tensor.ndim >= 1 and tensor.size % width == 0 and tensor.dtype == np.float32:
                rows = tensor.reshape(-1, width)
                assert not any(r.tobytes() in raw_rows for r in rows), f"tensor {name!r} carries a raw input row"
                checked += 1
    assert checked > 0
    # what crosses: weights, deltas, features and feature gradients of the generator's width, never inputs
    feature_width = config.model.hidden
    for ins, replies in executor.calls:
        for cid, reply in replies.items():
            if "features" in reply.tensors:
                assert cid in federation.target_ids and reply.tensors["features"].shape[1] == feature_width
            if "feature_grad" in reply.tensors:
                assert cid in federation.source_ids and reply.tensors["feature_grad"].shape[1] == feature_width
        for cid, instruction in ins.items():
            if instruction.operation in ("features", "disentangle", "evaluate"):
                assert not instruction.tensors


def test_fada_refuses_several_target_clients_and_bad_params(toy_overrides):
    config = load_config(None, toy_overrides + ["method.name=fada", "data.clients_per_domain=2"])
    federation = build_federation(config.data)
    with pytest.raises(UserError, match="has 2 clients: pass --clients-per-domain 1"):
        FADA.check_setting(config, federation)  # before anything is written
    with pytest.raises(UserError, match="clients-per-domain 1"):
        FADA(config, federation)
    for bad in (
        "method.gap_references=0",
        "method.lambda_mi=-1",
        "method.mine_rate=0",
        "method.schedule=linear",
        "method.target_batch=1",
        "method.gap_form=gap",
        "method.adversarial_steps=0",
        "method.guard=always",
        "method.guard_identifier_accuracy=0",
        "method.guard_identifier_accuracy=1.5",
    ):
        with pytest.raises(UserError, match=bad.split("=")[0]):
            load_config(None, toy_overrides + ["method.name=fada", bad])


def after_fit(toy_overrides, *extra):
    """A server after its setup and the first round's ``fit``: (federation, method, host, round-1 context)."""
    config = load_config(None, toy_overrides + FAST + list(extra))
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    ctx = server.context(1)
    ctx.call("fit", server.state["weights"], federation.source_ids, {"send_delta": False})
    return federation, server.method, executor.host, ctx


def encoder_weights(host, cid):
    return [p.detach().clone() for p in host.private_state(cid)["net"].encoder.parameters()]


def changed(before, after):
    return any(not torch.equal(a, b) for a, b in zip(before, after))


def test_one_adversarial_stage_moves_the_target_and_the_source_generators(toy_overrides):
    federation, method, host, ctx = after_fit(toy_overrides)
    tid, sources = federation.target_ids[0], federation.source_ids
    before = {cid: encoder_weights(host, cid) for cid in [tid, *sources]}
    metrics = {}
    method.adversarial_stage(ctx, sources, False, metrics)
    assert all(changed(before[cid], encoder_weights(host, cid)) for cid in [tid, *sources])  # G_t and every G_i
    assert metrics["target_feature_grad_norm"] > 0 and set(metrics["domain_identifier_accuracy"]) == {
        method.labels[c] for c in sources
    }
    assert "align_optimizer" not in host.private_state(tid) and all(
        "alignment" not in host.private_state(c) for c in sources
    )


@pytest.mark.parametrize("train_generator", [True, False])
def test_disentanglement_trains_the_source_generator_unless_switched_off(toy_overrides, train_generator):
    federation, method, host, ctx = after_fit(
        toy_overrides, f"method.disentangle_generator={str(train_generator).lower()}"
    )
    sources = federation.source_ids
    before = {cid: encoder_weights(host, cid) for cid in sources}
    buffers = {cid: [b.clone() for b in host.private_state(cid)["net"].buffers()] for cid in sources}
    invariant = {cid: host.private_state(cid)["net"].invariant[0].weight.detach().clone() for cid in sources}
    ctx.call("disentangle", None, sources, {"send_delta": False})
    for cid in sources:
        net = host.private_state(cid)["net"]
        assert changed(before[cid], encoder_weights(host, cid)) == train_generator
        assert not torch.equal(invariant[cid], net.invariant[0].weight)  # D_inv trains either way
        if not train_generator:
            assert not changed(buffers[cid], list(net.buffers()))


def test_attention_is_the_softmax_of_the_relative_dispersion_drops():
    """Four far-apart clusters whose spread is the weight s: I(s) = s^2 I(1), so a delta to s' gains 1 - s'^2."""
    rng = np.random.default_rng(0)
    centers = 100.0 * np.eye(4)[np.arange(80) % 4]
    pool = np.concatenate([centers, rng.normal(size=(80, 4))], axis=1)
    encode = lambda weights, x: x[:, :4] + float(weights["s"]) * x[:, 4:]  # noqa: E731
    deltas = [{"s": np.array(-0.5)}, {"s": np.array(0.0)}, {"s": np.array(0.5)}]
    weights, before, gains = dynamic_attention(encode, {"s": np.array(1.0)}, deltas, pool, 80, 4, 2, 1.0, seed=3)
    noise = pool[:, 4:]
    by_definition = 0.0  # I = sum_r D_r / (2 n_r), D_r the sum of the pairwise squared distances in cluster r
    for r in range(4):
        members = noise[np.arange(80) % 4 == r]
        by_definition += ((members[:, None] - members[None]) ** 2).sum() / (2 * len(members))
    assert math.isclose(before, by_definition, rel_tol=1e-9)
    np.testing.assert_allclose(gains, [0.75, 0.0, -1.25], atol=1e-9)
    np.testing.assert_allclose(weights, softmax(np.array([0.75, 0.0, -1.25])), rtol=1e-9)
    gap_weights, _, gap_gains = dynamic_attention(
        encode, {"s": np.array(1.0)}, deltas, pool, 80, 4, 2, 1.0, seed=3, form="tibshirani"
    )
    np.testing.assert_allclose(gap_weights, softmax(np.array(gap_gains)), rtol=1e-9)
    assert gap_gains[0] > 0 > gap_gains[2]  # tighter clusters: a larger gap
    share_weights, share, share_gains = dynamic_attention(
        encode, {"s": np.array(1.0)}, deltas, pool, 80, 4, 2, 1.0, seed=3, form="share"
    )
    scatter = lambda f: ((f - f.mean(0)) ** 2).sum()  # noqa: E731
    assert math.isclose(share, before / scatter(encode({"s": 1.0}, pool)), rel_tol=1e-9)
    np.testing.assert_allclose(share_weights, softmax(np.array(share_gains)), rtol=1e-9)
    assert share_gains[0] > 0 > share_gains[2] and max(abs(g) for g in share_gains) < 1


def test_share_gain_ignores_a_rescaling_that_the_dispersion_gain_punishes():
    """A delta that only scales the features by c: dispersion gain 1 - c^2 (one-hot softmax), share gain 0 (uniform)."""
    rng = np.random.default_rng(1)
    pool = 10.0 * np.eye(3)[np.arange(60) % 3] + rng.normal(size=(60, 3))
    encode = lambda weights, x: float(weights["s"]) * x  # noqa: E731
    deltas = [{"s": np.array(9.0)}, {"s": np.array(1.0)}, {"s": np.array(0.0)}]  # features x10, x2, unchanged
    weights, _, gains = dynamic_attention(
        encode, {"s": np.array(1.0)}, deltas, pool, 60, 3, 2, 1.0, seed=0, form="dispersion"
    )
    np.testing.assert_allclose(gains, [-99.0, -3.0, 0.0], rtol=1e-9)
    assert weights[2] > 0.95  # all weight on the delta that did nothing
    weights, _, gains = dynamic_attention(
        encode, {"s": np.array(1.0)}, deltas, pool, 60, 3, 2, 1.0, seed=0, form="share"
    )
    np.testing.assert_allclose(gains, 0.0, atol=1e-12)
    np.testing.assert_allclose(weights, np.full(3, 1 / 3), rtol=1e-9)


@pytest.mark.parametrize("overrides", [["run.clients_per_round=1"]])
def test_sampled_sources_only_work_that_round(toy_overrides, overrides):
    _, federation, executor, _, history = run_rounds(toy_overrides, *overrides, rounds=1)
    fit_clients = list(instructions(executor, "fit")[0])
    assert (
        len(fit_clients) == 1 and len(history[0]["attention"]) == 1 and list(history[0]["attention"].values()) == [1.0]
    )


def test_local_and_ray_backends_agree(toy_overrides, ray_cluster, tmp_path):
    results = {}
    for backend in ("local", "ray"):
        config = load_config(None, toy_overrides + FAST + [f"run.backend={backend}", "run.seed=5"])
        results[backend] = run_experiment(config, tmp_path / backend)
    local, ray_ = results["local"], results["ray"]
    assert local.summary["target_accuracy"] == ray_.summary["target_accuracy"]
    assert local.summary["source_accuracy"] == ray_.summary["source_accuracy"]
    assert local.summary["bytes_sent"] == ray_.summary["bytes_sent"]
    for a, b in zip(local.history, ray_.history):
        assert a["attention"] == pytest.approx(b["attention"], rel=1e-9)
        assert a["mine_estimate"] == pytest.approx(b["mine_estimate"], rel=1e-6, abs=1e-9)
    assert local.global_tensors.keys() == ray_.global_tensors.keys()
    for name in local.global_tensors:
        np.testing.assert_allclose(local.global_tensors[name], ray_.global_tensors[name], rtol=1e-6, atol=1e-7)


def test_resume_from_checkpoint_continues_every_private_model(toy_overrides, tmp_path):
    """Per-client models, private parts, the MINE average and its Adam state survive a checkpoint."""
    from fedsim.runtime.checkpoint import load_checkpoint

    config = load_config(None, toy_overrides + FAST + ["run.rounds=3", "run.checkpoint_every=2", "run.backend=local"])
    full = run_experiment(config, tmp_path / "full")
    run_until(config, tmp_path / "partial", 3)
    resumed = run_experiment(config, tmp_path / "partial", resume=load_checkpoint(tmp_path / "partial"))
    assert resumed.summary["target_accuracy"] == full.summary["target_accuracy"]
    assert resumed.summary["source_accuracy"] == full.summary["source_accuracy"]
    assert resumed.history[-1]["attention"] == full.history[-1]["attention"]
    for name in full.global_tensors:
        np.testing.assert_array_equal(resumed.global_tensors[name], full.global_tensors[name])


# ----------------------------------------------------------------------------- pieces


def test_gap_statistic_prefers_clustered_features_and_attention_is_a_softmax():
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 10, size=(4, 5))
    clustered = centers[np.arange(120) % 4] + rng.normal(0, 0.3, size=(120, 5))
    noise = rng.uniform(-10, 10, size=(120, 5))
    uniform = rng.random((4, 120, 5))
    assert gap_statistic(clustered, 4, uniform, seed=1) > gap_statistic(noise, 4, uniform, seed=1) + 1.0
    assert (
        abs(gap_statistic(noise, 4, uniform, seed=1)) < 0.6
    )  # uniform data: about no gap (the rotated box is a bit wider)
    assert gap_statistic(clustered, 4, uniform, seed=1) == gap_statistic(clustered, 4, uniform, seed=1)
    weights = softmax(np.array([0.5, -1.0, 2.0]))
    assert math.isclose(weights.sum(), 1.0) and np.argmax(weights) == 2
    np.testing.assert_allclose(softmax(np.zeros(3)), np.full(3, 1 / 3))


def test_apply_adds_weighted_deltas_and_rounds_integer_buffers():
    current = {"w": np.ones((2, 2), np.float32), "steps": np.array(10)}
    deltas = [
        {"w": np.full((2, 2), 2.0, np.float32), "steps": np.array(4)},
        {"w": np.full((2, 2), -1.0, np.float32), "steps": np.array(1)},
    ]
    out = apply_deltas(current, deltas, [0.25, 0.75])
    np.testing.assert_allclose(out["w"], np.full((2, 2), 1 + 0.5 - 0.75))
    assert out["w"].dtype == np.float32 and int(out["steps"]) == 12  # 10 + 1 + 0.75 -> 12


def test_domain_losses_entropy_and_reconstruction():
    logits = torch.zeros(5)
    assert math.isclose(float(domain_confusion_loss(logits)), math.log(2), rel_tol=1e-6)
    assert float(domain_confusion_loss(torch.full((5,), 3.0))) > math.log(2)
    assert float(domain_identifier_loss(torch.full((4,), 5.0), torch.full((4,), -5.0))) < 0.01
    assert domain_accuracy(torch.tensor([1.0, -1.0]), torch.tensor([-1.0, -1.0])) == 0.75
    assert math.isclose(float(entropy(torch.zeros(3, 10))), math.log(10), rel_tol=1e-6)
    assert float(entropy(torch.tensor([[50.0, 0.0, 0.0]]))) < 1e-6
    features = torch.randn(4, 3, requires_grad=True)
    rebuilt = torch.zeros(4, 3, requires_grad=True)
    reconstruction_loss(rebuilt, features).backward()
    assert features.grad is None  # the features are a target, not moved
    torch.testing.assert_close(rebuilt.grad, 2 * (rebuilt - features).detach() / features.numel())


def test_mine_bound_and_its_bias_corrected_gradient():
    joint, marginal = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 1.0, -1.0])
    expected = 2.0 - math.log((1 + math.e + math.exp(-1)) / 3)
    assert math.isclose(float(mine_lower_bound(joint, marginal)), expected, rel_tol=1e-6)
    # T = theta * s: the surrogate's gradient is E[s_j] - E[e^T s_m] / moving average (Belghazi et al. 2018, Sec. 3.2)
    mine = MINELoss(rate=0.5)
    s_j, s_m1, s_m2 = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -0.5]), torch.tensor([1.0, 0.0])
    theta = torch.tensor(0.3, requires_grad=True)
    mine.surrogate(theta * s_j, theta * s_m1)  # first batch initializes the average
    value = mine.surrogate(theta * s_j, theta * s_m2)
    (grad,) = torch.autograd.grad(value, theta)
    m1, m2 = float(torch.exp(0.3 * s_m1).mean()), float(torch.exp(0.3 * s_m2).mean())
    average = 0.5 * m1 + 0.5 * m2
    assert math.isclose(float(torch.exp(mine.log_average)), average, rel_tol=1e-5)
    manual = float(s_j.mean()) - float((torch.exp(0.3 * s_m2) * s_m2).mean()) / average
    assert math.isclose(float(grad), manual, rel_tol=1e-5)


def test_mine_separates_dependent_from_independent_pairs():
    with torch_threads(1):  # tiny networks: more threads only contend on a shared machine
        _mine_separates()


def _mine_separates():
    torch.manual_seed(0)
    x = torch.randn(512, 1)
    estimates = {}
    for name, z in {"dependent": 0.95 * x + 0.3 * torch.randn(512, 1), "independent": torch.randn(512, 1)}.items():
        statistics = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        mine, optimizer = MINELoss(0.05), torch.optim.Adam(statistics.parameters(), lr=1e-2)
        generator = torch.Generator().manual_seed(1)
        for _ in range(300):
            perm = torch.randperm(512, generator=generator)
            j, m = statistics(torch.cat([x, z], 1)).squeeze(-1), statistics(torch.cat([x, z[perm]], 1)).squeeze(-1)
            optimizer.zero_grad()
            (-mine.surrogate(j, m)).backward()
            optimizer.step()
        with torch.no_grad():
            perm = torch.randperm(512, generator=generator)
            estimates[name] = float(
                mine_lower_bound(statistics(torch.cat([x, z], 1)), statistics(torch.cat([x, z[perm]], 1)))
            )
    # true I = -0.5 log(1 - rho^2) ~ 0.9 nats for rho ~ 0.95, 0 for independent pairs
    assert estimates["dependent"] > 0.5 and abs(estimates["independent"]) < 0.15


def _batch_indices_before(n, batch_size, steps, generator):
    """The step-counted batches FADA drew before they were built on ``minibatches`` (the reference)."""
    wanted, done = steps if steps > 0 else -(-n // batch_size), 0
    while done < wanted:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            if done >= wanted:
                return
            done += 1
            idx = order[start : start + batch_size]
            if len(idx) >= 2 or n < 2:
                yield idx


def test_preserved_buffers_and_batch_steps():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    before = model[1].running_mean.clone()
    with preserved_buffers(model):
        model.train()
        model(torch.randn(8, 3) + 5)
        assert not torch.equal(model[1].running_mean, before)
    assert torch.equal(model[1].running_mean, before)
    batches = list(batch_steps(10, 4, 0, torch.Generator().manual_seed(0)))
    assert [len(b) for b in batches] == [4, 4, 2]
    batches = list(
        batch_steps(9, 4, 5, torch.Generator().manual_seed(0))
    )  # cycles epochs, counts skipped single-sample batches
    assert [len(b) for b in batches] == [4, 4, 4, 4]
    # the same batches and the same later draws as before, with another draw between batches (the MINE pairing)
    for n, batch_size, steps in [(10, 4, 0), (9, 4, 5), (9, 4, 6), (12, 4, 7), (1, 4, 3), (17, 5, 11)]:
        runs = []
        for make in (batch_steps, _batch_indices_before):
            generator = torch.Generator().manual_seed(3)
            runs.append(
                [
                    (b.tolist(), torch.randperm(len(b), generator=generator).tolist())
                    for b in make(n, batch_size, steps, generator)
                ]
            )
            runs[-1].append(torch.randperm(5, generator=generator).tolist())
        assert runs[0] == runs[1], (n, batch_size, steps)
