"""Selection without target labels: each score picks by its own mean over seeds (never by accuracy), the oracle by
target accuracy, the gap is their difference; ties, missing seeds and a default outside the grid; results.csv's score
columns; a reproduce spec's ``select:`` and its report files."""

import copy
import csv
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from fedsim.errors import UserError
from fedsim.experiments.reproduce_plots import plot_names
from fedsim.experiments.reproduce_results import (
    read_results_csv,
    results_rows,
    selection_rows,
    write_results_csv,
    write_selection_of_lines,
    write_selection_report,
)
from fedsim.experiments.reproduce_spec import PaperSpec, default_run, shrink
from fedsim.experiments.selection import markdown, mean_over, select, write_selection
from fedsim.experiments.sweep_results import write_results


def _trial(lr, seed, accuracy, scores, status="finished", target="usps", epochs=1):
    return {
        "trial_id": f"lr{lr}-s{seed}-{target}",
        "status": status,
        "params": {"method": "fedavg", "local_epochs": epochs, "seed": seed, "method.lr": lr},
        "benchmark": "digits",
        "target": target,
        "target_accuracy": accuracy if status == "finished" else None,
        "mean_source_accuracy": 0.9 if status == "finished" else None,
        "summary": {f"score_{k}": v for k, v in scores.items()} if status == "finished" else {},
    }


# lr -> (target accuracy at seeds 0 and 1, entropy score, source_accuracy score): entropy favours 1.0, the least
# accurate; source accuracy favours 0.1, the most accurate
GRID = {0.01: ((0.60, 0.62), -0.40, 0.90), 0.1: ((0.80, 0.84), -0.60, 0.97), 1.0: ((0.30, 0.20), -0.05, 0.80)}


def _grid(grid=GRID, target="usps"):
    return [
        _trial(lr, seed, acc[seed], {"entropy": ent + 0.01 * seed, "source_accuracy": src}, target=target)
        for lr, (acc, ent, src) in grid.items()
        for seed in (0, 1)
    ]


def _select(records, scores=("entropy", "source_accuracy"), default=None):
    return select(records, list(scores), ["method"], ["method.lr"], default=default or {"method.lr": 0.01})


def test_each_score_picks_by_its_mean_the_oracle_by_accuracy_and_the_gap_is_their_difference():
    (row,) = _select(_grid())
    assert row.group == (("method", "fedavg"),) and row.seeds == (0, 1)
    assert [c.label for c in row.candidates] == ["method.lr=0.01", "method.lr=0.1", "method.lr=1.0"]
    entropy, source = row.picks["entropy"], row.picks["source_accuracy"]
    assert entropy.params == {"method.lr": 1.0} and entropy.score == pytest.approx(-0.045)  # mean over seeds
    assert entropy.accuracy == pytest.approx(0.25) and entropy.accuracy_std == pytest.approx(np.std([0.3, 0.2], ddof=1))
    assert source.params == {"method.lr": 0.1} and source.accuracy == pytest.approx(0.82)
    assert row.oracle.params == {"method.lr": 0.1} and row.oracle.accuracy == pytest.approx(0.82)
    assert row.gaps == {"entropy": pytest.approx(0.82 - 0.25), "source_accuracy": pytest.approx(0.0)}
    assert row.default.params == {"method.lr": 0.01} and row.default.accuracy == pytest.approx(0.61)
    assert row.default.gap == pytest.approx(0.82 - 0.61) and row.default.source_accuracy == pytest.approx(0.9)
    assert not row.notes


def test_the_pick_never_reads_accuracy_the_oracle_does():
    """The same scores with the accuracies handed round: every score's pick stays, the oracle moves."""
    rotated = {
        0.01: (GRID[1.0][0], *GRID[0.01][1:]),
        0.1: (GRID[0.01][0], *GRID[0.1][1:]),
        1.0: (GRID[0.1][0], -0.05, 0.8),
    }
    (row,) = _select(_grid(rotated))
    assert row.picks["entropy"].params == {"method.lr": 1.0} and row.picks["entropy"].accuracy == pytest.approx(0.82)
    assert row.picks["source_accuracy"].params == {"method.lr": 0.1}
    assert row.oracle.params == {"method.lr": 1.0}
    assert row.gaps == {"entropy": pytest.approx(0.0), "source_accuracy": pytest.approx(0.82 - 0.61)}
    # no accuracy at all: the same picks, no oracle, no gap
    (blind,) = _select([{**r, "target_accuracy": None} for r in _grid(rotated)])
    assert blind.picks["entropy"].params == {"method.lr": 1.0} and blind.oracle is None
    assert blind.gaps == {"entropy": None, "source_accuracy": None}


