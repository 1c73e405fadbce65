"""`fedsim sweep` beyond grids: ranges in --set, Tune's searchers (random, Optuna) over the grid, ASHA on a
label-free score, --select, and a small Optuna + ASHA sweep that is interrupted and resumed."""

import csv
import json
import math
import os
import signal
import threading
import time

import pytest

from fedsim.config import load_config
from fedsim.errors import UserError
from fedsim.experiments import sweep_search
from fedsim.experiments.cli import build_parser, main
from fedsim.experiments.sweep import default_setting, selection_keys
from fedsim.experiments.sweep_grid import point_key, range_checks, spec_from_args
from fedsim.experiments.sweep_search import GridPoints
from fedsim.experiments.sweep_space import Range, SearchSettings, parse_range, with_scores
from fedsim.experiments.sweep_trial import TrialPlan, TrialResources, summary_row
from fedsim.selection import resolve_scores


def _flags(overrides, drop=()):
    flags = []
    for item in overrides:
        if item.split("=", 1)[0] not in drop:
            flags += ["--set", item]
    return flags


def _spec(argv):
    return spec_from_args(build_parser().parse_args(["sweep"] + argv))


def test_ranges_parse_to_tunes_own_domains():
    from ray.tune.search.sample import Categorical, Float, Integer, LogUniform, Uniform

    lr = parse_range("method.lr", "loguniform(1e-4, 1e-1)")
    assert lr == Range("loguniform", (1e-4, 0.1))
    domain = lr.domain()
    assert isinstance(domain, Float) and isinstance(domain.get_sampler(), LogUniform)
    assert (domain.lower, domain.upper) == (1e-4, 0.1)
    mu = parse_range("fedprox.mu", "uniform(0,1)").domain()
    assert isinstance(mu.get_sampler(), Uniform) and (mu.lower, mu.upper) == (0.0, 1.0)
    epochs = parse_range("method.local_epochs", "randint(1,4)")
    assert isinstance(epochs.domain(), Integer) and (epochs.domain().lower, epochs.domain().upper) == (1, 4)
    assert epochs.edges() == [1, 3]  # Tune's randint excludes its upper bound
    batch = parse_range("method.batch_size", "choice(16,32,64)")
    assert isinstance(batch.domain(), Categorical) and batch.domain().categories == [16, 32, 64]
    assert parse_range("model.name", "choice(mlp,linear)").args == ("mlp", "linear")
    assert Range.from_list(lr.to_list()) == lr


BAD_RANGES = [
    ("loguniform(1e-4)", "loguniform takes two arguments, lower and upper, got 1"),
    ("loguniform(0,1)", "a log-uniform range needs a lower bound above 0"),
    ("uniform(0.5,0.1)", "the lower bound must be below the upper one"),
    ("uniform(a,1)", "give two numbers"),
    ("uniform(0,inf)", "give finite numbers"),
    ("randint(1.5,4)", "give two integers"),
    ("randint(3,3)", "the upper one is excluded"),
    ("choice(8)", "give two values or more"),
    ("choice(8,8)", "'8' is given twice"),
    ("choice(8,,16)", "an argument is empty"),
    ("choice([1],[2])", "'[1]' is not a plain value"),
    ("logunifrom(1e-4,1e-1)", "unknown range 'logunifrom', use one of loguniform, uniform, randint, choice"),
]


@pytest.mark.parametrize("text, why", BAD_RANGES)
def test_a_malformed_range_is_one_line_naming_the_flag_and_an_example(text, why):
    with pytest.raises(UserError) as info:
        parse_range("method.lr", text)
    message = str(info.value)
    assert message.startswith(f"bad range --set method.lr={text}: ") and why in message
    assert "; e.g. --set method.lr=" in message and "\n" not in message


