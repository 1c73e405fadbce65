"""`ray up` on this machine, end to end: the cluster launcher with a local-provider cluster, a run, a sweep, `ray down`.

    .venv/bin/python -m tools.cluster_check            # from the repository root, as root (about 2 minutes)

What it does, all of it on loopback addresses:

1. installs openssh-server, rsync and netcat-openbsd with apt-get when one is missing (no service is started: the
   package's own sshd stays off), and starts an sshd of its own on 127.0.0.1 at a free port, with its own host key,
   key-only login with a key pair it generates, and ``HOME`` set to a folder of its own: that folder is the node's
   home, so the node (the head) is a fresh machine that shares nothing with this user's home;
2. writes a local-provider cluster config derived from ``cluster.yaml`` (:func:`local_config`): the same file mounts,
   setup commands and start commands, with the head at 127.0.0.1, the SSH port reached through ``nc`` (Ray's ``auth``
   has no port setting), ports of its own, and the packages of this checkout's venv standing in for a node image
   (``tools/cluster/preinstalled.sh``), so the setup's ``pip install`` installs fedsim alone;
3. ``ray up``, then from this machine: a Ray task that reports the workers' Python and fedsim, ``fedsim run
   --address`` and a two-trial ``fedsim sweep --address``, both with a method from a package written for the check
   that reaches the workers through Ray's runtime environment;
4. ``ray down``, and stops its sshd, whatever happened before; a folder of logs stays behind on failure (``--keep``:
   always).

The node's ``ray stop`` (at ``ray up`` and ``ray down``) stops only the Ray processes the node started
(``tools/cluster/node_ray.py``), never the other Ray clusters of this machine. Not part of ``make test``;
``tests/test_cluster_yaml.py`` validates the config it writes against Ray's schema without starting anything.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import getpass
import json
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

from tools.cluster.node_ray import recorded, stop_sessions

REPO = Path(__file__).resolve().parents[1]
CLUSTER_YAML = REPO / "cluster.yaml"
NODE_FILES = REPO / "tools" / "cluster"
HEAD_IP = "127.0.0.1"
# Ray's switch for clusters of one machine (named for Windows and macOS, where it is off): with it at 0, Ray gives
# nodes and drivers the address 127.0.0.1, where it would otherwise resolve 127.0.0.1 to the host's own address
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
PACKAGES = {"sshd": "openssh-server", "rsync": "rsync", "nc": "netcat-openbsd"}
PLUGIN_PACKAGE = "fedsim_check_plugin"
PLUGIN_METHOD = f"{PLUGIN_PACKAGE}.methods:FedMedian"
# digits, target usps, 500 training examples per domain, 2 rounds: a run of a few seconds once the actors are up
TOY = ["--benchmark", "digits", "--target", "usps", "--rounds", "2", "--set", "data.max_train_per_domain=500"]
PORT_NAMES = (
    "gcs",
    "object_manager",
    "node_manager",
    "client_server",
    "dashboard",
    "dashboard_agent_listen",
    "dashboard_agent_grpc",
    "metrics",
    "runtime_env_agent",
)
WORKER_PORTS = 100  # one per Ray worker process: drivers, actors, Tune trials, idle workers


class CheckFailed(RuntimeError):
    pass


# ---- the config -------------------------------------------------------------------------------------------------


def start_command(command: str, ports: dict[str, int], num_cpus: int, object_store_bytes: int) -> str:
    """``cluster.yaml``'s head ``ray start`` command on the shared machine: its ports, 127.0.0.1, a CPU count."""
    replacements = {
        "--port=6379": f"--port={ports['gcs']}",
        "--object-manager-port=8076": f"--object-manager-port={ports['object_manager']}",
        "--dashboard-host=0.0.0.0": f"--dashboard-host={HEAD_IP}",
    }
    for old, new in replacements.items():
        if old not in command:
            raise CheckFailed(f"cluster.yaml's head start command has no {old}: {command}")
        command = command.replace(old, new)
    extra = {
        "--node-ip-address": HEAD_IP,
        "--node-manager-port": ports["node_manager"],
        "--min-worker-port": ports["min_worker"],
        "--max-worker-port": ports["max_worker"],
        "--ray-client-server-port": ports["client_server"],
        "--dashboard-port": ports["dashboard"],
        "--dashboard-agent-listen-port": ports["dashboard_agent_listen"],
        "--dashboard-agent-grpc-port": ports["dashboard_agent_grpc"],
        "--metrics-export-port": ports["metrics"],
        "--runtime-env-agent-port": ports["runtime_env_agent"],
        "--num-cpus": num_cpus,
        "--object-store-memory": object_store_bytes,
    }
    return command + "".join(f" {flag}={value}" for flag, value in extra.items()) + " --disable-usage-stats"