def test_a_tie_goes_to_the_setting_first_in_the_grid_not_the_more_accurate():
    grid = {0.01: ((0.5, 0.5), -0.3, 0.9), 0.1: ((0.9, 0.9), -0.3, 0.9)}
    (row,) = _select(_grid(grid))
    assert row.picks["entropy"].params == {"method.lr": 0.01}
    assert row.picks["source_accuracy"].params == {"method.lr": 0.01}
    assert row.oracle.params == {"method.lr": 0.1} and row.gaps["entropy"] == pytest.approx(0.4)
    (reversed_row,) = _select(list(reversed(_grid(grid))))  # the grid's order decides, nothing else
    assert reversed_row.picks["entropy"].params == {"method.lr": 0.1}


def test_a_candidate_missing_a_seed_is_flagged_and_not_compared():
    """lr=1.0 failed at seed 1: its one seed's entropy is the best of all, yet it is neither picked nor the oracle."""
    records = _grid({**GRID, 1.0: ((0.99, 0.99), 5.0, 5.0)})
    records[-1] = _trial(1.0, 1, None, {}, status="error")
    (row,) = _select(records, default={"method.lr": 1.0})
    flagged = row.candidates[-1]
    assert flagged.seeds == (0,) and flagged.missing_seeds == (1,) and not flagged.complete
    assert row.picks["entropy"].params == {"method.lr": 0.01}  # the best entropy of the two compared
    assert row.picks["source_accuracy"].params == {"method.lr": 0.1} and row.oracle.params == {"method.lr": 0.1}
    assert row.default.params == {"method.lr": 1.0} and row.default.gap is None  # shown, not compared
    assert row.default.note == "not compared: no finished trial at seed 1"
    assert row.notes == ["method.lr=1.0: not compared, no finished trial at seed 1"]
    text = markdown([row], ["entropy", "source_accuracy"])
    assert "| default | method.lr=1.0 (not compared: no finished trial at seed 1) | 0.990 | 0.900 | n/a | n/a |" in text
    assert "| method.lr=1.0 | 0 (lacks 1) | 0.990 | 0.900 | 5.0000 | 5.0000 |" in text
    # a seed no candidate finished is no candidate's lack
    both = [r for r in _grid() if r["params"]["seed"] == 0] + [_trial(lr, 1, None, {}, "error") for lr in GRID]
    (row,) = _select(both)
    assert row.seeds == (0,) and all(c.complete for c in row.candidates) and not row.notes


def test_a_default_outside_the_grid_is_none_and_said_so(tmp_path):
    (row,) = _select(_grid(), default={"method.lr": 0.5})
    assert row.default is None and row.notes == ["the default (method.lr=0.5) is not in the grid"]
    assert row.picks["entropy"].params == {"method.lr": 1.0}
    (row_without,) = select(_grid(), ["entropy"], ["method"], ["method.lr"])
    assert row_without.default is None and not row_without.notes
    write_selection(tmp_path, [row], ["entropy", "source_accuracy"])
    assert "| default | not in the grid | n/a | n/a | n/a | n/a |" in (tmp_path / "selection.md").read_text()
    lines = list(csv.DictReader((tmp_path / "selection.csv").open()))
    assert lines[0] == {
        "method": "fedavg",
        "rule": "default",
        "setting": "",
        "target_accuracy": "",
        "target_accuracy_std": "",
        "mean_source_accuracy": "",
        "score": "",
        "gap": "",
        "seeds": "",
        "note": "not in the grid",
    }


