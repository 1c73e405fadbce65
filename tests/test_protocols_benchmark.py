"""The pure parts of experiments/benchmarks/protocols.py: reading a reproduction directory and splitting its time."""

import json
import os

import pytest
import yaml

from tools.benchmarks.protocols import (
    covered_seconds,
    first_trial_spec,
    format_split,
    parse_args,
    round_totals,
    split_protocol,
    trial_timings,
)


def _trial(root, trial_id, rounds, summary_at, result_rows, wall):
    run = root / "runs" / trial_id
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    (run / "summary.json").write_text(json.dumps({"wall_seconds": wall}))
    os.utime(run / "summary.json", (summary_at, summary_at))
    tune = root / "tune" / f"run_trial_{trial_id}_0_run_seed=0"
    tune.mkdir(parents=True)
    (tune / "result.json").write_text("".join(json.dumps({"trial_id": trial_id, **r}) + "\n" for r in result_rows))


@pytest.fixture
def reproduction(tmp_path):
    """Two trials: t1 from 1002 to 1012 (summary.json ends it), t2 from 1008 to 1014 (Tune's timestamp ends it)."""
    _trial(
        tmp_path,
        "t1",
        [
            {"round": 1, "round_seconds": 1.0, "checkpoint_seconds": 0.25, "bytes_sent": 10},
            {"round": 2, "round_seconds": 2.0, "eval_seconds": 0.5, "evaluated": True},
        ],
        1012.0,
        [{"time_total_s": 4.0, "timestamp": 1005}, {"time_total_s": 10.0, "timestamp": 1011}],
        wall=99.0,  # results.csv's value wins
    )
    _trial(
        tmp_path,
        "t2",
        [{"round": 1, "round_seconds": 3.0, "ot_seconds": {"0": 0.5, "1": 0.25}, "solver_seconds": 0.125}],
        1013.5,
        [{"time_total_s": 6.0, "timestamp": 1014}],
        wall=3.5,
    )
    (tmp_path / "results.csv").write_text(
        "row,trial_id,wall_seconds\nr,t1,4.0\nr-E,t1,4.0\nr,t2,3.5\n"  # two rows read t1
    )
    return tmp_path


def test_trial_timings_read_what_the_runs_wrote(reproduction):
    t1, t2 = trial_timings(reproduction)
    assert (t1.trial_id, t1.trial_seconds, t1.wall_seconds) == ("t1", 10.0, 4.0)
    assert (t1.rounds, t1.evaluation, t1.checkpoints, t1.ot, t1.ended) == (3.0, 0.5, 0.25, None, 1012.0)
    assert (t2.trial_seconds, t2.wall_seconds, t2.rounds, t2.ot, t2.ended) == (6.0, 3.5, 3.0, 0.75, 1014.0)
    assert t2.other == {"solver_seconds": 0.125}


def test_split_adds_up_to_the_wall_time_and_shares_out_concurrent_trials(reproduction):
    split = split_protocol(trial_timings(reproduction), 1000.0, 1020.0)
    assert split.protocol_wall == 20.0 and split.trials == 2
    assert split.trial == pytest.approx(
        {
            "training": 6.0,
            "evaluation": 0.5,
            "checkpoints": 0.25,
            "start-up outside the run": 8.5,  # (10 - 4) + (6 - 3.5)
            "setup and callbacks in the run": 0.75,  # (4 - 3 - 0.5 - 0.25) + (3.5 - 3)
        }
    )
    # trials covered 1002..1014 = 12 s of wall for 16 trial-seconds: each part at 0.75 s per trial-second
    assert split.wall == pytest.approx(
        {
            "training": 4.5,
            "evaluation": 0.375,
            "checkpoints": 0.1875,
            "start-up outside the run": 6.375,
            "setup and callbacks in the run": 0.5625,
            "grid / Tune": 8.0,
        }
    )
    assert sum(split.wall.values()) == pytest.approx(20.0)
    assert split.ot == pytest.approx(0.75) and split.other == {"solver_seconds": 0.125}
    table = format_split("fake", split)
    assert "| training (rounds less evaluation, checkpoints) |     6.0 |    4.5 | 22.5% |" in table
    assert "| grid / Tune (no trial running)" in table and "|    8.0 | 40.0% |" in table
    assert "not training: 77.5% of the wall time" in table
    assert "| " + "  of which OT".ljust(46) + " |     0.8 |    0.6 |  2.8% |" in table


def test_missing_ot_is_said_to_be_not_reported():
    totals = round_totals([{"round_seconds": 1.5, "eval_seconds": 0.5}, {"round_seconds": 2.5}])
    assert (totals["round_seconds"], totals["eval_seconds"], totals["checkpoint_seconds"]) == (4.0, 0.5, 0.0)
    assert totals["ot"] is None
    empty = split_protocol([], 0.0, 5.0)
    assert empty.wall["grid / Tune"] == 5.0
    assert "|   of which OT: not reported" in format_split("empty", empty)


def test_covered_seconds_merges_overlaps_and_clips():
    assert covered_seconds([(5, 8), (1, 3), (2, 4), (9, 30)], 0, 10) == pytest.approx(3 + 3 + 1)
    assert covered_seconds([(-5, 2)], 0, 10) == 2


def test_first_trial_spec_is_one_trial_of_the_full_protocol(tmp_path):
    from fedsim.experiments.reproduce_spec import load_spec, to_sweep

    path = tmp_path / "fada-first-trial.yaml"
    path.write_text(yaml.safe_dump(first_trial_spec("fada"), sort_keys=False))
    narrowed, full = load_spec(None, str(path)), load_spec("fada", None)
    assert narrowed.seeds == [0]
    assert narrowed.variants() == full.variants()[:1]
    assert narrowed.config_file(narrowed.variants()[0][1]) == full.config_file(full.variants()[0][1])
    assert narrowed.claims == []
    name = full.variants()[0][0]  # the same config, overrides included, as that trial of the full grid
    assert to_sweep(narrowed).variants[name] == to_sweep(full).variants[name]


def test_unknown_paper_is_refused():
    assert parse_args(["--papers", "fada,fedod"]).papers == ["fada", "fedod"]
    with pytest.raises(SystemExit):
        parse_args(["--papers", "fadaa"])
