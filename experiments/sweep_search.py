"""Search beyond grids in `fedsim sweep`: sampled ranges, Ray Tune's searchers, ASHA, and the score they rank by.

    fedsim sweep --methods fedavg --seeds 0,1 --set method.lr=loguniform(1e-4,1e-1) \\
        --search optuna --num-samples 20 --scheduler asha --select entropy,snd

A ``--set`` value ``loguniform(a,b)``, ``uniform(a,b)``, ``randint(a,b)`` or ``choice(a,b,...)`` is a range: Tune's
own ``tune.loguniform``, ``tune.uniform``, ``tune.randint`` (upper bound excluded, as Tune's) or ``tune.choice``. A
range samples a method or model setting (``method.*``, ``model.*``, ``<method>.*``) and needs ``--search``:

- ``random``: Tune's ``BasicVariantGenerator`` draws ``--num-samples`` configurations (seeded from the sweep's first
  seed) and keeps each one constant over the whole grid (``constant_grid_search``);
- ``optuna``: ``ray.tune.search.optuna.OptunaSearch`` (TPE, Bergstra et al., NeurIPS 2011; seeded from the sweep's
  first seed) suggests
  ``--num-samples`` configurations. Optuna takes no grid axis, so :class:`GridPoints` runs each suggestion at every
  grid point (methods x local epochs x seeds x ``--set`` lists) and tells Optuna the mean of the metric over them.

Either way a sampled configuration runs at every grid point, seeds included: ``--num-samples N`` runs
N x (grid points) trials, and the seeds of one configuration share its sampled values, so a selection averages a
configuration over its seeds.

The metric (what Optuna maximizes and ASHA compares) is a score computed without target labels, reported as
``score_<name>`` on every evaluated round and in the run's summary: the first ``--select`` score, else
``source_accuracy`` (the sources' held-out validation accuracy, DomainBed's training-domain validation; Gulrajani &
Lopez-Paz, ICLR 2021) when ``data.validation_fraction`` is above 0, else ``entropy`` (the target's prediction
entropy, Morerio et al., ICLR 2018), which needs no validation part. Target accuracy is never the metric.
``--scheduler asha`` is Tune's ``ASHAScheduler`` (Li et al., MLSys 2020) on that metric with ``time_attr="round"``,
``--grace-period`` rounds (1 by default, Tune's own), Tune's reduction factor (4) and ``max_t`` one above the trials'
rounds (a trial that survives every rung ends by itself and reports its summary); it also prunes plain grids. ASHA
compares trials one by one (each seed of a configuration apart, as Tune runs them). A trial ASHA stops keeps its
rounds and has the status ``stopped``; it counts as not finished in a selection, so a configuration stopped at some
seed is not compared with those that finished there.

This module imports Ray Tune: the command line imports it only when a sweep runs.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from typing import Optional

import yaml
from ray.tune.search import Searcher

from fedsim.errors import UserError
from fedsim.experiments.sweep_grid import RANGE_CALL, parse_list

log = logging.getLogger(__name__)

SEARCHES = ("random", "optuna")
SCHEDULERS = ("asha",)
DEFAULT_NUM_SAMPLES = 10
DEFAULT_GRACE_PERIOD = 1  # ASHAScheduler's own default
DEFAULT_SCORE = "source_accuracy"  # the metric when --select names none
SCORE_PREFIX = "score_"
#: the sections a range may sample (besides a method's own ``<method>.<key>``): the grid's data, resources and
#: seeds decide each trial's federation and placement, which are checked and planned before the sweep starts
SAMPLED_SECTIONS = ("method", "model")
NOT_SAMPLED = {"method.name": "sweep methods with --methods a,b"}
INSTALL_HINT = "pip install 'fedsim-da[search]'"

EXAMPLES = {
    "loguniform": "loguniform(1e-4,1e-1)",
    "uniform": "uniform(0.1,0.9)",
    "randint": "randint(1,6)",
    "choice": "choice(16,32,64)",
}


@dataclass(frozen=True)
class Range:
    """One sampled ``--set`` value: ``kind`` (a key of :data:`EXAMPLES`) and its arguments."""

    kind: str
    args: tuple

    def domain(self):
        """Tune's own search-space object for this range."""
        from ray import tune

        return (
            getattr(tune, self.kind)(list(self.args)) if self.kind == "choice" else getattr(tune, self.kind)(*self.args)
        )

    def edges(self) -> list:
        """The values each grid point's config is checked with before the sweep: the bounds (randint's upper one
        excluded, as Tune's), every choice."""
        if self.kind == "choice":
            return list(self.args)
        if self.kind == "randint":
            return [self.args[0], self.args[1] - 1]
        return list(self.args)

    def to_list(self) -> list:
        return [self.kind, *self.args]

    @classmethod
    def from_list(cls, items: list) -> "Range":
        return cls(items[0], tuple(items[1:]))


