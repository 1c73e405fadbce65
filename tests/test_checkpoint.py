"""Checkpoint and resume: a run killed with SIGKILL continues to the same summary."""
import json
import pytest

from experiments.run import run_experiment
from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.runtime import LocalExecutor, Server, Simulator
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
    federation = build_federation(config.data)
    simulator = Simulator(config, Server(config, federation, LocalExecutor(config, federation)), partial)

    class Killed(Exception):
        pass

    original = simulator.server.run_round

    def run_round(rnd, evaluate):
        if rnd == 3:
            raise Killed
        return original(rnd, evaluate)

    simulator.server.run_round = run_round
    with pytest.raises(Killed):
        simulator.run()
    assert (partial / CHECKPOINT_FILE).exists() and not (partial / "summary.json").exists()
    resumed = run_experiment(config, partial, resume=load_checkpoint(partial))
    _same_summary(full.summary, resumed.summary)
    lines = [json.loads(line) for line in (partial / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [1, 2, 3, 4]


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
