"""`fedsim sweep`: the grid, trial resources, bad input (one line, nothing written), and a real
Tune sweep on the toy federation that is interrupted and resumed."""

import csv
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from fedsim.config import load_config
from fedsim.errors import UserError
from fedsim.experiments.cli import build_parser, main
from fedsim.experiments.sweep_grid import point_key, spec_from_args
from fedsim.experiments.sweep_trial import (
    TRIAL_CPUS,
    TrialPlan,
    TrialResources,
    TuneReport,
    flatten,
    plan_trial,
    summary_row,
)


def _flags(overrides, drop=()):
    flags = []
    for item in overrides:
        if item.split("=", 1)[0] not in drop:
            flags += ["--set", item]
    return flags


def _spec(argv):
    return spec_from_args(build_parser().parse_args(["sweep"] + argv))


def test_grid_from_flags_and_set_lists(toy_overrides):
    spec = _spec(
        [
            "--methods",
            "fedavg,fedprox",
            "--local-epochs",
            "1,5",
            "--seeds",
            "0,1",
            "--set",
            "method.lr=0.01,0.1",
            "--set",
            "method.batch_size=8",
            "--cpus-per-client",
            "0.5",
        ]
        + _flags(toy_overrides, drop=("method.lr", "method.batch_size"))
    )
    assert list(spec.axes) == ["method.name", "method.local_epochs", "run.seed", "method.lr"]
    assert spec.axes["method.lr"] == [0.01, 0.1]
    assert "method.batch_size=8" in spec.overrides and "resources.cpus_per_client=0.5" in spec.overrides
    points = spec.points()
    assert len(points) == 2 * 2 * 2 * 2
    assert {p["method.name"] for p in points} == {"fedavg", "fedprox"}
    config = spec.config_for(points[-1])
    assert (config.method.name, config.method.local_epochs, config.run.seed, config.method.lr) == ("fedprox", 5, 1, 0.1)
    assert config.method.batch_size == 8 and config.resources.cpus_per_client == 0.5


def test_single_values_and_defaults_come_from_the_config(toy_overrides):
    spec = _spec(_flags(toy_overrides))
    assert spec.axes == {"method.name": ["fedavg"], "method.local_epochs": [1], "run.seed": [0]}
    assert len(spec.points()) == 1


def test_a_methods_own_parameter_applies_to_its_trials_only(toy_overrides, tmp_path):
    spec = _spec(["--methods", "fedavg,fedprox", "--set", "fedprox.mu=0.5"] + _flags(toy_overrides))
    configs = {p["method.name"]: spec.config_for(p) for p in spec.points()}
    assert configs["fedprox"].method.params.mu == 0.5
    assert not hasattr(configs["fedavg"].method.params, "mu")
    # a YAML file for fedprox (with its mu): adding fedavg to the sweep is one word in --methods
    yaml_file = tmp_path / "fedprox.yaml"
    yaml_file.write_text("method:\n  name: fedprox\n  mu: 0.3\n  lr: 0.02\n")
    spec = _spec(
        ["--config", str(yaml_file), "--methods", "fedavg,fedprox"] + _flags(toy_overrides, drop=("method.lr",))
    )
    configs = {p["method.name"]: spec.config_for(p) for p in spec.points()}
    assert (
        configs["fedprox"].method.params.mu == 0.3
        and configs["fedavg"].method.lr == configs["fedprox"].method.lr == 0.02
    )
    spec = _spec(["--config", str(yaml_file)] + _flags(toy_overrides, drop=("method.lr",)))
    assert spec.axes["method.name"] == ["fedprox"]


BAD_SWEEPS = [
    (["--methods", "fedavg,fedprox", "--set", "method.mu=0.1"], "unknown config key 'method.mu' for method 'fedavg'"),
    (["--set", "fedprx.mu=0.1"], "unknown config section or method 'fedprx'"),
    (["--methods", "fedavg,fedprox", "--set", "fedprox.mu=0.1,0.2"], "takes one value"),
    (["--methods", "fedavg,fedavgg"], "unknown method 'fedavgg': did you mean 'fedavg'?"),
    (["--methods", "fedavg,,fedprox"], "bad list for --methods"),
    (["--local-epochs", "1,x"], "--local-epochs must be an integer of 1 or more, got 'x'"),
    (["--seeds", "0,0"], "lists '0' twice"),
    (["--local-epochs", "0"], "--local-epochs must be an integer of 1 or more, got '0'"),
    (["--local-epochs", "1,-1"], "--local-epochs must be an integer of 1 or more, got '-1'"),
    (["--seeds", "0,-1"], "--seeds must be an integer of 0 or more, got '-1'"),
    (["--cpus-per-client", "0.5,0"], "--cpus-per-client must be a number above 0, got '0'"),
    (["--rounds", "0"], "--rounds must be an integer of 1 or more, got '0'"),
    (["--set", "method.lrr=0.1,0.2"], "did you mean 'lr'"),
    (["--set", "run.backend=local"], "every trial runs on the Ray backend"),
    (["--rounds", "2,3"], "sweep it with --set run.rounds=2,3"),
    (["--methods", "fedavg", "--set", "method.name=fedprox"], "given twice"),
    (["--target", "svhn"], "unknown target domain"),
    (["--target", "dom1", "--set", "data.target=dom2"], "data.target given twice (--target and --set)"),
    (["--address", "127.0.0.1:1"], "cannot reach a Ray cluster at 127.0.0.1:1"),
    (["--resume"], "--resume takes the grid from the sweep's sweep.json: drop --set"),
    (["--set", "clients.availability_trace=/nonexistent/trace.json"], "does not exist: name an existing .csv or .json"),
]


