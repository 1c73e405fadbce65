"""Helpers for the benchmark scripts: resident memory of a process tree, machine description."""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time

import psutil


def tree_rss_bytes(root_pid: int | None = None) -> tuple[int, int]:
    """Resident memory (bytes) and process count of a process and all its descendants."""
    root = psutil.Process(root_pid or os.getpid())
    processes = [root] + root.children(recursive=True)
    total = 0
    for proc in processes:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total, len(processes)


def tree_pss_bytes(root_pid: int | None = None) -> int:
    """Proportional set size of a process tree: shared library pages divided among their users (the kernel's sums
    in /proc/<pid>/smaps_rollup, far cheaper to read than smaps)."""
    try:
        root = psutil.Process(root_pid or os.getpid())
        family = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in family:
        try:
            total += smaps_rollup(proc.pid)["pss"]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return total


def tree_breakdown(root_pid: int | None = None) -> list[tuple[str, int]]:
    """(short name, RSS bytes) of every process of the tree, largest first."""
    root = psutil.Process(root_pid or os.getpid())
    rows = []
    for proc in [root] + root.children(recursive=True):
        try:
            cmd = proc.cmdline()
            name = (
                proc.name()
                if proc.name().startswith("ray::")
                else os.path.basename(cmd[-1] if len(cmd) > 1 else cmd[0] if cmd else proc.name())
            )
            if proc.pid == root.pid:
                name = "driver"
            rows.append((name[:40], proc.memory_info().rss))
        except (psutil.NoSuchProcess, psutil.AccessDenied, IndexError):
            pass
    return sorted(rows, key=lambda r: -r[1])


#: (role, test on the command line) for Ray's own processes, in the order a table lists them
RAY_DAEMONS = (
    ("gcs_server", lambda cmd: "gcs_server" in cmd[0]),
    ("raylet", lambda cmd: cmd[0].endswith("raylet")),
    ("dashboard head (API server)", lambda cmd: any(c.endswith("dashboard/dashboard.py") for c in cmd)),
    ("dashboard agent", lambda cmd: any(c.endswith("dashboard/agent.py") for c in cmd)),
    ("runtime env agent", lambda cmd: any(c.endswith("runtime_env/agent/main.py") for c in cmd)),
    ("autoscaler monitor", lambda cmd: any(c.endswith("autoscaler/_private/monitor.py") for c in cmd)),
    ("log monitor", lambda cmd: any(c.endswith("log_monitor.py") for c in cmd)),
    ("process reaper", lambda cmd: any("ray_process_reaper" in c for c in cmd)),
    ("Ray client server", lambda cmd: "ray.util.client.server" in cmd),
)


def smaps_rollup(pid: int) -> dict[str, int]:
    """Rss, Pss and USS (Private_Clean + Private_Dirty) of one process in bytes, from /proc/<pid>/smaps_rollup."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                values[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return {
        "rss": values.get("Rss", 0),
        "pss": values.get("Pss", 0),
        "uss": values.get("Private_Clean", 0) + values.get("Private_Dirty", 0),
    }


def process_role(proc: psutil.Process, driver_pid: int) -> str:
    """What a process is in a Ray run: driver, an actor (by class), an idle worker, or one of Ray's daemons."""
    if proc.pid == driver_pid:
        return "driver"
    name = proc.name()
    cmd = proc.cmdline() or [name]
    title = cmd[0] if cmd else name
    if title.startswith("ray::"):
        role = title.split()[0][len("ray::") :].split(".")[0]
        return {"IDLE": "idle worker", "DashboardAgent": "dashboard agent", "RuntimeEnvAgent": "runtime env agent"}.get(
            role, f"actor {role}"
        )
    if any(c.endswith("default_worker.py") for c in cmd):
        return "worker (starting)"
    for role, matches in RAY_DAEMONS:
        if matches(cmd):
            return role
    return os.path.basename(title)[:40]


def cluster_pids(port: int) -> set[int]:
    """The processes of the Ray cluster whose GCS listens on ``port`` (started by ``ray start``, so not this
    process's children): those naming the port on their command line, and all their descendants."""
    roots = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or []) + " "
        if f":{port} " in cmd or f"port={port} " in cmd:
            roots.add(proc.pid)
    pids = set(roots)
    for pid in roots:
        try:
            pids |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return pids


