"""FedAvg arithmetic on mock replies, and contract tests over every registered method (detection included)."""

import numpy as np
import pytest
import torch
from conftest import RecordingExecutor

from fedsim.config import load_config
from fedsim.data.scenario import ClientInfo, Federation, build_federation, load_client_data
from fedsim.messages import Reply
from fedsim.methods.base import Method
from fedsim.methods.common.aggregation import weighted_average
from fedsim.optim import SGD
from fedsim.registry import METHODS
from fedsim.runtime import Server
from fedsim.runtime.context import RoundContext

#: a tiny detection scenario (the scenes benchmark's tiny variant), for the detection methods
SCENES_TINY = [
    "data.benchmark=scenes",
    "data.variant=tiny",
    "data.target=dusk",
    "data.sources=server,farm",
    "run.rounds=1",
    "method.batch_size=4",
    "method.lr=0.01",
    "method.width=4",
    "method.fpn_channels=8",
    "method.head_convs=1",
    "method.base_iters=2",
    "method.client_iters=1",
]
DETECTION_EXTRA = {"fedod": ["method.distill_iters=1"], "fedrep_det": ["method.head_iters=1"]}


def mock_federation():
    clients = (
        ClientInfo(0, "a", "source", 10, 5),
        ClientInfo(1, "b", "source", 30, 5),
        ClientInfo(2, "c", "target", 20, 5),
    )
    return Federation("mock", "c", ("a", "b", "c"), clients, (4,), 3)


def test_fedavg_aggregate_is_the_sample_weighted_mean():
    method = METHODS.get("fedavg")(load_config(), mock_federation())
    replies = {
        0: Reply(
            0, {"w": np.full((2, 2), 1.0, np.float32), "steps": np.array(10)}, {"train_loss": 0.5}, num_examples=10
        ),
        1: Reply(
            1, {"w": np.full((2, 2), 4.0, np.float32), "steps": np.array(21)}, {"train_loss": 0.1}, num_examples=30
        ),
    }
    state, metrics = method.aggregate(None, {"weights": {}}, replies)
    # (10 * 1 + 30 * 4) / 40 = 3.25 ; (10 * 10 + 30 * 21) / 40 = 18.25 -> 18 for an integer buffer
    np.testing.assert_allclose(state["weights"]["w"], np.full((2, 2), 3.25))
    assert state["weights"]["w"].dtype == np.float32
    assert int(state["weights"]["steps"]) == 18
    assert metrics["train_loss"] == {"0": 0.5, "1": 0.1}


def test_weighted_average_rejects_empty_input():
    with pytest.raises(ValueError, match="at least one"):
        weighted_average([], [])


class _Capture:
    """An executor stand-in that records the instructions of each call and answers nothing."""

    def __init__(self):
        self.calls = []

    def run(self, instructions, rnd=0, replay=False):
        self.calls.append((rnd, instructions))
        return {}


def test_fedavg_trains_only_labeled_sources_with_one_shared_payload_and_derived_seeds():
    method = METHODS.get("fedavg")(load_config(), mock_federation())
    exchange = method.configure(RoundContext(_Capture(), 0, 1), {"weights": {"w": np.zeros(1)}})
    capture = _Capture()
    RoundContext(capture, 7, 3).call(exchange.operation, exchange.tensors, exchange.clients)
    rnd, instructions = capture.calls[0]
    assert rnd == 3 and sorted(instructions) == [0, 1]
    assert all(ins.operation == "fit" for ins in instructions.values())
    assert len({id(ins.tensors) for ins in instructions.values()}) == 1  # serialized once by the executors
    ctx = RoundContext(capture, 7, 3)
    assert [ins.seed for ins in instructions.values()] == [ctx.seed(0, "fit"), ctx.seed(1, "fit")]
    assert all(ins.round == 3 and ins.values == {} for ins in instructions.values())
    assert ctx.seed(0, "fit") != ctx.seed(1, "fit") != RoundContext(capture, 7, 4).seed(1, "fit")


def test_client_operations_are_declared_not_found_by_name():
    assert METHODS.get("fedavg").operations == {"fit", "evaluate"}
    method = METHODS.get("fedavg")(load_config(), mock_federation())
    with pytest.raises(ValueError, match="no client operation 'init_server'"):
        method.operation("init_server")


def _contains_raw_data(tensor: np.ndarray, data) -> bool:
    arrays = [data.train.x, data.test.x, data.test.y] + ([data.train.y] if data.train.y is not None else [])
    for array in arrays:
        if tensor.shape == array.shape and np.allclose(tensor, array):
            return True
        if (
            tensor.ndim >= 1
            and tensor.shape[0] in (len(data.train), len(data.test))
            and tensor.shape[1:] == data.train.x.shape[1:]
        ):
            return True
    return False