def test_a_range_becomes_a_sampled_key_and_a_comma_list_stays_an_axis(toy_overrides):
    spec = _spec(
        ["--seeds", "0,1", "--set", "method.lr=loguniform(1e-3,1e-1)", "--set", "method.local_epochs=1,2"]
        + ["--search", "random", "--num-samples", "3"]
        + _flags(toy_overrides, drop=("method.lr",))
    )
    assert spec.ranges == {"method.lr": ["loguniform", 0.001, 0.1]}
    assert spec.axes == {"method.name": ["fedavg"], "method.local_epochs": [1, 2], "run.seed": [0, 1]}
    # no --select and no validation part: the target's prediction entropy ranks
    assert spec.search == SearchSettings(search="random", num_samples=3, metric="entropy")
    assert json.loads(spec.to_json())["search"] == {
        "search": "random",
        "num_samples": 3,
        "scheduler": None,
        "grace_period": None,
        "select": [],
        "metric": "entropy",
    }
    again = type(spec).from_json(spec.to_json())  # sweep.json keeps the ranges and the search for --resume
    assert (again.ranges, again.search, again.axes) == (spec.ranges, spec.search, spec.axes)
    # run.scores takes a comma list of its own: a constant, not a grid axis
    spec = _spec(["--set", "run.scores=entropy,snd"] + _flags(toy_overrides))
    assert "run.scores=entropy,snd" in spec.overrides and "run.scores" not in spec.axes


def test_random_search_keeps_each_sample_constant_over_the_grid(toy_overrides):
    """BasicVariantGenerator with constant_grid_search: N samples x every grid point, the seeds of a sample share
    its values; the draw is seeded by the sweep's first seed."""
    spec = _spec(
        ["--seeds", "3,4", "--set", "method.lr=loguniform(1e-3,1e-1)", "--set", "method.batch_size=choice(8,16)"]
        + ["--search", "random", "--num-samples", "3"]
        + _flags(toy_overrides, drop=("method.lr", "method.batch_size"))
    )
    space = sweep_search.param_space(spec.axes, spec.ranges, spec.search)
    assert space["run.seed"] == {"grid_search": [3, 4]} and space["method.name"] == {"grid_search": ["fedavg"]}
    assert sweep_search.num_samples(spec.points(), spec.search) == 3

    def draw():
        generator = sweep_search.search_algorithm(spec.points(), spec.search, seed=3)
        generator.add_configurations({"sweep": {"run": lambda config: None, "num_samples": 3, "config": dict(space)}})
        trials = []
        while (trial := generator.next_trial()) is not None:
            trials.append(trial.config)
        return trials

    trials = draw()
    assert len(trials) == 3 * 2
    samples = {}
    for config in trials:
        assert 1e-3 <= config["method.lr"] <= 1e-1 and config["method.batch_size"] in (8, 16)
        samples.setdefault((config["method.lr"], config["method.batch_size"]), []).append(config["run.seed"])
    assert len(samples) == 3 and all(sorted(seeds) == [3, 4] for seeds in samples.values())
    assert [c["method.lr"] for c in draw()] == [c["method.lr"] for c in trials]  # seeded


def test_optuna_search_space_and_its_suggestions_over_the_grid(toy_overrides):
    """OptunaSearch takes no grid axis: the space is the ranges only, GridPoints runs each suggestion at every grid
    point and tells Optuna the mean of the metric over them."""
    from ray.tune.search.optuna import OptunaSearch

    spec = _spec(
        ["--seeds", "0,1", "--set", "method.lr=loguniform(1e-3,1e-1)", "--search", "optuna", "--num-samples", "2"]
        + ["--select", "entropy,snd"]
        + _flags(toy_overrides, drop=("method.lr",))
    )
    space = sweep_search.param_space(spec.axes, spec.ranges, spec.search)
    assert list(space) == ["method.lr"]  # no grid_search: Optuna would refuse it
    assert sweep_search.num_samples(spec.points(), spec.search) == 2 * 2
    searcher = sweep_search.search_algorithm(spec.points(), spec.search, seed=0)
    assert isinstance(searcher, GridPoints) and isinstance(searcher.searcher, OptunaSearch)
    assert searcher.metric == "score_entropy" and searcher.mode == "max"  # the first --select score
    searcher.set_search_properties(None, None, space)
    first, second, third = (searcher.suggest(f"t{i}") for i in range(3))
    assert first["method.lr"] == second["method.lr"] != third["method.lr"]
    assert (first["run.seed"], second["run.seed"], third["run.seed"]) == (0, 1, 0)
    assert first["method.name"] == "fedavg" and 1e-3 <= first["method.lr"] <= 1e-1
    searcher.on_trial_complete("t0", {"score_entropy": -0.5})
    study = searcher.searcher._ot_study
    assert study.trials[0].value is None  # told only once every grid point of the suggestion has ended
    searcher.on_trial_complete("t1", {"score_entropy": -0.25})
    assert study.trials[0].value == pytest.approx(-0.375) and study.trials[0].params["method.lr"] == first["method.lr"]


