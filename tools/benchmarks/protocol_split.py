"""Where a finished reproduction's wall time went, from what its trials wrote.

A ``fedsim reproduce`` directory (``runs/<trial id>/metrics.jsonl`` and ``summary.json``, Tune's ``tune/*/result.json``,
``results.csv``) read into one :class:`TrialTiming` per trial (:func:`trial_timings`), and the command's wall time
split into its parts (:func:`split_protocol`, printed by :func:`format_split`):

* training: the trials' ``round_seconds`` (metrics.jsonl: a round less its evaluation; checkpoints are taken
  after it), OT inside it where a method reports ``*ot_seconds``;
* evaluation, checkpoints: ``eval_seconds``, ``checkpoint_seconds`` (metrics.jsonl);
* start-up: each trial's time in Tune (``time_total_s`` of its last result) less its rounds: outside the run's
  ``wall_seconds`` (results.csv) building the data and starting and stopping the backend and its actors,
  inside it the setup exchange and the callbacks;
* grid / Tune: the command's wall time when no trial ran (Python and Ray start-up, the checks, which build every
  federation once, Tune starting the trials' processes, the tables, plots). A trial's interval ends at its
  summary.json (or Tune's last timestamp, in whole seconds, if later) and starts ``time_total_s`` earlier.

Trial-seconds add up over trials that run at the same time; a part's wall seconds are its share of the time
when some trial ran, so that the wall column adds up to the command's wall time.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

KNOWN_SECONDS = ("round_seconds", "eval_seconds", "checkpoint_seconds")
STARTUP_PARTS = ("start-up outside the run", "setup and callbacks in the run")  # trial time not in rounds


@dataclass(frozen=True)
class TrialTiming:
    """What one trial's files say about its time."""

    trial_id: str
    trial_seconds: float  # Tune's time_total_s (else the run's wall_seconds)
    wall_seconds: float  # the run's own (Simulator) wall time, results.csv
    rounds: float  # sum of round_seconds (evaluation and checkpoints excluded)
    evaluation: float
    checkpoints: float
    ot: Optional[float]  # None: the method reports no OT time
    ended: float  # epoch seconds
    other: dict  # any other *_seconds metric: name -> sum


@dataclass(frozen=True)
class Split:
    """A protocol's wall time split into its parts; ``trial`` holds trial-seconds, ``wall`` wall seconds."""

    protocol_wall: float
    trials: int
    trial: dict
    wall: dict
    ot: Optional[float]
    other: dict


def seconds_in(value) -> float:
    """A timing metric as one number: itself, or the sum of a per-client mapping."""
    return float(sum(seconds_in(v) for v in value.values())) if isinstance(value, dict) else float(value)


def round_totals(rows: list[dict]) -> dict:
    """Sums over a run's metrics.jsonl rows of every ``*_seconds`` metric; ``ot`` None when none names OT."""
    totals = {name: 0.0 for name in KNOWN_SECONDS}
    other: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            if not key.endswith("_seconds") or value is None:
                continue
            target = totals if key in KNOWN_SECONDS else other
            target[key] = target.get(key, 0.0) + seconds_in(value)
    ot_keys = [k for k in other if k == "ot_seconds" or k.endswith("_ot_seconds") or k.startswith("ot_")]
    totals["ot"] = sum(other.pop(k) for k in ot_keys) if ot_keys else None
    totals["other"] = other
    return totals


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def tune_results(tune_dir: Path) -> dict[str, dict]:
    """trial id -> Tune's last result of it (``time_total_s``, ``timestamp``)."""
    found = {}
    for path in sorted(tune_dir.glob("*/result.json")):
        rows = [r for r in read_jsonl(path) if "time_total_s" in r and "trial_id" in r]
        if rows:
            found[str(rows[-1]["trial_id"])] = rows[-1]
    return found


def wall_by_trial(results_csv: Path) -> dict[str, float]:
    """trial id -> wall_seconds of results.csv (several rows may read one trial: one value each)."""
    if not results_csv.is_file():
        return {}
    with results_csv.open() as fh:
        return {r["trial_id"]: float(r["wall_seconds"]) for r in csv.DictReader(fh) if r.get("wall_seconds")}


def trial_timings(protocol_dir: Path) -> list[TrialTiming]:
    """Every trial of a reproduction directory (``runs/<trial id>/``) with its measured times."""
    tune, walls = tune_results(protocol_dir / "tune"), wall_by_trial(protocol_dir / "results.csv")
    timings = []
    for run_dir in sorted(p for p in (protocol_dir / "runs").glob("*") if p.is_dir()):
        trial_id, totals = run_dir.name, round_totals(read_jsonl(run_dir / "metrics.jsonl"))
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        wall = walls.get(trial_id, summary.get("wall_seconds", sum(totals[k] for k in KNOWN_SECONDS)))
        result = tune.get(trial_id, {})
        ends = [summary_path.stat().st_mtime] if summary_path.is_file() else []
        ends += [float(result["timestamp"])] if "timestamp" in result else []
        timings.append(
            TrialTiming(
                trial_id,
                float(result.get("time_total_s", wall)),
                float(wall),
                *(totals[k] for k in KNOWN_SECONDS),  # rounds, evaluation, checkpoints
                totals["ot"],
                max(ends) if ends else run_dir.stat().st_mtime,
                totals["other"],
            )
        )
    return timings


