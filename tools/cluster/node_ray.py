"""The ``ray`` command of a stand-in node that shares its host with other Ray clusters.

``tools/cluster_check.py`` installs this file as ``~/fedsim-venv/bin/ray`` on the node it emulates (a home folder of
its own, reached over SSH). Every subcommand is Ray's own command line, with two differences:

- ``ray start`` first appends its session id to ``~/.ray-sessions``: the processes it starts (GCS, raylet, dashboard,
  agents, workers) keep that session id, whatever title they give themselves;
- ``ray stop`` stops only the processes of the recorded sessions (SIGTERM, then SIGKILL after a grace period), where
  Ray's own ``ray stop`` would stop every Ray process of the host: other users' clusters and test runs included.

``python3 node_ray.py stop`` does the same stop without importing Ray (the node's plain ``python3`` has no Ray).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

GRACE_S = 16.0  # as Ray's own `ray stop`


def sessions_file() -> Path:
    return Path(os.path.expanduser("~/.ray-sessions"))


def session_of(pid: int) -> int | None:
    """The session id of process ``pid`` (field 6 of /proc/<pid>/stat), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
    state, session = fields[0], int(fields[3])
    return None if state == "Z" else session


def name_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return str(pid)


def members(sessions: set[int]) -> list[int]:
    """The live processes (zombies left out) whose session id is in ``sessions``, this process excepted."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and session_of(int(entry)) in sessions:
            pids.append(int(entry))
    return pids


def recorded(path: Path | None = None) -> set[int]:
    """The session ids that ``ray start`` recorded in ``path`` (``~/.ray-sessions``)."""
    path = path or sessions_file()
    return {int(line) for line in path.read_text().split()} if path.exists() else set()


def stop(path: Path | None = None, grace_s: float = GRACE_S) -> tuple[int, list[str]]:
    """``ray stop`` of the node: stops the recorded sessions (:func:`stop_sessions`), then forgets them."""
    path = path or sessions_file()
    result = stop_sessions(recorded(path), grace_s)
    path.unlink(missing_ok=True)  # the sessions are over: their ids may be reused
    return result


def stop_sessions(sessions: set[int], grace_s: float = GRACE_S) -> tuple[int, list[str]]:
    """Stop every process of ``sessions`` in the order of Ray's ``ray stop``: the raylet, then the other processes,
    then the GCS server, each group with SIGTERM and a third of ``grace_s`` before SIGKILL; then any process that
    started meanwhile. Returns how many processes there were, and the names of those that needed SIGKILL."""
    pids = members(sessions)
    first = [pid for pid in pids if name_of(pid) == "raylet"]
    last = [pid for pid in pids if name_of(pid) == "gcs_server"]
    stubborn = []
    for group in (first, [pid for pid in pids if pid not in first + last], last):
        stubborn += _terminate(group, sessions, grace_s / 3)
    late = members(sessions)
    stubborn += _terminate(late, sessions, grace_s / 3)
    return len(pids) + len(late), stubborn


def _terminate(pids: list[int], sessions: set[int], grace_s: float) -> list[str]:
    """SIGTERM to ``pids``, SIGKILL to those still in ``sessions`` after ``grace_s``; returns the latter's names."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(session_of(pid) in sessions for pid in pids):
        time.sleep(0.2)
    stubborn = []
    for pid in pids:
        if session_of(pid) in sessions:
            stubborn.append(name_of(pid))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return stubborn


def main(argv: list[str]) -> int:
    if argv[:1] == ["stop"]:
        count, stubborn = stop()
        killed = f"; after SIGKILL: {', '.join(stubborn)}" if stubborn else ""
        print(f"Stopped {count} processes of the Ray sessions started on this node{killed}.")
        return 0
    if argv[:1] == ["start"]:
        with sessions_file().open("a") as f:
            f.write(f"{os.getsid(0)}\n")
    from ray.scripts.scripts import main as ray_main

    sys.argv[0] = "ray"
    return ray_main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
