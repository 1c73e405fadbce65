"""The share of a FedDaDiL round spent inside optimal transport solver calls (POT, and scipy's assignment).

Runs FedDaDiL on the local backend and times every call into POT made by
``fedsim.ot`` (``ot.emd``, ``ot.sinkhorn``, ``ot.dist``) against the rounds'
wall time, and, separately, the per-round drift metrics (``atom_drift`` and
``atom_dispersion``, whose POT calls are part of the POT column). Default: the
TEP benchmark (6 modes, target mode2) with the spec's PyDiL settings
(n = 500, n_b = 200, E = 5).

Square problems with uniform weights (every mini-batch and atom comparison of DaDiL) are solved exactly as an
assignment (scipy's ``linear_sum_assignment``, timed with the POT calls). The last round also evaluates (DaDiL-R
and -E classifiers), which is not OT. Measured shares: docs/feddadil.md.

    python -m tools.benchmarks.feddadil_ot [--benchmark tep --target mode2 --rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import logging
import time

from tools.benchmarks.measure import machine


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="tep")
    parser.add_argument("--target", default="mode2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[])
    return parser.parse_args()


def run_config(args: argparse.Namespace):
    """One local FedDaDiL run at the spec's PyDiL settings, evaluated only after its last round."""
    from fedsim.config import load_config

    overrides = [
        f"data.benchmark={args.benchmark}",
        f"data.target={args.target}",
        "method.name=feddadil",
        f"run.rounds={args.rounds}",
        "method.batch_size=200",
        "method.local_epochs=5",
        f"run.eval_every={args.rounds + 1}",
        "run.backend=local",
        "run.progress=false",
        "run.tensorboard=false",
        "run.checkpoint_every=0",
    ]
    return load_config(None, overrides + args.set)


def instrument(spent: dict) -> None:
    """Time every POT call of ``fedsim.ot.wasserstein`` and the drift metrics into ``spent``."""
    import ot

    from fedsim.methods.common import dictionary
    from fedsim.ot import wasserstein  # the module whose POT calls are timed

    for name in ("emd", "sinkhorn", "dist"):
        setattr(wasserstein.ot, name, timed(getattr(ot, name), spent, "seconds", "calls"))
    # the exact solver of square uniform problems (fedsim.ot.wasserstein.assignment_plan) is OT too
    wasserstein.linear_sum_assignment = timed(wasserstein.linear_sum_assignment, spent, "seconds", "calls")
    for name in ("atom_drift", "atom_dispersion"):
        setattr(dictionary, name, timed(getattr(dictionary, name), spent, "drift"))


def ledger(spent: dict, per_round: list):
    """A callback that moves ``spent`` into one ``per_round`` line per round and starts it again."""
    from fedsim.runtime.callbacks import Callback

    class Ledger(Callback):
        def on_round_end(self, simulator, metrics):
            seconds, calls, drift = spent["seconds"], spent["calls"], spent["drift"]
            per_round.append((metrics["round"], metrics.get("stage"), metrics["round_seconds"], seconds, calls, drift))
            spent["seconds"], spent["calls"], spent["drift"] = 0.0, 0, 0.0

    return Ledger()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    from fedsim.api import run_experiment

    spent = {"seconds": 0.0, "calls": 0, "drift": 0.0}
    per_round: list = []
    instrument(spent)
    run_experiment(run_config(args), callbacks=[ledger(spent, per_round)])
    report(args, per_round)


def report(args, per_round: list) -> None:
    """The per-round table and the dictionary rounds' POT and drift shares."""
    print(f"FedDaDiL OT share, {args.benchmark} -> {args.target}, {machine()}")
    print(f"{'round':>5s} {'stage':>10s} {'round s':>8s} {'OT s':>7s} {'calls':>6s} {'share':>6s} {'drift s':>8s}")
    for rnd, stage, seconds, pot, calls, drift in per_round:
        note = "  (includes DaDiL-R/E evaluation)" if rnd == len(per_round) else ""
        print(
            f"{rnd:5d} {str(stage):>10s} {seconds:8.2f} {pot:7.2f} {calls:6d} "
            f"{100 * pot / seconds:5.1f}% {drift:8.2f}{note}"
        )
    train = [r for r in per_round[:-1] if r[1] == "dictionary"]
    if train:
        share = sum(r[3] for r in train) / sum(r[2] for r in train)
        print(
            f"dictionary rounds without evaluation: {100 * share:.1f} % of the time inside OT calls "
            "(POT and linear_sum_assignment)"
        )
        drift = sum(r[5] for r in train) / sum(r[2] for r in train)
        print(
            "of which the drift metrics (atom_drift, atom_dispersion; their OT calls included): "
            f"{100 * drift:.1f} % of the time"
        )


def timed(function, spent: dict, seconds_key: str, calls_key: str = ""):
    """``function`` with its wall time added to ``spent[seconds_key]`` (its calls counted in ``spent[calls_key]``)."""

    @functools.wraps(function)
    def wrapper(*a, **k):
        started = time.perf_counter()
        try:
            return function(*a, **k)
        finally:
            spent[seconds_key] += time.perf_counter() - started
            if calls_key:
                spent[calls_key] += 1

    return wrapper


if __name__ == "__main__":
    main()