def test_bad_scores_and_keys_are_one_line():
    with pytest.raises(
        UserError,
        match=r"no run reports the score 'snd': the runs report entropy, source_accuracy; .*"
        r"run\.scores",
    ):
        _select(_grid(), scores=["snd"])
    with pytest.raises(UserError, match=r"name it 'entropy', without the score_ prefix"):
        _select(_grid(), scores=["score_entropy"])
    with pytest.raises(UserError, match="at least one score"):
        _select(_grid(), scores=[])
    with pytest.raises(UserError, match=r"the default names method\.mu, which are not candidate keys"):
        _select(_grid(), default={"method.mu": 0.1})
    with pytest.raises(UserError, match=r"no value for 'method\.mu': group and compare by"):
        select(_grid(), ["entropy"], ["method"], ["method.mu"])
    mixed = _grid() + [_trial(0.01, 2, 0.6, {"entropy": 0.0, "source_accuracy": 0.9}, epochs=5)]
    with pytest.raises(UserError, match=r"differ in 'local_epochs' \(1, 5\): add it to the group or candidate keys"):
        _select(mixed)
    with pytest.raises(UserError, match="are the same setting and seed"):
        _select(_grid() + _grid()[:1])


def test_groups_and_their_mean_over_targets():
    records = _grid(target="usps") + _grid({**GRID, 0.1: ((0.80, 0.84), 0.5, 0.97)}, target="mnistm")
    rows = select(records, ["entropy"], ["method", "target"], ["method.lr"], {"method.lr": 0.01})
    assert [r.group for r in rows] == [(("method", "fedavg"), ("target", t)) for t in ("usps", "mnistm")]
    assert [r.picks["entropy"].params for r in rows] == [{"method.lr": 1.0}, {"method.lr": 0.1}]
    (mean,) = mean_over(rows, "target")
    assert mean.group == (("method", "fedavg"), ("target", "mean of usps, mnistm"))
    assert mean.picks["entropy"].label == "method.lr=1.0 ×1, method.lr=0.1 ×1"
    assert mean.picks["entropy"].accuracy == pytest.approx((0.25 + 0.82) / 2)
    assert mean.picks["entropy"].gap == pytest.approx((0.57 + 0.0) / 2)
    assert mean.oracle.accuracy == pytest.approx(0.82) and mean.default.accuracy == pytest.approx(0.61)
    assert mean_over(rows[:1], "target") == []  # one target: no mean


# ----------------------------------------------------------------------------- results.csv

BASE_HEADER = (
    "trial_id,status,method,local_epochs,seed,benchmark,target,rounds,target_accuracy,mean_source_accuracy,"
    "bytes_sent,bytes_received,wall_seconds,client_nodes"
)


def _sweep_record(trial, seed, summary=None):
    record = {
        "trial_id": trial,
        "status": "finished",
        "params": {"method": "fedavg", "local_epochs": 1, "seed": seed},
        "benchmark": "digits",
        "target": "usps",
        "rounds": 2,
        "target_accuracy": 0.5,
        "mean_source_accuracy": 0.9,
        "bytes_sent": 10,
        "bytes_received": 20,
        "wall_seconds": 1.5,
        "client_nodes": "n1",
        "history": [],
    }
    if summary is not None:
        record["summary"] = summary
    return record


def test_results_csv_has_one_column_per_score_after_the_others(tmp_path):
    records = [
        _sweep_record("t0", 0, {"target_accuracy": 0.5, "score_snd": 1.25}),
        _sweep_record("t1", 1, {"target_accuracy": 0.5, "score_entropy": -0.5, "score_snd": 2.0}),
    ]
    write_results(tmp_path, records)
    text = (tmp_path / "results.csv").read_text().splitlines()
    assert text == [
        BASE_HEADER + ",score_entropy,score_snd",
        "t0,finished,fedavg,1,0,digits,usps,2,0.5,0.9,10,20,1.5,n1,,1.25",
        "t1,finished,fedavg,1,1,digits,usps,2,0.5,0.9,10,20,1.5,n1,-0.5,2.0",
    ]


@pytest.mark.parametrize("summary", [None, {"target_accuracy": 0.5, "rounds": 2}])
def test_results_csv_without_scores_is_unchanged(tmp_path, summary):
    write_results(tmp_path, [_sweep_record("t0", 0, summary)])
    assert (tmp_path / "results.csv").read_bytes() == (
        BASE_HEADER + "\r\nt0,finished,fedavg,1,0,digits,usps,2,0.5,0.9,10,20,1.5,n1\r\n"
    ).encode()


