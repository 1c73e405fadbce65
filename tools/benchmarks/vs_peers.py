"""fedsim beside a peer simulator on the same job: ``fedavg-lenet-10`` through ``fedsim run``, the plain-torch
floor, and pfl-research (one process, and two ``torchrun`` workers) when the peer interpreter has ``pfl``.

The job (:mod:`tools.benchmarks.overhead_job`): 10 IID clients of the 5,000-image MNIST subset, LeNet-5,
FedAvg with every client every round, 5 rounds, 1 local epoch, batch 32, SGD lr 0.05 momentum 0.9, one torch
thread per training process. Every way gets the same 10 clients' arrays. Each way runs in a fresh process,
``--repeat`` times interleaved (medians printed), and is measured from outside, the same way for all:

- **whole s**: the process (tree) from start to exit: interpreter, imports, data, workers or cluster, shutdown;
- **rounds 2-5 s**: the rounds after the first (which pays lazy start-up), training and aggregation only:
  fedsim's ``round_seconds`` (metrics.jsonl reports ``eval_seconds`` and ``checkpoint_seconds`` apart), pfl's
  time between its central iterations, the floor's own clock;
- **PSS MiB**: the largest proportional set size of the whole process tree (every descendant: Ray's daemons and
  actors, torchrun's workers), sampled every 0.25 s in one more run of each way after the timed ones. The timed
  runs are not sampled: reading one torch process's ``smaps_rollup`` costs about 10 ms of CPU, so on two cores
  the sampler slows a tree of three torch processes (Ray's, torchrun's) more than the floor's single one.

    python -m tools.benchmarks.vs_peers [--repeat 3] [--joined] [--peer-python /path/to/venv/bin/python]

``--joined`` adds fedsim joining a cluster that ``ray start --head`` started once (as a series of runs or a sweep
does): its start is timed apart, and its processes' PSS is counted in the run's. The idle cluster slows the other
ways' Ray starts, so compare the own-cluster way from a run without ``--joined``.

``--peer-python`` is an interpreter with ``pfl[pytorch]`` installed (default: this one); without ``pfl`` the
pfl ways are left out with a line saying so. Measured figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

from tools.benchmarks.measure import PeakPss, cluster_pids, machine, stop_cluster
from tools.benchmarks.overhead import CLUSTER_PORT, joined_env, start_cluster

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_TAGS = ("PEER-RESULT ", "OVERHEAD-RESULT ")


def write_clients(root: str) -> str:
    """The job's data (mnist.npz, usps.npz) and ``clients.npz``: each fedsim client's training arrays and the
    target's test set, so that the peers train on exactly fedsim's clients."""
    from fedsim.config import load_config
    from fedsim.data.scenario import build_federation, load_client_data
    from tools.benchmarks.overhead_job import job_overrides, write_job_data

    write_job_data(root)
    with tempfile.TemporaryDirectory() as cache:
        config = load_config(None, job_overrides(root, cache, "local"))
        federation = build_federation(config.data)
        arrays = {}
        for cid in federation.source_ids:
            data = load_client_data(config.data, federation, cid)
            arrays[f"x_{cid}"], arrays[f"y_{cid}"] = data.train.x, data.train.y
        targets = [load_client_data(config.data, federation, cid).test for cid in federation.target_ids]
    arrays["target_x"] = np.concatenate([t.x for t in targets])
    arrays["target_y"] = np.concatenate([t.y for t in targets])
    os.makedirs(os.path.join(root, "peers"), exist_ok=True)  # not a domain file of the npz benchmark's root
    path = os.path.join(root, "peers", "clients.npz")
    np.savez(path, **arrays)
    return path


def measured(
    command: list[str], env: dict | None = None, also: tuple[int, ...] = (), sample: bool = False
) -> tuple[float, int, str]:
    """Run ``command``; its whole seconds, with ``sample`` the peak PSS of its process tree (plus the trees of the
    ``also`` processes: a joined cluster's, whose actors are not the command's children; 0 without) and its
    stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=os.path.dirname(os.path.dirname(HERE)))
        sampler = PeakPss((child.pid, *(pid for pid in also if psutil.pid_exists(pid)))) if sample else None
        child.wait()  # the exit is timed to the moment, not to the sampler's next tick
        seconds = time.perf_counter() - started
        peak = sampler.stop() if sampler else 0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed (exit {child.returncode}):\n{stderr[-3000:]}")
    return seconds, peak, stdout