@pytest.mark.parametrize("args, expected", BAD_SWEEPS)
def test_bad_input_one_line_exit_2_nothing_written(args, expected, toy_overrides, tmp_path, capsys):
    out = tmp_path / "never"
    drop = ("run.rounds", "data.target") if "--target" in args else ("run.rounds",)
    code = main(["sweep", "-q", "--out", str(out)] + _flags(toy_overrides, drop=drop) + args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_resume_needs_an_existing_sweep(tmp_path, capsys):
    assert main(["sweep", "--resume"]) == 2
    assert "--resume needs --out DIR" in capsys.readouterr().err
    assert main(["sweep", "--resume", "--out", str(tmp_path)]) == 2
    assert "holds no sweep (sweep.json missing)" in capsys.readouterr().err


def test_trial_plan_fits_the_cluster(toy_overrides):
    config = load_config(None, toy_overrides + ["resources.cpus_per_client=0.5"])
    assert plan_trial(config, 3, {"CPU": 2.0}) == TrialPlan(3, 0.5, 0.0)
    assert plan_trial(config, 3, {"CPU": 1.0}) == TrialPlan(1, 0.5, 0.0)  # 0.1 + 1 x 0.5 fits, 2 would not
    capped = load_config(None, toy_overrides + ["resources.cpus_per_client=0.5", "ray.max_actors=2"])
    assert plan_trial(capped, 3, {"CPU": 8.0}).actors == 2
    gpu = load_config(None, toy_overrides + ["resources.cpus_per_client=1", "resources.gpus_per_client=0.25"])
    assert plan_trial(gpu, 8, {"CPU": 16.0, "GPU": 1.0}) == TrialPlan(4, 1.0, 0.25)  # 4 actors share one GPU
    assert plan_trial(gpu, 8, {"CPU": 16.0}) == TrialPlan(8, 1.0, 0.0)  # no GPU in the cluster: CPU bundles
    assert TrialPlan(2, 1.0, 0.25).bundles() == [
        {"CPU": TRIAL_CPUS},
        {"CPU": 1.0, "GPU": 0.25},
        {"CPU": 1.0, "GPU": 0.25},
    ]
    big = load_config(None, toy_overrides + ["resources.cpus_per_client=4"])
    with pytest.raises(UserError, match="lower --cpus-per-client"):
        plan_trial(big, 3, {"CPU": 2.0})


def test_trial_resources_is_a_placement_group_factory():
    from ray import tune

    point = {"method.name": "fedavg", "method.local_epochs": 1, "run.seed": 0}
    factory = TrialResources({point_key(point): TrialPlan(2, 0.5, 0.25)})(
        {"config_file": None, "overrides": [], **point}
    )
    assert isinstance(factory, tune.PlacementGroupFactory)
    assert factory.bundles == [{"CPU": TRIAL_CPUS}, {"CPU": 0.5, "GPU": 0.25}, {"CPU": 0.5, "GPU": 0.25}]
    assert factory.required_resources == {"CPU": TRIAL_CPUS + 1.0, "GPU": 0.5}


def test_tune_report_flattens_rounds_and_keeps_totals():
    rows = []
    callback = TuneReport(report=rows.append)
    callback.on_run_start(None)
    for rnd in (1, 2):
        placement = {"client_nodes": ["b", "a", "b"]} if rnd == 1 else {}  # the first round records where clients run
        callback.on_round_end(
            None,
            {
                "round": rnd,
                "train_loss": {"0": 0.5},
                "source_accuracy": {"usps": 0.9},
                "target_accuracy": 0.7,
                "bytes_sent": 10,
                "bytes_received": 4,
                **placement,
            },
        )
    assert rows[1]["source_accuracy/usps"] == 0.9 and rows[1]["train_loss/0"] == 0.5
    assert (rows[0]["bytes_sent_total"], rows[1]["bytes_sent_total"], rows[1]["bytes_received_total"]) == (10, 20, 8)
    assert rows[1]["client_nodes"] == "a,b"
    assert flatten({"a": {"b": {"c": 1}}, "d": None}) == {"a/b/c": 1}


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_sweep_interrupted_then_resumed(toy_overrides, tmp_path, ray_cluster, capsys):
    """Two trials one after another (1.1 CPUs each on 2). A Ctrl-C-like stop as soon as the second trial
    starts its run (so the first one has returned and been recorded) leaves the second unfinished;
    --resume finishes it without running the first again. The second trial runs 40 rounds, so it is still
    running when the stop arrives however fast its actors start."""
    out = tmp_path / "sweep"
    args = [
        "sweep",
        "-q",
        "--out",
        str(out),
        "--set",
        "run.rounds=2,40",
        "--cpus-per-client",
        "1",
        "--set",
        "ray.max_actors=1",
    ] + _flags(toy_overrides, drop=("run.rounds",))
    stop = threading.Event()

    def interrupt_after_first_trial():
        while not stop.is_set():
            if len(list(out.glob("runs/*"))) >= 2:  # the second trial's run directory: it has just started
                os.kill(os.getpid(), signal.SIGUSR1)  # Tune stops on SIGINT or SIGUSR1 and saves its state
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=interrupt_after_first_trial, daemon=True)
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)  # a late signal must never end pytest
    watcher.start()
    try:
        assert main(args) == 1
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)
    err = capsys.readouterr().err
    assert f"continue with 'fedsim sweep --resume --out {out}'" in err
    first = _rows(out / "results.csv")
    assert [r["status"] for r in first] == ["finished", "interrupted"] or [r["status"] for r in first] == [
        "finished",
        "pending",
    ]
    finished_before = {r["trial_id"]: r for r in first if r["status"] == "finished"}

    assert main(["sweep", "-q", "--resume", "--out", str(out)]) == 0
    rows = _rows(out / "results.csv")
    assert [r["status"] for r in rows] == ["finished"] * 2
    assert [r["rounds"] for r in rows] == ["2", "40"]
    for row in rows:
        assert (row["method"], row["local_epochs"], row["seed"]) == ("fedavg", "1", "0")
        assert 0 <= float(row["target_accuracy"]) <= 1 and int(row["bytes_sent"]) > 0 and float(row["wall_seconds"]) > 0
        assert row["client_nodes"]
        if row["trial_id"] in finished_before:  # a finished trial is not run again
            assert row["wall_seconds"] == finished_before[row["trial_id"]]["wall_seconds"]
    rounds = _rows(out / "rounds.csv")
    assert sorted((r["trial_id"], r["round"]) for r in rounds) == sorted(
        (r["trial_id"], str(k)) for r in rows for k in range(1, int(r["rounds"]) + 1)
    )
    report = (out / "report.md").read_text()
    assert "| method | local_epochs | run.rounds | seeds | target accuracy" in report
    for name in ("accuracy_per_round.png", "accuracy_vs_local_epochs.png", "accuracy_vs_bytes.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "tune").is_dir() and any(Path(out / "tune").glob("*/result.json"))
    for row in rows:  # each trial's own run directory
        assert json.loads((out / "runs" / row["trial_id"] / "summary.json").read_text())["method"] == "fedavg"
    assert main(["sweep", "-q", "--out", str(out)] + _flags(toy_overrides)) == 2  # no silent overwrite
    assert "already holds a sweep: pass --resume" in capsys.readouterr().err


def test_summary_row_carries_every_number_of_the_summary():
    summary = {
        "rounds": 3,
        "target_accuracy": 0.5,
        "source_accuracy": {"a": 0.25, "b": 0.75},
        "backend": "ray",
        "final_detection": {"wg": {"A_com": 0.3, "clients": {"1": {"s": 0.1}}}},
        "bytes_sent": 10,
    }
    row = summary_row(summary, "n1")
    assert row["summary/final_detection/wg/A_com"] == 0.3 and row["summary/final_detection/wg/clients/1/s"] == 0.1
    assert row["summary/source_accuracy/b"] == 0.75 and row["summary/mean_source_accuracy"] == 0.5
    assert row["summary/rounds"] == 3 and row["client_nodes"] == "n1" and "summary/backend" not in row


def test_a_local_trial_reserves_one_bundle(toy_overrides):
    config = load_config(None, toy_overrides + ["resources.cpus_per_client=0.5"])
    assert plan_trial(config, 3, {"CPU": 2.0}, backend="local") == TrialPlan(0, 0.5, 0.0)
    assert TrialPlan(0, 0.5, 0.0).bundles() == [{"CPU": 0.5}]
    with pytest.raises(UserError, match="lower it"):
        plan_trial(load_config(None, toy_overrides + ["resources.cpus_per_client=4"]), 3, {"CPU": 2.0}, backend="local")
