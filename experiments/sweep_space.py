"""Search beyond grids in `fedsim sweep`: sampled ranges, Ray Tune's searchers, ASHA, and the score they rank by.

    fedsim sweep --methods fedavg --seeds 0,1 --set method.lr=loguniform(1e-4,1e-1) \\
        --search optuna --num-samples 20 --scheduler asha --select entropy,snd

A ``--set`` value ``loguniform(a,b)``, ``uniform(a,b)``, ``randint(a,b)`` or ``choice(a,b,...)`` is a range: Tune's
own ``tune.loguniform``, ``tune.uniform``, ``tune.randint`` (upper bound excluded, as Tune's) or ``tune.choice``. A
range samples a method or model setting (``method.*``, ``model.*``, ``<method>.*``) and needs ``--search``:

- ``random``: Tune's ``BasicVariantGenerator`` draws ``--num-samples`` configurations (seeded from the sweep's first
  seed) and keeps each one constant over the whole grid (``constant_grid_search``);
- ``optuna``: ``ray.tune.search.optuna.OptunaSearch`` (TPE, Bergstra et al., NeurIPS 2011; seeded from the sweep's
  first seed) suggests ``--num-samples`` configurations. Optuna takes no grid axis, so
  :class:`fedsim.experiments.sweep_search.GridPoints` runs each suggestion at every grid point (methods x local
  epochs x seeds x ``--set`` lists) and tells Optuna the mean of the metric over them.

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

This module holds what a sweep checks and stores without Ray (ranges, the typed search settings, the scores every
trial computes); :mod:`fedsim.experiments.sweep_search` turns them into Ray Tune's searchers and scheduler.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional

import yaml

from fedsim.coercion import closest, coerce_value
from fedsim.errors import UserError
from fedsim.experiments.flags import parse_list

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
#: a ``--set`` value written as a call, ``kind(arguments)``: a sampled range
RANGE_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)$", re.S)

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


def check_select(names) -> tuple[str, ...]:
    """Score names (``--select entropy,snd`` as text, or a list) -> a tuple, each in
    :data:`fedsim.selection.SCORES`."""
    if names is None:
        return ()
    from fedsim.selection import SCORES

    names = parse_list("select", names, str, "entropy,snd") if isinstance(names, str) else list(names)
    for name in names:
        if name not in SCORES:
            raise UserError(f"--select: unknown score {name!r}: the scores are {', '.join(SCORES)}")
    return tuple(names)


@dataclass(frozen=True)
class SearchSettings:
    """The search section of a sweep (``SweepSpec.search``, ``sweep.json``'s ``"search"``), parsed and checked
    once: how ranges are sampled, how trials are pruned, and the scores a selection compares. All unset for a
    plain grid."""

    search: Optional[str] = None
    """"random" or "optuna" (``--search``); None: nothing is sampled."""
    num_samples: Optional[int] = None
    """The sampled configurations (``--num-samples``; :data:`DEFAULT_NUM_SAMPLES` with a search), None without."""
    scheduler: Optional[str] = None
    """"asha" (``--scheduler``), or None."""
    grace_period: Optional[int] = None
    """ASHA's grace period in rounds (``--grace-period``; :data:`DEFAULT_GRACE_PERIOD` with ASHA), None without."""
    select: tuple[str, ...] = ()
    """The scores a selection report compares (``--select``); the first one is the metric."""
    metric: Optional[str] = None
    """The score trials are ranked by when ``--select`` names none, fixed when the sweep starts
    (:func:`fedsim.experiments.sweep_grid.spec_from_args`), so ``--resume`` ranks alike."""

    def __post_init__(self):
        for key, value, choices in (("search", self.search, SEARCHES), ("scheduler", self.scheduler, SCHEDULERS)):
            if value is not None and value not in choices:
                raise UserError(f"search setting {key}={value!r} is not one of {', '.join(choices)}")
        for key in ("num_samples", "grace_period"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UserError(f"search setting {key}={value!r} must be an integer of 1 or more")
        object.__setattr__(self, "select", check_select(self.select))
        if self.metric is not None:
            check_select([self.metric])

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "the sweep's search settings") -> "SearchSettings":
        """Settings from their stored form (:meth:`to_dict`); an unknown key or a value of the wrong type is one
        line naming it."""
        if not isinstance(raw, Mapping):
            raise UserError(f"{where} must be a mapping of settings, got {raw!r}")
        hints = typing.get_type_hints(cls)
        names = [f.name for f in fields(cls)]
        for key in raw:
            if key not in names:
                raise UserError(f"unknown search setting {key!r} in {where}: {closest(str(key), names)}")
        return cls(**{key: coerce_value(value, hints[key], f"search setting {key}") for key, value in raw.items()})

    def to_dict(self) -> dict:
        """The stored form: empty for a plain grid, else every setting (``metric`` only when fixed)."""
        if self.empty:
            return {}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "metric"}
        out["select"] = list(self.select)
        return out if self.metric is None else {**out, "metric": self.metric}

    @property
    def empty(self) -> bool:
        """No search flag was given: a plain grid."""
        return self == SearchSettings()

    @property
    def ranked(self) -> bool:
        """Whether a searcher or a scheduler ranks the trials by a metric."""
        return self.search is not None or self.scheduler is not None

    @property
    def metric_score(self) -> Optional[str]:
        """The score a searcher or scheduler ranks trials by: the first ``--select`` score, else :attr:`metric`
        (``source_accuracy`` with a validation part, else ``entropy``); None for a grid without either."""
        if not self.ranked:
            return None
        return (self.select or (self.metric or DEFAULT_SCORE,))[0]

    @property
    def metric_name(self) -> Optional[str]:
        """The reported metric of :attr:`metric_score`: ``score_<name>``."""
        score = self.metric_score
        return None if score is None else SCORE_PREFIX + reported_name(score)


