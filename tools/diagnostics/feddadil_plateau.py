"""``python -m tools.diagnose feddadil-plateau RUN_DIR [RUN_DIR ...]``: the plateau rule on the sources' DiL loss.

The rule that sets FedDaDiL's protocol rounds (docs/feddadil.md, "Rounds of the protocol"), applied to pilot runs:
L_r is the sources' mean DiL loss of dictionary round r (the target client left out), M_r the mean of the
``--window`` losses ending at r; the plateau is the first dictionary round r >= ``--start`` with
M_r >= ``--ratio`` x M_(r - window). A run needs its encoder rounds plus its plateau round (``--cap`` when it has
none); the protocol takes the largest need over the runs, rounded up to a multiple of the window, at most the cap.
Reads only metrics.jsonl and config.yaml: no target label is used.
"""

from __future__ import annotations

import argparse
import math
from typing import Optional

from tools.diagnostics.run_dir import RunDir

NAME = "feddadil-plateau"
HELP = "the plateau rule on the sources' DiL loss of FedDaDiL runs: the protocol's number of rounds"
METHODS = ("feddadil", "dadil")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="FedDaDiL or DaDiL pilot run directories")
    parser.add_argument("--window", type=int, default=5, help="rounds of the moving mean (default 5)")
    parser.add_argument("--start", type=int, default=10, help="first dictionary round the rule may stop at")
    parser.add_argument("--ratio", type=float, default=0.98, help="plateau when M_r >= ratio x M_(r-window)")
    parser.add_argument("--cap", type=int, default=50, help="most rounds the protocol may take (default 50)")


def sources_loss(run: RunDir) -> list[float]:
    """L_r of every dictionary round, in order: the mean DiL loss of the source clients that replied."""
    targets = {str(cid) for cid in run.federation.target_ids}
    losses = []
    for metrics in run.metrics:
        if metrics.get("stage") != "dictionary":
            continue
        sources = [value for cid, value in metrics["dil_loss"].items() if cid not in targets]
        losses.append(sum(sources) / len(sources))
    return losses


def plateau_round(losses: list[float], window: int = 5, start: int = 10, ratio: float = 0.98) -> Optional[int]:
    """First dictionary round r >= start (1-based) with M_r >= ratio x M_(r - window); None when there is none."""

    def moving_mean(r: int) -> float:
        return sum(losses[r - window : r]) / window

    for r in range(max(start, 2 * window), len(losses) + 1):
        if moving_mean(r) >= ratio * moving_mean(r - window):
            return r
    return None


def run(args: argparse.Namespace) -> int:
    needed = []
    print(f"{'run':32s} {'dictionary rounds':>17s} {'plateau':>8s} {'encoder':>8s} {'needs':>6s}")
    for path in args.run_dirs:
        run_dir = RunDir.open(path, NAME, METHODS)
        losses = sources_loss(run_dir)
        encoder = sum(1 for m in run_dir.metrics if m.get("stage") != "dictionary")
        found = plateau_round(losses, args.window, args.start, args.ratio)
        needs = args.cap if found is None else found + encoder
        needed.append(needs)
        shown = "none" if found is None else str(found)
        print(f"{run_dir.path.name:32s} {len(losses):17d} {shown:>8s} {encoder:8d} {needs:6d}")
    rounds = min(args.cap, args.window * math.ceil(max(needed) / args.window))
    print(f"protocol run.rounds = {rounds}")
    return 0
