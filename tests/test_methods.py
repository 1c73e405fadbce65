"""FedAvg arithmetic on mock replies, and contract tests over every registered method."""
import numpy as np
import pytest

from fedsim.config import load_config
from fedsim.data.scenario import ClientInfo, Federation, build_federation, load_client_data
from fedsim.messages import Reply
from fedsim.methods.common.training import weighted_average
from fedsim.registry import METHODS
from fedsim.runtime import Server

from conftest import RecordingExecutor


def mock_federation():
    clients = (ClientInfo(0, "a", "source", 10, 5), ClientInfo(1, "b", "source", 30, 5), ClientInfo(2, "c", "target", 20, 5))
    return Federation("mock", "c", ("a", "b", "c"), clients, (4,), 3)


def test_fedavg_aggregate_is_the_sample_weighted_mean():
    method = METHODS.get("fedavg")(load_config(), mock_federation())
    replies = {
        0: Reply(0, {"w": np.full((2, 2), 1.0, np.float32), "steps": np.array(10)}, {"train_loss": 0.5}, num_examples=10),
        1: Reply(1, {"w": np.full((2, 2), 4.0, np.float32), "steps": np.array(21)}, {"train_loss": 0.1}, num_examples=30),
    }
    state, metrics = method.aggregate(1, {"weights": {}}, replies)
    # (10 * 1 + 30 * 4) / 40 = 3.25 ; (10 * 10 + 30 * 21) / 40 = 18.25 -> 18 for an integer buffer
    np.testing.assert_allclose(state["weights"]["w"], np.full((2, 2), 3.25))
    assert state["weights"]["w"].dtype == np.float32
    assert int(state["weights"]["steps"]) == 18
    assert metrics["train_loss"] == {"0": 0.5, "1": 0.1}


def test_weighted_average_rejects_empty_input():
    with pytest.raises(ValueError):
        weighted_average([], [])


def test_fedavg_trains_only_labeled_sources():
    method = METHODS.get("fedavg")(load_config(), mock_federation())
    instructions = method.configure_round(1, method.init_server() if False else {"weights": {"w": np.zeros(1)}})
    assert sorted(instructions) == [0, 1]
    assert all(ins.operation == "fit" for ins in instructions.values())
    # one shared payload for every client: serialized once by the executors
    assert len({id(ins.tensors) for ins in instructions.values()}) == 1




def _contains_raw_data(tensor: np.ndarray, data) -> bool:
    arrays = [data.train.x, data.test.x, data.test.y] + ([data.train.y] if data.train.y is not None else [])
    for array in arrays:
        if tensor.shape == array.shape and np.allclose(tensor, array):
            return True
        if tensor.ndim >= 1 and tensor.shape[0] in (len(data.train), len(data.test)) and tensor.shape[1:] == data.train.x.shape[1:]:
            return True
    return False


CLASSIFICATION = [n for n in METHODS.names() if getattr(METHODS.get(n), "task", "classification") == "classification"]


@pytest.mark.parametrize("method_name", CLASSIFICATION)
def test_method_contract_two_rounds_no_raw_data_in_replies(method_name, toy_overrides):
    config = load_config(None, toy_overrides + [f"method.name={method_name}"])
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    for rnd in (1, 2):
        metrics = server.run_round(rnd, evaluate=True)
        assert 0.0 <= metrics["target_accuracy"] <= 1.0
        assert set(metrics["source_accuracy"]) == set(federation.source_domains)
        assert metrics["bytes_sent"] > 0
    assert executor.bytes_received > 0
    assert executor.replies
    if getattr(METHODS.get(method_name), "centralized", False):
        return  # a centralized upper bound uploads client data by design (it is labelled so, see test below)
    for reply in executor.replies:
        data = load_client_data(config.data, federation, reply.client_id)
        for name, tensor in reply.tensors.items():
            assert not _contains_raw_data(np.asarray(tensor), data), f"{method_name} reply tensor {name!r} carries raw client data"
        assert all(np.isscalar(v) for v in reply.metrics.values()), "reply metrics must be scalars"


@pytest.mark.parametrize("method_name", CLASSIFICATION)
def test_method_never_trains_on_target_labels(method_name, toy_overrides):
    config = load_config(None, toy_overrides + [f"method.name={method_name}"])
    federation = build_federation(config.data)
    for cid in federation.target_ids:
        assert load_client_data(config.data, federation, cid).train.y is None


def test_fedavg_target_client_only_evaluates(toy_overrides):
    config = load_config(None, toy_overrides)
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    Server(config, federation, executor).run_round(1, evaluate=True)
    target_replies = [r for r in executor.replies if r.client_id in federation.target_ids]
    assert target_replies and all(r.metrics.keys() >= {"correct", "total"} and not r.tensors for r in target_replies)


def test_only_declared_centralized_methods_upload_data():
    declared = [name for name in METHODS.names() if getattr(METHODS.get(name), "centralized", False)]
    assert all(name in ("dadil",) or name.startswith("centralized") for name in declared)


def test_clients_per_round_samples_deterministically(toy_overrides):
    config = load_config(None, toy_overrides + ["data.clients_per_domain=5", "run.clients_per_round=3"])
    federation = build_federation(config.data)
    method = METHODS.get("fedavg")(config, federation)
    state = {"weights": {"w": np.zeros(1)}}
    chosen = [sorted(method.configure_round(r, state)) for r in (1, 2, 3)]
    assert all(len(c) == 3 and set(c) <= set(federation.source_ids) for c in chosen)
    assert chosen == [sorted(method.configure_round(r, state)) for r in (1, 2, 3)]
    assert len({tuple(c) for c in chosen}) > 1, "different rounds sample different clients"
    half = METHODS.get("fedavg")(load_config(None, toy_overrides + ["data.clients_per_domain=5", "run.clients_per_round=0.5"]), federation)
    assert len(half.configure_round(1, state)) == 5
