"""`fedsim report DIR`: plots and a markdown table for a run, a directory of runs, or a sweep.

    fedsim report runs/sweep-20250101-120000-digits-mnistm

Writes next to the results (or into ``--out``):

* ``accuracy_per_round.png``: target accuracy per round, one line per method
  and setting (mean over seeds, band = one standard deviation);
* ``accuracy_vs_local_epochs.png``: final target accuracy against local epochs;
* ``accuracy_vs_bytes.png``: target accuracy against bytes communicated
  (sent + received, cumulative);
* ``report.md``: the table of means and sample standard deviations over seeds.

"Final" accuracy is the accuracy at the last evaluated round. A record is one
trial or one run: its parameters (method, local_epochs, seed and any swept
key), its final numbers and its per-round history.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.errors import UserError
from fedsim.experiments.grouping import format_mean_std, groups, mean_std
from fedsim.experiments.report_plots import (
    PLOTS,
    plot_accuracy_per_round,
    plot_accuracy_vs_bytes,
    plot_accuracy_vs_local_epochs,
)

# run-directory configs: keys that never describe the experiment itself
_IGNORED_KEYS = {
    "run.out",
    "run.progress",
    "run.tensorboard",
    "run.address",
    "data.cache_dir",
    "data.root",
    "run.seed",
    "method.name",
    "method.local_epochs",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir", help="a run directory (summary.json), a directory of runs, or a sweep directory (results.csv)"
    )
    parser.add_argument("--out", help="where to write report.md and the plots (default: DIR)")


# ----------------------------------------------------------------------------- loading


def _number(text: Any) -> Any:
    """CSV cell -> int, float, None (empty) or the text."""
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        return text
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text in ("True", "False"):
        return text == "True"
    return text


def load_sweep(path: Path) -> list[dict]:
    """results.csv + rounds.csv of a sweep directory -> records."""
    results, rounds = path / "results.csv", path / "rounds.csv"
    if not rounds.is_file():
        raise UserError(
            f"{path} has results.csv but no rounds.csv: rerun 'fedsim sweep --resume --out {path}' to rewrite both"
        )
    fixed = {
        "trial_id",
        "status",
        "benchmark",
        "target",
        "rounds",
        "target_accuracy",
        "mean_source_accuracy",
        "bytes_sent",
        "bytes_received",
        "wall_seconds",
        "client_nodes",
        "error",
    }
    histories: dict[str, list[dict]] = {}
    with rounds.open(newline="") as fh:
        for row in csv.DictReader(fh):
            histories.setdefault(row["trial_id"], []).append({k: _number(v) for k, v in row.items() if k != "trial_id"})
    records = []
    with results.open(newline="") as fh:
        for row in csv.DictReader(fh):
            record = {k: _number(v) for k, v in row.items() if k in fixed}
            record["trial_id"] = row["trial_id"]
            # a trial's label-free selection scores (score_<name>) are results, not grid parameters
            record["params"] = {k: _number(v) for k, v in row.items() if k not in fixed and not k.startswith("score_")}
            record["summary"] = {k: _number(v) for k, v in row.items() if k.startswith("score_") and v != ""}
            record["history"] = sorted(histories.get(row["trial_id"], []), key=lambda h: h["round"])
            records.append(record)
    if not records:
        raise UserError(f"{results} lists no trials: run the sweep again or with --resume")
    return records


def _flat_config(path: Path) -> dict[str, Any]:
    import yaml

    file = path / "config.yaml"
    if not file.is_file():
        return {}
    raw = yaml.safe_load(file.read_text()) or {}
    return {
        f"{section}.{key}": value
        for section, values in raw.items()
        if isinstance(values, dict)
        for key, value in values.items()
    }


def load_run(path: Path) -> dict:
    """One run directory (summary.json, metrics.jsonl, config.yaml) -> a record."""
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path / 'summary.json'} cannot be read ({exc}): give a finished run directory") from None
    config = _flat_config(path)
    history, total = [], 0
    metrics_file = path / "metrics.jsonl"
    lines = metrics_file.read_text().splitlines() if metrics_file.is_file() else []
    for line in lines:
        if not line.strip():
            continue
        m = json.loads(line)
        total += int(m.get("bytes_sent", 0)) + int(m.get("bytes_received", 0))
        history.append(
            {
                "round": int(m["round"]),
                "target_accuracy": m.get("target_accuracy"),
                "mean_source_accuracy": m.get("mean_source_accuracy"),
                "bytes_total": total,
            }
        )
    sources = list((summary.get("source_accuracy") or {}).values())
    return {
        "trial_id": path.name,
        "status": "finished",
        "params": {
            "method": summary["method"],
            "local_epochs": config.get("method.local_epochs"),
            "seed": summary["seed"],
        },
        "benchmark": summary.get("benchmark"),
        "target": summary.get("target"),
        "rounds": summary.get("rounds"),
        "target_accuracy": summary.get("target_accuracy"),
        "mean_source_accuracy": float(np.mean(sources)) if sources else None,
        "bytes_sent": summary.get("bytes_sent"),
        "bytes_received": summary.get("bytes_received"),
        "wall_seconds": summary.get("wall_seconds"),
        "client_nodes": ",".join(summary.get("client_nodes", []) or []),
        "history": history,
        "_config": config,
    }


def load_records(path: Path) -> tuple[str, list[dict]]:
    """A run, a sweep or a directory of runs -> ('run' | 'sweep' | 'runs', records)."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a directory: give a run directory, a directory of runs, or a sweep directory")
    if (path / "results.csv").is_file():
        return "sweep", load_sweep(path)
    if (path / "summary.json").is_file():
        return "run", [load_run(path)]
    runs = sorted(p for p in path.iterdir() if (p / "summary.json").is_file())
    if not runs:
        if (path / "sweep.json").is_file():
            raise UserError(
                f"{path} is a sweep without results.csv yet: finish it with 'fedsim sweep --resume --out {path}'"
            )
        raise UserError(
            f"{path} holds no run (summary.json) and no sweep (results.csv): "
            "give the directory 'fedsim run' or 'fedsim sweep' wrote"
        )
    records = [load_run(p) for p in runs]
    # settings that differ between the runs become parameters, like a sweep's --set axes
    keys = sorted({k for r in records for k in r["_config"]} - _IGNORED_KEYS)
    varying = [
        k for k in keys if len({json.dumps(r["_config"].get(k), sort_keys=True, default=str) for r in records}) > 1
    ]
    for r in records:
        r["params"].update({k: r["_config"].get(k) for k in varying})
    return "runs", records


