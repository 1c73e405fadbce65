"""Unreliable clients (the ``clients`` section): availability and failures drawn from the seed, the simulated
clock and its deadline, a round without sources, and one-line errors for bad settings."""

import json

import numpy as np
import pytest
from conftest import assert_same_results

from fedsim.api import run_experiment
from fedsim.config import build_config, load_config
from fedsim.data.scenario import build_federation
from fedsim.errors import UserError
from fedsim.experiments.cli import main
from fedsim.runtime.unreliable import MEGABIT, client_speeds, read_availability_trace, read_speed_trace
from fedsim.seeding import numpy_rng

SEED = 5
SIX_SOURCES = ["data.clients_per_domain=3", f"run.seed={SEED}", "run.backend=local"]  # sources 0-2 and 6-8


def _run(toy_overrides, *extra, out=None):
    config = load_config(None, toy_overrides + SIX_SOURCES + list(extra))
    return config, run_experiment(config, out)


def _model_bytes(result) -> int:
    return sum(int(np.asarray(t).nbytes) for t in result.global_tensors.values())


def test_availability_draws_follow_the_seed(toy_overrides):
    config, result = _run(toy_overrides, "run.rounds=3", "clients.availability=0.5")
    sources = build_federation(config.data).source_ids
    assert sources == [0, 1, 2, 6, 7, 8]
    for rnd, metrics in enumerate(result.history, start=1):
        away = [c for c in sources if not numpy_rng(SEED, "availability", rnd, c).random() < 0.5]
        assert metrics["clients_missing"] == {str(c): "unavailable" for c in away}
        assert (metrics["clients_unavailable"], metrics["clients_answered"]) == (len(away), 6 - len(away))
        assert sorted(metrics["train_loss"]) == [str(c) for c in sources if c not in away]
        assert metrics["bytes_sent_by_stage"]["fit"] == (6 - len(away)) * _model_bytes(result)


def test_failed_replies_are_lost_and_the_run_finishes(toy_overrides):
    config, result = _run(toy_overrides, "run.rounds=3", "clients.failure_rate=0.4")
    sources, model = build_federation(config.data).source_ids, _model_bytes(result)
    assert result.summary["rounds"] == 3
    for rnd, metrics in enumerate(result.history, start=1):
        failed = [c for c in sources if numpy_rng(SEED, "failure", rnd, c, "fit", 0).random() < 0.4]
        assert metrics["clients_missing"] == {str(c): "failed" for c in failed}
        assert (metrics["clients_failed"], metrics["clients_answered"]) == (len(failed), 6 - len(failed))
        assert sorted(metrics["train_loss"]) == [str(c) for c in sources if c not in failed]
        # a failed client received its instruction; its reply never came
        assert metrics["bytes_sent_by_stage"]["fit"] == 6 * model
        assert metrics["bytes_received_by_stage"]["fit"] == (6 - len(failed)) * model


def test_waiting_for_failed_clients_keeps_the_numbers_and_costs_time_and_bytes(toy_overrides):
    _, steady = _run(toy_overrides, "clients.clock=true")
    _, waited = _run(toy_overrides, "clients.failure_rate=0.4", "clients.on_failure=wait")
    assert_same_results(steady, waited, ("target_accuracy", "source_accuracy"))
    model = _model_bytes(steady)
    retried = [m["failed_attempts"] for m in waited.history]
    assert sum(retried) > 0 and [m["failed_attempts"] for m in steady.history] == [0, 0]
    for quiet, busy, again in zip(steady.history, waited.history, retried):
        assert busy["bytes_sent"] - quiet["bytes_sent"] == again * model
        assert busy["clients_answered"] == quiet["clients_answered"] == 6
        assert busy["virtual_seconds"] >= quiet["virtual_seconds"]
    for result in (steady, waited):  # the summary holds the whole run's simulated time
        assert result.summary["virtual_seconds"] == pytest.approx(sum(m["virtual_seconds"] for m in result.history))


