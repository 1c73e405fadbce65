"""``python -m tools.diagnose sources REPRODUCE_DIR --control ROW``: each row's source accuracy against a control row.

For a directory that `fedsim reproduce` wrote (``results.csv`` and the trials' ``runs/<trial id>/summary.json``):
per benchmark and row, the mean over seeds of (the row's accuracy on one source domain - the control's, same
target and seed), over every (target, source) pair. Prints the mean difference, how many pairs fall more than
``--margin`` below the control, and the worst pair: whether a method's gain on the target costs its sources (FADA's
rows against FedAvg with the same labeled training, for example).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

from fedsim.errors import UserError

NAME = "sources"
HELP = "each row's per-source-domain accuracy against a control row, from a 'fedsim reproduce' directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reproduce_dir", metavar="REPRODUCE_DIR", help="the --out directory of a 'fedsim reproduce'")
    parser.add_argument("--control", required=True, help="the row every other row is compared with, e.g. fedavg-3ep")
    parser.add_argument("--rows", help="comma-separated rows to compare (default: every other row)")
    parser.add_argument("--margin", type=float, default=0.05, help="a pair counts as below past this (default 0.05)")


def source_accuracy(root: Path) -> dict[tuple, dict[tuple, dict]]:
    """(benchmark, row) -> (target, seed) -> {source domain: accuracy}, from finished trials."""
    table = root / "results.csv"
    if not table.is_file():
        raise UserError(f"{NAME}: {root} has no results.csv: give the --out directory of a 'fedsim reproduce'")
    found: dict[tuple, dict[tuple, dict]] = defaultdict(dict)
    with table.open() as fh:
        for line in csv.DictReader(fh):
            summary = root / "runs" / line["trial_id"] / "summary.json"
            if line.get("status") != "finished" or not summary.is_file():
                continue
            sources = json.loads(summary.read_text()).get("source_accuracy", {})
            found[(line["benchmark"], line["row"])][(line["target_domain"], line["seed"])] = sources
    return found


def compare(cells: dict[tuple, dict], control: dict[tuple, dict]) -> dict[tuple, float]:
    """(target, source) -> mean over the seeds both ran of (row - control)."""
    differences = defaultdict(list)
    for (target, seed), sources in cells.items():
        reference = control.get((target, seed))
        if reference is None:
            continue
        for source, value in sources.items():
            if source in reference:
                differences[(target, source)].append(value - reference[source])
    return {pair: statistics.mean(values) for pair, values in differences.items()}


def run(args: argparse.Namespace) -> int:
    root = Path(args.reproduce_dir)
    if not root.is_dir():
        raise UserError(f"{NAME}: {root} is not a directory: give the --out directory of a 'fedsim reproduce'")
    found = source_accuracy(root)
    rows = sorted({row for _, row in found})
    if args.control not in rows:
        raise UserError(f"{NAME}: no finished trial of row {args.control!r} in {root}; its rows: {', '.join(rows)}")
    wanted = [r for r in args.rows.split(",") if r] if args.rows else [r for r in rows if r != args.control]
    unknown = [r for r in wanted if r not in rows]
    if unknown:
        raise UserError(f"{NAME}: unknown row(s) {', '.join(unknown)} in {root}; its rows: {', '.join(rows)}")
    print(f"{'benchmark':10s} {'row':24s} {'pairs':>5s} {'mean':>7s} {'below':>6s}  worst (source, target)")
    for bench in sorted({b for b, _ in found}):
        for row in wanted:
            means = compare(found.get((bench, row), {}), found.get((bench, args.control), {}))
            if not means:
                continue
            worst = min(means, key=means.get)
            below = sum(value < -args.margin for value in means.values())
            print(
                f"{bench:10s} {row:24s} {len(means):5d} {100 * statistics.mean(means.values()):+6.1f}  {below:6d}  "
                f"{worst[1]} (target {worst[0]}) {100 * means[worst]:+.1f} pts"
            )
    print(f"points of source accuracy against {args.control}; below: pairs more than {100 * args.margin:g} pts under")
    return 0
