"""A run's own Ray cluster dies with the run, even when the run is killed with SIGKILL (fedsim.actors.reaper)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from fedsim.actors.reaper import OWNER_ENV, Watchdog
from fedsim.runtime.checkpoint import CHECKPOINT_FILE


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.Error:
            pass
    return alive


def _wait_gone(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    deadline = time.time() + seconds
    while _alive(processes) and time.time() < deadline:
        time.sleep(0.2)
    return _alive(processes)


def test_the_watchdog_kills_the_marked_processes_of_a_killed_driver_and_no_other(tmp_path):
    pids = tmp_path / "pids"
    driver_code = textwrap.dedent(
        f"""
        import subprocess, time
        from fedsim.actors.reaper import Watchdog
        Watchdog().start()  # marks this process's environment: the child below inherits the mark
        child = subprocess.Popen(["sleep", "120"])
        open({str(pids)!r}, "w").write(str(child.pid))
        time.sleep(120)
        """
    )
    driver = subprocess.Popen([sys.executable, "-c", driver_code])
    bystander = subprocess.Popen(["sleep", "120"], env={**os.environ, OWNER_ENV: "another-run"})
    unmarked = subprocess.Popen(["sleep", "120"], env={k: v for k, v in os.environ.items() if k != OWNER_ENV})
    try:
        deadline = time.time() + 60
        while not (pids.exists() and pids.read_text()) and time.time() < deadline:
            time.sleep(0.05)
        child = psutil.Process(int(pids.read_text()))
        assert child.environ()[OWNER_ENV].startswith(f"{driver.pid}-")
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert not _wait_gone([child], 30), "the killed driver's marked child outlived it"
        assert bystander.poll() is None and unmarked.poll() is None, "a process outside the run's cluster was killed"
    finally:
        for process in (driver, bystander, unmarked):
            process.kill()
            process.wait()


def test_a_run_that_shuts_down_itself_stops_its_watchdog_and_drops_the_mark(monkeypatch):
    monkeypatch.delenv(OWNER_ENV, raising=False)
    watchdog = Watchdog()
    watchdog.start()
    process = watchdog._process
    assert os.environ[OWNER_ENV] == watchdog.token and process.poll() is None
    watchdog.stop()
    assert OWNER_ENV not in os.environ
    assert process.poll() is not None, "the watchdog still runs after the run shut its cluster down"


def test_sigkilled_ray_driver_leaves_no_ray_process_and_resumes(toy_overrides, tmp_path):
    """``fedsim run`` on its own Ray cluster, killed with SIGKILL after a checkpoint (as the OOM killer does): every
    process the run started (raylet, GCS, DashboardAgent, RuntimeEnvAgent, workers) is gone; ``--resume`` finishes
    and leaves nothing either."""
    flags = []
    for item in toy_overrides + ["run.rounds=60", "run.checkpoint_every=2", "run.progress=false"]:
        flags += ["--set", item]
    out = tmp_path / "run"
    command = [sys.executable, "-m", "fedsim.experiments.cli", "run", "-q", "--backend", "ray"]
    victim = subprocess.Popen(command + ["--out", str(out)] + flags, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and not (out / CHECKPOINT_FILE).exists() and victim.poll() is None:
        time.sleep(0.05)
    assert victim.poll() is None, victim.stderr.read().decode()
    started = psutil.Process(victim.pid).children(recursive=True)
    names = " ".join(p.name() for p in started)
    assert "raylet" in names and "gcs_server" in names, names
    agents = [p for p in started if "Agent" in " ".join(p.cmdline())]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    if (out / "summary.json").exists():
        pytest.skip("the run finished before the kill landed (machine too fast for this timing)")
    left = _wait_gone(started, 60)
    assert not left, f"processes of the killed run still alive: {[(p.pid, p.name()) for p in left]}"
    assert agents, "Ray's agents were among the run's processes"

    resumed = subprocess.Popen(command + ["--resume", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: list[psutil.Process] = []
    while resumed.poll() is None:
        try:
            seen += [p for p in psutil.Process(resumed.pid).children(recursive=True) if p not in seen]
        except psutil.Error:
            pass
        time.sleep(0.2)
    assert resumed.returncode == 0, resumed.stderr.read().decode()
    assert (out / "summary.json").exists()
    left = _wait_gone(seen, 30)
    assert not left, f"processes of the resumed run still alive: {[(p.pid, p.name()) for p in left]}"
