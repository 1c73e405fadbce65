"""Differential privacy on what clients send (the ``privacy`` section, ``docs/privacy.md``): the accountant against a
published figure, the clip and the noise, the calibration of a budget, runs that repeat on both backends and
resume, every supported method within its budget, one-line refusals, and privacy off changing nothing."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_results, run_until

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.errors import MissingDependency, UserError
from fedsim.experiments.cli import main
from fedsim.messages import Instruction, Reply
from fedsim.privacy.accountant import calibrate_noise_multiplier, make_accountant, run_event, spent_epsilon
from fedsim.privacy.exchanges import EACH, UNIFORM, WEIGHTED
from fedsim.privacy.mechanism import privatize, update_reference
from fedsim.privacy.protocol import RunPrivacy, reply_noise_stds
from fedsim.registry import METHODS
from fedsim.runtime.checkpoint import load_checkpoint
from fedsim.seeding import numpy_rng

ON = ["privacy.noise_multiplier=1.0", "privacy.clip=1.0"]
VOLATILE = {"round_seconds", "eval_seconds", "client_nodes", "checkpoint_seconds"}


def _run(toy_overrides, *extra, out=None):
    return run_experiment(load_config(None, toy_overrides + ["run.backend=local", *extra]), out)


def _steady(history):
    return [{k: v for k, v in m.items() if k not in VOLATILE} for m in history]


# ---- the accountant ---------------------------------------------------------------------------------------------


def test_rdp_accountant_gives_the_tf_privacy_tutorials_epsilon():
    """DP-SGD on MNIST as in TF Privacy's tutorial (tensorflow/privacy, tutorials/README.md: q = 256/60000,
    z = 1.1, 60 epochs = 14063 steps, delta = 1e-5 "satisfies differential privacy with eps = 3.01"), with the
    classic RDP conversion that figure uses (Mironov 2017, Prop. 3: min over orders of rdp + log(1/delta) / (a-1)).
    dp_accounting's own get_epsilon converts the same curve with the sharper bound of Canonne, Kamath & Steinke
    (2020, Prop. 12), and PLD accounting is tighter still."""
    rounds = [(256 / 60000,)] * math.ceil(60 * 60000 / 256)
    accountant = make_accountant("rdp").compose(run_event(rounds, 1.1))
    classic = float(np.min(accountant.rdp + math.log(1 / 1e-5) / (accountant.orders - 1)))
    assert round(classic, 2) == 3.01
    sharper = spent_epsilon(rounds, 1.1, 1e-5)
    assert sharper == pytest.approx(2.5967, abs=1e-4) and sharper < classic
    assert spent_epsilon(rounds, 1.1, 1e-5, "pld") < sharper


def test_calibration_finds_the_smallest_noise_within_the_budget():
    rounds = [(0.5, 1.0)] * 10  # a sampled sum and an unsampled stage, every round
    z = calibrate_noise_multiplier(rounds, 4.0, 1e-5)
    assert spent_epsilon(rounds, z, 1e-5) <= 4.0 < spent_epsilon(rounds, z - 1e-3, 1e-5)
    unsampled = calibrate_noise_multiplier([(1.0, 1.0)] * 10, 4.0, 1e-5)
    assert unsampled > z  # sampling amplifies: less noise for the same budget
    with pytest.raises(UserError, match="no noised exchange"):
        calibrate_noise_multiplier([()] * 3, 4.0, 1e-5)


# ---- the clip and the noise ---------------------------------------------------------------------------------------


def test_clipping_bounds_the_contribution_and_keeps_small_ones():
    rng = np.random.default_rng(0)
    big = {"w": rng.normal(size=(30, 4)).astype(np.float32), "b": np.full(5, 3.0, np.float32)}
    clipped, norm = privatize(big, None, 2.0, 0.0, np.random.default_rng(1))
    flat = np.concatenate([clipped["b"].ravel(), clipped["w"].ravel()]).astype(np.float64)
    assert norm > 2.0 and np.linalg.norm(flat) == pytest.approx(2.0, rel=1e-6)
    assert clipped["w"].dtype == np.float32 and clipped["w"].shape == (30, 4)
    np.testing.assert_allclose(clipped["w"], big["w"] * (2.0 / norm), rtol=1e-6)
    small = {"w": np.full(4, 0.1, np.float32)}
    kept, _ = privatize(small, None, 2.0, 0.0, np.random.default_rng(1))
    np.testing.assert_array_equal(kept["w"], small["w"])


def test_a_model_update_is_clipped_as_its_difference_from_what_the_server_sent():
    sent = {"w": np.ones((10, 10), np.float32), "bn.num_batches_tracked": np.array(4)}
    reply = {"w": np.ones((10, 10), np.float32) + 1.0, "bn.num_batches_tracked": np.array(9)}
    reference = update_reference(reply, sent)
    assert set(reference) == {"w"}
    out, norm = privatize(reply, reference, 1.0, 0.0, np.random.default_rng(0))
    assert norm == pytest.approx(10.0)  # ||ones(10, 10)||
    np.testing.assert_allclose(out["w"], 1.0 + 0.1, rtol=1e-6)  # sent + the difference scaled to norm 1
    assert int(out["bn.num_batches_tracked"]) == 9  # a step counter passes as it is
    assert update_reference({"features": np.ones((3, 2), np.float32)}, sent) is None  # features: clipped as they are
    assert update_reference({"w": np.ones((5, 20), np.float32)}, sent) is None  # another shape: not an update
    with pytest.raises(UserError, match=r"\['y'\]"):
        privatize({"x": np.ones(3, np.float32), "y": np.arange(3)}, None, 1.0, 1.0, np.random.default_rng(0))


def test_noise_has_the_standard_deviation_asked_and_follows_its_seed():
    zero = {"g": np.zeros(200_000, np.float64)}
    noised, _ = privatize(zero, None, 1.0, 0.7, numpy_rng(3, 2, 5, "fit", 0, "privacy"))
    assert noised["g"].std() == pytest.approx(0.7, rel=0.01) and abs(noised["g"].mean()) < 0.01
    again, _ = privatize(zero, None, 1.0, 0.7, numpy_rng(3, 2, 5, "fit", 0, "privacy"))
    np.testing.assert_array_equal(noised["g"], again["g"])
    other, _ = privatize(zero, None, 1.0, 0.7, numpy_rng(3, 2, 6, "fit", 0, "privacy"))
    assert not np.allclose(noised["g"], other["g"])


def test_central_noise_on_a_weighted_sum_is_z_times_its_sensitivity():
    """DP-FedAvg's noise N(0, z^2 C^2) on the sum, split among the m replies; on FedAvg's mean weighted by sample
    counts w_k the mean's noise is z times its sensitivity to one client, C max(w) / sum(w)."""
    z, clip, weights = 1.3, 0.5, {0: 100.0, 1: 40.0, 2: 10.0}
    stds = reply_noise_stds("central", WEIGHTED, z, clip, weights)
    total = sum(weights.values())
    mean_std = math.sqrt(sum((weights[k] / total) ** 2 * stds[k] ** 2 for k in weights))
    assert mean_std == pytest.approx(z * clip * max(weights.values()) / total)
    uniform = reply_noise_stds("central", UNIFORM, z, clip, weights)
    assert all(s == pytest.approx(z * clip / math.sqrt(3)) for s in uniform.values())
    assert math.sqrt(sum(s**2 for s in uniform.values())) == pytest.approx(z * clip)  # the sum's N(0, z^2 C^2)
    for mode, combined in (("central", EACH), ("local", WEIGHTED), ("local", UNIFORM)):
        assert reply_noise_stds(mode, combined, z, clip, weights) == {k: z * clip for k in weights}


