"""The pre-registered plateau rule (docs/feddadil.md, "Rounds of the protocol") applied to the pilot runs.

    python results/feddadil-protocol/plateau.py PILOT_DIR [PILOT_DIR ...]

Reads only each pilot's per-round DiL losses (metrics.jsonl) and the target domain's name (config.yaml).
"""
import json
import math
import sys
from pathlib import Path

from fedsim.config import load_config
from fedsim.data.scenario import build_federation


def sources_loss_per_dictionary_round(run: Path) -> list[float]:
    """L_r: the sources' mean DiL loss of every dictionary round (the target client excluded)."""
    config = load_config(str(run / "config.yaml"), [])
    target_ids = {str(cid) for cid in build_federation(config.data).target_ids}
    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = []
    for r in rounds:
        if r.get("stage") != "dictionary":
            continue
        sources = [v for cid, v in r["dil_loss"].items() if cid not in target_ids]
        losses.append(sum(sources) / len(sources))
    return losses


def plateau_round(losses: list[float]) -> int | None:
    """First dictionary round r >= 10 with M_r >= 0.98 M_(r-5), M_r the mean of the 5 losses ending at r."""
    def m(r):  # r is 1-based
        return sum(losses[r - 5:r]) / 5
    for r in range(10, len(losses) + 1):
        if m(r) >= 0.98 * m(r - 5):
            return r
    return None


if __name__ == "__main__":
    needed = []
    for arg in sys.argv[1:]:
        run = Path(arg)
        losses = sources_loss_per_dictionary_round(run)
        encoder = sum(1 for line in (run / "metrics.jsonl").read_text().splitlines() if json.loads(line).get("stage") != "dictionary")
        r = plateau_round(losses)
        total = 50 if r is None else r + encoder
        needed.append(total)
        print(f"{run.name}: {len(losses)} dictionary rounds, plateau at dictionary round {r} -> {total} rounds")
    rounds = min(50, 5 * math.ceil(max(needed) / 5))
    print(f"protocol run.rounds = {rounds}")
