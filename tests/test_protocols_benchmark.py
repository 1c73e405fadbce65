"""tools/benchmarks/protocols.py and its modules: splitting a reproduction's time, the full grid's kinds and cut,
the scaling of a cut trial to the full protocol, the trials at once, and the committed results' times."""

import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml

from tools.benchmarks.protocol_committed import (
    committed_kinds,
    committed_results,
    format_committed,
    of_spec,
    paper_of,
    totals,
)
from tools.benchmarks.protocol_grid import (
    Shape,
    cut_settings,
    cut_shape,
    cut_sweep,
    flat,
    group_kinds,
    settings_key,
    trials_at_once,
)
from tools.benchmarks.protocol_report import PaperLine, format_estimate, format_summary
from tools.benchmarks.protocol_scale import (
    KindEstimate,
    TrialEstimate,
    cold_start,
    combine,
    scale_evaluations,
    scale_rounds,
    scaled_trial,
)
from tools.benchmarks.protocol_split import (
    TrialTiming,
    covered_seconds,
    format_split,
    round_totals,
    split_protocol,
    trial_timings,
)
from tools.benchmarks.protocols import first_trial_spec, kind_estimates, parse_args


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


# ---- a finished reproduction's split -----------------------------------------------------------------------------
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
    totals_ = round_totals([{"round_seconds": 1.5, "eval_seconds": 0.5}, {"round_seconds": 2.5}])
    assert (totals_["round_seconds"], totals_["eval_seconds"], totals_["checkpoint_seconds"]) == (4.0, 0.5, 0.0)
    assert totals_["ot"] is None
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