class _Inner:
    """A searcher that suggests lr = 1, 2, ... and keeps what it is told."""

    metric, mode = "score_snd", "max"

    def __init__(self):
        self.told = []
        self.count = 0

    def set_search_properties(self, metric, mode, config, **spec):
        return True

    def suggest(self, trial_id):
        self.count += 1
        return {"method.lr": float(self.count)}

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.told.append((trial_id, result, error))


def test_grid_points_means_over_its_trials_and_its_state_restores():
    points = [{"run.seed": 0}, {"run.seed": 1}, {"run.seed": 2}]
    inner = _Inner()
    searcher = GridPoints(inner, points)
    configs = [searcher.suggest(f"t{i}") for i in range(6)]
    assert [c["method.lr"] for c in configs] == [1.0] * 3 + [2.0] * 3
    assert [c["run.seed"] for c in configs] == [0, 1, 2, 0, 1, 2]
    searcher.on_trial_complete("t0", {"score_snd": 1.0})
    searcher.on_trial_complete("t1", {"round": 1})  # stopped before it reported the score: left out of the mean
    state = searcher.get_state()
    restored = GridPoints(inner, [])
    restored.set_state(state)  # as Tune's SearchGenerator does when a sweep resumes
    restored.on_trial_complete("t2", {"score_snd": 3.0})
    assert inner.told == [("t0", {"score_snd": 2.0}, False)]
    for trial in ("t3", "t4", "t5"):  # none reported the score: a failed suggestion
        restored.on_trial_complete(trial, None, error=True)
    assert inner.told[-1] == ("t3", None, True)
    assert restored.suggest("t6") == {"method.lr": 3.0, "run.seed": 0}


class _Trial:
    def __init__(self, trial_id):
        self.trial_id = trial_id


def test_asha_stops_by_the_score_per_round_and_skips_rounds_without_it(toy_overrides):
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    spec = _spec(["--scheduler", "asha", "--grace-period", "2", "--select", "snd"] + _flags(toy_overrides))
    assert spec.search.scheduler == "asha" and spec.search.search is None  # ASHA also prunes a plain grid
    scheduler = sweep_search.scheduler(spec.search, max_rounds=8)
    assert isinstance(scheduler, ASHAScheduler)
    assert (scheduler._time_attr, scheduler._metric, scheduler._mode) == ("round", "score_snd", "max")
    assert scheduler._max_t == 9 and [m for m, _ in scheduler._brackets[0]._rungs] == [8, 2]
    good, bad = _Trial("good"), _Trial("bad")
    for trial in (good, bad):
        scheduler.on_trial_add(None, trial)
    continue_, stop = TrialScheduler.CONTINUE, TrialScheduler.STOP
    assert scheduler.on_trial_result(None, good, {"round": 2, "score_snd": 3.0}) == continue_
    assert scheduler.on_trial_result(None, bad, {"round": 2}) == continue_  # a round without evaluation
    assert scheduler.on_trial_result(None, bad, {"round": 2, "score_snd": 1.0}) == stop
    with pytest.raises(UserError, match="--grace-period 2 leaves ASHA nothing to stop"):
        sweep_search.scheduler(spec.search, max_rounds=2)


