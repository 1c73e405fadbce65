"""Ray Tune's side of a sweep's search: the parameter space, the searcher (seeded ``BasicVariantGenerator`` or
OptunaSearch inside :class:`GridPoints`) and ASHA, from the checked :class:`fedsim.experiments.sweep_space.
SearchSettings` (the flags, ranges and metric are described there).

This module imports Ray Tune: the command line imports it only when a sweep runs.
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Optional

from ray.tune.search import Searcher

from fedsim.experiments.sweep_space import Range, SearchSettings, check_schedule, require_optuna

log = logging.getLogger(__name__)


def param_space(axes: dict, ranges: dict, settings: SearchSettings) -> dict:
    """Tune's ``param_space``: the grid axes as ``tune.grid_search`` and the ranges as Tune's domains; for
    ``optuna`` the ranges only (:class:`GridPoints` adds each grid point's values)."""
    from ray import tune

    sampled = {key: Range.from_list(value).domain() for key, value in ranges.items()}
    if settings.search == "optuna":
        return sampled
    return {**{key: tune.grid_search(values) for key, values in axes.items()}, **sampled}


def num_samples(points: list, settings: SearchSettings) -> int:
    """Tune's ``num_samples``: the sampled configurations, times the grid points for :class:`GridPoints` (which
    makes each suggestion one trial per point); 1 for a plain grid."""
    if settings.search == "optuna":
        return settings.num_samples * len(points)
    return settings.num_samples or 1


def search_algorithm(points: list[dict], settings: SearchSettings, seed: int):
    """None (a grid: Tune's default generator), a seeded ``BasicVariantGenerator`` keeping each sample constant
    over the grid, or OptunaSearch (TPE seeded with ``seed``) inside :class:`GridPoints`."""
    search = settings.search
    if search is None:
        return None
    if search == "random":
        from ray.tune.search import BasicVariantGenerator

        return BasicVariantGenerator(constant_grid_search=True, random_state=seed)
    require_optuna()
    from ray.tune.search.optuna import OptunaSearch

    return GridPoints(OptunaSearch(metric=settings.metric_name, mode="max", seed=seed), points)


def scheduler(settings: SearchSettings, max_rounds: int):
    """ASHA on the metric per round (``time_attr="round"``), or None. ``max_t`` is one above the longest trial so
    that a trial left running reaches its own end (and reports its summary) instead of being stopped there."""
    if settings.scheduler is None:
        return None
    check_schedule(settings, max_rounds)
    grace = settings.grace_period
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(
        time_attr="round", metric=settings.metric_name, mode="max", grace_period=grace, max_t=max_rounds + 1
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
