"""The TEP protocol's target mode2 on one machine without Ray: every trial through ``fedsim.api.run_experiment`` on
the local backend (on ``cuda`` when there is one), results.csv and the table as ``fedsim reproduce`` writes them.

    python -m tools.device.tep_protocol --out DIR [--spec tools/device/tep_mode2.yaml] [--seeds 0,1,2]
        [--runs fedavg,centralized,...] [--targets mode2] [--windows 100] [--precision bf16] [--device cuda]
        [--workers 16] [--budget-s 540] [--set KEY=VALUE ...]

The spec (:data:`SPEC`, the ``fedsim reproduce`` format) names the runs; ``--windows``, ``--precision``, the device
(``resources.gpus_per_client=1`` on ``cuda``), ``--workers`` and ``--set`` are applied after every setting of the
spec. The windows of every mode are built first (``data.workers`` processes: the machine's cores) and cached under
``DIR/cache``; then the trials run seed by seed (every run's seed 0 first), and after each one results.csv, table.md
and claims.md are rewritten (:mod:`fedsim.experiments.reproduce_results`), so a call cut short keeps what finished.
A trial that would start after ``--budget-s`` seconds is left out and listed as ``skipped`` in results.csv.
``trials.csv`` has one line per trial: its run, seed, status, wall seconds and device. Nothing here imports Ray.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "tools" / "device" / "tep_mode2.yaml"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "tep-protocol", help="output folder ($OUT)")
    parser.add_argument("--spec", default=str(SPEC), help="the protocol's spec (fedsim reproduce format)")
    parser.add_argument("--seeds", default=None, help="comma list replacing the spec's seeds")
    parser.add_argument("--runs", default=None, help="comma list of the spec's runs to keep (default: all)")
    parser.add_argument("--targets", default=None, help="comma list of the spec's targets to keep (default: all)")
    parser.add_argument("--windows", type=int, default=None, help="data.windows_per_class (default: the spec's)")
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16"), help="run.precision")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda where available)")
    parser.add_argument("--workers", type=int, default=None, help="data.workers: processes building TEP's windows")
    parser.add_argument("--budget-s", type=float, default=None, help="start no trial after this many seconds")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE after every other setting")
    return parser.parse_args(argv)


def load(args: argparse.Namespace):
    """The spec with the runs kept, the seeds replaced and this machine's settings last."""
    from fedsim.experiments.reproduce_spec import PaperSpec, load_spec, shrink

    spec = load_spec(None, args.spec)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    spec = shrink(spec, False, seeds)
    raw = dict(spec.raw)
    if args.runs:
        runs = [r.strip() for r in args.runs.split(",") if r.strip()]
        spec._known("run", runs, spec.runs, f"spec {spec.name}: --runs")
        keep_runs(raw, runs)
    if args.targets:
        keep_targets(raw, [t.strip() for t in args.targets.split(",") if t.strip()], spec.name)
    last = [
        "run.backend=local",
        f"run.precision={args.precision}",
        f"run.cache_dir={Path(args.out).resolve() / 'cache'}",
    ]
    last += [f"data.cache_dir={Path(args.out).resolve() / 'cache' / 'data'}", "run.progress=false"]
    last += [f"resources.gpus_per_client={1 if args.device == 'cuda' else 0}"]
    if args.windows is not None:
        last.append(f"data.windows_per_class={args.windows}")
    if args.workers:
        last.append(f"data.workers={args.workers}")
    raw["set_last"] = list(raw.get("set_last", [])) + last + list(args.set)
    spec = PaperSpec(spec.name, raw, spec.origin)
    raw["paper"] = titled(raw.get("paper", spec.name), spec)
    return PaperSpec(spec.name, raw, spec.origin)


def titled(paper: str, spec) -> str:
    """The spec's title naming what this call runs: windows a class and precision (a ``, N windows a class, P``
    suffix of the spec's own title replaced)."""
    from fedsim.experiments.reproduce_spec import to_sweep

    sweep = to_sweep(spec)
    config = sweep.config_for(next(iter(sweep.points())))
    base = re.sub(r", \d+ windows a class, \w+$", "", paper)
    windows = getattr(config.data.options, "windows_per_class", None)  # a benchmark other than tep has none
    return (
        f"{base}, {windows} windows a class, {config.run.precision}" if windows else f"{base}, {config.run.precision}"
    )


def keep_targets(raw: dict, targets: list[str], name: str) -> None:
    """Every benchmark's targets narrowed to ``targets`` (a benchmark left with none is dropped)."""
    from fedsim.errors import UserError

    known = {t for bench in raw["benchmarks"].values() for t in bench.get("targets", [])}
    unknown = [t for t in targets if t not in known]
    if unknown:
        raise UserError(
            f"spec {name}: --targets {', '.join(unknown)}: not a target of the spec ({', '.join(sorted(known))})"
        )
    benchmarks = {}
    for key, bench in raw["benchmarks"].items():
        kept = [t for t in bench.get("targets", []) if t in targets]
        if kept:
            benchmarks[key] = {**bench, "targets": kept}
    raw["benchmarks"] = benchmarks