def test_the_metric_is_a_label_free_score_and_every_trial_computes_it(toy_overrides):
    assert SearchSettings(search="optuna", num_samples=2, select=("snd", "entropy")).metric_name == "score_snd"
    assert SearchSettings(scheduler="asha", grace_period=1).metric_name == "score_source_accuracy"
    assert SearchSettings(select=("snd",)).metric_name is None  # a grid that only selects afterwards
    config = load_config(None, toy_overrides + ["run.scores=snd"])
    with_select = with_scores(config, SearchSettings(select=("entropy", "snd")))
    assert with_select.run.scores == "entropy,snd"  # the user's and --select's, in the registry's order
    held_out = load_config(None, toy_overrides + ["data.validation_fraction=0.2", "run.scores=snd,entropy"])
    ranked = with_scores(held_out, SearchSettings(search="random", num_samples=2, select=("dev",)))
    assert ranked.run.scores == "entropy,snd,dev"  # the user's and --select's (dev, also the metric)
    default_metric = with_scores(held_out, SearchSettings(scheduler="asha", grace_period=1))
    assert default_metric.run.scores == "source_accuracy,entropy,snd"  # + source_accuracy, ASHA's metric
    auto = with_scores(load_config(None, toy_overrides), SearchSettings(select=("snd",)))
    assert set(auto.run.scores.split(",")) == {*resolve_scores("auto", has_validation=False), "snd"}
    with pytest.raises(UserError, match="needs the sources' held-out validation part"):
        with_scores(config, SearchSettings(select=("iwv",)))


def test_trial_resources_and_overrides_ignore_sampled_values(toy_overrides):
    point = {"method.name": "fedavg", "method.local_epochs": 1, "run.seed": 0}
    resources = TrialResources({point_key(point): TrialPlan(1, 0.5, 0.0)}, keys=list(point))
    assert resources({**point, "method.lr": 0.0123}).bundles[1] == {"CPU": 0.5}
    spec = _spec(
        ["--methods", "fedavg,fedprox", "--set", "fedprox.mu=uniform(0.01,1)", "--search", "random"]
        + ["--select", "entropy"]
        + _flags(toy_overrides)
    )
    configs = {p["method.name"]: spec.config_for({**p, "fedprox.mu": 0.25}) for p in spec.points()}
    assert configs["fedprox"].method.params.mu == 0.25 and not hasattr(configs["fedavg"].method.params, "mu")
    assert range_checks({"method.lr": ["loguniform", 0.001, 0.1], "method.batch_size": ["choice", 8, 16, 32]}) == [
        {"method.lr": 0.001, "method.batch_size": 8},
        {"method.lr": 0.1, "method.batch_size": 8},
        {"method.lr": 0.001, "method.batch_size": 16},
        {"method.lr": 0.001, "method.batch_size": 32},
    ]


def test_selection_groups_by_method_and_defaults_to_a_plain_runs_values(toy_overrides):
    spec = _spec(
        ["--methods", "fedavg,fedprox", "--local-epochs", "1,2", "--seeds", "0,1", "--set", "fedprox.mu=uniform(0,1)"]
        + ["--set", "method.lr=loguniform(1e-3,1e-1)", "--search", "random", "--select", "entropy"]
        + _flags(toy_overrides, drop=("method.lr",))
    )
    group_by, candidates = selection_keys(spec)
    assert group_by == ["method"] and candidates == ["local_epochs", "fedprox.mu", "method.lr"]
    default = default_setting(spec, candidates)  # per group: a plain run of its method (defaults, recipe)
    assert default({"method": "fedprox"}) == {"local_epochs": 1, "fedprox.mu": 0.01, "method.lr": 0.05}
    assert default({"method": "fedavg"}) == {"local_epochs": 1, "method.lr": 0.05}


def test_summary_row_carries_the_scores_a_searcher_reads():
    row = summary_row({"rounds": 2, "score_entropy": -0.5, "score_snd": 4.0, "source_accuracy": {"a": 0.5}}, "")
    assert row["score_entropy"] == -0.5 and row["summary/score_entropy"] == -0.5 and row["score_snd"] == 4.0


