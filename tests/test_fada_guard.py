"""FADA's consensus guard on the target update (fedsim's addition, off by default), and FADA's loss-weight defaults
(DAL's, Peng et al. ICML 2019)."""

import dataclasses

import numpy as np
import pytest
from conftest import LabelGuard, RecordingExecutor

from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.messages import Instruction
from fedsim.methods.common.training import load_numpy, model_to_numpy
from fedsim.methods.fada import FADA
from fedsim.methods.fada.attention import apply_deltas
from fedsim.methods.fada.guard import consensus_guard, guard_inputs, softmax_rows
from fedsim.methods.fada.params import FADAParams
from fedsim.runtime import Server

# ----------------------------------------------------------------------------- the pure guard on linear models


def predict(weights, x):
    """A linear classifier's logits x W + b."""
    return x @ weights["w"] + weights["b"]


def linear(w, b=(0.0, 0.0)):
    return {"w": np.asarray(w, dtype=np.float64), "b": np.asarray(b, dtype=np.float64)}


def difference(model, start):
    return {name: model[name] - start[name] for name in start}


INPUTS = np.random.default_rng(0).normal(size=(200, 2))
RULE = (INPUTS[:, 0] <= INPUTS[:, 1]).astype(int)  # class 1 when x1 >= x0: the sources' shared rule
START = linear(np.zeros((2, 2)))
SOURCES = [linear(3 * np.eye(2)), linear(2 * np.eye(2))]  # both follow RULE
DELTAS = [difference(model, START) for model in SOURCES]
ATTENTION = [0.5, 0.5]


def test_the_sources_consensus_is_their_shared_rule():
    consensus = np.mean([softmax_rows(predict(m, INPUTS)) for m in SOURCES], axis=0).argmax(1)
    np.testing.assert_array_equal(consensus, RULE)


def test_an_alignment_that_agrees_as_much_is_kept():
    aligned = linear(0.5 * np.eye(2))  # moves G_t along the sources' rule: the same predictions
    kept, metrics = consensus_guard(predict, START, aligned, DELTAS, ATTENTION, INPUTS)
    expected = apply_deltas(aligned, DELTAS, ATTENTION)
    for name in expected:
        np.testing.assert_array_equal(kept[name], expected[name])
    assert metrics == {"consensus_agreement": 1.0, "guard_kept_alignment": 1.0}


def test_an_alignment_that_agrees_less_is_dropped():
    aligned = linear(-10 * np.eye(2))  # the alignment flipped the target's classifier
    kept, metrics = consensus_guard(predict, START, aligned, DELTAS, ATTENTION, INPUTS)
    unaligned = apply_deltas(START, DELTAS, ATTENTION)  # 2.5 I: the sources' rule
    for name in unaligned:
        np.testing.assert_array_equal(kept[name], unaligned[name])
    assert metrics == {"consensus_agreement": 1.0, "guard_kept_alignment": 0.0}


def test_an_alignment_that_agrees_more_is_kept_with_its_agreement():
    sources = [linear(3 * np.eye(2)), linear(3 * np.eye(2), (0.0, 2.0)), linear(3 * np.eye(2))]
    deltas, attention = [difference(m, START) for m in sources], [0.05, 0.9, 0.05]  # B leans on the biased source
    aligned = linear(np.zeros((2, 2)), (0.0, -1.8))  # the alignment removes most of that bias
    consensus = np.mean([softmax_rows(predict(m, INPUTS)) for m in sources], axis=0).argmax(1)
    agree = lambda m: float(np.mean(predict(m, INPUTS).argmax(1) == consensus))  # noqa: E731
    with_alignment, without = apply_deltas(aligned, deltas, attention), apply_deltas(START, deltas, attention)
    assert agree(with_alignment) > agree(without)  # the premise of the case
    kept, metrics = consensus_guard(predict, START, aligned, deltas, attention, INPUTS)
    np.testing.assert_array_equal(kept["b"], with_alignment["b"])
    assert metrics == {"consensus_agreement": agree(with_alignment), "guard_kept_alignment": 1.0}
    _, metrics = consensus_guard(predict, START, aligned, deltas, attention, INPUTS, identifiers_won=True)
    assert metrics == {"consensus_agreement": agree(without), "guard_kept_alignment": 0.0}


def test_the_alignment_is_dropped_when_the_domain_identifiers_won():
    aligned = linear(0.5 * np.eye(2))
    kept, metrics = consensus_guard(predict, START, aligned, DELTAS, ATTENTION, INPUTS, identifiers_won=True)
    np.testing.assert_array_equal(kept["w"], apply_deltas(START, DELTAS, ATTENTION)["w"])
    assert metrics == {"consensus_agreement": 1.0, "guard_kept_alignment": 0.0}


def test_guard_inputs_are_a_seeded_subset_in_pool_order():
    pool = np.arange(50.0)[:, None]
    first, again, other = guard_inputs(pool, 10, 3), guard_inputs(pool, 10, 3), guard_inputs(pool, 10, 4)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other) and len(first) == 10 and np.all(np.diff(first[:, 0]) > 0)
    np.testing.assert_array_equal(guard_inputs(pool, 80, 3), pool)  # fewer rows than asked: all of them


# ----------------------------------------------------------------------------- the guard inside FADA's target update


