"""Classification FedRep: what crosses the wire (heads only in the evaluation-only exchange), the target's
mixture rule."""

import numpy as np
import torch
from conftest import RecordingExecutor

from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.methods.fedrep import FedRep, split_head
from fedsim.runtime import Server


def _run(toy_overrides, *extra):
    config = load_config(None, toy_overrides + ["method.name=fedrep", "method.head_epochs=2", *extra])
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    return config, federation, executor, server


def test_heads_leave_a_client_only_in_the_evaluation_exchange(toy_overrides):
    config, federation, executor, server = _run(toy_overrides)
    server.run_round(1, evaluate=False)
    assert executor.operations() == ["fit"]
    for _, cid, operation, reply in executor.log:
        assert cid in federation.source_ids and not any(k.startswith("head.") for k in reply.tensors)
    assert not any(k.startswith("head.") for k in server.state["weights"])
    server.run_round(2, evaluate=True)
    ops = executor.operations()
    assert ops[-2:] == ["share_head", "evaluate"]
    for _, cid, operation, reply in executor.log:
        heads = [k for k in reply.tensors if k.startswith("head.")]
        assert not heads or operation == "share_head", (operation, heads)
        if operation == "share_head":
            assert cid in federation.source_ids and heads and set(reply.tensors) == set(heads)


def test_heads_are_personal_and_the_representation_is_averaged(toy_overrides):
    config, federation, executor, server = _run(toy_overrides)
    server.run_round(1, evaluate=False)
    heads = [executor.host.private_state(cid)["head"] for cid in federation.source_ids]
    assert all(h is not None and set(h) == {"head.weight", "head.bias"} for h in heads)
    assert not np.allclose(heads[0]["head.weight"], heads[1]["head.weight"])
    fits = [reply for _, _, op, reply in executor.log if op == "fit"]
    mean = sum(r.num_examples * r.tensors["encoder.0.weight"].astype(np.float64) for r in fits) / sum(
        r.num_examples for r in fits
    )
    np.testing.assert_allclose(server.state["weights"]["encoder.0.weight"], mean, rtol=1e-5, atol=1e-6)
    target = federation.target_ids[0]
    assert executor.host.private_state(target)["head"] is None  # the target never trains a head


def test_target_predicts_with_the_sample_weighted_mean_of_the_sources_probabilities(toy_overrides):
    config, federation, executor, server = _run(toy_overrides)
    server.run_round(1, evaluate=True)
    _, (evaluate, replies) = executor.calls[-2], executor.calls[-1]
    target = federation.target_ids[0]
    payload = evaluate[target].tensors
    data = load_client_data(config.data, federation, target)
    method = FedRep(config, federation)
    model = method.classifier.build()
    body = {k: v for k, v in payload.items() if not k.startswith("heads.")}
    sources = sorted(federation.source_ids)
    counts = np.array([float(payload[f"heads.{c}.count"]) for c in sources])
    assert counts.tolist() == [float(federation.info(c).num_train) for c in sources]
    mixture = 0
    for cid, weight in zip(sources, counts / counts.sum()):
        head = {
            k[len(f"heads.{cid}.") :]: v
            for k, v in payload.items()
            if k.startswith(f"heads.{cid}.") and not k.endswith("count")
        }
        model.load_state_dict({k: torch.tensor(v) for k, v in {**body, **head}.items()})
        model.eval()
        with torch.no_grad():
            mixture = mixture + weight * torch.softmax(model(torch.from_numpy(data.test.x)).double(), 1).numpy()
    expected = float((mixture.argmax(1) == data.test.y).sum())
    assert replies[target].metrics["correct"] == expected and replies[target].metrics["total"] == len(data.test.y)


def test_split_head_and_declared_disclosure():
    body, head = split_head({"encoder.0.weight": 1, "head.weight": 2, "head.bias": 3})
    assert body == {"encoder.0.weight": 1} and head == {"head.weight": 2, "head.bias": 3}
    assert FedRep.disclosed_state_keys == ("head",) and FedRep.centralized is False
    assert FedRep.operations == {"fit", "share_head", "evaluate"}


def test_head_epochs_encode_once_and_leave_the_representation_as_sent(toy_overrides, monkeypatch):
    """Alg. 1: phi^t is frozen during the tau_h head epochs: one encoder pass (no backward through it), the
    representation (buffers included) reaches the representation epoch exactly as the server sent it."""
    import fedsim.methods.fedrep as fedrep_module

    config, federation, executor, server = _run(toy_overrides, "method.head_epochs=3")
    sent = {k: v.copy() for k, v in server.state["weights"].items()}
    seen, encoder_calls = [], []
    original = fedrep_module.train_epochs

    def spy(model, split, *args, **kwargs):
        seen.append(({k: v.detach().clone() for k, v in model.state_dict().items()}, len(encoder_calls)))
        return original(model, split, *args, **kwargs)

    monkeypatch.setattr(fedrep_module, "train_epochs", spy)
    model = executor.host.method.classifier.shared()
    hook = model.encoder.register_forward_hook(lambda *_: encoder_calls.append(1))
    try:
        server.run_round(1, evaluate=False)
    finally:
        hook.remove()
    assert len(seen) == len(federation.source_ids)
    initial_head = split_head(executor.host.method.classifier.initial_weights())[1]
    previous = 0
    for cid, (state, calls) in zip(sorted(federation.source_ids), seen):
        for key, value in sent.items():
            np.testing.assert_array_equal(state[key].numpy(), value)
        assert not np.allclose(state["head.weight"].numpy(), initial_head["head.weight"])  # the head did train
        batches = -(-federation.info(cid).num_train // config.method.batch_size)
        assert calls - previous == batches  # one pass over the training inputs, not head_epochs passes
        previous = calls + batches  # the representation epoch's own forward passes