def local_config(
    base: dict,
    *,
    cluster_name: str,
    user: str,
    private_key: str,
    ssh_port: int,
    ports: dict[str, int],
    token: str,
    data: str,
    site_packages: str,
    num_cpus: int = 2,
    object_store_bytes: int = 300 * 2**20,
) -> dict:
    """The local-provider config of the check: ``cluster.yaml`` (``base``) with its head on 127.0.0.1.

    Kept from ``cluster.yaml``: the file mounts' remote paths and the checkout's ``"."``, ``rsync_exclude``, the setup
    commands and the head start commands. Changed: the provider (local, no workers), the SSH login (``user``, the
    check's key, ``nc`` to the check's sshd), the data folder and token mounted from the check's folder, no
    ``head_setup_commands`` (boto3 is AWS's), the ports; one setup command added after the venv's creation:
    ``preinstalled.sh`` (the dependencies from ``site_packages`` instead of a download).
    """
    dropped = ("provider", "auth", "docker", "available_node_types", "head_node_type")
    config = {key: copy.deepcopy(value) for key, value in base.items() if key not in dropped}
    config["cluster_name"] = cluster_name
    config["max_workers"] = 0
    config["provider"] = {"type": "local", "head_ip": HEAD_IP, "worker_ips": []}
    config["auth"] = {"ssh_user": user, "ssh_private_key": private_key, "ssh_proxy_command": f"nc %h {ssh_port}"}
    config["file_mounts"]["~/fedsim-data"] = data
    config["file_mounts"]["~/.ray/auth_token"] = token
    setup = list(config["setup_commands"])
    made = [i for i, command in enumerate(setup) if "-m venv ~/fedsim-venv" in command]
    if not made:
        raise CheckFailed("cluster.yaml's setup_commands do not create ~/fedsim-venv")
    setup.insert(made[0] + 1, f"bash ~/image/preinstalled.sh ~/fedsim-venv {site_packages}")
    config["setup_commands"] = setup
    config["head_setup_commands"] = []
    config["head_start_ray_commands"] = [
        start_command(c, ports, num_cpus, object_store_bytes) if "ray start" in c else c
        for c in base["head_start_ray_commands"]
    ]
    config["worker_start_ray_commands"] = []  # no worker_ips
    return config


# ---- the machine ------------------------------------------------------------------------------------------------


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HEAD_IP, port))
        except OSError:
            return False
    return True