# ----------------------------------------------------------------------------- a reproduce spec's select:

SPEC = {
    "paper": "Toy selection",
    "seeds": [0, 1],
    "benchmarks": {"npz": {"targets": ["dom1", "dom2"]}},
    "runs": {"lr-small": {"set": ["method.lr=0.01"]}, "lr-mid": {}, "lr-big": {"set": ["method.lr=0.1"]}, "other": {}},
    "rows": [{"name": "lr-small"}, {"name": "lr-mid"}, {"name": "lr-big"}],
    "select": {
        "scores": ["source_accuracy", "entropy"],
        "groups": {"fedavg": {"runs": ["lr-small", "lr-mid", "lr-big"]}},  # the default: lr-mid, a plain run's lr
    },
}


def _spec(**changes):
    raw = copy.deepcopy(SPEC)
    for key, value in changes.items():
        raw["select"][key] = value
    return PaperSpec("toy", raw, Path("."))


def test_a_spec_select_is_parsed():
    spec = _spec()
    assert spec.select.scores == ["source_accuracy", "entropy"]
    group = spec.select.groups["fedavg"]
    assert (group.name, group.runs) == ("fedavg", ["lr-small", "lr-mid", "lr-big"])
    assert default_run(spec, group)({"benchmark": "npz", "target": "dom1"}) == {"run": "lr-mid"}  # lr 0.05
    assert PaperSpec("toy", {k: v for k, v in SPEC.items() if k != "select"}, Path(".")).select is None
    assert plot_names(spec)[-3:] == ["selection.md", "selection.csv", "selection.png"]
    quick = copy.deepcopy(SPEC)
    quick["quick"] = {"runs": ["lr-small", "lr-big", "other"]}
    small = shrink(PaperSpec("toy", quick, Path(".")), True, None)
    assert (
        small.select.groups["fedavg"].runs == ["lr-small", "lr-big"] and small.select.groups["fedavg"].default is None
    )
    quick["quick"] = {"runs": ["lr-small", "other"]}
    assert shrink(PaperSpec("toy", quick, Path(".")), True, None).select is None


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"groups": {"fedavg": {"runs": ["lr-small", "lr-mdi"]}}},
            r"select\.groups\.fedavg names an unknown run "
            r"'lr-mdi': did you mean 'lr-mid'\?",
        ),
        ({"scores": ["score_entropy"]}, r"select\.scores names 'score_entropy': give it without the prefix, 'entropy'"),
        ({"scores": ["Entropy"]}, r"'Entropy': a score's name is lower-case letters, digits and _"),
        ({"scores": ["entropi"]}, r"select\.scores names an unknown score 'entropi': did you mean 'entropy'\?"),
        ({"scores": "entropy"}, r"select\.scores must be a list of strings"),
        ({"scores": []}, r"select\.scores lists no score"),
        ({"scores": ["snd", "snd"]}, r"lists a score twice"),
        ({"score": ["snd"]}, r"unknown key 'score' in spec toy: select: did you mean 'scores'\?"),
        ({"groups": {"fedavg": {"runs": ["lr-small"]}}}, r"must list two or more runs"),
        (
            {"groups": {"fedavg": {"runs": ["lr-small", "lr-mid"], "default": "lr-mid"}}},
            r"groups\.fedavg: drop default: a group's default is the run whose settings a plain run of its method",
        ),
        ({"groups": {"fedavg": {"run": ["lr-small", "lr-mid"]}}}, r"unknown key 'run' .* did you mean 'runs'\?"),
        ({"groups": []}, r"select\.groups must map a group's name to its runs"),
    ],
)
def test_a_spec_select_error_is_one_line(changes, message):
    with pytest.raises(UserError, match=message) as caught:
        _spec(**changes)
    assert "\n" not in str(caught.value)


def test_a_spec_select_run_without_a_row_is_one_line():
    """A run the selection chooses among needs a row reading the default metrics: results.csv carries its scores."""
    raw = copy.deepcopy(SPEC)
    raw["rows"] = [{"name": "lr-small"}, {"name": "lr-mid"}, {"name": "lr-big", "metrics": {"target": "other"}}]
    with pytest.raises(
        UserError,
        match=r"groups\.fedavg: run 'lr-big' has no row reading the default target and "
        r"source metrics: add one to rows: \(- \{name: lr-big\}\)",
    ):
        PaperSpec("toy", raw, Path("."))