def test_a_reply_is_an_update_of_the_model_sent_earlier_in_the_round(toy_overrides):
    """FADA's target replies with its new w_t to an instruction that carries the sources' deltas: its contribution
    is the difference from the w_t the server sent in the round's fit."""
    config = load_config(None, toy_overrides + ["method.name=fada", "run.backend=local", *ON])
    federation = build_federation(config.data)
    privacy = RunPrivacy(config, federation, METHODS.get("fada")(config, federation))
    round_privacy = privacy.round(1)
    model = {"layer.weight": np.zeros((4, 4), np.float32)}
    fit = {cid: Instruction("fit", model, round=1) for cid in federation.source_ids}
    round_privacy.protect("fit", fit, {cid: Reply(cid, {}, {"train_loss": 1.0}) for cid in fit})
    tid = federation.target_ids[0]
    update = {tid: Instruction("update", {"0:layer.weight": np.ones((4, 4), np.float32)}, round=1)}
    new_model = {"layer.weight": np.full((4, 4), 5.0, np.float32)}
    out = round_privacy.protect("update", update, {tid: Reply(tid, new_model)})[tid]
    rng = numpy_rng(config.run.seed, 1, tid, "update", 0, "privacy")
    expected = 5.0 / 20.0 + 1.0 * rng.standard_normal(16).reshape(4, 4)  # ||5 * ones(4, 4)|| = 20, clipped to 1
    np.testing.assert_allclose(out.tensors["layer.weight"], expected.astype(np.float32), rtol=1e-6)
    assert round_privacy.rates == [1.0]  # fit carried no tensor: only the update is accounted