def markdown_table(records: list[dict]) -> str:
    """Means ± sample standard deviations over seeds, one row per method and setting."""
    grouped = groups(records)
    names = [name for name, _ in next(iter(grouped))] if grouped else []
    header = names + ["seeds", "target accuracy", "mean source accuracy", "MB communicated", "wall s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for key, members in grouped.items():
        done = [r for r in members if r.get("status", "finished") == "finished"]
        seeds = ",".join(str(r["params"].get("seed")) for r in done)
        acc = mean_std([r.get("target_accuracy") for r in done])
        src = mean_std([r.get("mean_source_accuracy") for r in done])
        mb = mean_std(
            [((r.get("bytes_sent") or 0) + (r.get("bytes_received") or 0)) / 1e6 for r in done] if done else []
        )
        wall = mean_std([r.get("wall_seconds") for r in done])
        cells = [str(v) for _, v in key] + [
            seeds or "none finished",
            format_mean_std(*acc[:2]),
            format_mean_std(*src[:2]),
            format_mean_std(*mb[:2], digits=2),
            format_mean_std(*wall[:2], digits=1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command


def _title(records: list[dict]) -> str:
    pairs = sorted({(r.get("benchmark"), r.get("target")) for r in records if r.get("benchmark")}, key=str)
    return f" ({pairs[0][0]} -> {pairs[0][1]})" if len(pairs) == 1 else ""


def write_report(out: Path, records: list[dict]) -> list[Path]:
    """report.md and the three plots into ``out``; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    title = _title(records)
    plots = [
        plot_accuracy_per_round(records, out / PLOTS[0], title),
        plot_accuracy_vs_local_epochs(records, out / PLOTS[1], title),
        plot_accuracy_vs_bytes(records, out / PLOTS[2], title),
    ]
    finished = sum(r.get("status", "finished") == "finished" for r in records)
    text = [
        f"# fedsim report{title}",
        "",
        f"{len(records)} trials, {finished} finished. Final target accuracy = accuracy at the last evaluated round; "
        "mean ± sample standard deviation over seeds; MB communicated = bytes sent + received over all rounds.",
        "",
        markdown_table(records),
        "",
    ]
    unfinished = [r for r in records if r.get("status", "finished") != "finished"]
    if unfinished:
        text += ["Not finished: " + ", ".join(f"{r['trial_id']} ({r['status']})" for r in unfinished), ""]
    text += [f"![{p.stem.replace('_', ' ')}]({p.name})" for p in plots] + [""]
    report = out / "report.md"
    report.write_text("\n".join(text))
    return [report] + plots


def run(args: argparse.Namespace) -> int:
    kind, records = load_records(Path(args.dir))
    out = Path(args.out) if args.out else Path(args.dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {args.out} is a file: give a directory path")
    written = write_report(out, records)
    print(markdown_table(records))
    print(f"{kind} report: " + ", ".join(str(p) for p in written))
    return 0