def keep_runs(raw: dict, runs: list[str]) -> None:
    """The spec's ``runs``, the rows that read them and the claims on those rows only."""
    raw["runs"] = {k: v for k, v in raw["runs"].items() if k in runs}
    raw["rows"] = [r for r in raw["rows"] if r.get("run", r["name"]) in raw["runs"]]
    kept = {r["name"] for r in raw["rows"]}
    raw["claims"] = [
        c
        for c in raw.get("claims", [])
        if all(str(i).partition(":")[0] in kept for g in c["order"] for i in (g if isinstance(g, list) else [g]))
    ]


def numbers(flat: dict) -> dict[str, float]:
    """The numeric entries of a flattened summary or round (booleans left out)."""
    return {k: v for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def build_windows(configs) -> float:
    """Every client's data of every distinct data section built (and cached) before the first trial; seconds."""
    from fedsim.api import checked_federation
    from fedsim.data.scenario import forget_domain_data, load_client_data

    started, seen = time.perf_counter(), set()
    for config in configs:
        if config.data in seen:
            continue
        seen.add(config.data)
        federation = checked_federation(config)
        for client_id in federation.client_ids:
            load_client_data(config.data, federation, client_id)
        forget_domain_data(config.data)
    return time.perf_counter() - started


def record(point: dict, config, summary: Optional[dict], history: list, status: str, error: str = "") -> dict:
    """One trial as :func:`fedsim.experiments.sweep_results.collect_records` gives it to the table writers."""
    from fedsim.experiments.sweep_grid import COLUMNS
    from fedsim.experiments.sweep_trial import flatten

    summary = summary or {}
    out = {
        "trial_id": f"{point['spec.variant']}#{point.get('run.seed', config.run.seed)}",
        "status": status,
        "params": {COLUMNS.get(k, k): v for k, v in point.items()},
        "benchmark": config.data.benchmark,
        "target": config.data.target,
        "rounds": summary.get("rounds", 0),
        "target_accuracy": summary.get("target_accuracy"),
        "mean_source_accuracy": summary.get("mean_source_accuracy"),
        "wall_seconds": summary.get("wall_seconds"),
        "summary": numbers(flatten(summary)),
        "round_metrics": [numbers(flatten(row)) for row in history],
    }
    if error:
        out["error"] = error
    return out


def write(spec, records: list[dict], trials: list[dict], out: Path) -> None:
    """results.csv, table.md and claims.md of the records so far (no plots: matplotlib is not needed), and
    trials.csv."""
    from fedsim.experiments.reproduce import write_tables
    from fedsim.experiments.reproduce_results import results_rows, write_results_csv

    lines = results_rows(spec, records)
    write_results_csv(out / "results.csv", lines)
    write_tables(spec, lines, out)
    with (out / "trials.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["trial", "run", "seed", "status", "wall_seconds", "device", "error"])
        writer.writeheader()
        writer.writerows(trials)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    import torch

    from fedsim.api import run_experiment
    from fedsim.errors import first_line
    from fedsim.experiments.reproduce_spec import to_sweep
    from fedsim.experiments.sweep_grid import point_key, prepare

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = load(args)
    sweep = to_sweep(spec)
    configs, _ = prepare(sweep)
    seconds = build_windows(configs.values())
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"device {name}, precision {args.precision}; data built in {seconds:.1f} s", flush=True)
    where = spec.trials()
    points = sorted(sweep.points(), key=lambda p: p.get("run.seed", where[p["spec.variant"]][3] or 0))
    records, trials = [], []
    for point in points:
        key, (run, _, _, own_seed) = point_key(point), where[point["spec.variant"]]
        config = configs[key]
        seed = point.get("run.seed", own_seed)
        if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
            records.append(record(point, config, None, [], "skipped"))
            trials.append({"trial": key, "run": run, "seed": seed, "status": "skipped", "device": args.device})
            continue
        try:
            result = run_experiment(config, out / "runs" / f"{run}-seed{seed}")
            records.append(record(point, config, result.summary, result.history, "finished"))
            status, error, wall = "finished", "", result.summary.get("wall_seconds")
        except Exception as exc:  # noqa: BLE001 (one failed trial is a line of the table, the others still run)
            records.append(record(point, config, None, [], "error", first_line(exc)))
            status, error, wall = "error", first_line(exc), None
        trials.append(
            {"trial": key, "run": run, "seed": seed, "status": status, "wall_seconds": wall, "device": args.device}
            | ({"error": error} if error else {})
        )
        write(spec, records, trials, out)
        print(f"{run} seed {seed}: {status} in {wall or 0:.1f} s ({time.perf_counter() - started:.0f} s)", flush=True)
    write(spec, records, trials, out)
    print((out / "table.md").read_text(), flush=True)
    print(f"ray imported: {'ray' in sys.modules}", flush=True)
    return 0 if all(t["status"] != "error" for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