def _speeds_file(tmp_path) -> str:
    speeds = {"0": {"speed": 1.0}, "1": {"speed": 0.1}, "2": {"speed": 2.0}, "6": {"speed": 0.2}}
    path = tmp_path / "speeds.json"
    path.write_text(json.dumps(speeds))
    return str(path)


def test_the_deadline_drops_the_sources_the_clock_makes_late(toy_overrides, tmp_path):
    clock = [f"clients.speed_trace={_speeds_file(tmp_path)}", "clients.seconds_per_sample=0.01", "run.rounds=1"]
    config, open_ended = _run(toy_overrides, *clock)
    federation, model = build_federation(config.data), _model_bytes(open_ended)
    speeds = {0: 1.0, 1: 0.1, 2: 2.0, 6: 0.2, 7: 1.0, 8: 1.0}
    seconds = {
        c: federation.info(c).num_train * 0.01 / speed + 2 * model / (100 * MEGABIT) for c, speed in speeds.items()
    }
    assert open_ended.history[0]["virtual_seconds"] == pytest.approx(max(seconds.values()), rel=1e-12)
    late = sorted(c for c, s in seconds.items() if s > 1.0)
    assert late == [1, 6]  # speeds 0.1 and 0.2: several seconds; the others well under one
    _, cut = _run(toy_overrides, *clock, "clients.deadline_seconds=1.0")
    metrics = cut.history[0]
    assert metrics["clients_missing"] == {"1": "late", "6": "late"} and metrics["stragglers_dropped"] == 2
    assert sorted(metrics["train_loss"]) == ["0", "2", "7", "8"]
    assert metrics["virtual_seconds"] == 1.0  # the call ended at the deadline
    assert metrics["bytes_received_by_stage"]["fit"] == 4 * model  # a late reply is not received


def test_a_round_without_sources_leaves_the_model_as_it_was(toy_overrides, tmp_path):
    trace = tmp_path / "available.csv"
    trace.write_text("round,client\n2,3\n2,4\n2,5\n")  # round 2: only the target's clients (3-5)
    _, once = _run(toy_overrides, "run.rounds=1")
    _, skipped = _run(toy_overrides, f"clients.availability_trace={trace}")
    first, second = skipped.history
    assert first["clients_answered"] == 6 and first["clients_missing"] == {}
    assert second["aggregation_skipped"] is True and second["clients_answered"] == 0
    assert second["clients_missing"] == {str(c): "unavailable" for c in (0, 1, 2, 6, 7, 8)}
    assert second["evaluated"] is True and "fit" not in second["bytes_sent_by_stage"]
    for name, tensor in once.global_tensors.items():
        np.testing.assert_array_equal(tensor, skipped.global_tensors[name], err_msg=name)


def test_speeds_are_drawn_from_the_seed_and_a_trace_replaces_them(toy_overrides, tmp_path):
    config = load_config(
        None, toy_overrides + ["clients.speed_spread=0.5", f"clients.speed_trace={_speeds_file(tmp_path)}"]
    )
    speeds = client_speeds(config.clients, [0, 1, 2], 11)
    assert speeds == client_speeds(config.clients, [0, 1, 2], 11) != client_speeds(config.clients, [0, 1, 2], 12)
    drawn = np.exp(numpy_rng(11, "client-speed", 0).normal(0.0, 0.5, 2))
    assert (speeds[0].compute, speeds[0].link_mbps) == (1.0, pytest.approx(100 * drawn[1], rel=1e-12))
    assert speeds[1].compute == 0.1 and speeds[2].compute == 2.0


