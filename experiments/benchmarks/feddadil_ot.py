"""The share of a FedDaDiL round spent inside POT (optimal transport solver calls).

Runs FedDaDiL on the local backend and times every call into POT made by
``fedsim.ot`` (``ot.emd``, ``ot.sinkhorn``, ``ot.dist``) against the rounds'
wall time. Default: the TEP benchmark (6 modes, target mode2).

    python -m experiments.benchmarks.feddadil_ot [--benchmark tep --target mode2 --rounds 3]
"""
from __future__ import annotations

import argparse
import functools
import logging
import time

from experiments.benchmarks.measure import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="tep")
    parser.add_argument("--target", default="mode2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import ot

    from experiments.run import run_experiment
    from fedsim.config import load_config
    from fedsim.ot import wasserstein  # the module whose POT calls are timed

    spent = {"seconds": 0.0, "calls": 0}

    def timed(function):
        @functools.wraps(function)
        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                spent["seconds"] += time.perf_counter() - started
                spent["calls"] += 1

        return wrapper

    for name in ("emd", "sinkhorn", "dist"):
        setattr(wasserstein.ot, name, timed(getattr(ot, name)))
    config = load_config(
        None,
        [f"data.benchmark={args.benchmark}", f"data.target={args.target}", "method.name=feddadil", f"run.rounds={args.rounds}",
         f"run.eval_every={args.rounds + 1}", "run.backend=local", "run.progress=false", "run.tensorboard=false", "run.checkpoint_every=0"]
        + args.set,
    )
    from fedsim.runtime.callbacks import Callback

    per_round = []

    class Ledger(Callback):
        def on_round_end(self, simulator, metrics):
            per_round.append((metrics["round"], metrics.get("stage"), metrics["round_seconds"], spent["seconds"], spent["calls"]))
            spent["seconds"], spent["calls"] = 0.0, 0

    run_experiment(config, callbacks=[Ledger()])
    print(f"FedDaDiL POT share, {args.benchmark} -> {args.target}, {machine()}")
    print(f"{'round':>5s} {'stage':>10s} {'round s':>8s} {'POT s':>7s} {'calls':>6s} {'share':>6s}")
    for rnd, stage, seconds, pot, calls in per_round:
        note = "  (includes DaDiL-R/E evaluation)" if rnd == len(per_round) else ""
        print(f"{rnd:5d} {str(stage):>10s} {seconds:8.2f} {pot:7.2f} {calls:6d} {100 * pot / seconds:5.1f}%{note}")
    train = [r for r in per_round[:-1] if r[1] == "dictionary"]
    if train:
        share = sum(r[3] for r in train) / sum(r[2] for r in train)
        print(f"dictionary rounds without evaluation: {100 * share:.1f} % of the time inside POT calls")


if __name__ == "__main__":
    main()
