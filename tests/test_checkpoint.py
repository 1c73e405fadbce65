"""Checkpoint and resume: a run killed with SIGKILL continues to the same summary."""

import json

import pytest
from conftest import run_until

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.errors import UserError
from fedsim.runtime.checkpoint import CHECKPOINT_FILE, load_checkpoint


def _same_summary(a: dict, b: dict) -> None:
    a, b = dict(a), dict(b)
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b


@pytest.mark.parametrize("method", ["fedavg", "feddadil"])
def test_resume_from_checkpoint_equals_uninterrupted_run(toy_overrides, tmp_path, method):
    extra = [f"method.name={method}", "run.rounds=4", "run.checkpoint_every=2", "run.backend=local"]
    if method == "feddadil":
        extra += ["method.samples_per_atom=40", "method.batch_size=20", "method.classifier_steps=30"]
    config = load_config(None, toy_overrides + extra)
    full = run_experiment(config, tmp_path / "full")
    # a run that stops after its round-2 checkpoint (as if killed), then resumes
    partial = tmp_path / "partial"
    run_until(config, partial, 3)
    assert (partial / CHECKPOINT_FILE).exists() and not (partial / "summary.json").exists()
    resumed = run_experiment(config, partial, resume=load_checkpoint(partial))
    _same_summary(full.summary, resumed.summary)
    lines = [json.loads(line) for line in (partial / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [1, 2, 3, 4]
    if method == "fedavg":  # seconds apart: evaluation (every round here), the checkpoint in the round it follows
        full_lines = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
        assert [sorted(k for k in m if k.endswith("_seconds")) for m in full_lines] == [
            ["eval_seconds", "round_seconds"],
            ["checkpoint_seconds", "eval_seconds", "round_seconds"],
            ["eval_seconds", "round_seconds"],
            ["eval_seconds", "round_seconds"],
        ]
        assert all(m[k] >= 0 for m in full_lines for k in m if k.endswith("_seconds"))


def test_resume_errors(tmp_path):
    with pytest.raises(UserError, match="no such run directory"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no checkpoint.pkl"):
        load_checkpoint(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / CHECKPOINT_FILE).write_bytes(b"not a pickle")
    with pytest.raises(UserError, match="unreadable"):
        load_checkpoint(tmp_path / "bad")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "summary.json").write_text("{}")
    with pytest.raises(UserError, match="already finished"):
        load_checkpoint(tmp_path / "done")


def test_sigkill_midway_then_resume_gives_the_same_summary(toy_overrides, tmp_path):
    """A real process killed with SIGKILL after a checkpoint, continued with `fedsim run --resume`."""
    import os
    import signal
    import subprocess
    import sys
    import time

    flags = []
    for item in toy_overrides + [
        "run.rounds=300",
        "run.checkpoint_every=3",
        "run.progress=false",
        "run.tensorboard=false",
    ]:
        flags += ["--set", item]
    command = [sys.executable, "-m", "fedsim.experiments.cli", "run", "-q", "--backend", "local"]
    reference = subprocess.run(
        command + ["--out", str(tmp_path / "reference")] + flags, capture_output=True, text=True, timeout=300
    )
    assert reference.returncode == 0, reference.stderr
    victim_dir = tmp_path / "victim"
    victim = subprocess.Popen(
        command + ["--out", str(victim_dir)] + flags, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 240
    while time.time() < deadline and not (victim_dir / CHECKPOINT_FILE).exists():
        time.sleep(0.01)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert (victim_dir / CHECKPOINT_FILE).exists(), "the run wrote a checkpoint before it was killed"
    if (victim_dir / "summary.json").exists():
        pytest.skip("the run finished before the kill landed (machine too fast for this timing)")
    resumed = subprocess.run(command + ["--resume", str(victim_dir)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    _same_summary(
        json.loads((tmp_path / "reference" / "summary.json").read_text()),
        json.loads((victim_dir / "summary.json").read_text()),
    )


def test_resume_refuses_other_flags(tmp_path, capsys):
    from fedsim.experiments.cli import main

    assert main(["run", "--resume", str(tmp_path), "--rounds", "5"]) == 2
    assert "drop --rounds" in capsys.readouterr().err
