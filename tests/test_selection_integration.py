"""Model selection inside runs: the sources' validation parts (``data.validation_fraction``) and the scores every
evaluation reports (``run.scores``), checked against the centralized references on pooled arrays."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError


def _clients(overrides):
    config = load_config(None, overrides)
    federation = build_federation(config.data)
    return config, federation, {cid: load_client_data(config.data, federation, cid) for cid in federation.client_ids}


def _rows(x: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in np.ascontiguousarray(x)}


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_validation_part_is_stratified_disjoint_and_taken_from_the_training_rows(toy_overrides, partition):
    common = toy_overrides + ["data.clients_per_domain=2", f"data.partition={partition}", "data.dirichlet_alpha=5"]
    _, _, before = _clients(common)
    config, federation, after = _clients(common + ["data.validation_fraction=0.2"])
    for cid, data in after.items():
        info = federation.info(cid)
        if data.is_target:
            assert data.validation is None and info.num_validation == 0
            np.testing.assert_array_equal(data.train.x, before[cid].train.x)
            continue
        held, kept, everything = data.validation, data.train, before[cid].train
        assert (len(kept), len(held)) == (info.num_train, info.num_validation)
        assert len(kept) + len(held) == len(everything)
        assert not _rows(kept.x) & _rows(held.x), "no validation row trains"
        assert _rows(kept.x) | _rows(held.x) == _rows(everything.x), "the training part is split, nothing else"
        classes, counts = np.unique(everything.y, return_counts=True)
        expected = np.floor(0.2 * counts + 0.5).astype(int)  # round(fraction x rows) of each class
        np.testing.assert_array_equal([np.sum(held.y == c) for c in classes], expected)
        np.testing.assert_array_equal(data.test.x, before[cid].test.x)


def test_validation_part_is_seeded_by_the_data_seed(toy_overrides):
    overrides = toy_overrides + ["data.validation_fraction=0.3"]
    _, federation, first = _clients(overrides)
    _, _, again = _clients(overrides)
    _, _, other = _clients(overrides + ["data.seed=1"])
    source = federation.source_ids[0]
    np.testing.assert_array_equal(first[source].validation.x, again[source].validation.x)
    assert _rows(first[source].validation.x) != _rows(other[source].validation.x)


def test_fraction_zero_leaves_the_training_data_as_it_was(toy_overrides):
    _, federation, default = _clients(toy_overrides)
    _, _, zero = _clients(toy_overrides + ["data.validation_fraction=0"])
    for cid, data in default.items():
        assert data.validation is None and zero[cid].validation is None
        np.testing.assert_array_equal(data.train.x, zero[cid].train.x)
        assert (data.train.y is None) == data.is_target
        if data.train.y is not None:
            np.testing.assert_array_equal(data.train.y, zero[cid].train.y)
        assert federation.info(cid).num_validation == 0


@pytest.mark.parametrize("fraction", ["1", "-0.1", "1.5"])
def test_fraction_outside_the_unit_interval_is_one_line(toy_overrides, fraction):
    with pytest.raises(UserError, match=r"data.validation_fraction must be in \[0, 1\)"):
        load_config(None, toy_overrides + [f"data.validation_fraction={fraction}"])


def test_a_class_too_small_to_split_is_one_line(toy_overrides):
    # 50 rows of each class per domain over 40 clients: a client holds one or two rows of a class, and
    # a fraction of 0.9 would hold out every one of them
    config = load_config(None, toy_overrides + ["data.clients_per_domain=40", "data.validation_fraction=0.9"])
    with pytest.raises(UserError, match="lower data.validation_fraction"):
        build_federation(config.data)


def test_standardization_is_fitted_on_what_trains_and_applied_to_the_validation_part(toy_overrides):
    from fedsim.data import normalization
    from fedsim.runtime import LocalExecutor, Server

    config = load_config(None, toy_overrides + ["data.normalization=per-domain", "data.validation_fraction=0.2"])
    federation = build_federation(config.data)
    raw = {cid: load_client_data(config.data, federation, cid) for cid in federation.source_ids}
    executor = LocalExecutor(config, federation)
    Server(config, federation, executor).setup(1)
    for cid, before in raw.items():
        scaled = executor.host._client(cid)
        mean, std = normalization.mean_std(normalization.feature_stats(before.train.x))
        np.testing.assert_allclose(scaled.train.x.mean(0), 0, atol=1e-4)
        np.testing.assert_array_equal(scaled.validation.x, normalization.standardize(before.validation.x, mean, std))
        np.testing.assert_array_equal(scaled.validation.y, before.validation.y)


# ---- scores reported by runs -------------------------------------------------------------------------------------
SCORE_OVERRIDES = ["run.backend=local", "run.tensorboard=false", "data.normalization=federated"]
#: the scores "auto" computes with a validation part, and SND (on request only)
WITH_SND = ["run.scores=source_accuracy,source_loss,entropy,snd,mano"]
FEDDADIL_FAST = [
    "method.name=feddadil",
    "method.samples_per_atom=40",
    "method.batch_size=20",
    "method.classifier_steps=50",
    "run.eval_every=1",
]


def _simulate(overrides):
    """A whole run on the local backend, its exchanges recorded: (config, federation, executor, server, history,
    summary)."""
    from conftest import RecordingExecutor

    from fedsim.runtime import Server, Simulator

    config = load_config(None, overrides)
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    simulator = Simulator(config, server)
    summary = simulator.run()
    return config, federation, executor, server, simulator.history, summary


def _pooled(executor, federation):
    """The clients' (standardized) arrays as the run held them: sources' validation inputs and labels pooled, the
    target's training inputs pooled."""
    host = executor.host
    sources = [host._client(cid) for cid in federation.source_ids]
    targets = [host._client(cid) for cid in federation.target_ids]
    validation_x = np.concatenate([d.validation.x for d in sources])
    validation_y = np.concatenate([d.validation.y for d in sources])
    return validation_x, validation_y, np.concatenate([d.train.x for d in targets])


