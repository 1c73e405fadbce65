"""FedBN: batch norm stays private to each source; the target re-estimates BN statistics (AdaBN)."""

import logging

import numpy as np
import pytest
import torch
from conftest import RecordingExecutor, write_image_domains

from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError
from fedsim.messages import Instruction
from fedsim.methods.base import SingleExchange
from fedsim.methods.common.aggregation import weighted_average
from fedsim.methods.common.training import load_numpy
from fedsim.methods.fedbn import FedBN, initial_bn
from fedsim.models.normalization import bn_keys
from fedsim.runtime import Server


@pytest.fixture(scope="module")
def image_overrides(tmp_path_factory):
    root = write_image_domains(str(tmp_path_factory.mktemp("images")))
    return [
        "data.benchmark=npz",
        f"data.root={root}",
        "data.target=img2",
        f"data.cache_dir={tmp_path_factory.mktemp('cache')}",
        "data.normalization=none",
        "model.name=cnn",
        "model.hidden=16",
        "run.rounds=2",
        "run.progress=false",
        "method.name=fedbn",
        "method.batch_size=16",
        "method.lr=0.05",
    ]


def start(overrides):
    config = load_config(None, overrides)
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    return config, federation, executor, server


def build(server):
    """A freshly built model with the run's initial weights."""
    return server.method.fedavg.classifier.build()


def private_bn(executor, cid):
    return {k: np.array(v) for k, v in executor.host.private_state(cid)["bn"].items()}


def test_bn_stays_private_and_server_averages_the_rest(image_overrides):
    config, federation, executor, server = start(image_overrides)
    keys = bn_keys(build(server))
    assert "encoder.1.running_mean" in keys and "encoder.5.weight" in keys
    server.run_round(1, evaluate=True)
    after_one = {cid: private_bn(executor, cid) for cid in federation.source_ids}
    server.run_round(2, evaluate=True)

    for *_, reply in executor.log:
        assert not keys & set(reply.tensors), "a reply carries batch-norm tensors"
    fits = [r for rnd, _, op, r in executor.log if rnd == 2 and op == "fit"]
    assert sorted(r.client_id for r in fits) == federation.source_ids
    expected = weighted_average([r.tensors for r in fits], [r.num_examples for r in fits])
    assert set(server.state["weights"]) == set(build(server).state_dict()) - keys == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(server.state["weights"][name], value)

    a, b = (private_bn(executor, cid) for cid in federation.source_ids[:2])
    assert set(a) == keys
    for name in ("encoder.1.running_mean", "encoder.1.running_var", "encoder.5.running_mean"):
        assert not np.allclose(a[name], b[name]), f"two sources share {name}"
    for cid in federation.source_ids:  # round 2 continued from the client's own BN, not from the initial one
        nbt = "encoder.1.num_batches_tracked"
        assert int(private_bn(executor, cid)[nbt]) == 2 * int(after_one[cid][nbt]) > 0
    assert executor.host.private_state(federation.target_ids[0])["bn"] is None  # the target never trains


def test_target_reestimates_bn_from_unlabeled_inputs(image_overrides):
    results = {}
    for target_bn in ("adabn", "none"):
        config, federation, executor, server = start(image_overrides + [f"method.target_bn={target_bn}"])
        for rnd in (1, 2):
            server.run_round(rnd, evaluate=True)
        (tid,) = federation.target_ids
        results[target_bn] = [
            r.metrics for rnd, _, op, r in executor.log if rnd == 2 and r.client_id == tid and op == "evaluate"
        ][0]
        data = load_client_data(config.data, federation, tid)
        assert data.train.y is None
        method, state = executor.host.method, executor.host.private_state(tid)
        method.evaluate(Instruction("evaluate", server.state["weights"], round=2), state, data)
        model = state["model"]
        first_bn = model.state_dict()["encoder.1.running_mean"].numpy()
        if target_bn == "adabn":  # one batch: the exact channel mean of the first conv on the target's train inputs
            probe = build(server)
            load_numpy(probe, {**server.state["weights"], **initial_bn(probe)})
            with torch.no_grad():
                conv = probe.encoder[0](torch.from_numpy(data.train.x))
            np.testing.assert_allclose(first_bn, conv.mean(dim=(0, 2, 3)).numpy(), rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_array_equal(first_bn, np.zeros_like(first_bn))
    assert results["adabn"]["total"] == results["none"]["total"] > 0
    assert results["adabn"]["loss_sum"] != results["none"]["loss_sum"]


def test_initial_bn_is_what_a_fresh_model_holds_and_nothing_is_stashed_on_the_method(image_overrides):
    config, federation, executor, server = start(image_overrides)
    fresh = build(server)
    expected = {k: v.numpy() for k, v in fresh.state_dict().items() if k in bn_keys(fresh)}
    trained = build(server)
    with torch.no_grad():  # move every BN tensor away from its initial value
        trained.train()
        trained(torch.randn(8, 1, 8, 8) * 3 + 2)
        for module in trained.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.add_(0.5)
    computed = initial_bn(trained)
    assert computed.keys() == expected.keys()
    for name, value in expected.items():
        assert computed[name].dtype == value.dtype
        np.testing.assert_array_equal(computed[name], value, err_msg=name)
    assert FedBN.__bases__ == (SingleExchange,) and FedBN.operations == {"fit", "evaluate"}
    server.run_round(1, evaluate=True)
    for method in (server.method, executor.host.method):  # per-client state lives in the client state only
        assert set(vars(method)) == {"config", "federation", "params", "_device", "fedavg", "selection_scores"}


def test_same_seed_gives_identical_runs(image_overrides):
    runs = []
    for _ in range(2):
        _, federation, executor, server = start(image_overrides)
        history = [server.run_round(rnd, evaluate=True) for rnd in (1, 2)]
        for metrics in history:
            metrics.pop("round_seconds"), metrics.pop("eval_seconds")
        runs.append((history, server.state["weights"], private_bn(executor, federation.source_ids[0])))
    (h1, w1, bn1), (h2, w2, bn2) = runs
    assert h1 == h2
    for name in w1:
        np.testing.assert_array_equal(w1[name], w2[name])
    for name in bn1:
        np.testing.assert_array_equal(bn1[name], bn2[name])


def test_model_without_batch_norm_is_fedavg(toy_overrides, caplog):
    states = {}
    for name in ("fedavg", "fedbn"):
        with caplog.at_level(logging.WARNING, logger="fedsim.methods.fedbn"):
            _, _, _, server = start(toy_overrides + [f"method.name={name}", "model.name=mlp"])
        states[name] = (server.run_round(1, evaluate=True)["target_accuracy"], server.state["weights"])
    assert states["fedavg"][0] == states["fedbn"][0]
    assert states["fedavg"][1].keys() == states["fedbn"][1].keys()
    for key, value in states["fedavg"][1].items():
        np.testing.assert_array_equal(value, states["fedbn"][1][key])
    assert any("no batch-norm layer" in r.getMessage() for r in caplog.records)


def test_bad_target_bn_is_a_user_error():
    with pytest.raises(UserError, match="adabn, none"):
        load_config(None, ["method.name=fedbn", "method.target_bn=bogus"])
