"""Results of `fedsim sweep`: Tune's ResultGrid -> one record per trial (:func:`collect_records`),
written as ``results.csv`` and ``rounds.csv`` (:func:`write_results`); the records are what
:func:`fedsim.experiments.selection.select` chooses among."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Optional

from fedsim.errors import UserError, unwrapped
from fedsim.experiments.sweep_grid import COLUMNS, SweepSpec, point_key


def _cell(value: Any) -> Any:
    if value is None:
        return None
    try:
        if isinstance(value, float) and math.isnan(value):
            return None
    except TypeError:
        pass
    if hasattr(value, "item"):  # numpy / pandas scalars
        return value.item()
    return value


def _int(value: Any) -> Optional[int]:
    value = _cell(value)
    return None if value is None else int(value)


def _attempt(rows: list[dict]) -> list[dict]:
    """The per-round rows of one trial's last attempt (a trial restarted by --resume starts its rounds again)."""
    kept: list[dict] = []
    for row in rows:
        rnd = _cell(row.get("round"))
        if rnd is None:
            continue
        if kept and int(rnd) <= int(kept[-1]["round"]):
            kept = []
        kept.append(row)
    return kept


def _history(rows: list[dict]) -> list[dict]:
    """The fixed columns of ``rounds.csv`` for each round of the last attempt."""
    return [
        {
            "round": int(_cell(row["round"])),
            "target_accuracy": _cell(row.get("target_accuracy")),
            "mean_source_accuracy": _cell(row.get("mean_source_accuracy")),
            "bytes_total": (_int(row.get("bytes_sent_total")) or 0) + (_int(row.get("bytes_received_total")) or 0),
        }
        for row in rows
    ]


def _numbers(row: dict, prefix: str = "") -> dict[str, float]:
    """The numeric cells of a Tune row whose name starts with ``prefix`` (prefix removed)."""
    out = {}
    for key, value in row.items():
        value = _cell(value)
        if key.startswith(prefix) and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key[len(prefix) :]] = value
    return out


def error_text(error: BaseException) -> str:
    """A failed trial's error on one line (at most 300 characters): a fedsim error's own message, out of the
    wrappers Tune and Ray put around it, else the last line of the error's text."""
    cause = unwrapped(error)
    if isinstance(cause, UserError):
        text = str(cause)
    else:
        lines = str(error).strip().splitlines()
        text = lines[-1] if lines else type(error).__name__
    return " ".join(text.split())[:300]


def collect_records(result_grid, spec: SweepSpec, configs: dict[str, Any]) -> list[dict]:
    """Tune's ResultGrid -> the records of :mod:`fedsim.experiments.report` (one per trial, with its rounds)."""
    records = []
    for result in result_grid:
        point = {k: v for k, v in (result.config or {}).items() if "." in k}
        config = configs.get(point_key(point))
        frame = result.metrics_dataframe
        rows = [] if frame is None else frame.to_dict("records")
        attempt = _attempt(rows)
        history = _history(attempt)
        final = rows[-1] if rows and _cell(rows[-1].get("summary/rounds")) is not None else {}
        if result.error:
            status = "error"
        elif final:
            status = "finished"
        else:
            status = "interrupted" if history else "pending"
        last = next((row for row in reversed(rows) if _cell(row.get("client_nodes"))), {})
        trial_id = (result.metrics or {}).get("trial_id") or Path(str(result.path)).name
        record = {
            "trial_id": trial_id,
            "status": status,
            "params": {COLUMNS.get(k, k): v for k, v in point.items()},
            "benchmark": config.data.benchmark if config else None,
            "target": config.data.target if config else None,
            "rounds": _int(final.get("summary/rounds")) or (history[-1]["round"] if history else 0),
            "target_accuracy": _cell(final.get("summary/target_accuracy")),
            "mean_source_accuracy": _cell(final.get("summary/mean_source_accuracy")),
            "bytes_sent": _int(final.get("summary/bytes_sent")),
            "bytes_received": _int(final.get("summary/bytes_received")),
            "wall_seconds": _cell(final.get("summary/wall_seconds")),
            "client_nodes": _cell(last.get("client_nodes")) or "",
            "history": history,
            "summary": _numbers(final, "summary/"),  # every number of the run's summary, flattened
            "round_metrics": [_numbers(row) for row in attempt],  # every number reported in each round
        }
        if result.error:
            record["error"] = error_text(result.error)
        records.append(record)
    order = {point_key(p): i for i, p in enumerate(spec.points())}
    inverse = {v: k for k, v in COLUMNS.items()}
    records.sort(key=lambda r: order.get(point_key({inverse.get(k, k): v for k, v in r["params"].items()}), len(order)))
    return records


def score_columns(records: list[dict]) -> list[str]:
    """The ``score_<name>`` keys of any record's summary, sorted: the label-free selection scores the runs
    report (:mod:`fedsim.experiments.selection`)."""
    return sorted({k for r in records for k in (r.get("summary") or {}) if k.startswith("score_")})


def write_results(out: Path, records: list[dict]) -> tuple[Path, Path]:
    """``results.csv`` (one row per trial, then one column per score any trial reports, empty where a trial has
    none) and ``rounds.csv`` (one row per trial and round)."""
    param_names: list[str] = []
    for record in records:
        param_names += [k for k in record["params"] if k not in param_names]
    results_path, rounds_path = out / "results.csv", out / "rounds.csv"
    fields = (
        ["trial_id", "status"]
        + param_names
        + [
            "benchmark",
            "target",
            "rounds",
            "target_accuracy",
            "mean_source_accuracy",
            "bytes_sent",
            "bytes_received",
            "wall_seconds",
            "client_nodes",
        ]
    )
    if any(r.get("error") for r in records):
        fields.append("error")
    scores = score_columns(records)
    with results_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields + scores)
        writer.writeheader()
        for r in records:
            summary = r.get("summary") or {}
            writer.writerow(
                {
                    **{k: r.get(k) for k in fields if k not in param_names},
                    **r["params"],
                    **{k: summary.get(k) for k in scores},
                }
            )
    with rounds_path.open("w", newline="") as fh:
        writer = csv.DictWriter(
            fh, fieldnames=["trial_id", "round", "target_accuracy", "mean_source_accuracy", "bytes_total"]
        )
        writer.writeheader()
        for r in records:
            for h in r["history"]:
                writer.writerow({"trial_id": r["trial_id"], **h})
    return results_path, rounds_path