def test_modes_and_papers_are_checked():
    assert parse_args(["--papers", "fada,fedod"]).papers == ["fada", "fedod"]
    args = parse_args(["--estimate", "--spec", "x.yaml", "--cpus", "4"])
    assert (args.estimate, args.spec, args.cpus, args.steady_rounds) == (True, "x.yaml", 4.0, 1)
    for wrong in (["--papers", "fadaa"], ["--estimate", "--full"], ["--papers", "fada", "--spec", "x.yaml"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)
    with pytest.raises(SystemExit):
        parse_args(["--estimate", "--steady-rounds", "0"])


# ---- the full grid's kinds and their cut -------------------------------------------------------------------------
def test_shape_counts_stages_evaluations_and_checkpoints():
    feddadil = Shape((10, 50), eval_every=1000)
    assert (feddadil.rounds, feddadil.stage_of(10), feddadil.stage_of(11), feddadil.evaluated()) == (60, 0, 1, [60])
    assert feddadil.early_evaluations() == [0, 0] and feddadil.text() == "60 (10 encoder + 50 dictionary)"
    every = Shape((4, 6), eval_every=3, checkpoint_every=4)
    assert every.evaluated() == [3, 6, 9, 10] and every.early_evaluations() == [1, 2]
    assert every.checkpoints() == 2  # rounds 4 and 8 (never after the last)
    with pytest.raises(ValueError):
        every.stage_of(11)


def test_the_cut_keeps_each_stage_and_the_last_round():
    # FedDaDiL: 2 encoder rounds (first + steady), 3 dictionary rounds (first + steady + last), evaluation at the end
    cut = cut_shape(Shape((10, 50), 1000))
    assert cut == Shape((2, 3), 1000)
    assert cut_settings(Shape((10, 50), 1000), cut) == ["run.rounds=5", "method.encoder_rounds=2"]
    # FADA: every round evaluated, kept so; FedOD's 3 rounds uncut; an evaluation every 5 rounds: every cut round
    assert cut_shape(Shape((10,), 1)) == Shape((3,), 1)
    assert cut_settings(Shape((3,), 1), cut_shape(Shape((3,), 1))) == []
    five = cut_shape(Shape((20,), 5, checkpoint_every=4), steady=2)
    assert five == Shape((4,), 1, 1)
    assert cut_settings(Shape((20,), 5, 4), five) == ["run.rounds=4", "run.eval_every=1", "run.checkpoint_every=1"]
    assert cut_shape(Shape((1, 2), 1000)) == Shape((1, 2), 1000)


TINY_SPEC = {
    "paper": "two runs on digits",
    "seeds": [0, 1],
    "set": ["run.rounds=10", "run.tensorboard=false", "run.checkpoint_every=0"],
    "benchmarks": {"digits": {"targets": ["mnist", "usps"]}},
    "runs": {
        "fedavg": {"set": ["method.name=fedavg"]},
        "slow": {"set": ["method.name=fedavg", "method.local_epochs=2"], "seeds": [0]},
    },
    "rows": [{"name": "fedavg"}, {"name": "slow"}],
}


@pytest.fixture
def tiny_grid():
    """A spec's full grid without its data: (spec, sweep, configs, clients), 3 clients a trial."""
    from fedsim.experiments.reproduce_spec import PaperSpec, to_sweep
    from fedsim.experiments.sweep_grid import point_key

    spec = PaperSpec("tiny", json.loads(json.dumps(TINY_SPEC)), os.getcwd())
    sweep = to_sweep(spec)
    configs = {point_key(p): sweep.config_for(p) for p in sweep.points()}
    return spec, sweep, configs, {key: 3 for key in configs}


def test_trials_group_into_kinds_that_differ_in_target_and_seed_only(tiny_grid):
    from fedsim.experiments.sweep_grid import VARIANT_KEY, point_key

    spec, sweep, configs, clients = tiny_grid
    kinds = group_kinds(spec, sweep, configs, clients)
    assert [(k.name, len(k.points), k.shape) for k in kinds] == [
        ("fedavg@digits", 4, Shape((10,), 1)),  # 2 targets x 2 seeds
        ("slow@digits", 2, Shape((10,), 1)),  # its own seed: 2 targets x 1 seed
    ]
    assert kinds[0].point == {VARIANT_KEY: "fedavg@digits.mnist#0"} and kinds[0].config.data.target == "mnist"
    assert settings_key(configs[kinds[0].points[0]]) == settings_key(configs[kinds[0].points[-1]])
    cut = cut_sweep(sweep, kinds, warmups=3, cache=Path("/c"))  # three warm-up trials first, the kinds in turn
    names = ["fedavg@digits~warm-up1", "slow@digits~warm-up2", "fedavg@digits~warm-up3", "fedavg@digits", "slow@digits"]
    assert cut.points() == [{VARIANT_KEY: name} for name in names]
    assert cut.config_for({VARIANT_KEY: names[1]}).run.cache_dir == "/c/slow@digits~warm-up2"  # a cache of its own
    cut = cut_sweep(sweep, kinds)
    assert cut.points() == [{VARIANT_KEY: "fedavg@digits"}, {VARIANT_KEY: "slow@digits"}]
    for kind, point in zip(kinds, cut.points()):  # the kind's first trial, rounds cut, nothing else changed
        full, measured = flat(vars_of(configs[point_key(kind.point)])), flat(vars_of(cut.config_for(point)))
        assert {k for k in full if full[k] != measured[k]} == {"run.rounds"} and measured["run.rounds"] == 3
        assert (measured["run.seed"], measured["data.target"]) == (0, "mnist")


def vars_of(config) -> dict:
    return dataclasses.asdict(config)


def test_trials_at_once_follow_plan_trial(tiny_grid):
    spec, sweep, configs, clients = tiny_grid
    kind = group_kinds(spec, sweep, configs, clients)[0]  # 1 CPU per client, 3 clients
    assert trials_at_once(kind, {"CPU": 2.0}, "ray") == 1  # one actor + 0.1 for the trial: 1.1 CPUs
    assert trials_at_once(kind, {"CPU": 8.0}, "ray") == 2  # 3 actors + 0.1: 3.1 CPUs
    assert trials_at_once(kind, {"CPU": 8.0}, "local") == 8  # one 1-CPU bundle
    object.__setattr__(kind.config.resources, "gpus_per_client", 0.5)  # half a GPU per trial: two fit in one
    assert trials_at_once(kind, {"CPU": 16.0, "GPU": 1.0}, "local") == 2


# ---- scaling a cut trial -----------------------------------------------------------------------------------------
def test_rounds_scale_per_stage_first_steady_and_last():
    # encoder: first 5 + 9 x steady 1; dictionary: first 8 + 48 x steady 2 + last 3
    values = {1: 5.0, 2: 1.0, 3: 8.0, 4: 2.0, 5: 3.0}
    assert scale_rounds(values, Shape((2, 3), 1000), Shape((10, 50), 1000)) == pytest.approx(14 + 107)
    assert scale_rounds({1: 4.0, 2: 1.0, 3: 2.0}, Shape((3,), 1), Shape((20,), 1)) == pytest.approx(4 + 18 + 2)
    assert scale_rounds({1: 7.0}, Shape((1,), 1), Shape((1,), 1)) == 7.0
    assert scale_rounds({1: 7.0, 2: 1.0}, Shape((2,), 1), Shape((2,), 1)) == 8.0
    assert scale_rounds({2: 1.0}, Shape((3,), 1), Shape((20,), 1)) == pytest.approx(18)  # missing rounds count 0


def test_evaluations_scale_per_stage():
    values = {1: 1.0, 2: 1.0, 3: 4.0, 4: 6.0, 5: 10.0}  # encoder evaluations 1, dictionary ones 5, the last 10
    every = scale_evaluations(values, Shape((2, 3), 1), Shape((10, 50), 1))
    assert every == pytest.approx(10 + 10 * 1 + 49 * 5)
    assert scale_evaluations({5: 10.0}, Shape((2, 3), 1000), Shape((10, 50), 1000)) == 10.0
    # an evaluation every 5 rounds, measured in every cut round of the one stage: 3 earlier ones at their mean
    assert scale_evaluations({1: 2.0, 2: 4.0, 3: 9.0}, Shape((3,), 1), Shape((20,), 5)) == pytest.approx(9 + 3 * 3)


def _timing(trial_seconds, wall, rounds, evaluation, checkpoints=0.0):
    return TrialTiming("t", trial_seconds, wall, rounds, evaluation, checkpoints, None, 0.0, {})


def test_a_cut_trial_scales_to_a_full_trial():
    rows = [
        {"round": 1, "round_seconds": 2.0, "ot_seconds": {"0": 0.5, "1": 0.5}},
        {"round": 2, "round_seconds": 1.0, "ot_seconds": {"0": 0.25, "1": 0.25}, "barycenter_seconds": 0.1},
        {"round": 3, "round_seconds": 1.5, "ot_seconds": 0.5, "eval_seconds": 4.0, "predictor_seconds": 3.0},
    ]
    # the cut's trial: 12 s in Tune, 9 s of it in the run (rounds 4.5, evaluation 4): 3 s outside, 0.5 s setup
    estimate = scaled_trial(rows, _timing(12.0, 9.0, 4.5, 4.0), Shape((3,), 1000), Shape((20,), 1000))
    assert estimate.parts == pytest.approx(
        {
            "training": 2.0 + 18 * 1.0 + 1.5,
            "evaluation": 4.0,
            "checkpoints": 0.0,
            "start-up outside the run": 3.0,
            "setup and callbacks in the run": 0.5,
        }
    )
    assert estimate.subs == pytest.approx({"OT": 1.0 + 18 * 0.5 + 0.5, "barycenters": 18 * 0.1, "predictors": 3.0})
    assert estimate.seconds == pytest.approx(29.0) and estimate.in_run == pytest.approx(26.0)


def _kind(name, trials, at_once, parts, subs=None):
    return KindEstimate(name, trials, at_once, Shape((3,), 1), Shape((3,), 1), 1.0, TrialEstimate(parts, subs or {}))


def _parts(training, evaluation, outside, setup):
    return {
        "training": training,
        "evaluation": evaluation,
        "checkpoints": 0.0,
        "start-up outside the run": outside,
        "setup and callbacks in the run": setup,
    }


def test_kinds_add_up_in_trial_seconds_and_divide_by_the_trials_at_once():
    kinds = [_kind("a", 10, 2, _parts(100, 20, 8, 2), {"OT": 40.0}), _kind("b", 3, 1, _parts(1000, 0, 10, 0))]
    result = combine(kinds, grid_seconds=60.0, cold_seconds=5.0, processes=2)  # 2 processes start cold once
    assert result.trials == 13 and result.longest == 1010.0
    assert result.trial["training"] == 10 * 100 + 3 * 1000
    assert result.wall == pytest.approx(
        {
            "training": 10 * 100 / 2 + 3 * 1000,
            "evaluation": 100.0,
            "checkpoints": 0.0,
            "start-up outside the run": 40 + 30,
            "setup and callbacks in the run": 10.0,
            "cold start of the trial processes": 5.0,
            "grid / Tune": 60.0,
        }
    )
    assert result.trial["cold start of the trial processes"] == 10.0
    assert result.wall_seconds == pytest.approx(500 + 3000 + 100 + 70 + 10 + 5 + 60)
    assert (result.sub_trial, result.sub_wall) == ({"OT": 400.0}, {"OT": 200.0})
    table = format_estimate("fake", kinds, result, "measured: --quick's", ["- a note"])
    assert "13 trials in 2 kinds: 1.21 trial-hours, estimated wall 1.04 h (3745 s)" in table
    assert (
        "| training (rounds less evaluation, checkpoints) | scaled: the cut's rounds, per stage | 1.11 | 0.97 |"
        in table
    )
    assert "|   of which OT | scaled as training | 0.11 | 0.06 |" in table
    assert "|   of which predictors: not reported by the methods |" in table
    assert "| grid / Tune (no trial running) | measured: --quick's |  | 0.02 | 1.6% |" in table
    assert "| a | 10 | 2 | 3 | 3 | 3 | 1.0 | 130.0 | 122.0 |  |" in table
    summary = format_summary([PaperLine("fake", 2, result, (7200.0, 5), 600.0)])
    assert "| fake | 13 | 2 | 1.21 | 1.04 | 2.00 (5) | 93.5% | 2.7% | 2.3% | 1.6% | 10.0 min |" in summary


def test_the_cold_start_is_a_warm_up_trial_less_the_same_kind_warm():
    cold = {"a~warm-up1": 9.0, "b~warm-up2": 3.0, "a~warm-up3": 4.0, "gone~warm-up4": 50.0}
    assert cold_start(cold, {"a": 5.0, "b": 1.0}) == pytest.approx((4 + 2 + 0) / 3)  # never below 0
    assert cold_start({}, {"a": 5.0}) == 0.0


def test_trials_replaying_the_shared_stage_do_not_pay_it():
    kind = KindEstimate("k", 6, 2, Shape((2, 3), 1), Shape((2, 3), 1), 1.0, TrialEstimate(_parts(100, 20, 8, 2), {}))
    shared = dataclasses.replace(kind, computes=2, shared=30.0)  # 2 trials compute a 30 s stage, 4 replay it
    assert shared.total("training") == 6 * 100 - 4 * 30 and shared.total("evaluation") == kind.total("evaluation")
    assert shared.mean_seconds == pytest.approx(130 - 4 * 30 / 6) and shared.mean_in_run == pytest.approx(102)
    assert combine([shared], 0.0).wall["training"] == pytest.approx((600 - 120) / 2)


def test_kind_estimates_read_the_cut_directory(tmp_path, tiny_grid):
    spec, sweep, configs, clients = tiny_grid
    kinds = group_kinds(spec, sweep, configs, clients)
    rows = [
        {"round": 1, "round_seconds": 3.0, "eval_seconds": 1.0},
        {"round": 2, "round_seconds": 1.0, "eval_seconds": 1.0},
        {"round": 3, "round_seconds": 2.0, "eval_seconds": 2.0},
    ]
    _trial(tmp_path, "c1", rows, 1100.0, [{"time_total_s": 14.0, "timestamp": 1100}], wall=10.0)
    (tmp_path / "results.csv").write_text("trial_id,wall_seconds\nc1,10.0\n")
    committed = {settings_key(kinds[0].config): (30.0, 6)}
    (estimate,) = kind_estimates(
        kinds, {"fedavg@digits": 2, "slow@digits": 1}, tmp_path, {"c1": "fedavg@digits"}, 1, committed
    )
    # 10 rounds: 3 + 8 x 1 + 2 = 13; evaluations: 9 earlier at 1 + the last 2 = 11; 14 - 10 = 4 s outside the run
    assert (estimate.name, estimate.trials, estimate.at_once, estimate.cut_seconds) == ("fedavg@digits", 4, 2, 14.0)
    assert estimate.trial.parts["setup and callbacks in the run"] == pytest.approx(10 - 6 - 4)
    assert estimate.trial.seconds == pytest.approx(13 + 11 + 4) and estimate.committed == (30.0, 6)


# ---- the committed results ---------------------------------------------------------------------------------------
def _results(root, folder, text):
    (root / "results" / folder).mkdir(parents=True)
    (root / "results" / folder / "results.csv").write_text(text)


def test_committed_results_sum_each_trial_once_by_paper(tmp_path):
    header = "row,run,benchmark,target_domain,seed,trial_id,wall_seconds\n"
    _results(tmp_path, "fada", header + "a,fedavg,digits,mnist,0,t1,10\na-E,fedavg,digits,mnist,0,t1,10\n")
    _results(tmp_path, "fada-guard", header + "a,fedavg,digits,usps,0,t2,5.5\na,fedavg,digits,usps,1,t3,\n")
    _results(tmp_path, "feddadil/tep-pdn", header + "a,fedavg,tep,mode1,0,t1,7200\n")
    _results(tmp_path, "baselines", header + "a,fedavg,digits,mnist,0,t9,1\n")
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("fada", "feddadil-tep-pdn"):
        (specs / f"{name}.yaml").write_text("paper: x\n")
    entries = committed_results(["feddadil", "fada", "fedod"], tmp_path / "results", specs)
    assert [(e.name, e.folder, e.paper, e.spec is not None, e.walls) for e in entries] == [
        ("baselines", "results/baselines", None, False, {"t9": 1.0}),
        ("fada", "results/fada", "fada", True, {"t1": 10.0}),  # two rows read t1: once
        ("fada-guard", "results/fada-guard", "fada", False, {"t2": 5.5}),  # t3 has no wall_seconds
        ("feddadil-tep-pdn", "results/feddadil/tep-pdn", "feddadil", True, {"t1": 7200.0}),
    ]
    assert totals([e for e in entries if e.paper == "fada"]) == (15.5, 2)
    assert of_spec(entries, specs / "fada.yaml", ["fada"]) == [entries[1]]  # the spec that made it
    assert of_spec(entries, tmp_path / "fada-mine.yaml", ["fada"]) == entries[1:3]  # its paper's
    assert paper_of("fedodx", ["fedod"]) is None and paper_of("fada-real", ["fada", "fad"]) == "fada"
    text = format_committed(entries)
    assert "| feddadil | results/feddadil/tep-pdn | 1 | 2.00 |" in text and "| **fada** | all | 2 | 0.00 |" in text


def test_committed_trials_match_kinds_by_their_settings(tmp_path, tiny_grid):
    spec, sweep, configs, clients = tiny_grid
    kinds = group_kinds(spec, sweep, configs, clients)
    made = dict(TINY_SPEC, runs={"other-name": {"set": ["method.name=fedavg"]}}, rows=[{"name": "other-name"}])
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "fada.yaml").write_text(yaml.safe_dump(made))
    header = "row,run,benchmark,target_domain,seed,trial_id,wall_seconds\n"
    lines = "r,other-name,digits,mnist,0,t1,10\nr-E,other-name,digits,mnist,0,t1,10\nr,other-name,digits,usps,1,t2,20\n"
    _results(tmp_path, "fada", header + lines + "r,gone,digits,usps,1,t3,99\n")
    entries = committed_results(["fada"], tmp_path / "results", tmp_path / "specs")
    found = committed_kinds(entries, {settings_key(k.config) for k in kinds})
    assert found == {settings_key(kinds[0].config): (15.0, 2)}  # the same settings under another run name


