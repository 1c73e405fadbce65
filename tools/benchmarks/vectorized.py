"""Local training of K MLP clients: one client after the other (the loop) against one batched computation.

Each client holds ``--samples`` random 53-d feature vectors (``--classes`` labels), starts from the same
weights and runs one epoch of SGD (momentum 0.9) at batch 32 from its own seed: 50 steps at 1,600 samples.
The loop is what a FedAvg client runs (``load_numpy``, ``make_optimizer``, ``train_epochs``,
``model_to_numpy``); the batched form is :func:`fedsim.methods.common.vectorized.train_clients`, which
``resources.vectorize: auto`` uses. Both run on one thread; each figure is the median of ``--repeats`` runs,
and the last column is the largest weight difference between the two (rounding, which training on random labels
can amplify for a few clients as much as a 1-ulp change of their start would). Measured figures: docs/performance.md.

    python -m tools.benchmarks.vectorized [--clients 10 100 --samples 1600 --repeats 3]

``--tep`` instead runs whole FedAvg rounds through fedsim on the embedded TEP benchmark (target mode1, the five
other modes split into 20 clients each: 100 clients per round, the ``mlp`` model) on the Ray backend with 2
client actors, once with ``resources.vectorize=off`` and once with ``auto``, ``--repeats`` times interleaved,
and prints the median of the runs' mean round (rounds 2 to ``--rounds``, evaluation apart) for each
``--local-epochs`` value, the ratio of the medians, the range of the runs' own ratios (each batched run against the
loop run beside it), and whether both forms reached the same accuracy in every run.

    python -m tools.benchmarks.vectorized --tep [--rounds 8 --local-epochs 1 5] [--method fedmmd]

``--method fedmmd`` runs FedMMD's rounds instead (the target's features, then the sources' MMD-aligned fit).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tools.benchmarks.measure import machine


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--samples", type=int, default=1600)
    parser.add_argument("--features", type=int, default=53)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tep", action="store_true", help="whole FedAvg rounds on TEP, 100 clients, 2 Ray actors")
    parser.add_argument("--rounds", type=int, default=8, help="with --tep: rounds per run")
    parser.add_argument("--local-epochs", type=int, nargs="+", default=[1, 5], help="with --tep")
    parser.add_argument("--method", choices=("fedavg", "fedmmd"), default="fedavg", help="with --tep")
    return parser.parse_args()


def make_jobs(args: argparse.Namespace, count: int, weights: dict) -> list:
    from fedsim.methods.common.vectorized import ClientJob

    rng = np.random.default_rng(count)
    return [
        ClientJob(
            rng.normal(size=(args.samples, args.features)).astype(np.float32),
            rng.integers(0, args.classes, args.samples),
            weights,
            seed=seed,
        )
        for seed in range(count)
    ]


def loop(model, jobs: list, settings) -> list[dict]:
    """Each client alone, as ``GlobalClassifier.train`` runs it."""
    import torch

    from fedsim.data.base import ArraySplit
    from fedsim.methods.common.training import load_numpy, make_optimizer, model_to_numpy, train_epochs

    out = []
    for job in jobs:
        load_numpy(model, job.weights)
        optimizer = make_optimizer(model, settings)
        split = ArraySplit(job.x, job.y)
        train_epochs(model, split, settings.local_epochs, settings.batch_size, optimizer, job.seed, torch.device("cpu"))
        out.append(model_to_numpy(model))
    return out


def median_seconds(function, repeats: int):
    """The median wall time of ``repeats`` calls and the last call's result."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def tep_rounds(vectorize: str, rounds: int, epochs: int, method: str = "fedavg") -> tuple[float, float]:
    """Mean seconds of rounds 2.. of a ``method`` run on TEP (100 clients per round, Ray, 2 actors), target
    accuracy."""
    from fedsim.api import run_experiment
    from fedsim.config import load_config

    settings = {
        "data.benchmark": "tep",
        "data.target": "mode1",
        "data.clients_per_domain": 20,
        "model.name": "mlp",
        "method.name": method,
        "method.local_epochs": epochs,
        "run.rounds": rounds,
        "run.eval_every": rounds,
        "run.backend": "ray",
        "run.progress": False,
        "run.tensorboard": False,
        "ray.max_actors": 2,
        "resources.vectorize": vectorize,
    }
    result = run_experiment(load_config(None, [f"{k}={v}" for k, v in settings.items()]))
    later = [m["round_seconds"] for m in result.history[1:]]
    return statistics.mean(later), result.summary["target_accuracy"]


def main_tep(args: argparse.Namespace) -> None:
    print(
        f"{args.method} on TEP, 100 clients per round, Ray backend with 2 client actors, "
        f"medians of {args.repeats} runs, {machine()}"
    )
    header = f"{'local epochs':>12s} {'loop s/round':>12s} {'batched s/round':>15s} {'ratio':>6s} {'runs':>11s}"
    print(header + f" {'same accuracy':>13s}")
    for epochs in args.local_epochs:
        runs = [
            (tep_rounds("off", args.rounds, epochs, args.method), tep_rounds("auto", args.rounds, epochs, args.method))
            for _ in range(args.repeats)
        ]
        loop_s = statistics.median(loop[0] for loop, _ in runs)
        batched_s = statistics.median(batched[0] for _, batched in runs)
        same = all(abs(loop[1] - batched[1]) < 1e-9 for loop, batched in runs)
        ratios = [batched[0] / loop[0] for loop, batched in runs]  # each run's pair, for the spread
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}x"
        print(
            f"{epochs:12d} {loop_s:12.4f} {batched_s:15.4f} {batched_s / loop_s:5.2f}x {spread:>11s} {str(same):>13s}"
        )


def main() -> None:
    args = parse_args()
    if args.tep:
        main_tep(args)
        return
    import torch

    from fedsim.messages import LocalSettings
    from fedsim.methods.common.training import model_to_numpy
    from fedsim.methods.common.vectorized import train_clients
    from fedsim.models.mlp import mlp

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = mlp((args.features,), args.classes)
    settings = LocalSettings(local_epochs=1, batch_size=32, lr=0.05, momentum=0.9, weight_decay=0.0)
    initial = model_to_numpy(model)  # the loop leaves its last client's weights in the model
    steps = -(-args.samples // settings.batch_size)
    print(f"MLP local training, {args.features}-d features, {steps} steps per client, one thread, {machine()}")
    print(f"{'clients':>7s} {'loop s':>8s} {'batched s':>9s} {'speed-up':>8s} {'max |dw|':>9s}")
    for count in args.clients:
        jobs = make_jobs(args, count, initial)
        loop(model, jobs[:1], settings)  # first steps pay torch's lazy imports
        looped, reference = median_seconds(lambda: loop(model, jobs, settings), args.repeats)
        batched, (weights, _) = median_seconds(lambda: train_clients(model, jobs, settings, "cpu"), args.repeats)
        gap = max(float(np.abs(w[n] - r[n]).max()) for w, r in zip(weights, reference) for n in r)
        print(f"{count:7d} {looped:8.3f} {batched:9.3f} {looped / batched:7.1f}x {gap:9.1e}")


if __name__ == "__main__":
    main()
