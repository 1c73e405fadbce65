"""The vocabulary of a `fedsim reproduce` spec file: the keys each part accepts, the checks of their types, and
the parsed rows and claims (:mod:`fedsim.experiments.reproduce_spec` reads a whole spec with them)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Optional

from fedsim.errors import UserError

DEFAULT_METRICS = {"target": "target_accuracy", "source": "source_accuracy"}
KEYS = {
    "spec": {
        "paper",
        "description",
        "seeds",
        "set",
        "set_last",
        "benchmarks",
        "runs",
        "rows",
        "metrics",
        "columns",
        "claims",
        "series",
        "select",
        "quick",
    },
    "benchmark": {"targets", "seeds", "set", "run_set", "benchmark", "data_root"},
    "run": {"config", "seeds", "set", "only"},
    "row": {"name", "label", "run", "metrics", "vars"},
    "claim": {"claim", "order", "metric", "strict", "benchmark", "target", "per_target"},
    "series": {"metric", "title", "runs", "benchmark", "target", "split"},
    "quick": {"seeds", "targets", "set", "run_set", "runs", "benchmarks"},
    "select": {"scores", "groups"},
    "select group": {"runs", "default"},
}
REQUIRED = {
    "spec": ("paper", "benchmarks", "runs", "rows"),
    "row": ("name",),
    "claim": ("claim", "order"),
    "series": ("metric", "runs"),
    "select": ("scores", "groups"),
    "select group": ("runs",),
}


def check_keys(kind: str, raw: Any, where: str) -> dict:
    if not isinstance(raw, dict):
        raise UserError(f"{where} must be a mapping of keys ({', '.join(sorted(KEYS[kind]))}), got {raw!r}")
    for key in raw:
        if key not in KEYS[kind]:
            close = difflib.get_close_matches(str(key), sorted(KEYS[kind]), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(sorted(KEYS[kind]))}"
            raise UserError(f"unknown key {key!r} in {where}: {hint}")
    for key in REQUIRED.get(kind, ()):
        if key not in raw:
            raise UserError(f"{where} has no {key!r}: every {kind} needs one")
    return raw


def strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where} must be a list of strings, got {value!r}")
    return list(value)


def seed_list(value: Any, where: str) -> list[int]:
    """A list of seeds: integers of 0 or more, each once, at least one."""
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        raise UserError(f"{where} must be a list of integers of 0 or more, e.g. [0, 1, 2], got {value!r}")
    if len(set(value)) != len(value):
        raise UserError(f"{where} lists a seed twice: {value!r}")
    return list(value)


@dataclass
class Row:
    name: str
    label: str
    run: str
    metrics: dict[str, str]  # metric name -> reference (see fedsim.experiments.reproduce_results.metric_value)


@dataclass
class Claim:
    text: str
    order: list[list[tuple[str, str]]]  # groups of (row, metric), each group above the next
    strict: bool
    benchmark: Optional[str]
    target: Optional[str]  # None: the mean over the benchmark's targets (or each target with per_target)
    per_target: bool = False


@dataclass
class SelectGroup:
    name: str
    runs: list[str]  # the candidates, in the order a tie is broken
    default: Optional[str]  # the run a user would run untuned (None: the group names none)


@dataclass
class Selection:
    """A spec's ``select:``: the scores that choose among each group's runs, without target labels
    (:mod:`fedsim.experiments.selection`)."""

    scores: list[str]  # score names as the runs' summaries carry them, without ``score_``
    groups: dict[str, SelectGroup]