def parse_range(name: str, raw: str) -> Range:
    """``loguniform(1e-4,1e-1)`` -> Range; a malformed range is one line naming the flag and an example."""
    text = raw.strip()
    match = RANGE_CALL.match(text)
    kind = match.group(1) if match else ""
    example = EXAMPLES.get(kind, EXAMPLES["loguniform"])

    def bad(why: str) -> UserError:
        return UserError(f"bad range --set {name}={text}: {why}; e.g. --set {name}={example}")

    if not match:
        raise bad("write it as kind(arguments)")
    if kind not in EXAMPLES:
        raise bad(f"unknown range {kind!r}, use one of {', '.join(EXAMPLES)}")
    items = [item.strip() for item in match.group(2).split(",")]
    if any(not item for item in items):
        raise bad("an argument is empty")
    if kind == "choice":
        if len(items) < 2:
            raise bad("give two values or more")
        values = []
        for item in items:
            if item.startswith(("[", "{", "(")):
                raise bad(f"{item!r} is not a plain value")
            try:
                value = yaml.safe_load(item)
            except yaml.YAMLError:
                raise bad(f"{item!r} is not a plain value") from None
            if value in values:
                raise bad(f"{item!r} is given twice")
            values.append(value)
        return Range(kind, tuple(values))
    if len(items) != 2:
        raise bad(f"{kind} takes two arguments, lower and upper, got {len(items)}")
    if kind == "randint":
        try:
            low, high = (int(item, 10) for item in items)
        except ValueError:
            raise bad("give two integers") from None
        if low >= high:
            raise bad("the lower bound must be below the upper one (the upper one is excluded)")
        return Range(kind, (low, high))
    try:
        low, high = (float(item) for item in items)
    except ValueError:
        raise bad("give two numbers") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise bad("give finite numbers")
    if low >= high:
        raise bad("the lower bound must be below the upper one")
    if kind == "loguniform" and low <= 0:
        raise bad("a log-uniform range needs a lower bound above 0")
    return Range(kind, (low, high))


def check_sampled_key(name: str, text: str, methods) -> None:
    """A range may sample ``method.*``, ``model.*`` or ``<method>.<key>``, never the grid's own keys."""
    section = name.split(".", 1)[0]
    if name in NOT_SAMPLED:
        raise UserError(f"--set {text}: {name} is not sampled: {NOT_SAMPLED[name]}")
    if section not in SAMPLED_SECTIONS and section not in methods:
        raise UserError(
            f"--set {text}: a range samples a method or model setting (method.*, model.*, <method>.*); "
            f"give {name} one value or a comma list (a grid axis)"
        )


def check_select(text: Optional[str]) -> list[str]:
    """``--select entropy,snd`` -> the score names, each in :data:`fedsim.selection.SCORES`."""
    if text is None:
        return []
    from fedsim.selection import SCORES

    names = parse_list("select", text, str, "entropy,snd")
    for name in names:
        if name not in SCORES:
            raise UserError(f"--select: unknown score {name!r}: the scores are {', '.join(SCORES)}")
    return names