def stop_cluster(port: int, timeout: float = 10.0) -> None:
    """Stop the cluster on ``port`` by the ids of its processes (``ray stop`` would stop every Ray on the machine)."""
    procs = [psutil.Process(pid) for pid in cluster_pids(port) if psutil.pid_exists(pid)]
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        proc.kill()


def process_table(driver_pid: int | None = None, cluster_port: int = 0) -> list[dict]:
    """One row per process of the driver's tree (and of the cluster on ``cluster_port``, when one is given):
    role, USS/PSS/RSS bytes, seconds after the driver started (negative: before it), CPU seconds so far."""
    driver = psutil.Process(driver_pid or os.getpid())
    procs = {p.pid: p for p in [driver] + driver.children(recursive=True)}
    if cluster_port:
        procs.update(
            {pid: psutil.Process(pid) for pid in cluster_pids(cluster_port) - set(procs) if psutil.pid_exists(pid)}
        )
    rows = []
    for proc in procs.values():
        try:
            cpu = proc.cpu_times()
            rows.append(
                {
                    "pid": proc.pid,
                    "role": process_role(proc, driver.pid),
                    **smaps_rollup(proc.pid),
                    "started_s": proc.create_time() - driver.create_time(),
                    "cpu_s": cpu.user + cpu.system,
                }
            )
        except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError, ProcessLookupError):
            pass
    return sorted(rows, key=lambda r: r["started_s"])


def median_runs(runs: list[dict]) -> dict:
    """The median of every number over repeated runs of one way (process rows matched by role and order)."""
    out = dict(runs[-1])
    for key, value in runs[-1].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    out["marks"] = {k: statistics.median(r["marks"][k] for r in runs) for k in runs[-1].get("marks", {})}
    if "table" in out:
        out["table"] = median_table([r["table"] for r in runs])
    return out


def median_table(tables: list[list[dict]]) -> list[dict]:
    keyed: dict = {}
    for table in tables:
        seen: dict = {}
        for row in table:
            seen[row["role"]] = seen.get(row["role"], 0) + 1
            keyed.setdefault((row["role"], seen[row["role"]]), []).append(row)
    return sorted(
        (
            {
                **rows[0],
                **{k: statistics.median(r[k] for r in rows) for k in ("uss", "pss", "rss", "started_s", "cpu_s")},
            }
            for rows in keyed.values()
        ),
        key=lambda r: r["started_s"],
    )


def ray_processes_rss() -> tuple[int, int]:
    """Resident memory of every Ray process on this machine (raylet, GCS, workers) plus this driver."""
    total, count = tree_rss_bytes()
    seen = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        if proc.pid in seen:
            continue
        cmd = " ".join(proc.info.get("cmdline") or [])
        if (
            "ray::" in (proc.info.get("name") or "")
            or "ray/core/src" in cmd
            or "raylet" in cmd
            or "gcs_server" in cmd
            or "default_worker.py" in cmd
        ):
            try:
                total += proc.memory_info().rss
                count += 1
            except psutil.NoSuchProcess:
                pass
    return total, count


def plasma_mib() -> float:
    """Object-store (plasma) memory in use on the connected Ray cluster, in MiB."""
    import re

    import ray
    from ray._private.internal_api import memory_summary  # the store's own figure; no public API gives it

    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    match = re.search(r"Plasma memory usage (\d+) MiB", text)
    return float(match.group(1)) if match else 0.0


def machine() -> str:
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{platform.machine()}, {psutil.cpu_count()} cores, {memory:.0f} GiB, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


class PeakPss:
    """The largest PSS of the process trees rooted at ``pids``, sampled every ``interval`` s in a thread until
    :meth:`stop` (which returns it)."""

    def __init__(self, pids: tuple[int, ...], interval: float = 0.25):
        self.pids, self.interval, self.peak = pids, interval, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, sum(tree_pss_bytes(pid) for pid in self.pids))
            self._done.wait(self.interval)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


class PeakMemory:
    """Samples the resident memory of this process tree (driver + Ray) in the background."""

    def __init__(self, interval: float = 0.25):
        self.interval = interval
        self.peak = 0
        self.processes = 0
        self.breakdown: list[tuple[str, int]] = []  # (process, RSS) at the peak
        self._stop = threading.Event()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            rss, count = tree_rss_bytes()
            if rss > self.peak:
                self.peak, self.processes = rss, count
                self.breakdown = tree_breakdown()
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
