"""Helpers for the benchmark scripts: resident memory of a process tree, machine description."""
from __future__ import annotations

import os
import platform
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
    """Proportional set size of a process tree: shared library pages divided among their users."""
    root = psutil.Process(root_pid or os.getpid())
    total = 0
    for proc in [root] + root.children(recursive=True):
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            pass
    return total


def tree_breakdown(root_pid: int | None = None) -> list[tuple[str, int]]:
    """(short name, RSS bytes) of every process of the tree, largest first."""
    root = psutil.Process(root_pid or os.getpid())
    rows = []
    for proc in [root] + root.children(recursive=True):
        try:
            cmd = proc.cmdline()
            name = proc.name() if proc.name().startswith("ray::") else os.path.basename(cmd[-1] if len(cmd) > 1 else cmd[0] if cmd else proc.name())
            if proc.pid == root.pid:
                name = "driver"
            rows.append((name[:40], proc.memory_info().rss))
        except (psutil.NoSuchProcess, psutil.AccessDenied, IndexError):
            pass
    return sorted(rows, key=lambda r: -r[1])


def ray_processes_rss() -> tuple[int, int]:
    """Resident memory of every Ray process on this machine (raylet, GCS, workers) plus this driver."""
    total, count = tree_rss_bytes()
    seen = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        if proc.pid in seen:
            continue
        cmd = " ".join(proc.info.get("cmdline") or [])
        if "ray::" in (proc.info.get("name") or "") or "ray/core/src" in cmd or "raylet" in cmd or "gcs_server" in cmd or "default_worker.py" in cmd:
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
    return f"{platform.machine()}, {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


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