# ---- runs ---------------------------------------------------------------------------------------------------------


def test_a_private_run_repeats_its_numbers_and_spends_more_each_round(toy_overrides):
    plain = _run(toy_overrides, "run.rounds=3")
    first, second = (_run(toy_overrides, "run.rounds=3", *ON) for _ in range(2))
    assert_same_results(first, second, ("target_accuracy", "source_accuracy", "privacy_epsilon"))
    assert _steady(first.history) == _steady(second.history)
    spent = [m["privacy_epsilon"] for m in first.history]
    assert 0 < spent[0] < spent[1] < spent[2] == first.summary["privacy_epsilon"]
    expected = spent_epsilon([(1.0,)] * 3, 1.0, 1e-5)  # every source, every round: three Gaussians
    assert first.summary["privacy_epsilon"] == pytest.approx(expected)
    assert first.summary["privacy_noise_multiplier"] == 1.0 and first.summary["privacy_delta"] == 1e-5
    assert all(m["privacy_exchanges"] == 1 for m in first.history)
    assert any(not np.allclose(first.global_tensors[k], plain.global_tensors[k]) for k in plain.global_tensors)
    assert not any(k.startswith("privacy_") for m in plain.history for k in m)


def test_only_the_central_mode_counts_the_sampling(toy_overrides):
    """Two of four sources per round: the central mode accounts a Poisson-subsampled Gaussian (q = 1/2), the local
    one a plain Gaussian (the server sees who sent each reply), with noise z C on every reply."""
    sampled = ["data.clients_per_domain=2", "run.clients_per_round=2", *ON]
    central = _run(toy_overrides, *sampled)
    local = _run(toy_overrides, *sampled, "privacy.mode=local")
    assert central.summary["privacy_epsilon"] == pytest.approx(spent_epsilon([(0.5,)] * 2, 1.0, 1e-5))
    assert local.summary["privacy_epsilon"] == pytest.approx(spent_epsilon([(1.0,)] * 2, 1.0, 1e-5))
    assert central.summary["privacy_epsilon"] < local.summary["privacy_epsilon"]
    assert any(not np.allclose(central.global_tensors[k], local.global_tensors[k]) for k in local.global_tensors)