def test_a_spec_select_group_needs_the_same_seeds():
    raw = copy.deepcopy(SPEC)
    raw["runs"]["lr-big"] = {"seeds": [0, 1, 2]}
    with pytest.raises(
        UserError,
        match=r"its runs run different seeds on npz \(lr-small: 0, 1; lr-mid: 0, 1; "
        r"lr-big: 0, 1, 2\): give them the same seeds",
    ):
        PaperSpec("toy", raw, Path("."))


def _reproduce_record(spec, run, target, seed, accuracy, source, entropy, status="finished"):
    variant = next(name for name, r, _, t in spec.variants() if (r, t) == (run, target))
    summary = {
        "target_accuracy": accuracy,
        "source_accuracy/dom0": 0.9,
        "source_accuracy/dom2": 0.7,
        "score_source_accuracy": source,
        "score_entropy": entropy,
    }
    return {
        "trial_id": f"{run}-{target}-{seed}",
        "status": status,
        "params": {"variant": variant, "seed": seed},
        "summary": summary if status == "finished" else {},
    }


def _toy_records(spec):
    """On dom1 source accuracy picks lr-big (the oracle), entropy lr-small; on dom2 both pick lr-mid, the oracle
    lr-small; lr-big on dom2 lost seed 1."""
    # (run, target) -> (accuracy per seed, source score, entropy score)
    table = {
        ("lr-small", "dom1"): ((0.50, 0.60), 0.80, -0.10),
        ("lr-mid", "dom1"): ((0.70, 0.70), 0.85, -0.30),
        ("lr-big", "dom1"): ((0.90, 0.80), 0.90, -0.50),
        ("lr-small", "dom2"): ((0.95, 0.95), 0.70, -0.90),
        ("lr-mid", "dom2"): ((0.40, 0.50), 0.75, -0.20),
        ("lr-big", "dom2"): ((0.99, 0.99), 0.99, -0.01),
    }
    records = [
        _reproduce_record(spec, run, target, seed, acc[seed], src, ent)
        for (run, target), (acc, src, ent) in table.items()
        for seed in (0, 1)
    ] + [_reproduce_record(spec, "other", "dom1", 0, 1.0, 1.0, 1.0)]  # in no group
    records[-2] = _reproduce_record(spec, "lr-big", "dom2", 1, None, None, None, status="error")
    return records