def tagged(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        for tag in RESULT_TAGS:
            if line.startswith(tag):
                return json.loads(line[len(tag) :])
    raise SystemExit(f"no result line in the output:\n{stdout[-2000:]}")


def run_floor(root: str, sample: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        command = [sys.executable, "-m", "tools.benchmarks.overhead", "--way", "floor"]
        seconds, pss, stdout = measured(command + ["--root", root, "--cache", cache], sample=sample)
    result = tagged(stdout)
    return {"whole_s": seconds, "pss": pss, "rounds": result["detail"]["round_seconds"], "accuracy": result["accuracy"]}


def run_fedsim(root: str, sample: bool, backend: str, extra: list[str], cluster: tuple | None = None) -> dict:
    """``fedsim run`` of the job; ``cluster``: (port, root pids) of a ``ray start`` cluster to join."""
    from tools.benchmarks.overhead_job import job_overrides

    fedsim = os.path.join(os.path.dirname(sys.executable), "fedsim")
    env = os.environ | joined_env(cluster[0]) if cluster else None
    address = "auto" if cluster else ""
    with tempfile.TemporaryDirectory() as scratch:
        overrides = job_overrides(root, os.path.join(scratch, "cache"), backend, address) + extra
        sets = [a for o in overrides for a in ("--set", o)]
        out = os.path.join(scratch, "run")
        command = [fedsim, "run", *sets, "--out", out, "-q"]
        seconds, pss, _ = measured(command, env, cluster[1] if cluster else (), sample)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        with open(os.path.join(out, "summary.json")) as f:
            accuracy = json.load(f)["target_accuracy"]
    return {"whole_s": seconds, "pss": pss, "rounds": [r["round_seconds"] for r in rows], "accuracy": accuracy}


def run_pfl(peer_python: str, clients: str, workers: int, sample: bool, layout: tuple[str, ...] = ()) -> dict:
    script = os.path.join(HERE, "peers_pfl.py")
    launcher = [peer_python] if workers == 1 else [peer_python, "-m", "torch.distributed.run", "--standalone"]
    workers_flag = [] if workers == 1 else ["--nproc_per_node", str(workers)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    seconds, pss, stdout = measured(launcher + workers_flag + [script, clients, *layout], env=env, sample=sample)
    result = tagged(stdout)
    return {"whole_s": seconds, "pss": pss, "rounds": result["round_seconds"], "accuracy": result["accuracy"]}


def has_pfl(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import pfl, torch"], capture_output=True, check=False)
    return probe.returncode == 0


def ways(args: argparse.Namespace, cluster) -> dict:
    """way label -> a function of (root, clients path, sample) that runs it once (``sample``: its PSS too)."""
    extra = args.fedsim_set
    table = {
        "floor: plain serial torch loop": lambda root, clients, sample: run_floor(root, sample),
        "fedsim, local backend": lambda root, clients, sample: run_fedsim(root, sample, "local", extra),
        "fedsim, Ray backend (2 actors)": lambda root, clients, sample: run_fedsim(root, sample, "ray", extra),
    }
    if cluster:
        table["fedsim, Ray, joined cluster"] = lambda root, clients, sample: run_fedsim(
            root, sample, "ray", extra, cluster
        )
    if has_pfl(args.peer_python):
        table["pfl-research, one process"] = lambda root, clients, sample: run_pfl(args.peer_python, clients, 1, sample)
        table["pfl-research, 2 torchrun workers"] = lambda root, clients, sample: run_pfl(
            args.peer_python, clients, 2, sample
        )
        table["pfl-research, 2 workers, channels-last"] = lambda root, clients, sample: run_pfl(
            args.peer_python, clients, 2, sample, ("channels-last",)
        )
    else:
        print(f"pfl-research left out: {args.peer_python} cannot import pfl (pip install 'pfl[pytorch]')")
    return table


def report(results: dict[str, list[dict]], pss: dict[str, int]) -> None:
    def med(label: str, key) -> float:
        return statistics.median(key(r) for r in results[label])

    floor = "floor: plain serial torch loop"
    later = lambda r: sum(r["rounds"][1:])  # noqa: E731
    base_whole, base_later = med(floor, lambda r: r["whole_s"]), med(floor, later)
    print(
        f"{'way':40s} {'whole s':>8s} {'/floor':>7s} {'round 1 s':>9s} {'rounds 2-5 s':>12s} {'/floor':>7s} "
        f"{'PSS MiB':>8s} {'target acc':>10s}"
    )
    for label in results:
        whole, rest = med(label, lambda r: r["whole_s"]), med(label, later)
        print(
            f"{label:40s} {whole:8.2f} {whole / base_whole:6.2f}x {med(label, lambda r: r['rounds'][0]):9.2f} "
            f"{rest:12.2f} {rest / base_later:6.2f}x {pss[label] / 2**20:8.0f} "
            f"{med(label, lambda r: r['accuracy']):10.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs of every way (medians printed)")
    parser.add_argument("--peer-python", default=sys.executable, help="an interpreter with pfl[pytorch] installed")
    parser.add_argument(
        "--joined", action="store_true", help="also fedsim joining a cluster started once with 'ray start --head'"
    )
    parser.add_argument(
        "--fedsim-set", nargs="*", default=[], metavar="KEY=VALUE", help="extra fedsim overrides for both backends"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        cluster, cluster_start = None, 0.0
        if args.joined:
            cluster_start = start_cluster(CLUSTER_PORT, os.path.join(root, "ray"))
            cluster = (CLUSTER_PORT, tuple(cluster_pids(CLUSTER_PORT)))
        try:
            table = ways(args, cluster)
            results: dict[str, list[dict]] = {label: [] for label in table}
            clients = write_clients(root)
            for _ in range(args.repeat):
                for label, run in table.items():
                    results[label].append(run(root, clients, False) | {"load": os.getloadavg()[0]})
            pss = {label: run(root, clients, True)["pss"] for label, run in table.items()}
        finally:
            if cluster:
                stop_cluster(CLUSTER_PORT)
    print(f"fedavg-lenet-10, medians of {args.repeat} interleaved runs (PSS: one more sampled run), {machine()}")
    report(results, pss)
    if cluster:
        print(
            f"joined cluster: 'ray start --head' took {cluster_start:.2f} s once, outside the runs; its PSS "
            "(daemons and the run's actors) is counted in the run's figure"
        )


if __name__ == "__main__":
    main()
