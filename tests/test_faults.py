"""Client actors that die mid-round are recreated and their work redone: same results as no failure."""

import json

from fedsim.api import run_experiment
from fedsim.config import load_config


def _without_wall(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "wall_seconds"}


def test_three_injected_actor_kills_give_the_same_summary(toy_overrides, ray_cluster, tmp_path):
    base = toy_overrides + ["run.rounds=4", "run.backend=ray", "method.name=fedprox", "ray.call_timeout_s=60"]
    calm = run_experiment(load_config(None, base), tmp_path / "calm")
    stormy = run_experiment(load_config(None, base + ["ray.inject_faults=3"]), tmp_path / "stormy")
    assert _without_wall(calm.summary) == _without_wall(stormy.summary)
    assert sum(m.get("actor_restarts", 0) for m in stormy.history) >= 2  # kills land on actors with work
    for name, value in calm.global_tensors.items():
        assert (value == stormy.global_tensors[name]).all()


def test_private_state_survives_an_actor_kill(toy_overrides, ray_cluster, tmp_path):
    extra = [
        "method.name=feddadil",
        "method.samples_per_atom=40",
        "method.batch_size=20",
        "method.classifier_steps=30",
        "run.rounds=3",
        "ray.call_timeout_s=60",
    ]
    calm = run_experiment(load_config(None, toy_overrides + extra), tmp_path / "calm")
    stormy = run_experiment(load_config(None, toy_overrides + extra + ["ray.inject_faults=2"]), tmp_path / "stormy")
    assert _without_wall(calm.summary) == _without_wall(stormy.summary)


def test_repeated_failures_drop_the_clients_and_are_recorded(toy_overrides, ray_cluster, tmp_path):
    config = load_config(None, toy_overrides + ["run.rounds=3", "ray.inject_faults=1", "ray.max_restarts=0"])
    result = run_experiment(config, tmp_path / "run")
    assert result.summary["rounds"] == 3
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    events = [e for m in lines for e in m.get("client_failures", [])]
    assert len(events) == 1 and events[0]["clients"]