def _global_model(config, federation, weights):
    import torch

    from fedsim.methods.common.classifier import GlobalClassifier
    from fedsim.methods.common.training import load_numpy

    model = GlobalClassifier(config, federation, torch.device("cpu")).build()
    load_numpy(model, weights)
    return model.eval()


def _outputs(model, x):
    import torch

    with torch.no_grad():
        inputs = torch.from_numpy(x)
        return model(inputs).double().numpy(), model.features(inputs).double().numpy()


def _cheap_references(validation_logits, validation_y, target_logits, suffix="") -> dict:
    import selection_reference as reference

    return {
        f"score_source_accuracy{suffix}": reference.source_accuracy_score(validation_logits, validation_y),
        f"score_source_loss{suffix}": reference.source_loss_score(validation_logits, validation_y),
        f"score_entropy{suffix}": reference.entropy_score(target_logits),
        f"score_snd{suffix}": reference.snd_score(target_logits),
        f"score_mano{suffix}": reference.mano_score(target_logits),
    }


def _assert_scores(reported: dict, expected: dict) -> None:
    assert {k for k in reported if k.startswith("score_")} == set(expected)
    for key, value in expected.items():
        assert reported[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_fedavg_reports_the_cheap_scores_of_its_final_model(toy_overrides):
    config, federation, executor, server, history, summary = _simulate(
        toy_overrides + SCORE_OVERRIDES + WITH_SND + ["data.validation_fraction=0.2"]
    )
    model = _global_model(config, federation, server.state["weights"])
    validation_x, validation_y, target_x = _pooled(executor, federation)
    expected = _cheap_references(_outputs(model, validation_x)[0], validation_y, _outputs(model, target_x)[0])
    _assert_scores(summary, expected)
    _assert_scores(history[-1], expected)
    assert all(set(expected) <= set(metrics) for metrics in history)  # every evaluated round reports them
    assert summary["target_accuracy"] == history[-1]["target_accuracy"]


def test_without_a_validation_part_auto_reports_the_target_scores_only(toy_overrides):
    _, _, executor, _, _, summary = _simulate(toy_overrides + SCORE_OVERRIDES + ["run.rounds=1"])
    assert {k for k in summary if k.startswith("score_")} == {"score_entropy", "score_mano"}
    none = _simulate(toy_overrides + SCORE_OVERRIDES + ["run.rounds=1", "run.scores=none"])
    assert not any(k.startswith("score_") for k in none[5])
    assert none[5]["target_accuracy"] == summary["target_accuracy"]  # the scores change no number of the run
    assert none[5]["bytes_received"] == summary["bytes_received"]  # and travel as reply metrics, no tensor


def test_iwv_and_dev_fit_the_density_ratio_from_moments_and_match_the_pooled_reference(toy_overrides):
    import selection_reference as reference

    from fedsim.methods.common.selection_hooks import MOMENTS, STAGE

    config, federation, executor, server, history, summary = _simulate(
        toy_overrides + SCORE_OVERRIDES + ["data.validation_fraction=0.2", "run.scores=source_loss,iwv,dev"]
    )
    model = _global_model(config, federation, server.state["weights"])
    validation_x, validation_y, target_x = _pooled(executor, federation)
    validation_logits, validation_features = _outputs(model, validation_x)
    beta, intercept = reference.density_ratio_reference(validation_features, _outputs(model, target_x)[1], 1e-3)
    log_weights = validation_features @ beta + intercept
    expected = {
        "score_source_loss": reference.source_loss_score(validation_logits, validation_y),
        "score_iwv": reference.iwv_score(validation_logits, validation_y, log_weights),
        "score_dev": reference.dev_score(validation_logits, validation_y, log_weights),
    }
    _assert_scores(summary, expected)
    # what crossed the wire in the last evaluation: the moments (1 + d + d*d numbers per client), then the ratio
    # (d + 1 numbers) to the sources only; never a feature row
    moments_call, evaluate_call = executor.calls[-2], executor.calls[-1]
    d = config.model.hidden
    for cid, instruction in moments_call[0].items():
        assert instruction.operation == "evaluate" and instruction.values[STAGE] == MOMENTS
        shapes = {key: value.shape for key, value in moments_call[1][cid].tensors.items()}
        assert shapes == {"selection.count": (1,), "selection.sum": (d,), "selection.scatter": (d, d)}
    for cid, instruction in evaluate_call[0].items():
        density = {k: v.shape for k, v in instruction.tensors.items() if k.startswith("selection")}
        sources_get = {"selection.density.beta": (d,), "selection.density.intercept": (1,)}
        assert density == ({} if cid in federation.target_ids else sources_get)
        assert STAGE not in instruction.values and not evaluate_call[1][cid].tensors
    moments_bytes = len(federation.client_ids) * (1 + d + d * d) * 8
    weights_bytes = sum(np.asarray(v).nbytes for v in server.state["weights"].values())
    assert history[-1]["bytes_received_by_stage"]["evaluate"] == moments_bytes
    sent = 2 * len(federation.client_ids) * weights_bytes + len(federation.source_ids) * (d + 1) * 8
    assert history[-1]["bytes_sent_by_stage"]["evaluate"] == sent


def _dictionary_outputs(config, federation, executor) -> dict:
    """Each client's DaDiL-R ("") and DaDiL-E ("E") outputs on its selection inputs, from the predictors its last
    evaluation trained (the same atoms, alpha and seed)."""
    import torch

    from fedsim.methods.dictionary.predictors import evaluate_and_apply

    last_evaluation = executor.calls[-1][0]
    outputs = {}
    for cid in federation.client_ids:
        data, state = executor.host._client(cid), executor.host.private_state(cid)
        x = data.train.x if data.is_target else data.validation.x
        _, outputs[cid] = evaluate_and_apply(
            last_evaluation[cid].tensors,
            state["alpha"],
            state["test_features"],
            data.test.y,
            config.method.params,
            last_evaluation[cid].seed,
            torch.from_numpy(x),
        )
    return outputs


def test_feddadil_reports_the_scores_of_each_predictor(toy_overrides):
    config, federation, executor, server, history, summary = _simulate(
        toy_overrides + SCORE_OVERRIDES + FEDDADIL_FAST + WITH_SND + ["data.validation_fraction=0.2"]
    )
    outputs = _dictionary_outputs(config, federation, executor)
    _, validation_y, _ = _pooled(executor, federation)
    expected = {}
    for predictor, suffix in (("", ""), ("E", "_E")):
        validation = np.concatenate([outputs[cid][predictor] for cid in federation.source_ids])
        target = np.concatenate([outputs[cid][predictor] for cid in federation.target_ids])
        expected.update(_cheap_references(validation, validation_y, target, suffix))
    _assert_scores(summary, expected)
    assert summary["score_entropy"] != summary["score_entropy_E"]  # two predictors, two scores


def test_feddadil_fits_one_density_ratio_per_predictor_on_its_logits(toy_overrides):
    import selection_reference as reference

    config, federation, executor, server, history, summary = _simulate(
        toy_overrides + SCORE_OVERRIDES + FEDDADIL_FAST + ["data.validation_fraction=0.2", "run.scores=iwv,dev"]
    )
    classes = federation.num_classes
    moments = executor.calls[-2][1][federation.target_ids[0]].tensors
    assert {key: value.shape for key, value in moments.items()} == {
        f"{head}.{key}": shape
        for head in ("selection", "selection_E")
        for key, shape in (("count", (1,)), ("sum", (classes,)), ("scatter", (classes, classes)))
    }
    outputs = _dictionary_outputs(config, federation, executor)
    _, validation_y, _ = _pooled(executor, federation)
    expected = {}
    for predictor, suffix in (("", ""), ("E", "_E")):
        validation = np.concatenate([outputs[cid][predictor] for cid in federation.source_ids])
        target = np.concatenate([outputs[cid][predictor] for cid in federation.target_ids])
        beta, intercept = reference.density_ratio_reference(validation, target, 1e-3)
        log_weights = validation @ beta + intercept
        expected[f"score_iwv{suffix}"] = reference.iwv_score(validation, validation_y, log_weights)
        expected[f"score_dev{suffix}"] = reference.dev_score(validation, validation_y, log_weights)
    _assert_scores(summary, expected)


# ---- the target's labels ------------------------------------------------------------------------------------------
FADA_FAST = [
    "method.name=fada",
    "method.target_batch=48",
    "method.gap_samples=48",
    "method.gap_references=2",
    "method.adversarial_steps=2",
    "method.disentangle_steps=2",
]
#: every classification method, on the toy federation (cut down where a round is slow)
GUARDED_METHODS = {
    "centralized": ["method.name=centralized"],
    "dadil": [*FEDDADIL_FAST, "method.name=dadil"],
    "dann": ["method.name=dann"],
    "fada": FADA_FAST,
    "fedavg": [],
    "fedbn": ["method.name=fedbn"],
    "feddadil": FEDDADIL_FAST,
    "feddann": ["method.name=feddann"],
    "fedmmd": ["method.name=fedmmd"],
    "fedprox": ["method.name=fedprox", "method.mu=0.1"],
    "fedrep": ["method.name=fedrep", "method.head_epochs=1"],
    "mmd": ["method.name=mmd"],
}


def test_every_classification_method_is_guarded():
    from fedsim.registry import METHODS

    classification = {name for name in METHODS.names() if METHODS.get(name).task == "classification"}
    assert classification == set(GUARDED_METHODS)


@pytest.mark.parametrize("method", sorted(GUARDED_METHODS))
def test_target_statistics_never_read_a_target_label(toy_overrides, method):
    """Every auto score is reported; the target's training labels do not exist (reading even ``train.y``
    raises), and permuting its test labels leaves every selection statistic it sends as it was."""
    import dataclasses

    from conftest import LabelGuard, RecordingExecutor

    from fedsim.runtime import Server

    overrides = toy_overrides + SCORE_OVERRIDES + GUARDED_METHODS[method] + WITH_SND + ["data.validation_fraction=0.2"]
    config = load_config(None, overrides)
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    server.run_round(1, evaluate=False)
    host, sent = executor.host, {}
    unguarded = {tid: host._client(tid) for tid in federation.target_ids}
    assert all(data.train.y is None for data in unguarded.values())
    for permute in (False, True):
        for tid, data in unguarded.items():
            test_y = np.random.default_rng(tid).permutation(data.test.y) if permute else data.test.y
            test = dataclasses.replace(data.test, y=test_y)
            host._data[tid] = dataclasses.replace(data, train=LabelGuard(data.train.x), test=test)
        ctx = server.context(1)
        ctx.evaluating = True
        metrics = server.method.evaluate_round(ctx, server.state)
        names = ["source_accuracy", "source_loss", "entropy", "snd", "mano"]
        assert all(np.isfinite(metrics[f"score_{name}"]) for name in names), metrics
        replies = executor.calls[-1][1]
        sent[permute] = {tid: replies[tid].metrics for tid in federation.target_ids}
    for tid in federation.target_ids:
        statistics = {k: v for k, v in sent[False][tid].items() if k.startswith("selection")}
        assert statistics and statistics == {k: v for k, v in sent[True][tid].items() if k.startswith("selection")}


# ---- configuration ------------------------------------------------------------------------------------------------
def test_scores_are_checked_when_the_config_is(toy_overrides):
    with pytest.raises(UserError, match="run.scores=bogus: unknown selection score 'bogus'"):
        load_config(None, toy_overrides + ["run.scores=bogus"])
    with pytest.raises(UserError, match="data.validation_fraction=0.2"):
        load_config(None, toy_overrides + ["run.scores=entropy,source_accuracy"])
    assert load_config(None, toy_overrides + ["run.scores=entropy, mano"]).run.scores == "entropy, mano"
    detection = ["data.benchmark=scenes", "data.variant=tiny", "data.target=dusk", "method.name=fedavg_det"]
    with pytest.raises(UserError, match="detection method"):
        load_config(None, detection + ["run.scores=entropy"])
    assert load_config(None, detection).run.scores == "auto"