def settings_from_args(args, ranges: dict) -> dict:
    """The search settings of ``sweep.json``: search, num_samples, scheduler, grace_period, select (checked)."""
    search = getattr(args, "search", None)
    scheduler = getattr(args, "scheduler", None)
    samples = getattr(args, "num_samples", None)
    grace = getattr(args, "grace_period", None)
    select = check_select(getattr(args, "select", None))
    if ranges and search is None:
        first = next(iter(ranges))
        raise UserError(
            f"--set {first}=... is a range: sample it with --search random or --search optuna "
            "(or give a comma list for a grid axis)"
        )
    if search is not None and not ranges:
        raise UserError(
            f"--search {search} samples ranges and the sweep gives none: "
            "add one, e.g. --set method.lr=loguniform(1e-4,1e-1)"
        )
    if samples is not None and search is None:
        raise UserError("--num-samples counts sampled configurations: give --search random or --search optuna")
    if grace is not None and scheduler is None:
        raise UserError("--grace-period is ASHA's: give --scheduler asha")
    if search == "optuna":
        require_optuna()
    return {
        "search": search,
        "num_samples": int(samples) if samples is not None else (DEFAULT_NUM_SAMPLES if search else None),
        "scheduler": scheduler,
        "grace_period": int(grace) if grace is not None else (DEFAULT_GRACE_PERIOD if scheduler else None),
        "select": select,
    }


def require_optuna() -> None:
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UserError(f"--search optuna needs optuna, which is not installed: {INSTALL_HINT}") from None


def metric_score(settings: dict) -> Optional[str]:
    """The score a searcher or scheduler ranks trials by: the first ``--select`` score, else the sweep's default
    metric (``source_accuracy`` with a validation part, else ``entropy``: :func:`fedsim.experiments.sweep_grid.
    spec_from_args`); None for a grid without either."""
    if not settings.get("search") and not settings.get("scheduler"):
        return None
    return (settings.get("select") or [settings.get("metric") or DEFAULT_SCORE])[0]


def metric_name(settings: dict) -> Optional[str]:
    """The reported metric of :func:`metric_score`: ``score_<name>``."""
    score = metric_score(settings)
    return None if score is None else SCORE_PREFIX + score


def with_scores(config, settings: dict):
    """``config`` with ``run.scores`` holding, besides what the user asked for, the ``--select`` scores and the
    metric's score, so every trial computes them."""
    import dataclasses

    from fedsim.selection import SCORES, resolve_scores

    metric = metric_score(settings)
    needed = list(dict.fromkeys(list(settings.get("select") or []) + ([metric] if metric else [])))
    if not needed:
        return config
    from fedsim.registry import METHODS

    if METHODS.get(config.method.name).task != "classification":
        raise UserError(
            f"--select, --search and --scheduler read model-selection scores, computed from a classifier's logits, "
            f"and method {config.method.name!r} is a detection method: sweep it as a plain grid"
        )
    has_validation = config.data.validation_fraction > 0
    if metric == DEFAULT_SCORE and not settings.get("select") and not has_validation:
        raise UserError(
            f"--search and --scheduler rank trials by a score without target labels, {DEFAULT_SCORE} unless "
            "--select names one, and it needs the sources' validation part: add --set data.validation_fraction=0.2 "
            "or give --select entropy"
        )
    asked = resolve_scores(config.run.scores, has_validation)
    names = [name for name in SCORES if name in set(asked) | set(needed)]
    resolve_scores(names, has_validation)  # a --select score that needs the validation part says how to add it
    return dataclasses.replace(config, run=dataclasses.replace(config.run, scores=",".join(names)))


def param_space(axes: dict, ranges: dict, settings: dict) -> dict:
    """Tune's ``param_space``: the grid axes as ``tune.grid_search`` and the ranges as Tune's domains; for
    ``optuna`` the ranges only (:class:`GridPoints` adds each grid point's values)."""
    from ray import tune

    sampled = {key: Range.from_list(value).domain() for key, value in ranges.items()}
    if settings.get("search") == "optuna":
        return sampled
    return {**{key: tune.grid_search(values) for key, values in axes.items()}, **sampled}


def num_samples(points: list, settings: dict) -> int:
    """Tune's ``num_samples``: the sampled configurations, times the grid points for :class:`GridPoints` (which
    makes each suggestion one trial per point); 1 for a plain grid."""
    if settings.get("search") == "optuna":
        return settings["num_samples"] * len(points)
    return settings.get("num_samples") or 1


