"""FedDANN / FedMMD: the target-feature exchange, the shared payload, privacy of the discriminator, backends."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import RecordingExecutor

from fedsim.api import run_experiment
from fedsim.config import ModelConfig, load_config
from fedsim.data.base import ArraySplit
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError
from fedsim.losses import DANNLoss, MMDLoss
from fedsim.messages import LocalSettings
from fedsim.methods.alignment.base import FeatureAlignment
from fedsim.methods.alignment.feddann import FedDANN
from fedsim.methods.alignment.fedmmd import FedMMD
from fedsim.methods.alignment.objective import AlignmentObjective, steps_per_epoch
from fedsim.methods.common.aggregation import weighted_average
from fedsim.methods.common.target_features import TARGET_FEATURES, encode_subset
from fedsim.methods.common.training import train_epochs
from fedsim.models import build_model
from fedsim.registry import METHODS
from fedsim.runtime import LocalExecutor, Server
from fedsim.runtime.context import RoundContext
from fedsim.seeding import derive_seed, numpy_rng


def setup(toy_overrides, method_name, *extra):
    config = load_config(None, toy_overrides + [f"method.name={method_name}", *extra])
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    return config, federation, executor, METHODS.get(method_name)(config, federation)


def target_features(config, federation, executor, state, rnd):
    """Stage 1 of a round on its own: every target client's ``features`` reply."""
    ctx = RoundContext(executor, config.run.seed, rnd, LocalSettings.from_method(config.method))
    return ctx.call("features", state["weights"], federation.target_ids)


def test_target_replies_to_features_with_encoded_features_only(toy_overrides):
    config, federation, executor, method = setup(toy_overrides, "feddann", "method.target_batch=20")
    state = method.init_server()
    replies = target_features(config, federation, executor, state, 1)
    assert sorted(replies) == federation.target_ids
    for cid, reply in replies.items():
        data = load_client_data(config.data, federation, cid)
        assert data.train.y is None
        assert set(reply.tensors) == {"features"}
        features = reply.tensors["features"]
        assert features.shape == (20, config.model.hidden) and features.dtype == np.float32
        for raw in (data.train.x, data.test.x):
            assert features.shape[1:] != raw.shape[1:] and not np.isin(features, raw).any()
    # seeded: the same round gives the same subset, another round another one; all rows when target_batch is large
    again = target_features(config, federation, executor, state, 1)
    other = target_features(config, federation, executor, state, 2)
    cid = federation.target_ids[0]
    assert np.array_equal(again[cid].tensors["features"], replies[cid].tensors["features"])
    assert not np.array_equal(other[cid].tensors["features"], replies[cid].tensors["features"])
    config, _, executor, method = setup(toy_overrides, "feddann", "method.target_batch=100000")
    everything = target_features(config, federation, executor, method.init_server(), 1)[cid].tensors["features"]
    assert len(everything) == federation.info(cid).num_train


