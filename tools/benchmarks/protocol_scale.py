"""A full protocol's time from one measured cut trial per kind: the arithmetic.

A cut trial (:func:`tools.benchmarks.protocol_grid.cut_shape`) keeps, per stage, the stage's first round, a steady
round or more, and the run's last round. Its metrics.jsonl gives every round's ``*_seconds``; a full trial is then

* training: per stage, the first round + (rounds - 1, less the last round in the last stage) x the mean steady
  round, + the last round (:func:`scale_rounds`);
* evaluation: the last round's evaluation + per stage, the full run's earlier evaluations x the mean of the cut's
  earlier evaluations in that stage (:func:`scale_evaluations`); checkpoints: their mean x the full run's count;
* start-up: measured in the cut, once per trial (Tune's time less the run's, and the run's time less its rounds);
* OT, barycenters (inside training) and predictors (inside evaluation), where a method reports them as
  ``ot_seconds`` / ``*_ot_seconds``, ``*barycenter*_seconds``, ``*predictor*_seconds``: scaled as their parent.

A kind's trials cost that each, but for the stage the grid's trials share (FedDaDiL's and DaDiL's encoder, through
``run.cache_dir``): only the trials that compute it pay it, the others replay it (counted as no time). The grid
runs ``at_once`` of a kind's trials at a time, so a part's wall seconds are its trial-seconds / at_once, summed
over kinds, and the grid's own time (no trial running) is added once (:func:`combine`). Tune reuses a grid's trial
processes, so a kind is measured in a warm one (the cut starts with warm-up trials) and the cold start (a kind's
warm-up trial less its measured one, :func:`cold_start`) is paid once per process.
:func:`tools.benchmarks.protocol_report.format_estimate` prints it, saying which figures are measured and which
scaled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from tools.benchmarks.protocol_grid import Shape
from tools.benchmarks.protocol_split import STARTUP_PARTS, TrialTiming, seconds_in

PARTS = ("training", "evaluation", "checkpoints", *STARTUP_PARTS)
IN_RUN = ("training", "evaluation", "checkpoints", STARTUP_PARTS[1])  # what a run's wall_seconds holds
SUB_PARTS = {"OT": "training", "barycenters": "training", "predictors": "evaluation"}
GRID = "grid / Tune"
COLD = "cold start of the trial processes"  # once per process of the grid: imports, first calls
HOUR = 3600.0


def sub_part(metric: str) -> Optional[str]:
    """The named part a method's ``*_seconds`` metric belongs to (OT, barycenters, predictors), None: another."""
    if metric == "ot_seconds" or metric.endswith("_ot_seconds") or metric.startswith("ot_"):
        return "OT"
    if "barycenter" in metric:
        return "barycenters"
    if "predictor" in metric:
        return "predictors"
    return None


def per_round(rows: list[dict]) -> dict[str, dict[int, float]]:
    """metric -> round -> seconds, for every ``*_seconds`` metric of a run's metrics.jsonl rows."""
    out: dict[str, dict[int, float]] = {}
    for row in rows:
        if "round" not in row:
            continue
        for key, value in row.items():
            if key.endswith("_seconds") and value is not None:
                out.setdefault(key, {})[int(row["round"])] = seconds_in(value)
    return out


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def scale_stages(values: dict[int, float], cut: Shape, full: Shape) -> list[float]:
    """Per stage, a full run's sum of a per-round time, from the cut's rounds (missing rounds count 0)."""
    out, start = [], 1
    last = len(full.stages) - 1
    for index, (kept, count) in enumerate(zip(cut.stages, full.stages)):
        seconds = [values.get(r, 0.0) for r in range(start, start + kept)]
        start += kept
        steady = seconds[1:-1] if index == last else seconds[1:]
        typical = mean(steady) if steady else seconds[0]
        if index == last:
            out.append(seconds[-1] + (seconds[0] + (count - 2) * typical if count > 1 else 0.0))
        else:
            out.append(seconds[0] + (count - 1) * typical)
    return out


def scale_rounds(values: dict[int, float], cut: Shape, full: Shape) -> float:
    """A full run's sum of a per-round time, from the cut's rounds."""
    return sum(scale_stages(values, cut, full))


def scale_evaluations(values: dict[int, float], cut: Shape, full: Shape) -> float:
    """A full run's evaluation time: the cut's last evaluation, and per stage the full run's earlier evaluations
    at the mean of the cut's earlier ones in that stage (else of all of them, else of the last)."""
    final = values.get(cut.rounds, 0.0)
    early = {r: v for r, v in values.items() if r != cut.rounds}
    overall = mean(list(early.values())) if early else final
    total = final
    for index, count in enumerate(full.early_evaluations()):
        in_stage = [v for r, v in early.items() if cut.stage_of(r) == index]
        total += count * (mean(in_stage) if in_stage else overall)
    return total


@dataclass(frozen=True)
class TrialEstimate:
    """One full trial of a kind, scaled from its cut: seconds per part, per named sub-part, per other metric."""

    parts: dict
    subs: dict  # OT / barycenters / predictors -> seconds (absent: not reported)
    other: dict = field(default_factory=dict)
    stages: tuple = ()  # the training part per stage

    @property
    def seconds(self) -> float:
        return sum(self.parts.values())

    @property
    def in_run(self) -> float:
        return sum(self.parts[p] for p in IN_RUN)