def target_update(toy_overrides, train, identifiers_won, *extra):
    """FADA's ``update`` on the target, with round-start weights, aligned weights and deltas built by hand:
    (reply, start, aligned, deltas, sources)."""
    config = load_config(None, toy_overrides + ["method.name=fada", "method.gap_samples=40", *extra])
    federation = build_federation(config.data)
    method, tid, sources = FADA(config, federation), federation.target_ids[0], federation.source_ids
    data = load_client_data(config.data, federation, tid)
    data = dataclasses.replace(data, train=train(data.train))
    state = method.init_client(data)
    net, rng = state["net"], np.random.default_rng(1)
    start, parameters = model_to_numpy(net), {name for name, _ in net.named_parameters()}
    noise = lambda name, v, s: (s * rng.normal(size=v.shape)).astype(v.dtype) if name in parameters else 0 * v  # noqa: E731
    aligned = {name: v + noise(name, v, 1.0) for name, v in start.items()}  # a large move of the target model
    deltas = [{name: noise(name, v, 0.3) for name, v in start.items()} for _ in sources]
    load_numpy(net, aligned)
    state["round_start"] = start
    tensors = {f"{cid}:{name}": d[name] for cid, d in zip(sources, deltas) for name in d}
    values = {"sources": sources, "identifiers_won": identifiers_won}
    reply, state = method.update(Instruction("update", tensors, round=1, seed=11, values=values), state, data)
    assert "round_start" not in state
    return reply, start, aligned, deltas, sources


UNLABELED = {
    "raising": lambda split: LabelGuard(split.x),
    "all -1": lambda split: dataclasses.replace(split, y=np.full(len(split.x), -1)),
    "absent": lambda split: dataclasses.replace(split, y=None),
}


def test_the_guard_never_reads_target_labels(toy_overrides):
    guard = "method.guard=consensus"
    replies = {name: target_update(toy_overrides, train, False, guard)[0] for name, train in UNLABELED.items()}
    first = replies["raising"]
    assert set(first.metrics) >= {"consensus_agreement", "guard_kept_alignment"}
    for reply in replies.values():  # whatever the labels hold, or if reading them raises: the same update
        assert reply.metrics == first.metrics
        for name, value in first.tensors.items():
            np.testing.assert_array_equal(reply.tensors[name], value)


@pytest.mark.parametrize(
    "identifiers_won, guard, setting",
    [(True, "consensus", ["method.guard=consensus"]), (False, "off", ["method.guard=off"]), (True, "off", [])],
)
def test_the_kept_update_is_the_unaligned_one_when_dropped_and_the_aligned_one_when_off(
    toy_overrides, identifiers_won, guard, setting
):
    """With the guard asked for and the identifiers winning, the round's alignment is dropped; off (the default,
    the paper's FADA) the aligned update is kept even when the identifiers won."""
    reply, start, aligned, deltas, sources = target_update(
        toy_overrides, UNLABELED["absent"], identifiers_won, *setting
    )
    attention = [reply.metrics[f"attention:{cid}"] for cid in sources]
    expected = apply_deltas(start if guard == "consensus" else aligned, deltas, attention)
    for name, value in expected.items():
        np.testing.assert_array_equal(reply.tensors[name], value)
    assert ("guard_kept_alignment" in reply.metrics) == (guard == "consensus")
    if guard == "consensus":
        assert reply.metrics["guard_kept_alignment"] == 0.0


def test_a_dropped_alignment_leaves_the_attention_update_of_the_round_start_weights(toy_overrides):
    """A round of model II whose identifiers always win: the target model is w_start + sum_i a_i Delta_i, w_start
    the weights the sources started from."""
    fast = ["method.target_batch=16", "method.gap_samples=32", "method.adversarial_steps=2", "method.disentangle=false"]
    guard = ["method.guard=consensus", "method.guard_identifier_accuracy=1e-9"]
    config = load_config(None, toy_overrides + ["method.name=fada", *fast, *guard])
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    start = dict(server.state["weights"])
    metrics = server.run_round(1, evaluate=False)
    tid = federation.target_ids[0]
    update = next(ins[tid] for ins, _ in executor.calls if tid in ins and ins[tid].operation == "update")
    assert update.values["identifiers_won"] is True and metrics["guard_kept_alignment"] == 0.0
    sources = federation.source_ids
    deltas = [{name: update.tensors[f"{cid}:{name}"] for name in start} for cid in sources]
    attention = [metrics["attention"][server.method.labels[cid]] for cid in sources]
    for name, value in apply_deltas(start, deltas, attention).items():
        np.testing.assert_allclose(server.global_tensors()[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


# ----------------------------------------------------------------------------- defaults


def test_the_loss_weights_default_to_dals_and_the_guard_is_off(toy_overrides):
    params = load_config(None, toy_overrides + ["method.name=fada"]).method.params
    assert params == FADAParams()
    assert (params.lambda_recon, params.lambda_mi, params.lambda_adv, params.schedule) == (0.01, 1e-4, 0.01, "constant")
    # the guard is fedsim's addition: off by default, the paper's FADA
    assert (params.lambda_entropy, params.guard, params.guard_identifier_accuracy) == (1.0, "off", 0.99)
    config = load_config(None, toy_overrides + ["method.name=fada"])
    method = FADA(config, build_federation(config.data))
    assert [method.adversarial_weight(p) for p in (0.0, 0.5, 1.0)] == [0.01] * 3  # DAL's weight throughout
    off = load_config(None, toy_overrides + ["method.name=fada", "method.guard=off"]).method.params
    assert off.guard == "off"  # a bare YAML `off` reads as false: it still switches the guard off
    asked = load_config(None, toy_overrides + ["method.name=fada", "method.guard=consensus"]).method.params
    assert asked.guard == "consensus"