def test_encode_subset_uses_eval_mode_and_leaves_batch_norm_statistics_alone():
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="cnn", hidden=16), (3, 8, 8), 4)
    x = np.random.default_rng(0).normal(size=(30, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():  # give the running statistics non-trivial values
        model.train()
        model(torch.from_numpy(x) * 3 + 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    features = encode_subset(model, x, 10, seed=5, device=torch.device("cpu"))
    index = np.sort(numpy_rng(5).choice(30, 10, replace=False))
    model.eval()
    with torch.no_grad():
        expected = model.features(torch.from_numpy(x[index])).numpy()
    np.testing.assert_allclose(features, expected, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_encode_subset_with_batch_statistics_normalizes_each_chunk_by_itself():
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="cnn", hidden=16), (3, 8, 8), 4)
    x = np.random.default_rng(1).normal(size=(30, 3, 8, 8)).astype(np.float32)
    features = encode_subset(model, x, 10, seed=5, device=torch.device("cpu"), chunk=4, batch_statistics=True)
    index = np.sort(numpy_rng(5).choice(30, 10, replace=False))
    model.train()
    with torch.no_grad():
        expected = torch.cat([model.features(torch.from_numpy(x[index[i : i + 4]])) for i in (0, 4, 8)]).numpy()
    assert features.shape == (10, 16) and features.dtype == np.float32
    np.testing.assert_array_equal(features, expected)


def test_lambda_ramp_counts_every_batch_of_an_epoch_including_a_skipped_one():
    assert steps_per_epoch(33, 16) == (3, 2)  # the final batch of one is skipped but still a step of the ramp
    assert steps_per_epoch(32, 16) == (2, 2) and steps_per_epoch(1, 16) == (1, 1)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden=8), (4,), 3)
    x = np.random.default_rng(0).normal(size=(33, 4)).astype(np.float32)
    split = ArraySplit(x, (np.arange(33) % 3).astype(np.int64))
    steps = []
    objective = AlignmentObjective(
        MMDLoss(),
        torch.randn(20, 8),
        torch.Generator().manual_seed(1),
        lambda step: steps.append(step) or (0.5, 1.0),
        *steps_per_epoch(33, 16),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train_epochs(model, split, 2, 16, optimizer, seed=3, device=torch.device("cpu"), step_loss=objective)
    assert steps == [1, 2, 4, 5]
    metrics = objective.metrics()  # means over the 32 trained samples of the last epoch
    assert set(metrics) == {"train_loss", "domain_loss"} and objective.count == 32
    assert all(math.isfinite(v) for v in metrics.values())


def test_sources_get_one_shared_payload_with_the_target_features(toy_overrides):
    config, federation, executor, method = setup(toy_overrides, "fedmmd", "method.target_batch=32")
    state = method.init_server()
    settings = LocalSettings.from_method(config.method)
    new_state, metrics = method.run_round(RoundContext(executor, config.run.seed, 1, settings), state)
    (feature_instructions, feature_replies), (fit_instructions, fit_replies) = executor.calls
    assert {ins.operation for ins in feature_instructions.values()} == {"features"}
    assert sorted(feature_instructions) == federation.target_ids
    assert sorted(fit_instructions) == federation.source_ids
    assert {ins.operation for ins in fit_instructions.values()} == {"fit"}
    payloads = {id(ins.tensors) for ins in fit_instructions.values()}
    assert len(payloads) == 1, "every source must get the same tensor dict (serialized once)"
    payload = next(iter(fit_instructions.values())).tensors
    sent = np.concatenate([feature_replies[cid].tensors["features"] for cid in federation.target_ids])
    np.testing.assert_array_equal(payload[TARGET_FEATURES], sent)
    assert set(payload) == set(state["weights"]) | {TARGET_FEATURES}
    # the discriminator / loss state never leaves a source: replies carry exactly the model weights
    for reply in fit_replies.values():
        assert set(reply.tensors) == set(state["weights"])
        assert {"train_loss", "domain_loss"} <= set(reply.metrics)
    assert metrics["target_features"] == len(sent)
    assert set(metrics["domain_loss"]) == {str(c) for c in federation.source_ids}
    # each stage's seeds are the round's seeds of its own operation; every instruction also carries the round's
    # local-update settings (epochs, batch size, SGD's rate, momentum, weight decay); the server averages like FedAvg
    assert method.client_settings(1) == settings
    for cid, ins in {**feature_instructions, **fit_instructions}.items():
        seed = derive_seed(config.run.seed, 1, cid, ins.operation)
        assert (ins.seed, ins.round, ins.local, ins.values) == (seed, 1, settings, {})
    expected = weighted_average(
        [r.tensors for r in fit_replies.values()], [r.num_examples for r in fit_replies.values()]
    )
    assert set(new_state["weights"]) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(new_state["weights"][name], value)
    assert metrics["train_loss"] == {str(cid): r.metrics["train_loss"] for cid, r in fit_replies.items()}


def test_feddann_and_fedmmd_differ_only_by_the_loss_object(toy_overrides):
    allowed = {
        "__module__",
        "__qualname__",
        "__doc__",
        "__firstlineno__",
        "__static_attributes__",
        "registry_name",
        "Params",
        "make_domain_loss",
    }
    # set on every subclass by Method.__init_subclass__ (copes_with_missing_replies: declared, never inherited)
    allowed.update({"operations", "server_needs_torch", "copes_with_missing_replies"})
    allowed.add("domain_lr_scale")  # the learning rate of the loss's own parameters (DANN's discriminator)
    # FedMMD's batched form of the same fit (resources.vectorize=auto), equal to the loop's within rounding:
    # tests/test_vectorized_alignment.py
    allowed.update({"vectorized_operations", "vectorizable", "fit_vectorized"})
    # what privacy noises in its exchanges: declared beside the loss, since only DANN's has a per-record objective
    allowed.add("privacy_exchanges")
    for cls in (FedDANN, FedMMD):
        assert cls.__bases__ == (FeatureAlignment,)
        assert set(vars(cls)) <= allowed, f"{cls.__name__} overrides more than the loss: {set(vars(cls)) - allowed}"
        assert cls.operations == {"features", "fit", "evaluate"}
    _, _, _, dann = setup(toy_overrides, "feddann")
    _, _, _, mmd = setup(toy_overrides, "fedmmd")
    assert isinstance(dann.make_domain_loss(16), DANNLoss)
    assert isinstance(mmd.make_domain_loss(16), MMDLoss)


@pytest.mark.parametrize("method_name", ["feddann", "fedmmd"])
def test_zero_domain_weight_reduces_to_fedavg(method_name, toy_overrides):
    weights = {}
    for name, extra in (("fedavg", []), (method_name, ["method.lambda_domain=0", "method.lr_schedule=constant"])):
        config = load_config(None, toy_overrides + [f"method.name={name}", *extra])
        federation = build_federation(config.data)
        server = Server(config, federation, LocalExecutor(config, federation))
        server.setup(1)
        server.run_round(1, evaluate=False)
        weights[name] = server.global_tensors()
    for key, value in weights["fedavg"].items():
        np.testing.assert_allclose(weights[method_name][key], value, rtol=1e-5, atol=1e-6)


def test_discriminator_stays_private_and_persists_across_rounds(toy_overrides):
    config, federation, executor, _ = setup(toy_overrides, "feddann")
    server = Server(config, federation, executor)
    server.setup(1)
    source = federation.source_ids[0]
    server.run_round(1, evaluate=False)
    loss = executor.host.private_state(source)["domain_loss"]
    after_one = [p.detach().clone() for p in loss.parameters()]
    server.run_round(2, evaluate=False)
    assert executor.host.private_state(source)["domain_loss"] is loss
    assert any(not torch.equal(a, p) for a, p in zip(after_one, loss.parameters()))
    target = federation.target_ids[0]
    assert "domain_loss" not in executor.host.private_state(target)
    with pytest.raises(ValueError, match="labels"):  # the target has no labels to fit on
        data = load_client_data(config.data, federation, target)
        fit = next(ins for instructions, _ in executor.calls for ins in instructions.values() if ins.operation == "fit")
        server.method.fit(fit, executor.host.private_state(target), data)


def test_smoke_domain_loss_finite_and_discriminator_accuracy_reported(toy_overrides, tmp_path):
    result = run_experiment(
        load_config(None, toy_overrides + ["method.name=feddann", "run.backend=local", "run.rounds=3"]),
        tmp_path / "dann",
    )
    sources = {str(c) for c in result.federation.source_ids}
    for metrics in result.history:
        assert set(metrics["domain_loss"]) == sources and set(metrics["discriminator_accuracy"]) == sources
        assert all(math.isfinite(v) for v in metrics["domain_loss"].values())
        assert all(0.0 <= v <= 1.0 for v in metrics["discriminator_accuracy"].values())
    weights = [m["domain_weight"] for m in result.history]
    assert 0 < weights[0] < weights[1] < weights[2] < 1
    assert (tmp_path / "dann" / "metrics.jsonl").read_text().count("discriminator_accuracy") == 3
    mmd = run_experiment(
        load_config(None, toy_overrides + ["method.name=fedmmd", "run.backend=local", "method.schedule=constant"])
    )
    assert all(math.isfinite(v) for m in mmd.history for v in m["domain_loss"].values())
    assert "discriminator_accuracy" not in mmd.history[-1] and mmd.history[-1]["domain_weight"] == 1.0


def test_bad_parameters_are_user_errors(toy_overrides):
    for bad in ("method.schedule=linear", "method.target_batch=1", "method.lambda_domain=-1"):
        with pytest.raises(UserError):
            load_config(None, toy_overrides + ["method.name=feddann", bad])
    with pytest.raises(UserError):
        load_config(None, toy_overrides + ["method.name=fedmmd", "method.bandwidths=1,-2"])


def test_feddann_local_and_ray_agree(toy_overrides, ray_cluster, tmp_path):
    results = {}
    for backend in ("local", "ray"):
        config = load_config(None, toy_overrides + ["method.name=feddann", f"run.backend={backend}", "run.seed=3"])
        results[backend] = run_experiment(config, tmp_path / backend)
    local, ray_ = results["local"], results["ray"]
    assert local.summary["target_accuracy"] == ray_.summary["target_accuracy"]
    assert local.summary["bytes_sent"] == ray_.summary["bytes_sent"]
    assert [m["domain_loss"] for m in local.history] == [m["domain_loss"] for m in ray_.history]
    for name in local.global_tensors:
        np.testing.assert_allclose(local.global_tensors[name], ray_.global_tensors[name], rtol=1e-6, atol=1e-7)


def test_the_schedule_follows_ganins_ramp_and_annealing(toy_overrides):
    """lambda_p = 2/(1+exp(-10p)) - 1 and mu_p = mu_0/(1+10p)^0.75 at every local step (Ganin et al. 2016,
    Sec. 5.2.2)."""
    _, _, _, method = setup(toy_overrides, "feddann", "run.rounds=4")
    schedule = method.step_schedule(rnd=3, steps=10)
    for step in (1, 5, 10):
        p = (2 + step / 10) / 4
        weight, factor = schedule(step)
        assert weight == pytest.approx(2 / (1 + math.exp(-10 * p)) - 1)
        assert factor == pytest.approx(1 / (1 + 10 * p) ** 0.75)
    _, _, _, flat = setup(
        toy_overrides, "feddann", "method.schedule=constant", "method.lr_schedule=constant", "method.lambda_domain=0.3"
    )
    assert flat.step_schedule(2, 10)(7) == (0.3, 1.0)


def test_optimizer_anneals_every_group_and_scales_the_discriminator(toy_overrides):
    from fedsim.methods.alignment.objective import alignment_optimizer

    config, _, _, method = setup(toy_overrides, "feddann", "method.discriminator_lr_scale=10", "method.lr=0.02")
    assert method.domain_lr_scale() == 10
    model, loss = torch.nn.Linear(4, 3), DANNLoss(3, 5, 1)
    optimizer = alignment_optimizer(model, loss, config.method, method.domain_lr_scale())
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.02, 0.2])
    objective = AlignmentObjective(
        loss, torch.randn(8, 3), torch.Generator().manual_seed(0), lambda step: (1.0, 0.5), 1, 1, optimizer
    )
    wrapped = _Split(model)
    objective(wrapped, torch.randn(4, 4), torch.tensor([0, 1, 2, 0]))
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.01, 0.1])
    assert objective.metrics()["lr"] == pytest.approx(0.01)