BAD_SWEEPS = [
    (["--set", "method.lr=loguniform(1e-4,1e-1)"], "is a range: sample it with --search random or --search optuna"),
    (["--search", "random"], "--search random samples ranges and the sweep gives none"),
    (["--num-samples", "3"], "--num-samples counts sampled configurations"),
    (["--num-samples", "0"], "--num-samples must be an integer of 1 or more, got '0'"),
    (["--grace-period", "1"], "--grace-period is ASHA's: give --scheduler asha"),
    (["--select", "entropyy"], "--select: unknown score 'entropyy'"),
    (["--select", "entropy,entropy"], "lists 'entropy' twice"),
    (["--set", "method.lr=loguniform(1e-1,1e-4)", "--search", "random"], "bad range --set method.lr="),
    (["--set", "run.seed=randint(0,3)", "--search", "random"], "a range samples a method or model setting"),
    (["--set", "method.name=choice(fedavg,fedprox)", "--search", "random"], "sweep methods with --methods a,b"),
    (["--set", "method.batch_size=randint(0,4)", "--search", "random", "--select", "entropy"], "batch_size must be"),
    (["--scheduler", "asha", "--grace-period", "5", "--select", "entropy"], "--grace-period 5 leaves ASHA nothing"),
    (["--select", "source_loss"], "add --set data.validation_fraction=0.2"),
    (["--resume", "--search", "random"], "drop --search"),
]


