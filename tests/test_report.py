"""`fedsim report DIR`: run directories, directories of runs and sweep directories -> report.md + PNG plots."""

import json

import numpy as np
import pytest
from matplotlib.image import imread

from fedsim.experiments.cli import main
from fedsim.experiments.report import load_records, markdown_table
from fedsim.experiments.report_plots import PLOTS
from fedsim.experiments.sweep_results import write_results


def _flags(overrides):
    flags = []
    for item in overrides:
        flags += ["--set", item]
    return flags


def _record(trial, method, epochs, seed, accuracies, step_bytes=100, wall=2.0):
    total, history = 0, []
    for rnd, acc in enumerate(accuracies, start=1):
        total += step_bytes
        history.append({"round": rnd, "target_accuracy": acc, "mean_source_accuracy": 0.9, "bytes_total": total})
    return {
        "trial_id": trial,
        "status": "finished",
        "params": {"method": method, "local_epochs": epochs, "seed": seed},
        "benchmark": "digits",
        "target": "usps",
        "rounds": len(accuracies),
        "target_accuracy": accuracies[-1],
        "mean_source_accuracy": 0.9,
        "bytes_sent": total - 40,
        "bytes_received": 40,
        "wall_seconds": wall,
        "client_nodes": "n1",
        "history": history,
    }


def _assert_pngs(folder):
    for name in PLOTS:
        image = imread(folder / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert np.ptp(image[..., :3]) > 0, f"{name} is blank"


def test_sweep_directory_report_means_and_std_over_seeds(tmp_path, capsys):
    records = [
        _record("t0", "fedavg", 1, 0, [0.5, 0.6]),
        _record("t1", "fedavg", 1, 1, [0.5, 0.8]),
        _record("t2", "fedavg", 5, 0, [0.7, 0.9]),
        _record("t3", "fedavg", 5, 1, [0.6, 0.7]),
        _record("t4", "fedprox", 1, 0, [0.4, 0.5]),
        _record("t5", "fedprox", 1, 1, [0.4, 0.5]),
    ]
    write_results(tmp_path, records)
    assert main(["report", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    report = (tmp_path / "report.md").read_text()
    assert "| method | local_epochs | seeds | target accuracy |" in report
    # fedavg E=1: mean(0.6, 0.8) = 0.7, sample std = 0.1414; fedprox: std 0
    assert "| fedavg | 1 | 0,1 | 0.7000 ± 0.1414 |" in report
    assert "| fedavg | 5 | 0,1 | 0.8000 ± 0.1414 |" in report
    assert "| fedprox | 1 | 0,1 | 0.5000 ± 0.0000 |" in report
    assert "fedavg | 1 | 0,1 | 0.7000 ± 0.1414" in printed
    for name in PLOTS:
        assert f"]({name})" in report
    _assert_pngs(tmp_path)
    kind, loaded = load_records(tmp_path)
    assert kind == "sweep" and [r["trial_id"] for r in loaded] == [f"t{i}" for i in range(6)]
    assert loaded[1]["history"][-1] == {
        "round": 2,
        "target_accuracy": 0.8,
        "mean_source_accuracy": 0.9,
        "bytes_total": 200,
    }


def test_unfinished_trials_are_listed_not_averaged(tmp_path):
    records = [_record("a", "fedavg", 1, 0, [0.5]), _record("b", "fedavg", 1, 1, [0.9])]
    records[1].update(status="interrupted", target_accuracy=None)
    table = markdown_table(records)
    assert "| fedavg | 1 | 0 | 0.5000 |" in table


def test_run_directory_and_directory_of_runs(toy_overrides, tmp_path, capsys):
    runs = tmp_path / "runs"
    for epochs in (1, 2):
        out = runs / f"e{epochs}"
        assert (
            main(
                ["run", "-q", "--backend", "local", "--out", str(out), "--local-epochs", str(epochs)]
                + _flags(toy_overrides)
            )
            == 0
        )
    assert main(["report", str(runs / "e1")]) == 0
    summary = json.loads((runs / "e1" / "summary.json").read_text())
    report = (runs / "e1" / "report.md").read_text()
    assert f"| fedavg | 1 | 0 | {summary['target_accuracy']:.4f} |" in report
    _assert_pngs(runs / "e1")
    elsewhere = tmp_path / "elsewhere"
    assert main(["report", str(runs), "--out", str(elsewhere)]) == 0
    table = (elsewhere / "report.md").read_text()
    assert "| fedavg | 1 | 0 |" in table and "| fedavg | 2 | 0 |" in table
    _assert_pngs(elsewhere)
    assert "runs report" in capsys.readouterr().out


@pytest.mark.parametrize(
    "setup, expected",
    [
        (lambda p: None, "holds no run (summary.json) and no sweep (results.csv)"),
        (lambda p: (p / "sweep.json").write_text("{}"), "finish it with 'fedsim sweep --resume"),
        (lambda p: (p / "results.csv").write_text("trial_id,status\n"), "no rounds.csv"),
    ],
)
def test_bad_directories_one_line_exit_2(setup, expected, tmp_path, capsys):
    setup(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "report.md").exists()


def test_missing_directory(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_a_sweeps_selection_scores_read_back_as_results_not_as_grid_parameters(tmp_path):
    records = [_record("a", "fedavg", 1, 0, [0.5]), _record("b", "fedavg", 1, 1, [0.7])]
    records[0]["summary"] = {"score_entropy": -0.25, "score_snd": 3.5}
    records[1]["summary"] = {"score_entropy": -0.75, "score_snd": 3.0}
    write_results(tmp_path, records)
    _, loaded = load_records(tmp_path)
    assert [r["params"] for r in loaded] == [{"method": "fedavg", "local_epochs": 1, "seed": s} for s in (0, 1)]
    assert [r["summary"] for r in loaded] == [records[0]["summary"], records[1]["summary"]]
    assert "| fedavg | 1 | 0,1 | 0.6000 ± 0.1414 |" in markdown_table(loaded)