def covered_seconds(intervals: list[tuple[float, float]], started: float, finished: float) -> float:
    """Length of the union of ``intervals`` clipped to [started, finished]."""
    covered, reach = 0.0, started
    for begin, end in sorted(intervals):
        begin, end = max(begin, reach), min(end, finished)
        if end > begin:
            covered += end - begin
            reach = end
    return covered


def split_protocol(timings: list[TrialTiming], started: float, finished: float) -> Split:
    """The command's wall time (``started`` to ``finished``, epoch seconds) split into its parts."""
    trial = {
        "training": sum(t.rounds for t in timings),
        "evaluation": sum(t.evaluation for t in timings),
        "checkpoints": sum(t.checkpoints for t in timings),
        STARTUP_PARTS[0]: sum(t.trial_seconds - t.wall_seconds for t in timings),
        STARTUP_PARTS[1]: sum(t.wall_seconds - t.rounds - t.evaluation - t.checkpoints for t in timings),
    }
    total_trial = sum(t.trial_seconds for t in timings)
    covered = covered_seconds([(t.ended - t.trial_seconds, t.ended) for t in timings], started, finished)
    scale = covered / total_trial if total_trial > 0 else 0.0
    wall = {name: seconds * scale for name, seconds in trial.items()}
    wall["grid / Tune"] = (finished - started) - covered
    ots = [t.ot for t in timings if t.ot is not None]
    other = {key: sum(t.other.get(key, 0.0) for t in timings) for key in sorted({k for t in timings for k in t.other})}
    return Split(finished - started, len(timings), trial, wall, sum(ots) if ots else None, other)


def table_rows(split: Split) -> list[tuple[str, Optional[float], Optional[float]]]:
    """(part, trial-seconds, wall seconds) in the table's order; None: does not apply."""
    trial, wall = split.trial, split.wall
    per_trial_second = wall["training"] / trial["training"] if trial["training"] > 0 else 0.0
    ot = ("  of which OT", split.ot, split.ot * per_trial_second) if split.ot is not None else None
    return [
        ("training (rounds less evaluation, checkpoints)", trial["training"], wall["training"]),
        ot or ("  of which OT: not reported", None, None),
        ("evaluation", trial["evaluation"], wall["evaluation"]),
        ("checkpoints", trial["checkpoints"], wall["checkpoints"]),
        ("start-up (trial time not in rounds)", *(sum(d[k] for k in STARTUP_PARTS) for d in (trial, wall))),
        ("  data, process/actor start and stop", trial[STARTUP_PARTS[0]], wall[STARTUP_PARTS[0]]),
        ("  setup exchange, callbacks (in wall_seconds)", trial[STARTUP_PARTS[1]], wall[STARTUP_PARTS[1]]),
        ("grid / Tune (no trial running)", None, wall["grid / Tune"]),
        ("total", sum(trial.values()), split.protocol_wall),
    ]


def format_split(title: str, split: Split) -> str:
    """One table: each part in trial-seconds, wall seconds and share of the command's wall time."""
    total, in_trials = split.protocol_wall, sum(split.trial.values())
    covered = total - split.wall["grid / Tune"]
    lines = [
        f"## {title}",
        f"wall {total:.1f} s, {split.trials} trial{'' if split.trials == 1 else 's'}, {in_trials:.1f} trial-seconds "
        f"({in_trials / covered if covered > 0 else 0.0:.2f} trials at a time while some ran)",
        "",
        f"| {'part':<46} | trial-s | wall s | share |",
        f"|{'-' * 48}|--------:|-------:|------:|",
    ]
    for name, seconds, wall in table_rows(split):
        text = ["" if v is None else f"{v:.1f}" for v in (seconds, wall)]
        share = f"{100 * wall / total:.1f}%" if wall is not None and total > 0 else ""
        lines.append(f"| {name:<46} | {text[0]:>7} | {text[1]:>6} | {share:>5} |")
    not_training = 100 * (1 - split.wall["training"] / total) if total > 0 else 0.0
    lines += ["", f"not training: {not_training:.1f}% of the wall time"]
    lines += [f"also reported: {key} {seconds:.1f} trial-s" for key, seconds in sorted(split.other.items())]
    return "\n".join(lines) + "\n"