def choose_ports() -> dict[str, int]:
    """Free ports below the kernel's ephemeral range (where Ray draws the ports it is not given), none twice."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    rng = random.Random()
    taken: set[int] = set()

    def one(preferred: int | None = None) -> int:
        while True:
            port = preferred if preferred is not None else rng.randrange(10000, low - WORKER_PORTS)
            preferred = None
            if port not in taken and port_is_free(port):
                taken.add(port)
                return port

    ports = {"ssh": one(), "gcs": one(6390)}
    for name in PORT_NAMES[1:]:
        ports[name] = one()
    while True:  # a block of worker ports, all free
        start = rng.randrange(20000, low - WORKER_PORTS)
        block = range(start, start + WORKER_PORTS)
        if not taken.intersection(block) and all(port_is_free(p) for p in block):
            ports["min_worker"], ports["max_worker"] = start, start + WORKER_PORTS - 1
            return ports


def install_packages(log) -> None:
    """apt-get install the packages whose command is missing; a policy-rc.d keeps their services from starting."""
    missing = [pkg for cmd, pkg in PACKAGES.items() if not (shutil.which(cmd) or Path(f"/usr/sbin/{cmd}").exists())]
    if not missing:
        return
    log(f"installing {' '.join(missing)} (apt-get)")
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = not policy.exists()
    if made_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env, stdout=subprocess.DEVNULL)
    finally:
        if made_policy:
            policy.unlink()


class Sshd:
    """An sshd on 127.0.0.1:port with its own config, host key and authorized key; HOME is the node's home."""

    def __init__(self, root: Path, home: Path, port: int, user: str):
        self.dir = root / "ssh"
        self.dir.mkdir()
        self.port = port
        self.user = user
        self.key = self.dir / "id_ed25519"
        for path, comment in ((self.key, "fedsim-check"), (self.dir / "host_ed25519", "fedsim-check-host")):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        shutil.copy(self.dir / "id_ed25519.pub", self.dir / "authorized_keys")
        self.config = self.dir / "sshd_config"
        self.config.write_text(
            textwrap.dedent(f"""\
                ListenAddress {HEAD_IP}:{port}
                HostKey {self.dir}/host_ed25519
                PidFile {self.dir}/sshd.pid
                AuthorizedKeysFile {self.dir}/authorized_keys
                AllowUsers {user}
                PermitRootLogin prohibit-password
                PubkeyAuthentication yes
                PasswordAuthentication no
                KbdInteractiveAuthentication no
                UsePAM no
                StrictModes no
                PrintMotd no
                X11Forwarding no
                MaxStartups 30
                SetEnv HOME={home}
                """)
        )
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        log = open(self.dir / "sshd.log", "wb")
        self.process = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-e", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise CheckFailed(f"sshd exited: {(self.dir / 'sshd.log').read_text().strip()}")
            try:
                socket.create_connection((HEAD_IP, self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise CheckFailed(f"sshd does not answer on {HEAD_IP}:{self.port}")

    def ssh(self, command: str) -> str:
        """Runs ``command`` on the node as Ray's launcher would (key, ``nc`` proxy); returns its output."""
        args = ["ssh", "-i", str(self.key), "-o", f"ProxyCommand=nc %h {self.port}", "-o", "IdentitiesOnly=yes"]
        args += ["-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={os.devnull}", "-o", "LogLevel=ERROR"]
        done = subprocess.run([*args, f"{self.user}@{HEAD_IP}", command], capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise CheckFailed(f"ssh to the node failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def stop(self) -> None:
        """Waits for the connections' processes (Ray's SSH masters persist 10 s), then stops sshd and them."""
        if self.process is None:
            return
        import psutil

        try:
            listener = psutil.Process(self.process.pid)
            children = listener.children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        _, alive = psutil.wait_procs(children, timeout=20)
        for proc in [*alive]:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        psutil.wait_procs(alive, timeout=5)
        self.process = None


def prepare_node_home(home: Path, node_tmp: Path) -> None:
    """The node's home: Python 3.11 (this venv's base interpreter) on PATH, its own temp folder, and a ``ray stop``
    that stops the node's own Ray sessions only (node_ray.py)."""
    base_bin = Path(sys._base_executable).resolve().parent  # type: ignore[attr-defined]
    (home / "image").mkdir(parents=True)
    for name in ("node_ray.py", "preinstalled.sh"):
        shutil.copy(NODE_FILES / name, home / "image" / name)
    (home / ".bashrc").write_text(
        textwrap.dedent(f"""\
            # the node: Python 3.11 from {base_bin}, temporary files and Ray's sessions under {node_tmp}
            export PATH={base_bin}:$PATH
            export TMPDIR={node_tmp} RAY_TMPDIR={node_tmp}
            # one machine: Ray keeps 127.0.0.1 as the node's address (it otherwise swaps 127.0.0.1 for the host's)
            export {LOOPBACK_ONLY}=0
            # `ray stop` (ray down runs it) stops the Ray sessions started on this node only
            ray() {{ if [ "$1" = stop ]; then python3 ~/image/node_ray.py stop; else command ray "$@"; fi; }}
            """)
    )
    (home / ".profile").write_text(". ~/.bashrc\n")


PLUGIN_CODE = """\
\"\"\"FedMedian (Yin et al. 2018): FedAvg whose server takes the coordinate-wise median of the sources' weights.\"\"\"

import numpy as np

from fedsim.methods.common.aggregation import federated_average
from fedsim.methods.fedavg import FedAvg


class FedMedian(FedAvg):
    def aggregate(self, ctx, state, replies):
        _, metrics = federated_average(replies)
        tensors = [reply.tensors for reply in replies.values()]
        weights = {k: np.median([t[k] for t in tensors], axis=0).astype(tensors[0][k].dtype) for k in tensors[0]}
        return {**state, "weights": weights}, metrics
"""


def write_plugin(folder: Path) -> Path:
    """A user's package, not installed anywhere: ``fedsim_check_plugin.methods:FedMedian``."""
    package = folder / PLUGIN_PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A package of the user\'s own, for the cluster check."""\n')
    (package / "methods.py").write_text(PLUGIN_CODE)
    return folder


# A driver that asks one Ray worker what it runs: its Python, its fedsim, whether it can import the plugin's package
# by itself; and the nodes' addresses.
PROBE = """\
import importlib.util, json, sys
import ray

ray.init(address=ADDRESS, logging_level="ERROR", log_to_driver=False)


def where():
    import fedsim

    plugin = importlib.util.find_spec(PLUGIN) is not None
    return {"python": sys.executable, "fedsim": fedsim.__file__, "plugin importable": plugin}


found = ray.get(ray.remote(where).remote())
found["node addresses"] = sorted(node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"])
print("probe:", json.dumps(found))
"""


# the stages of `ray up`, as its log marks their starts (the first: from the launch to the first SSH command)
UP_STAGES = {
    "Launched a new head node": "config and hash of the mounts",
    "[1/7] Waiting for SSH": "ssh",
    "[2/7] Processing file mounts": "file mounts",
    "[6/7] Running setup commands": "setup commands",
    "[7/7] Starting the Ray runtime": "ray start",
    "New status: up-to-date": None,
}


def up_stages(log: str) -> str:
    """The seconds of each stage of ``ray up`` from the timestamps of its log (setup_commands: the venv and pip)."""
    starts = []
    for line in re.sub(r"\x1b\[[0-9;]*m", "", log).splitlines():
        for marker, name in UP_STAGES.items():
            if marker in line and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", line):
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                starts.append((stamp, name))
    parts = [f"{name} {(end - start).total_seconds():.1f} s" for (start, name), (end, _) in zip(starts, starts[1:])]
    return ", ".join(parts)


# ---- the steps --------------------------------------------------------------------------------------------------


class Check:
    def __init__(self, args):
        self.args = args
        self.root = Path(tempfile.mkdtemp(prefix="fsck", dir="/tmp"))  # short: Ray's socket paths live below it
        self.logs = self.root / "logs"
        self.logs.mkdir()
        self.home = self.root / "h"
        self.node_tmp = self.root / "n"
        self.node_tmp.mkdir()
        (self.root / "l").mkdir()  # the launcher's temporary files
        self.figures: list[tuple[str, str]] = []
        self.ports = choose_ports()
        self.user = getpass.getuser()
        self.name = f"fedsim-check-{os.getpid()}"
        self.address = f"{HEAD_IP}:{self.ports['gcs']}"
        self.sshd: Sshd | None = None
        self.config_path = self.root / "cluster.yaml"
        self.driver_dir = self.root / "driver"
        self.up_started = False
        self.token = self.root / "auth_token"
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
        self.env.update(
            PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(self.token),
            RAY_USAGE_STATS_ENABLED="0",
            **{LOOPBACK_ONLY: "0"},
            RAY_TMPDIR=str(self.root / "l"),  # the launcher's cluster state and lock files
            TMPDIR=str(self.root / "l"),  # its config cache and bootstrap files
            TQDM_DISABLE="1",
            PYTHONPATH=str(self.root / "plugin"),  # the drivers import the user's package from its folder
        )

    def log(self, message: str) -> None:
        print(message, flush=True)

    def step(
        self, name: str, args: list[str], timeout: float, cwd: Path | None = None, shown: str | None = None
    ) -> tuple[float, str]:
        """Runs one command (its output to logs/<name>.log); returns its seconds and output; raises on failure."""
        path = self.logs / f"{name.replace(' ', '-')}.log"
        self.log(f"$ {shown or shlex.join(args)}")
        start = time.monotonic()
        with open(path, "w") as out:
            try:
                done = subprocess.run(
                    args, cwd=cwd or REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
                )
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = f"timeout after {timeout:.0f} s"
        seconds = time.monotonic() - start
        output = path.read_text()
        if self.args.verbose or code:
            print(textwrap.indent("\n".join(output.splitlines()[-60:]), "    "), flush=True)
        if code:
            raise CheckFailed(f"{name} failed ({code}); its log: {path}")
        return seconds, output

    def run(self) -> None:
        install_packages(self.log)
        self.start_node()
        self.write_config()
        self.up_started = True
        seconds, output = self.step(
            "ray up", [self.bin("ray"), "up", "-y", "--no-config-cache", str(self.config_path)], 1200
        )
        self.figures.append(("ray up", f"{seconds:.1f} s: {up_stages(output)}"))
        self.look_at_the_node()
        self.run_and_sweep()

    def bin(self, name: str) -> str:
        return str(Path(sys.executable).parent / name)

    def start_node(self) -> None:
        """The node's home, the user's package, an empty data folder and driver folder; sshd."""
        prepare_node_home(self.home, self.node_tmp)
        write_plugin(self.root / "plugin")
        (self.root / "data").mkdir()
        # drivers start in an empty folder: Ray puts a driver's working directory on its workers' sys.path, which on
        # one machine would hand the workers this checkout and the plugin's folder without any runtime environment
        self.driver_dir.mkdir()
        self.sshd = Sshd(self.root, self.home, self.ports["ssh"], self.user)
        self.sshd.start()
        node_home = self.sshd.ssh("echo $HOME")
        if node_home != str(self.home):
            raise CheckFailed(f"the node's HOME is {node_home}, not {self.home}: sshd's SetEnv did not apply")
        self.log(f"sshd on {HEAD_IP}:{self.ports['ssh']} (pid {self.sshd.process.pid}); the node's home: {self.home}")

    def write_config(self) -> None:
        config = local_config(
            yaml.safe_load(CLUSTER_YAML.read_text()),
            cluster_name=self.name,
            user=self.user,
            private_key=str(self.sshd.key),
            ssh_port=self.ports["ssh"],
            ports=self.ports,
            token=str(self.token),
            data=str(self.root / "data"),
            site_packages=sysconfig.get_paths()["purelib"],
        )
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False, width=200))
        self.log(f"config: {self.config_path} (cluster.yaml with the local provider; GCS at {self.address})")

    def look_at_the_node(self) -> None:
        """What the head's shell finds (ray exec), and what a Ray worker runs and imports (a task)."""
        where = "type -P python3 ray fedsim; python3 -c 'import fedsim, ray; print(fedsim.__file__, ray.__version__)'"
        _, output = self.step("node", [self.bin("ray"), "exec", str(self.config_path), where], 120)
        found = [line.strip() for line in output.splitlines() if line.strip().startswith(str(self.home))]
        self.figures.append(("the head's shell (ray exec)", "; ".join(found[-4:]) or "?"))
        probe = PROBE.replace("ADDRESS", repr(self.address)).replace("PLUGIN", repr(PLUGIN_PACKAGE))
        shown = f"{sys.executable} -c PROBE  # one task on a Ray worker: its Python, fedsim, the plugin"
        _, output = self.step("workers", [sys.executable, "-c", probe], 180, cwd=self.driver_dir, shown=shown)
        found = json.loads(next(line for line in output.splitlines() if line.startswith("probe:")).split(":", 1)[1])
        self.figures.append(("a Ray worker's Python", found["python"]))
        self.figures.append(("a Ray worker's fedsim", found["fedsim"]))
        importable = "importable" if found["plugin importable"] else "not importable"
        self.figures.append(("the plugin, without runtime env", importable))
        self.figures.append(("the nodes' addresses", ", ".join(found["node addresses"])))
        if found["node addresses"] != [HEAD_IP] or not found["fedsim"].startswith(str(self.home / "fedsim")):
            raise CheckFailed(f"the workers should run on {HEAD_IP} with the node's fedsim: {found}")
        if found["plugin importable"]:
            raise CheckFailed("the workers import the plugin without a runtime environment: the check proves nothing")

    def run_and_sweep(self) -> None:
        method, fedsim = self.args.method, self.bin("fedsim")
        common = ["--address", self.address, *TOY, "--set", f"data.cache_dir={self.root / 'cache'}"]
        run_dir = self.root / "runs" / "run"
        args = [fedsim, "run", "--method", method, *common, "--out", str(run_dir), "-q"]
        seconds, _ = self.step("fedsim run", args, 900, cwd=self.driver_dir)
        accuracy = json.loads((run_dir / "summary.json").read_text())["target_accuracy"]
        self.figures.append(("fedsim run", f"{seconds:.1f} s; {method}: target accuracy {accuracy:.3f} (usps)"))

        sweep_dir = self.root / "runs" / "sweep"
        methods = f"fedavg,{method}" if method != "fedavg" else "fedavg,fedprox"
        args = [fedsim, "sweep", "--methods", methods, "--seeds", "0", *common, "--out", str(sweep_dir), "-q"]
        seconds, _ = self.step("fedsim sweep", args, 1200, cwd=self.driver_dir)
        with open(sweep_dir / "results.csv") as f:
            rows = list(csv.DictReader(f))
        trials = ", ".join(f"{r['method']} {float(r['target_accuracy'] or 'nan'):.3f} ({r['status']})" for r in rows)
        self.figures.append(("fedsim sweep", f"{seconds:.1f} s; {len(rows)} trials, target accuracy: {trials}"))
        if len(rows) != 2 or any(r["status"] != "finished" for r in rows):
            raise CheckFailed(f"the sweep should have finished 2 trials: {trials}")
        shipped = sorted(self.node_tmp.glob(f"ray/session_2*/runtime_resources/*/*/{PLUGIN_PACKAGE}"))
        where = ", ".join(str(path.relative_to(self.node_tmp)) for path in shipped) or "nowhere"
        self.figures.append(("the plugin on the node", where))

    def cleanup(self) -> list[str]:
        """ray down, the node's leftover Ray processes, sshd; returns what went wrong."""
        problems = []
        sessions = recorded(self.home / ".ray-sessions")  # ray down forgets them
        if self.up_started:
            try:
                seconds, _ = self.step("ray down", [self.bin("ray"), "down", "-y", str(self.config_path)], 300)
                self.figures.append(("ray down", f"{seconds:.1f} s"))
            except CheckFailed as exc:
                problems.append(str(exc))
        left = stop_sessions(sessions)[0]  # whatever ray down left running
        if left:
            problems.append(f"ray down left {left} Ray processes of the node running; stopped now")
        if self.sshd is not None:
            self.sshd.stop()
        control = Path("/tmp") / f"ray_ssh_{_sha(self.user)}" / _sha(self.name)  # Ray's SSH control sockets
        shutil.rmtree(control, ignore_errors=True)
        try:
            control.parent.rmdir()  # Ray's folder of this user's control sockets, when no other cluster uses it
        except OSError:
            pass
        return problems


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:10]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m tools.cluster_check")
    parser.add_argument(
        "--method", default=PLUGIN_METHOD, help=f"the method of the run and the sweep ({PLUGIN_METHOD})"
    )
    parser.add_argument("--keep", action="store_true", help="keep the check's folder (config, logs, runs)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every step's output")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("cluster_check: run it as root (it installs packages and starts sshd)", file=sys.stderr)
        return 2

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    check = Check(args)
    check.log(f"fedsim cluster check in {check.root}")
    problems: list[str] = []
    started = time.monotonic()
    try:
        check.run()
    except (Exception, KeyboardInterrupt) as exc:
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        problems += check.cleanup()
    check.figures.append(("whole check", f"{time.monotonic() - started:.1f} s"))
    print(f"\nfigures (~ is the node's home, {check.home}; the plugin's path is under {check.node_tmp}):")
    for name, value in check.figures:
        print(f"  {name:<34} {value.replace(str(check.home), '~')}")
    if problems:
        print("\nFAILED:\n  " + "\n  ".join(problems) + f"\nlogs: {check.logs}")
        return 1
    if args.keep:
        print(f"\nkept: {check.root}")
    else:
        shutil.rmtree(check.root, ignore_errors=True)
    print("\nOK: ray up, a run and a sweep on the cluster, ray down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