def test_trace_files_are_read_or_refused_in_one_line(tmp_path):
    (tmp_path / "a.json").write_text('{"1": [0, 2], "3": []}')
    assert read_availability_trace(str(tmp_path / "a.json")) == {1: frozenset({0, 2}), 3: frozenset()}
    (tmp_path / "s.csv").write_text("client,speed,link_mbps\n4,0.5,20\n")
    assert read_speed_trace(str(tmp_path / "s.csv")) == {4: {"speed": 0.5, "link_mbps": 20.0}}
    (tmp_path / "bad.csv").write_text("round,clients\n1,0\n")
    with pytest.raises(UserError, match=r"must have the header round,client, got \['round', 'clients'\]"):
        read_availability_trace(str(tmp_path / "bad.csv"))
    (tmp_path / "bad.json").write_text('{"0": {"speed": -1}}')
    with pytest.raises(UserError, match="-1 is not a positive finite number"):
        read_speed_trace(str(tmp_path / "bad.json"))
    (tmp_path / "inf.json").write_text('{"0": {"speed": "inf"}}')
    with pytest.raises(UserError, match="'inf' is not a positive finite number"):
        read_speed_trace(str(tmp_path / "inf.json"))
    (tmp_path / "huge.json").write_text('{"1e400": [0]}')
    with pytest.raises(UserError, match="'1e400' is not a round or client id"):
        read_availability_trace(str(tmp_path / "huge.json"))


@pytest.mark.parametrize(
    "settings, expected",
    [
        (["clients.failure_rate=1.5"], "clients.failure_rate must be in [0, 1), got 1.5"),
        (["clients.availability=0"], "clients.availability must be in (0, 1], got 0.0"),
        (["clients.on_failure=retry"], "clients.on_failure must be 'drop' or 'wait', got 'retry'"),
        (["clients.deadline_seconds=-1"], "clients.deadline_seconds must be positive, got -1.0"),
        (["clients.speed_trace=speeds.txt"], "clients.speed_trace must name a .csv or .json file"),
        (["clients.availability_trace=/nowhere/a.csv"], "clients.availability_trace '/nowhere/a.csv' does not exist"),
        (["method.name=fada", "clients.availability=0.5"], "method 'fada' needs every reply it asks for"),
    ],
)
def test_a_bad_setting_exits_with_one_line(settings, expected, toy_overrides, tmp_path, capsys):
    out = tmp_path / "never"
    flags = [flag for item in toy_overrides + settings for flag in ("--set", item)]
    code = main(["run", "-q", "--backend", "local", "--out", str(out)] + flags)
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_unreliable_clients_are_equal_on_both_backends(toy_overrides, ray_cluster, tmp_path):
    """Availability, failures, speeds and the deadline are drawn where the server runs, from the seed alone."""
    settings = [
        "data.clients_per_domain=2",
        "clients.availability=0.7",
        "clients.failure_rate=0.3",
        "clients.speed_spread=1.0",
        "clients.seconds_per_sample=0.01",
        "clients.deadline_seconds=0.5",
    ]
    results = {}
    for backend in ("local", "ray"):
        config = load_config(None, toy_overrides + settings + [f"run.backend={backend}", f"run.seed={SEED}"])
        results[backend] = run_experiment(config, tmp_path / backend)
    assert_same_results(results["local"], results["ray"], ("target_accuracy", "source_accuracy", "bytes_sent"))
    volatile = {"round_seconds", "eval_seconds", "client_nodes"}
    local, ray = ([{k: v for k, v in m.items() if k not in volatile} for m in r.history] for r in results.values())
    assert local == ray
    assert sum(len(m["clients_missing"]) for m in local) > 0  # the settings do drop sources


def test_dropout_is_the_complement_of_availability():
    """``clients.dropout=0.2`` is ``clients.availability=0.8``; both at once, or a dropout outside [0, 1), fails."""
    assert (
        build_config({"clients": {"dropout": 0.2}}).clients == build_config({"clients": {"availability": 0.8}}).clients
    )
    with pytest.raises(UserError, match="give one"):
        build_config({"clients": {"dropout": 0.2, "availability": 0.8}})
    for bad in (1, -0.1, "a lot"):
        with pytest.raises(UserError, match=r"clients.dropout must be a number in \[0, 1\)"):
            build_config({"clients": {"dropout": bad}})