class _Split(torch.nn.Module):
    """features = a linear map, head = identity: the smallest encoder/head split."""

    def __init__(self, linear=None):
        super().__init__()
        self.linear = linear

    def features(self, x):
        return self.linear(x)

    def head(self, f):
        return f


def test_feddann_defaults_are_ganins_mnist_discriminator(toy_overrides):
    _, _, _, method = setup(toy_overrides, "feddann")
    loss = method.make_domain_loss(16)
    linears = [m for m in loss.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(16, 100), (100, 1)]
    assert method.params.schedule == "dann" and method.params.lr_schedule == "dann" and method.domain_lr_scale() == 1.0


def test_digits_configs_carry_the_source_rule_lambda_and_references_keep_the_papers():
    """docs/baselines.md: lambda_domain 0.1 for FedDANN and FedMMD on digits (rule on the sources), 1 in the code
    (Ganin et al., Long et al.) and for the centralized references, which keep their sources with it."""
    configs = Path(__file__).parent.parent / "experiments" / "configs"
    weights = {
        name: load_config(str(configs / f"digits-{name}.yaml"), []).method.params.lambda_domain
        for name in ("feddann", "fedmmd", "dann", "mmd")
    }
    assert weights == {"feddann": 0.1, "fedmmd": 0.1, "dann": 1.0, "mmd": 1.0}
    assert FedDANN.Params().lambda_domain == 1.0 and FedMMD.Params().lambda_domain == 1.0