def search_algorithm(points: list[dict], settings: dict, seed: int):
    """None (a grid: Tune's default generator), a seeded ``BasicVariantGenerator`` keeping each sample constant
    over the grid, or OptunaSearch (TPE seeded with ``seed``) inside :class:`GridPoints`."""
    search = settings.get("search")
    if search is None:
        return None
    if search == "random":
        from ray.tune.search import BasicVariantGenerator

        return BasicVariantGenerator(constant_grid_search=True, random_state=seed)
    require_optuna()
    from ray.tune.search.optuna import OptunaSearch

    return GridPoints(OptunaSearch(metric=metric_name(settings), mode="max", seed=seed), points)


def check_schedule(settings: dict, max_rounds: int) -> None:
    """ASHA's grace period must leave rounds to stop: one line before anything runs."""
    grace = settings.get("grace_period")
    if settings.get("scheduler") and grace >= max_rounds:
        raise UserError(
            f"--grace-period {grace} leaves ASHA nothing to stop: give fewer rounds than the trials' {max_rounds}"
        )


def scheduler(settings: dict, max_rounds: int):
    """ASHA on the metric per round (``time_attr="round"``), or None. ``max_t`` is one above the longest trial so
    that a trial left running reaches its own end (and reports its summary) instead of being stopped there."""
    if settings.get("scheduler") is None:
        return None
    check_schedule(settings, max_rounds)
    grace = settings["grace_period"]
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(
        time_attr="round", metric=metric_name(settings), mode="max", grace_period=grace, max_t=max_rounds + 1
    )


def _set_search_properties(searcher, metric, mode, config, **spec) -> bool:
    from ray.tune.search.util import _set_search_properties_backwards_compatible

    return _set_search_properties_backwards_compatible(searcher.set_search_properties, metric, mode, config, **spec)


class GridPoints(Searcher):
    """A Tune searcher wrapper: each configuration the inner searcher suggests runs once at every grid point (its
    values added to the configuration), and the inner searcher is told the mean of the metric over those trials
    (NaN-free values only; a failed configuration when none has one). As Tune's ``Repeater``, with the grid
    point's own values in place of a repeat index; its state is saved with the experiment (``get_state``), the
    inner searcher's by Tune itself, so ``Tuner.restore`` continues a search where it stopped."""

    def __init__(self, searcher, points: list[dict]):
        self.searcher = searcher
        self.points = [dict(point) for point in points]
        self.groups: list[dict] = []  # {"primary", "config", "trials": {trial id: metric or None (running)}}
        self.group_of: dict[str, int] = {}
        super().__init__(metric=searcher.metric, mode=searcher.mode)

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: dict, **spec) -> bool:
        return _set_search_properties(self.searcher, metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> Optional[dict]:
        group = self.groups[-1] if self.groups and len(self.groups[-1]["trials"]) < len(self.points) else None
        if group is None:
            config = self.searcher.suggest(trial_id)
            if config is None or config == self.FINISHED:
                return config
            group = {"primary": trial_id, "config": copy.deepcopy(config), "trials": {}}
            self.groups.append(group)
        point = self.points[len(group["trials"])]
        group["trials"][trial_id] = None
        self.group_of[trial_id] = len(self.groups) - 1
        return {**group["config"], **point}

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        if trial_id not in self.group_of:
            log.warning("trial %s completed outside every suggested configuration", trial_id)
            return
        group = self.groups[self.group_of[trial_id]]
        value = (result or {}).get(self.searcher.metric)
        group["trials"][trial_id] = float(value) if value is not None else math.nan
        values = list(group["trials"].values())
        if len(values) < len(self.points) or any(v is None for v in values):
            return
        finite = [v for v in values if math.isfinite(v)]
        if finite:
            self.searcher.on_trial_complete(group["primary"], result={self.searcher.metric: sum(finite) / len(finite)})
        else:
            self.searcher.on_trial_complete(group["primary"], result=None, error=True)

    def get_state(self) -> dict:
        return copy.deepcopy({key: value for key, value in self.__dict__.items() if key != "searcher"})

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)