def scaled_trial(rows: list[dict], timing: TrialTiming, cut: Shape, full: Shape) -> TrialEstimate:
    """A full trial of shape ``full`` from the rows (metrics.jsonl) and times of a cut trial of shape ``cut``."""
    metrics = per_round(rows)
    evaluated = set(cut.evaluated())
    checkpoints = list(metrics.get("checkpoint_seconds", {}).values())
    stages = scale_stages(metrics.get("round_seconds", {}), cut, full)
    parts = {
        "training": sum(stages),
        "evaluation": scale_evaluations(metrics.get("eval_seconds", {}), cut, full),
        "checkpoints": mean(checkpoints) * full.checkpoints(),
        STARTUP_PARTS[0]: timing.trial_seconds - timing.wall_seconds,
        STARTUP_PARTS[1]: timing.wall_seconds - timing.rounds - timing.evaluation - timing.checkpoints,
    }
    subs: dict[str, float] = {}
    other: dict[str, float] = {}
    for metric, values in metrics.items():
        if metric in ("round_seconds", "eval_seconds", "checkpoint_seconds"):
            continue
        name = sub_part(metric)
        only_evaluated = set(values) <= evaluated and len(evaluated) < cut.rounds
        if SUB_PARTS.get(name) == "evaluation" or (name is None and only_evaluated):
            seconds = scale_evaluations(values, cut, full)
        else:
            seconds = scale_rounds(values, cut, full)
        if name is None:
            other[metric] = seconds
        else:
            subs[name] = subs.get(name, 0.0) + seconds
    return TrialEstimate(parts, subs, other, tuple(stages))


@dataclass(frozen=True)
class KindEstimate:
    """A kind of trials: its count, how many run at once, its cut trial's time and a full trial's estimate.

    ``computes`` of its trials compute the stage the grid's trials share (its first stage, ``shared`` seconds of
    training); the others replay it from the grid's cache, counted as taking no time."""

    name: str
    trials: int
    at_once: int
    shape: Shape
    cut: Shape
    cut_seconds: float  # the cut trial's time in Tune, measured
    trial: TrialEstimate
    committed: Optional[tuple[float, int]] = None  # mean wall_seconds and trials of committed runs of these settings
    computes: Optional[int] = None  # None: every trial
    shared: float = 0.0

    def total(self, part: str) -> float:
        """The part's seconds over the kind's trials."""
        replays = self.trials - (self.trials if self.computes is None else self.computes)
        return self.trials * self.trial.parts[part] - (replays * self.shared if part == "training" else 0.0)

    @property
    def mean_seconds(self) -> float:
        return sum(self.total(p) for p in PARTS) / self.trials if self.trials else 0.0

    @property
    def mean_in_run(self) -> float:
        return sum(self.total(p) for p in IN_RUN) / self.trials if self.trials else 0.0


@dataclass(frozen=True)
class Totals:
    """A protocol's estimate: trial-seconds and wall seconds per part (sub-parts apart, None: not reported)."""

    trials: int
    trial: dict
    wall: dict
    sub_trial: dict
    sub_wall: dict
    longest: float  # the longest single trial, seconds

    @property
    def wall_seconds(self) -> float:
        return sum(self.wall.values())


def combine(kinds: list[KindEstimate], grid_seconds: float, cold_seconds: float = 0.0, processes: int = 1) -> Totals:
    """Trial-seconds per part (x the kind's trials) and wall seconds (/ the trials at once), the cold start of the
    grid's ``processes`` trial processes (each once, side by side) and the grid's own time."""
    trial = {p: sum(k.total(p) for k in kinds) for p in PARTS}
    wall = {p: sum(k.total(p) / k.at_once for k in kinds) for p in PARTS}
    trial[COLD], wall[COLD] = processes * cold_seconds, cold_seconds
    wall[GRID] = grid_seconds
    sub_trial, sub_wall = {}, {}
    for name in SUB_PARTS:
        reporting = [k for k in kinds if name in k.trial.subs]
        if reporting:
            sub_trial[name] = sum(k.trials * k.trial.subs[name] for k in reporting)
            sub_wall[name] = sum(k.trials * k.trial.subs[name] / k.at_once for k in reporting)
    longest = max((k.trial.seconds for k in kinds), default=0.0)
    return Totals(sum(k.trials for k in kinds), trial, wall, sub_trial, sub_wall, longest)


def cold_start(cold: dict[str, float], warm: dict[str, float]) -> float:
    """The mean extra seconds of a kind's trial in a fresh process (``cold``: warm-up trial -> its seconds, named
    ``<kind>~warm-up<i>``) over the same trial in a warm one (``warm``: kind -> seconds); 0 when none compares."""
    from tools.benchmarks.protocol_grid import WARM_UP

    extra = [
        max(0.0, seconds - warm[name.rpartition(WARM_UP)[0]])
        for name, seconds in cold.items()
        if name.rpartition(WARM_UP)[0] in warm
    ]
    return mean(extra)