def _state_leaves(state, transient) -> list[np.ndarray]:
    """Every array in a client's private state (tensors, numpy arrays, module parameters and buffers)."""
    if isinstance(state, dict):
        return [leaf for key, value in state.items() if key not in transient for leaf in _state_leaves(value, ())]
    if isinstance(state, (list, tuple)):
        return [leaf for value in state for leaf in _state_leaves(value, ())]
    if isinstance(state, torch.nn.Module):
        return [t.detach().cpu().numpy() for t in state.state_dict().values()]
    if isinstance(state, (torch.optim.Optimizer, SGD)):
        return _state_leaves(list(state.state.values()), ())
    if isinstance(state, torch.Tensor):
        return [state.detach().cpu().numpy()]
    if isinstance(state, np.ndarray):
        return [state]
    return []


def _leaks(tensor: np.ndarray, leaves: list[np.ndarray]) -> bool:
    tensor = np.asarray(tensor)
    return any(
        leaf.shape == tensor.shape and leaf.size > 1 and np.array_equal(leaf, tensor) and np.any(leaf != leaf.flat[0])
        for leaf in leaves
    )


def _overrides(name, toy_overrides):
    if METHODS.get(name).task == "detection":
        cache = [o for o in toy_overrides if o.startswith("data.cache_dir=")]
        return (
            SCENES_TINY
            + cache
            + ["run.progress=false", "run.tensorboard=false", f"method.name={name}", *DETECTION_EXTRA.get(name, [])]
        )
    return toy_overrides + [f"method.name={name}"]


@pytest.mark.parametrize("method_name", METHODS.names())
def test_method_contract_no_raw_data_and_no_private_state_in_replies(method_name, toy_overrides):
    """Two rounds through a Server; every reply checked against the client's data and its private state."""
    config = load_config(None, _overrides(method_name, toy_overrides))
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    method_cls = METHODS.get(method_name)
    server.setup(1)
    rounds = (1,) if method_cls.task == "detection" else (1, 2)
    for rnd in rounds:
        metrics = server.run_round(rnd, evaluate=True)
        assert metrics["bytes_sent"] > 0 and metrics["round"] == rnd
        if method_cls.task == "classification":
            assert 0.0 <= metrics["target_accuracy"] <= 1.0
            assert set(metrics["source_accuracy"]) == set(federation.source_domains)
    assert executor.bytes_received > 0 and executor.replies
    transient = set(method_cls.transient_state_keys) | set(method_cls.disclosed_state_keys)
    for reply in executor.replies:
        assert all(np.isscalar(v) for v in reply.metrics.values()), "reply metrics must be scalars"
        leaves = _state_leaves(executor.host.private_state(reply.client_id), transient)
        for name, tensor in reply.tensors.items():
            assert not _leaks(tensor, leaves), (
                f"{method_name} reply tensor {name!r} is a leaf of client {reply.client_id}'s private state"
            )
        if method_cls.centralized:
            continue  # a centralized reference uploads client data by design (declared, see the test below)
        data = executor.host._client(reply.client_id)
        for name, tensor in reply.tensors.items():
            assert not _contains_raw_data(np.asarray(tensor), data), (
                f"{method_name} reply tensor {name!r} carries raw client data"
            )


@pytest.mark.parametrize("method_name", METHODS.names())
def test_every_method_declares_itself(method_name, toy_overrides):
    """Built from its config; one-line description for `fedsim list`; a task; declared client operations."""
    method_cls = METHODS.get(method_name)
    assert issubclass(method_cls, Method) and method_cls.registry_name == method_name
    assert method_cls.task in ("classification", "detection")
    assert len(method_cls.description()) > 10 and "\n" not in method_cls.description()
    assert "evaluate" in method_cls.operations or method_cls.evaluate_round is not Method.evaluate_round
    config = load_config(None, _overrides(method_name, toy_overrides))
    method = method_cls(config, build_federation(config.data))
    assert method.params == config.method.params and set(method.operations) <= set(dir(method))


def test_the_target_never_holds_training_labels(toy_overrides):
    config = load_config(None, toy_overrides)
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
    declared = sorted(name for name in METHODS.names() if METHODS.get(name).centralized)
    assert declared == ["centralized", "dadil", "dann", "mmd"]


def test_clients_per_round_samples_deterministically(toy_overrides):
    config = load_config(None, toy_overrides + ["data.clients_per_domain=5", "run.clients_per_round=3"])
    federation = build_federation(config.data)
    method = METHODS.get("fedavg")(config, federation)
    state = {"weights": {"w": np.zeros(1)}}

    def chosen(m, rnd):
        return sorted(m.configure(RoundContext(None, 0, rnd), state).clients)

    picks = [chosen(method, r) for r in (1, 2, 3)]
    assert all(len(c) == 3 and set(c) <= set(federation.source_ids) for c in picks)
    assert picks == [chosen(method, r) for r in (1, 2, 3)]
    assert len({tuple(c) for c in picks}) > 1, "different rounds sample different clients"
    half = METHODS.get("fedavg")(
        load_config(None, toy_overrides + ["data.clients_per_domain=5", "run.clients_per_round=0.5"]), federation
    )
    assert len(chosen(half, 1)) == 5