# ---- one real cut trial ------------------------------------------------------------------------------------------
def test_a_real_cut_trial_scales_from_its_own_metrics(tmp_path):
    """FedDaDiL on tiny digits, 2 encoder + 4 dictionary rounds, cut to 2 + 3, run here on the local backend."""
    from fedsim.api import run_experiment
    from fedsim.experiments.sweep_grid import VARIANT_KEY
    from tools.benchmarks.protocol_grid import full_grid
    from tools.benchmarks.protocol_split import read_jsonl

    settings = (
        "method.name=feddadil method.encoder_rounds=2 method.encoder_epochs=1 run.rounds=6 run.eval_every=1000 "
        "data.max_train_per_domain=40 method.num_atoms=2 method.samples_per_atom=20 method.batch_size=10 "
        "method.classifier_steps=2 model.hidden=16 run.tensorboard=false run.progress=false run.checkpoint_every=0"
    ).split()
    spec = {"paper": "tiny", "seeds": [0], "set": settings, "benchmarks": {"digits": {"targets": ["usps"]}}}
    # DaDiL after it, at the same encoder settings: it replays FedDaDiL's encoder stage from the grid's cache
    spec.update(runs={"feddadil": {}, "dadil": {"set": ["method.name=dadil"]}}, rows=[{"name": "feddadil"}])
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    paper, sweep, configs, clients = full_grid(None, str(path), "local")
    kind, dadil = group_kinds(paper, sweep, configs, clients)
    assert (kind.computes, dadil.computes) == (1, 0)
    assert kind.shape == Shape((2, 4), 1000) and cut_shape(kind.shape) == Shape((2, 3), 1000)
    config = cut_sweep(sweep, [kind]).config_for({VARIANT_KEY: kind.name}, ("run.backend=local",))
    run_experiment(config, tmp_path / "cut" / "runs" / "c1")
    rows = read_jsonl(tmp_path / "cut" / "runs" / "c1" / "metrics.jsonl")
    assert [r.get("stage") for r in rows] == ["encoder"] * 2 + ["dictionary"] * 3
    assert [r["round"] for r in rows if r.get("evaluated")] == [5]
    (timing,) = trial_timings(tmp_path / "cut")
    estimate = scaled_trial(rows, timing, cut_shape(kind.shape), kind.shape)
    seconds = [r["round_seconds"] for r in rows]  # encoder: 2 measured; dictionary: first, 2 x steady, last
    assert estimate.parts["training"] == pytest.approx(sum(seconds) + seconds[3])
    assert estimate.parts["evaluation"] == pytest.approx(rows[-1]["eval_seconds"])