@pytest.mark.parametrize("args, expected", BAD_SWEEPS)
def test_bad_search_input_one_line_exit_2_nothing_written(args, expected, toy_overrides, tmp_path, capsys):
    out = tmp_path / "never"
    drop = ("method.lr", "method.batch_size") if any("method." in a for a in args) else ()
    code = main(["sweep", "-q", "--out", str(out)] + _flags(toy_overrides, drop=drop) + args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_optuna_missing_names_the_extra_to_install(toy_overrides, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna -> ImportError
    out = tmp_path / "never"
    args = ["--set", "method.lr=loguniform(1e-4,1e-1)", "--search", "optuna", "--select", "entropy"]
    assert main(["sweep", "-q", "--out", str(out)] + _flags(toy_overrides, drop=("method.lr",)) + args) == 2
    err = capsys.readouterr().err
    assert "--search optuna needs optuna, which is not installed: pip install 'fedsim-da[search]'" in err
    assert not out.exists()


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_optuna_asha_sweep_interrupted_then_resumed(toy_overrides, tmp_path, ray_cluster, capsys):
    """Optuna samples two learning rates, each run at seeds 0 and 1 (four trials, one at a time), ASHA ranks them
    by the sources' validation accuracy. A Ctrl-C-like stop as soon as the first trial starts leaves the sweep
    unfinished; --resume restores Tune's searcher (Optuna's study and GridPoints' groups), so a trial restarted
    keeps its learning rate, and each learning rate runs at both seeds: a searcher that lost its state would draw
    a third one, or run one at a single seed."""
    out = tmp_path / "sweep"
    args = [
        "sweep",
        "-q",
        "--out",
        str(out),
        "--seeds",
        "0,1",
        "--cpus-per-client",
        "1",
        "--set",
        "method.lr=loguniform(1e-3,1e-1)",
        "--search",
        "optuna",
        "--num-samples",
        "2",
        "--scheduler",
        "asha",
        "--select",
        "source_accuracy,entropy",
    ] + _flags(toy_overrides, drop=("method.lr", "run.rounds"))
    args += _flags(["data.validation_fraction=0.2", "run.rounds=6", "ray.max_actors=1", "run.checkpoint_every=0"])
    stop = threading.Event()

    def interrupt_in_first_trial():
        while not stop.is_set():
            if any(out.glob("runs/*")):  # the first trial's run directory: it has just started
                os.kill(os.getpid(), signal.SIGUSR1)  # Tune stops on SIGINT or SIGUSR1 and saves its state
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=interrupt_in_first_trial, daemon=True)
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)  # a late signal must never end pytest
    watcher.start()
    try:
        assert main(args) == 1
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)
    assert f"continue with 'fedsim sweep --resume --out {out}'" in capsys.readouterr().err
    before = {r["trial_id"]: r for r in _rows(out / "results.csv")}
    assert 1 <= len(before) and any(r["status"] in ("interrupted", "pending") for r in before.values())
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["ranges"] == {"method.lr": ["loguniform", 0.001, 0.1]}
    assert saved["search"] == {
        "search": "optuna",
        "num_samples": 2,
        "scheduler": "asha",
        "grace_period": 1,
        "select": ["source_accuracy", "entropy"],
    }

    assert main(["sweep", "-q", "--resume", "--out", str(out)]) == 0
    rows = _rows(out / "results.csv")
    assert len(rows) == 4 and {r["status"] for r in rows} <= {"finished", "stopped"}
    by_lr = {}
    for row in rows:
        by_lr.setdefault(float(row["method.lr"]), []).append(row["seed"])
        assert 1e-3 <= float(row["method.lr"]) <= 1e-1
        if row["status"] == "finished":
            assert row["rounds"] == "6" and 0 <= float(row["score_source_accuracy"]) <= 1
        else:
            assert 1 <= int(row["rounds"]) < 6
    assert len(by_lr) == 2 and all(sorted(seeds) == ["0", "1"] for seeds in by_lr.values())
    for trial_id, row in before.items():  # the trials that had started before the stop keep their sampled values
        after = next(r for r in rows if r["trial_id"] == trial_id)
        assert after["method.lr"] == row["method.lr"] or row["status"] == "pending"
        if row["status"] == "finished":
            assert after["wall_seconds"] == row["wall_seconds"]  # not run again
    for result in out.glob("tune/*/result.json"):  # every evaluated round reports the metric ASHA reads
        rounds = [json.loads(line) for line in result.read_text().splitlines()]
        assert all(math.isfinite(r["score_source_accuracy"]) for r in rounds if r.get("round"))
    selection = (out / "selection.md").read_text()
    assert "| method=fedavg |" in selection and "source_accuracy (score)" in selection
    assert (out / "selection.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_select_a_search_ranks_by_source_accuracy_with_a_validation_part_else_by_entropy(toy_overrides):
    lr = ["--set", "method.lr=loguniform(1e-3,1e-1)", "--search", "random"]
    flags = _flags(toy_overrides, drop=("method.lr",))
    plain = _spec(flags + lr)
    held_out = _spec(flags + ["--set", "data.validation_fraction=0.2"] + lr)
    axis = _spec(flags + ["--set", "data.validation_fraction=0,0.2", "--scheduler", "asha"])
    assert (plain.search.metric, held_out.search.metric, axis.search.metric) == (
        "entropy",
        "source_accuracy",
        "entropy",  # a grid point without a validation part could not report source_accuracy
    )
    chosen = _spec(flags + lr + ["--select", "mano"])
    assert chosen.search.metric is None and chosen.search.metric_name == "score_mano"
    assert plain.search.metric_name == "score_entropy"


def test_the_search_section_is_parsed_and_checked_once_with_one_line_errors():
    assert SearchSettings.from_dict({}) == SearchSettings() and SearchSettings().to_dict() == {}  # a plain grid
    stored = SearchSettings(search="optuna", num_samples=4, select=["snd", "entropy"])
    assert stored.select == ("snd", "entropy") and stored.ranked and not stored.empty
    assert SearchSettings.from_dict(json.loads(json.dumps(stored.to_dict()))) == stored
    bad = [
        ({"num_sample": 3}, "unknown search setting 'num_sample' in the sweep's search settings: did you mean "),
        ({"num_samples": "many"}, "search setting num_samples must be an integer, got 'many'"),
        ({"num_samples": 0}, "search setting num_samples=0 must be an integer of 1 or more"),
        ({"search": "grid"}, "search setting search='grid' is not one of random, optuna"),
        ({"scheduler": "hyperband"}, "search setting scheduler='hyperband' is not one of asha"),
        ({"select": ["snd2"]}, "--select: unknown score 'snd2'"),
    ]
    for raw, message in bad:
        with pytest.raises(UserError) as caught:
            SearchSettings.from_dict(raw)
        assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
