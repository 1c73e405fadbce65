"""A real two-node Ray cluster on this machine: `fedsim run --address` and a two-trial
`fedsim sweep --address` place client actors on both nodes.

Each node is its own `ray start --block` process (head and worker) with one CPU, its own
custom resource, temp dir and ports, so nothing touches other Ray clusters on a shared
machine (no `ray stop`; both are stopped by process id). Client actors ask for 0.75 CPU,
so two of them never fit on one node: placement on both nodes is forced by arithmetic,
and read back from the GCS actor table (dead actors included) and from the sweep's
``client_nodes`` column.

Token authentication (on by default for local clusters since Ray 2.60): the test makes its
own token file and gives every process the same ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH``. An explicit address never turns token mode on by itself, so a
worker or driver joining ``host:port`` needs ``RAY_AUTH_MODE=token`` when the head uses a
token; a private token keeps the test independent of ``~/.ray/auth_token``.
"""

import csv
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multinode

BIN = Path(sys.executable).parent
CPUS_PER_CLIENT = "0.75"  # two client actors never fit on one 1-CPU node

QUERY = r"""
import json, sys, time
import ray
from ray._private.state import actors  # the GCS actor table (dead actors too); needs no dashboard

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
deadline = time.time() + 90
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline:
    time.sleep(0.5)
nodes = {n["NodeID"]: sorted(n["Resources"]) for n in ray.nodes() if n["Alive"]}
clients = {
    a: info["Address"]["NodeID"] for a, info in actors().items() if info["ActorClassName"].endswith("ClientActor")
}
print(json.dumps({"nodes": nodes, "clients": clients}))
"""


_TAKEN: set[int] = set()


def _free_port() -> int:
    """A free port below the kernel's ephemeral range, never handed out twice by this test.

    Ray picks the ports it is not given (the GCS server's among them) by binding port 0, which
    draws from the ephemeral range; a port chosen there, released and passed to Ray could be the
    one Ray draws for itself ("port ... used by other components")."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    rng = random.Random()
    while True:
        port = rng.randrange(10000, max(low, 10001))
        if port in _TAKEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _TAKEN.add(port)
        return port


def _port_flags() -> list[str]:
    """Every port a node opens, chosen free, so the node never collides with another cluster."""
    flags = ["--min-worker-port", "0", "--max-worker-port", "0"]
    for flag in (
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
    ):
        flags += [flag, str(_free_port())]
    return flags


class TwoNodeCluster:
    def __init__(self):
        # short path: Ray's unix sockets live under the temp dir and must stay under 108 characters
        self.root = Path(tempfile.mkdtemp(prefix="fsmn", dir="/tmp"))
        token = self.root / "token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
        self.env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(token),
            RAY_USAGE_STATS_ENABLED="0",
            TQDM_DISABLE="1",
            RAY_DEDUP_LOGS="0",
        )
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def _start(self, name: str, args: list[str]) -> None:
        common = [
            "--block",
            "--num-cpus",
            "1",
            "--object-store-memory",
            str(150 * 1024 * 1024),
            "--disable-usage-stats",
            "--temp-dir",
            str(self.root / name),
            "--node-ip-address",
            "127.0.0.1",
        ]
        log = open(self.root / f"{name}.log", "w")
        self.processes.append(
            subprocess.Popen(
                [str(BIN / "ray"), "start"] + args + common + _port_flags(),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def start(self) -> dict:
        self._start(
            "head",
            [
                "--head",
                "--port",
                str(self.port),
                "--include-dashboard",
                "false",
                "--ray-client-server-port",
                str(_free_port()),
                "--resources",
                '{"fedsim_head": 1}',
            ],
        )
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.processes[0].poll() is not None:
                    raise RuntimeError(f"head did not start:\n{self.log('head')}")
                time.sleep(0.3)
        self._start("worker", ["--address", self.address, "--resources", '{"fedsim_worker": 1}'])
        state = self.query()
        assert len(state["nodes"]) == 2, f"worker did not join:\n{self.log('worker')}"
        self.head = next(n for n, res in state["nodes"].items() if "fedsim_head" in res)
        self.worker = next(n for n, res in state["nodes"].items() if "fedsim_worker" in res)
        self.seen = set(state["clients"])
        return state

    def new_client_actors(self) -> dict:
        """Client actors (alive or dead) created since the last call -> their node ids."""
        clients = {a: n for a, n in self.query()["clients"].items() if a not in self.seen}
        self.seen |= set(clients)
        return clients

    def query(self) -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", QUERY, self.address], env=self.env, capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to each `ray start --block` process (it stops its node's processes), then SIGKILL
        to its own process group if it lingers; never `ray stop`, which would stop other clusters."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of this node only (start_new_session)
            except ProcessLookupError:
                pass
            proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def two_nodes():
    cluster = TwoNodeCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _fedsim(cluster, args, timeout=300):
    proc = subprocess.run(
        [str(BIN / "fedsim")] + args, env=cluster.env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def _toy_flags(toy_overrides, rounds=1):
    flags = []
    for item in toy_overrides:
        if not item.startswith("run.rounds="):
            flags += ["--set", item]
    return flags + ["--rounds", str(rounds), "--cpus-per-client", CPUS_PER_CLIENT]


def test_run_places_client_actors_on_both_nodes(two_nodes, toy_overrides, tmp_path):
    out = tmp_path / "run"
    _fedsim(
        two_nodes,
        ["run", "-q", "--backend", "ray", "--address", two_nodes.address, "--out", str(out)]
        + _toy_flags(toy_overrides),
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "ray" and 0.0 <= summary["target_accuracy"] <= 1.0
    clients = two_nodes.new_client_actors()
    assert len(clients) == 2  # 3 clients, 2 CPUs, 0.75 CPU per actor
    assert set(clients.values()) == {two_nodes.head, two_nodes.worker}
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    if "client_nodes" in first:  # recorded by the Ray backend itself, where it does so
        assert set(first["client_nodes"]) == {two_nodes.head, two_nodes.worker}


def test_sweep_places_each_trials_client_actors_on_both_nodes(two_nodes, toy_overrides, tmp_path):
    out = tmp_path / "sweep"
    _fedsim(
        two_nodes,
        ["sweep", "-q", "--address", two_nodes.address, "--methods", "fedavg,fedprox", "--out", str(out)]
        + _toy_flags(toy_overrides),
    )
    with open(out / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["method"], r["status"]) for r in rows] == [("fedavg", "finished"), ("fedprox", "finished")]
    for row in rows:  # each trial: head bundle + 2 client bundles of 0.75 CPU, so the bundles span both nodes
        assert set(row["client_nodes"].split(",")) == {two_nodes.head, two_nodes.worker}
        assert 0 <= float(row["target_accuracy"]) <= 1
    clients = two_nodes.new_client_actors()
    assert len(clients) == 4 and set(clients.values()) == {two_nodes.head, two_nodes.worker}
    assert (out / "report.md").exists() and (out / "accuracy_vs_bytes.png").exists()