def test_privacy_off_leaves_every_number_as_recorded(tmp_path):
    """The default: no privacy object, and FedAvg's golden case gives its recorded numbers."""
    from tools.golden import differences, record_case

    recorded = json.loads((Path(__file__).parent / "golden" / "summaries.json").read_text())
    actual = json.loads(json.dumps(record_case("fedavg", "local", tmp_path)))
    assert differences(recorded["fedavg/local"], actual, "fedavg") == []
    assert not any(k.startswith("privacy_") for k in actual["summary"])


@pytest.mark.parametrize(
    "method, extra",
    [
        ("fedavg", ["data.clients_per_domain=2", "run.clients_per_round=2"]),
        ("feddann", ["privacy.stage_clip={features: 20}"]),
        (
            "fada",
            [
                "method.target_batch=48",
                "method.gap_samples=48",
                "method.gap_references=2",
                "method.adversarial_steps=2",
                "method.disentangle_steps=2",
                "privacy.clip=0.01",
                "privacy.stage_clip={features: 1, adversarial: 0.1}",
            ],
        ),
        ("feddadil", ["method.samples_per_atom=40", "method.batch_size=20", "method.classifier_steps=30"]),
    ],
)
def test_a_method_spends_at_most_its_budget(toy_overrides, method, extra):
    budget = ["privacy.epsilon=4", "privacy.delta=1e-5", "privacy.clip=1.0"]
    result = _run(toy_overrides, f"method.name={method}", *budget, *extra)
    spent = [m["privacy_epsilon"] for m in result.history]
    assert spent == sorted(spent) and 0 < spent[-1] <= 4.0
    assert spent[-1] == pytest.approx(4.0, rel=1e-3)  # the calibration spends the budget, not far less
    assert result.summary["privacy_epsilon"] == spent[-1]


def test_resuming_a_private_run_keeps_its_ledger_and_numbers(toy_overrides, tmp_path):
    config = load_config(None, toy_overrides + ["run.rounds=3", "run.checkpoint_every=1", "run.backend=local", *ON])
    full = run_experiment(config, tmp_path / "full")
    run_until(config, tmp_path / "partial", 3)
    resumed = run_experiment(config, tmp_path / "partial", resume=load_checkpoint(tmp_path / "partial"))
    assert_same_results(full, resumed, ("target_accuracy", "privacy_epsilon", "privacy_noise_multiplier"))


def test_both_backends_give_the_same_noise(toy_overrides, ray_cluster, tmp_path):
    """The noise is drawn where the server runs, from the seed alone."""
    results = {}
    for backend in ("local", "ray"):
        config = load_config(None, toy_overrides + [f"run.backend={backend}", *ON])
        results[backend] = run_experiment(config, tmp_path / backend)
    assert_same_results(results["local"], results["ray"], ("target_accuracy", "privacy_epsilon", "bytes_sent"))
    assert _steady(results["local"].history) == _steady(results["ray"].history)


# ---- refusals -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--method", "centralized"], "privacy cannot apply to method 'centralized': it is a centralized reference"),
        (["--method", "fedod"], "privacy cannot apply to method 'fedod': it is a detection method"),
        (["--set", "privacy.stages=evaluate"], "privacy.stages names 'evaluate', an evaluation stage"),
        (["--method", "feddadil", "--set", "privacy.stages=feature_stats"], "sends the sample count there"),
        (["--set", "privacy.epsilon=2"], "two ways to set the noise: give one, not both"),
    ],
)
def test_a_refused_setting_exits_2_with_one_line(toy_overrides, tmp_path, capsys, flags, expected):
    out = tmp_path / "run"
    sets = [arg for override in toy_overrides + ON for arg in ("--set", override)]
    code = main(["run", "-q", "--backend", "local", "--out", str(out), *sets, *flags])
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_without_dp_accounting_privacy_says_what_to_install(toy_overrides, monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # as if it were not installed
    with pytest.raises(MissingDependency, match="pip install -c constraints.txt dp-accounting"):
        load_config(None, toy_overrides + ["run.backend=local", *ON])
    assert not load_config(None, toy_overrides + ["run.backend=local"]).privacy.active  # off: not needed
