"""Scale benchmark: many simulated clients multiplexed on a small pool of client actors.

1,000 clients (then 10,000), 10 sampled per round, 20 rounds, FedAvg with an
MLP on synthetic 32-d features (4 domains x 25,000 samples, so 10,000 clients
still hold 10 samples each), Ray backend with one actor per core. Prints the
time per round and the peak resident memory of the driver plus every Ray
process it started; time per round should not grow with the total.

    python -m tools.benchmarks.scale [--sizes 1000,10000] [--rounds 20] [--digits] [--flat-rounds 100]

``--digits`` also runs 1,000 clients on the embedded digits (--clients-per-domain 250).
Then 1,000 clients for ``--flat-rounds`` rounds: driver RSS, all-process RSS and
object-store use of rounds 10-40 against the last 30 rounds (memory stays flat).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import numpy as np
import psutil

from tools.benchmarks.measure import PeakMemory, machine, plasma_mib, tree_rss_bytes

PER_DOMAIN = 25_000


def write_features(root: str, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 1.5, size=(10, 32))
    for d in range(4):
        y = rng.integers(0, 10, PER_DOMAIN)
        x = centers[y] + rng.normal(0, 1.0, size=(PER_DOMAIN, 32)) + 0.3 * d
        np.savez(os.path.join(root, f"d{d}.npz"), x=x.astype(np.float32), y=y.astype(np.int64))


def run_size(overrides: list[str], label: str) -> None:
    from fedsim.api import run_experiment
    from fedsim.config import load_config

    config = load_config(None, overrides)
    with PeakMemory() as memory:
        started = time.perf_counter()
        result = run_experiment(config)
        wall = time.perf_counter() - started
    rounds = [m["round_seconds"] for m in result.history]
    train_rounds = [m["round_seconds"] for m in result.history if not m.get("evaluated")]
    print(
        f"{label:34s} clients {len(result.federation.clients):6d}  "
        f"mean round {np.mean(train_rounds or rounds):6.3f} s  median {np.median(train_rounds or rounds):6.3f} s  "
        f"final eval round {rounds[-1]:6.2f} s  wall {wall:6.1f} s  "
        f"peak RSS {memory.peak / 2**30:5.2f} GiB ({memory.processes} processes)"
    )
    print("    at the peak (MiB): " + ", ".join(f"{name} {rss / 2**20:.0f}" for name, rss in memory.breakdown))


def run_flatness(overrides: list[str], rounds: int) -> None:
    """Driver RSS, all-process RSS and object-store use after round 10 vs at the end (target: < 5 % growth)."""
    from fedsim.api import run_experiment
    from fedsim.config import load_config
    from fedsim.runtime.callbacks import Callback

    samples: dict[int, tuple[int, int, float]] = {}

    class Probe(Callback):
        def on_round_end(self, simulator, metrics):
            if metrics["round"] >= 10:  # every round: the store's usage is a sawtooth, its peaks are what compare
                samples[metrics["round"]] = (psutil.Process().memory_info().rss, tree_rss_bytes()[0], plasma_mib())

    run_experiment(
        load_config(None, overrides + [f"run.rounds={rounds}", f"run.eval_every={rounds}"]), callbacks=[Probe()]
    )
    # Ray frees released objects in batches (a sawtooth): compare the peaks of the first and the last 30 rounds
    first = [v for r, v in samples.items() if r <= 40]
    last = [v for r, v in samples.items() if r > rounds - 30]
    names = ("driver RSS", "all processes RSS", "object store")
    parts = []
    for i, name in enumerate(names):
        early, late = max(v[i] for v in first), max(v[i] for v in last)
        scale = 2**20 if i < 2 else 1.0
        parts.append(
            f"{name} {early / scale:.0f} -> {late / scale:.0f} MiB ({100 * (late - early) / max(early, 1e-9):+.1f} %)"
        )
    print(f"flat memory, 1000 clients, rounds 10-40 vs {rounds - 29}-{rounds} (peaks): " + "; ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--digits", action="store_true")
    parser.add_argument("--flat-rounds", type=int, default=100, help="rounds of the flat-memory run (0: skip it)")
    args = parser.parse_args()
    if args.flat_rounds and args.flat_rounds < 70:
        parser.error("--flat-rounds must be at least 70 (rounds 10-40 are compared with the last 30), or 0 to skip")
    logging.basicConfig(level=logging.WARNING)
    import ray

    from fedsim.actors.backend import RAY_AUTH_LOGGER, quiet_logger

    with quiet_logger(RAY_AUTH_LOGGER):
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    print(f"scale benchmark, {machine()}")
    try:
        with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as cache:
            write_features(root)

            def features(size: int) -> list[str]:
                return [
                    "data.benchmark=npz",
                    f"data.root={root}",
                    f"data.cache_dir={cache}",
                    "data.target=d3",
                    f"data.clients_per_domain={size // 4}",
                    "run.clients_per_round=10",
                    "run.progress=false",
                    "run.tensorboard=false",
                    "run.checkpoint_every=0",
                    "method.batch_size=10",
                ]

            for size in (int(s) for s in args.sizes.split(",")):
                run_size(
                    features(size) + [f"run.rounds={args.rounds}", f"run.eval_every={args.rounds}"],
                    f"features, {size} clients",
                )
            if args.flat_rounds:
                run_flatness(features(1000), args.flat_rounds)
            if args.digits:
                overrides = [
                    f"data.cache_dir={cache}",
                    "data.clients_per_domain=250",
                    "run.clients_per_round=10",
                    f"run.rounds={args.rounds}",
                    f"run.eval_every={args.rounds}",
                    "run.progress=false",
                    "run.tensorboard=false",
                    "run.checkpoint_every=0",
                ]
                run_size(overrides, "digits, 1000 clients")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