def test_a_spec_select_writes_its_report_with_the_values(tmp_path):
    """The choices of :func:`_toy_records`; the report gives each with its values and the mean over targets."""
    spec = _spec()
    records = _toy_records(spec)
    rows = selection_rows(spec, records)
    assert [r.group for r in rows] == [
        (("group", "fedavg"), ("benchmark", "npz"), ("target", "dom1")),
        (("group", "fedavg"), ("benchmark", "npz"), ("target", "dom2")),
        (("group", "fedavg"), ("benchmark", "npz"), ("target", "mean of dom1, dom2")),
    ]
    dom1, dom2, mean = rows
    assert [c.label for c in dom1.candidates] == ["lr-small", "lr-mid", "lr-big"]
    assert dom1.picks["source_accuracy"].label == "lr-big" and dom1.picks["entropy"].label == "lr-small"
    assert dom1.oracle.label == "lr-big" and dom1.picks["entropy"].gap == pytest.approx(0.85 - 0.55)
    assert dom1.default.label == "lr-mid" and dom1.default.source_accuracy == pytest.approx(0.8)
    assert dom2.picks["source_accuracy"].label == "lr-mid" and dom2.picks["entropy"].label == "lr-mid"
    assert dom2.oracle.label == "lr-small" and dom2.notes == ["lr-big: not compared, no finished trial at seed 1"]
    assert mean.picks["source_accuracy"].accuracy == pytest.approx((0.85 + 0.45) / 2)
    assert mean.picks["source_accuracy"].gap == pytest.approx((0.0 + 0.5) / 2)
    assert mean.default.label == "lr-mid ×2" and mean.oracle.label == "lr-big ×1, lr-small ×1"

    written = write_selection_report(spec, records, tmp_path)
    assert [p.name for p in written] == ["selection.md", "selection.csv", "selection.png"]
    text = (tmp_path / "selection.md").read_text()
    assert text.startswith("# Toy selection: selection without target labels\n")
    assert "upper bound" in text and "target's labels" in text
    assert "| group | default | source_accuracy | entropy | oracle |" in text
    assert (
        "| group=fedavg, benchmark=npz, target=dom1 | 0.700 (gap 0.150) | 0.850 (gap 0.000) | 0.550 (gap 0.300) "
        "| 0.850 |" in text
    )
    assert "| source_accuracy (score) | lr-big | 0.850 ± 0.071 | 0.800 | 0.9000 | 0.000 |" in text
    assert "| entropy (score) | lr-small | 0.550 ± 0.071 | 0.800 | -0.1000 | 0.300 |" in text
    assert "| oracle (target labels) | lr-big | 0.850 ± 0.071 | 0.800 | n/a | 0.000 |" in text
    assert "| source_accuracy (score) | lr-big ×1, lr-mid ×1 | 0.650 | 0.800 | n/a | 0.250 |" in text
    assert "- lr-big: not compared, no finished trial at seed 1" in text
    lines = list(csv.DictReader((tmp_path / "selection.csv").open()))
    assert len(lines) == 3 * 4 and list(lines[0])[:3] == ["group", "benchmark", "target"]
    entropy_dom1 = next(ln for ln in lines if ln["target"] == "dom1" and ln["rule"] == "entropy")
    assert entropy_dom1["setting"] == "lr-small" and float(entropy_dom1["gap"]) == pytest.approx(0.3)
    assert float(entropy_dom1["target_accuracy"]) == pytest.approx(0.55) and entropy_dom1["seeds"] == "2"
    image = imread(tmp_path / "selection.png")
    assert image.shape[0] > 100 and np.ptp(image[..., :3]) > 0
    assert (
        write_selection_report(
            PaperSpec("toy", {k: v for k, v in SPEC.items() if k != "select"}, Path(".")), records, tmp_path / "none"
        )
        == []
    )


def test_results_csv_carries_the_scores_and_tables_only_rewrites_the_same_selection(tmp_path):
    """A select: spec's results.csv has a column per score with the runs' values; the selection report made from
    it, read back (``--tables-only``), is the one made from the trial records, file for file."""
    spec = _spec()
    records = _toy_records(spec)
    lines = results_rows(spec, records)
    write_results_csv(tmp_path / "results.csv", lines)
    header = next(csv.reader((tmp_path / "results.csv").open()))
    assert header[-2:] == ["score_source_accuracy", "score_entropy"]
    by_trial = {ln["trial_id"]: ln for ln in csv.DictReader((tmp_path / "results.csv").open())}
    assert float(by_trial["lr-big-dom1-0"]["score_entropy"]) == -0.5
    assert float(by_trial["lr-mid-dom2-1"]["score_source_accuracy"]) == 0.75
    assert by_trial["lr-big-dom2-1"]["score_entropy"] == ""  # the failed trial reports no score
    read = read_results_csv(tmp_path / "results.csv", spec)
    assert read == lines
    (tmp_path / "records").mkdir(), (tmp_path / "lines").mkdir()
    write_selection_report(spec, records, tmp_path / "records")
    write_selection_of_lines(spec, read, tmp_path / "lines")
    for name in ("selection.md", "selection.csv"):
        assert (tmp_path / "lines" / name).read_text() == (tmp_path / "records" / name).read_text()
    plain = PaperSpec("toy", {k: v for k, v in SPEC.items() if k != "select"}, Path("."))
    assert "score_entropy" not in results_rows(plain, records)[0]


def test_a_spec_select_names_a_score_no_run_reports():
    spec = _spec(scores=["snd"])
    records = [_reproduce_record(spec, "lr-small", "dom1", 0, 0.5, 0.5, 0.5)]
    with pytest.raises(UserError, match=r"no run reports the score 'snd': the runs report entropy, source_accuracy"):
        selection_rows(spec, records)
