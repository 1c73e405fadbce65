"""The processes of a Ray cluster that a run started die with the run, even when the run is killed.

``ray.shutdown()`` stops a local cluster when the driver ends normally. A driver killed with SIGKILL (the kernel's
OOM killer, ``kill -9``) runs no shutdown: the raylet and the GCS notice and exit, but Ray's DashboardAgent and
RuntimeEnvAgent, reparented to init, keep running and ignore SIGTERM. So before a run starts its own cluster it
marks its environment with a token that the processes of the cluster inherit (:data:`OWNER_ENV`), and starts a
small watchdog process (``python -m fedsim.actors.reaper``, detached so that a signal to the run's
process group spares it) that records the driver's descendants while the driver lives (Ray's agents get an
environment of their own, without the token, but they are the raylet's children) and waits for the driver to end.
When it does, the watchdog gives a normal shutdown a few seconds and then SIGKILLs every recorded descendant still
running and every process carrying the token, and only those: a cluster another run or the user started is neither.
A run that shuts its cluster down itself stops its watchdog (:meth:`Watchdog.stop`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
import time

import psutil

log = logging.getLogger(__name__)

#: the environment variable that marks every process of a cluster a run started (inherited from the driver)
OWNER_ENV = "FEDSIM_CLUSTER_OWNER"
#: seconds between two checks of whether the driver is alive
POLL_SECONDS = 0.5
#: seconds a driver that ended gets for its own shutdown before the watchdog kills what is left
GRACE_SECONDS = 3.0


def marked_processes(token: str) -> list[psutil.Process]:
    """The processes of this user whose environment carries ``token`` under :data:`OWNER_ENV` (this one excluded)."""
    found = []
    for process in psutil.process_iter(["pid"]):
        if process.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):  # gone meanwhile, or another user's process
            if process.environ().get(OWNER_ENV) == token:
                found.append(process)
    return found


def kill_marked(token: str, recorded: dict[int, psutil.Process] | None = None) -> int:
    """SIGKILL every process marked with ``token`` and every ``recorded`` one still running (psutil checks that a pid
    was not reused); the number killed."""
    processes = {p.pid: p for p in (recorded or {}).values() if _running(p)}
    processes.update({p.pid: p for p in marked_processes(token)})
    processes.pop(os.getpid(), None)
    processes = list(processes.values())
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=5)
    return len(processes)


class Watchdog:
    """The watchdog of one cluster start: :meth:`start` marks this process's environment (before ``ray.init``, so
    that every process of the cluster inherits the mark) and starts the watchdog; :meth:`stop` ends it once the
    run has shut its cluster down itself."""

    def __init__(self):
        self.token = f"{os.getpid()}-{secrets.token_hex(8)}"
        self._process: subprocess.Popen | None = None

    def start(self) -> None:
        os.environ[OWNER_ENV] = self.token
        driver = psutil.Process()
        command = [
            sys.executable,
            "-m",
            "fedsim.actors.reaper",
            str(driver.pid),
            repr(driver.create_time()),
            self.token,
        ]
        environment = {k: v for k, v in os.environ.items() if k != OWNER_ENV}  # the watchdog spares itself anyway
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=environment,
        )

    def stop(self) -> None:
        """End the watchdog (the cluster is down) and drop the mark, so a later cluster of this process gets its own."""
        if os.environ.get(OWNER_ENV) == self.token:
            del os.environ[OWNER_ENV]
        if self._process is not None:
            with contextlib.suppress(OSError):
                self._process.kill()
                self._process.wait(timeout=5)
            self._process = None


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def driver_alive(pid: int, create_time: float) -> bool:
    """Whether the process ``pid`` that started at ``create_time`` still runs (a reused pid is another process)."""
    try:
        process = psutil.Process(pid)
        return process.create_time() == create_time and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch(pid: int, create_time: float, token: str) -> int:
    """Record the driver's descendants while it lives; once it ended, give its shutdown :data:`GRACE_SECONDS` and
    kill what is left of its cluster."""
    recorded: dict[int, psutil.Process] = {}
    while driver_alive(pid, create_time):
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pid).children(recursive=True):
                recorded.setdefault(child.pid, child)
        time.sleep(POLL_SECONDS)
    time.sleep(GRACE_SECONDS)
    return kill_marked(token, recorded)


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