def reported_name(score: str) -> str:
    """The name a score reports its metric under, ``score_<this>``: its declared name (a plugin's dotted path
    reports as ``score_<Score.name>``)."""
    from fedsim.selection import SCORES

    return SCORES.get(score).column()[len(SCORE_PREFIX) :]


def settings_from_args(args, ranges: dict) -> SearchSettings:
    """The search flags -> checked :class:`SearchSettings`."""
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
    return SearchSettings(
        search=search,
        num_samples=int(samples) if samples is not None else (DEFAULT_NUM_SAMPLES if search else None),
        scheduler=scheduler,
        grace_period=int(grace) if grace is not None else (DEFAULT_GRACE_PERIOD if scheduler else None),
        select=select,
    )


def require_optuna() -> None:
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UserError(f"--search optuna needs optuna, which is not installed: {INSTALL_HINT}") from None


def with_scores(config, settings: SearchSettings):
    """``config`` with ``run.scores`` holding, besides what the user asked for, the ``--select`` scores and the
    metric's score, so every trial computes them."""
    from fedsim.selection import SCORES, resolve_scores

    metric = settings.metric_score
    needed = list(dict.fromkeys(list(settings.select) + ([metric] if metric else [])))
    if not needed:
        return config
    from fedsim.registry import METHODS

    if METHODS.get(config.method.name).task != "classification":
        raise UserError(
            f"--select, --search and --scheduler read model-selection scores, computed from a classifier's logits, "
            f"and method {config.method.name!r} is a detection method: sweep it as a plain grid"
        )
    has_validation = config.data.validation_fraction > 0
    if metric == DEFAULT_SCORE and not settings.select and not has_validation:
        raise UserError(
            f"--search and --scheduler rank trials by a score without target labels, {DEFAULT_SCORE} unless "
            "--select names one, and it needs the sources' validation part: add --set data.validation_fraction=0.2 "
            "or give --select entropy"
        )
    asked = resolve_scores(config.run.scores, has_validation)
    wanted = list(dict.fromkeys([*asked, *needed]))
    listed = list(SCORES)  # built-ins and entry points in their order, then plugins named by a dotted path
    names = [name for name in listed if name in wanted] + [name for name in wanted if name not in listed]
    resolve_scores(names, has_validation)  # a --select score that needs the validation part says how to add it
    return dataclasses.replace(config, run=dataclasses.replace(config.run, scores=",".join(names)))


def check_schedule(settings: SearchSettings, max_rounds: int) -> None:
    """ASHA's grace period must leave rounds to stop: one line before anything runs."""
    grace = settings.grace_period
    if settings.scheduler and grace >= max_rounds:
        raise UserError(
            f"--grace-period {grace} leaves ASHA nothing to stop: give fewer rounds than the trials' {max_rounds}"
        )
