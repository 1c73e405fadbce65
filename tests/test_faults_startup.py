"""Actor deaths at every phase of a Ray run, start-up included: the undisturbed run's summary, or one clear line.

Client actors are killed with the ``FEDSIM_TEST_KILL`` hook (``fedsim.actors.client``): the first client actor to reach
a named phase exits at once, once per phase (a marker file records it), so every kill lands where it is meant to.
"""

import json
import re

import pytest

from fedsim.actors.client import KILL_ENV, KILL_PHASES
from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.errors import UserError
from fedsim.experiments.cli import main
from fedsim.runtime.callbacks import Callback

#: fedavg takes its initial model from client actor 0 (the hand-off); federated standardization is the setup
#: stage; a checkpoint after round 1; evaluation in round 2
EXTRA = [
    "run.backend=ray",
    "method.name=fedavg",
    "data.normalization=federated",
    "run.checkpoint_every=1",
    "ray.call_timeout_s=60",
]


def _summary(out_dir) -> dict:
    summary = json.loads((out_dir / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k != "wall_seconds"}


@pytest.fixture(scope="module")
def calm(toy_overrides, ray_cluster, tmp_path_factory):
    """The undisturbed run's directory."""
    out = tmp_path_factory.mktemp("calm") / "run"
    run_experiment(load_config(None, toy_overrides + EXTRA), out)
    return out


def test_a_client_actor_killed_at_every_phase_gives_the_undisturbed_summary(toy_overrides, calm, tmp_path, monkeypatch):
    """One kill per phase (constructor, data build, initial-model hand-off, setup stage, round, evaluation,
    checkpoint), all in one run: each is recovered, and the run ends with the undisturbed run's summary.json."""
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv(KILL_ENV, f"{','.join(KILL_PHASES)}@{markers}")
    result = run_experiment(load_config(None, toy_overrides + EXTRA), tmp_path / "run")
    assert sorted(p.name for p in markers.iterdir()) == sorted(KILL_PHASES)  # every phase killed an actor
    assert sum(m.get("actor_restarts", 0) for m in result.history) == len(KILL_PHASES)  # one recreation each
    assert _summary(tmp_path / "run") == _summary(calm)


def test_a_client_actor_that_keeps_dying_at_start_up_is_one_line_and_exit_code_2(
    toy_overrides, ray_cluster, tmp_path, monkeypatch, capsys
):
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv(KILL_ENV, f"handoff@{markers}")
    settings = toy_overrides + EXTRA + ["ray.max_restarts=0", "ray.max_actors=1"]
    out = tmp_path / "run"
    assert main(["run", "-q", "--out", str(out)] + [f for item in settings for f in ("--set", item)]) == 2
    lines = capsys.readouterr().err.splitlines()  # the actors' log lines reach stderr too, through Ray
    [line] = [line for line in lines if line.startswith("fedsim")]
    assert re.fullmatch(
        r"fedsim: error: client actor 0 \(clients \[0, 1, 2\]\) died once during the initial-model hand-off, past "
        r"ray.max_restarts=0 \(ActorDiedError: The actor died unexpectedly before finishing this task. "
        r"The actor is dead because its worker process has died. \(pid \d+\)\)",
        line,
    )
    assert not out.exists()  # start-up fails before the run directory is made


class KillServer(Callback):
    """Kills the server actor twice: as the run starts (after the setup stage, before round 1), and while the
    first checkpoint is written, once the server's part of it is exported (so that checkpoint is complete)."""

    def __init__(self):
        self.kills = 0

    def _kill(self) -> None:
        import ray

        ray.kill(self.simulator.server.actor)
        self.kills += 1

    def on_run_start(self, simulator):
        self.simulator = simulator
        self._kill()

    def state_dict(self) -> dict:
        if self.kills == 1:
            self._kill()
        return {}


def test_a_dead_server_actor_is_replaced_before_round_1_and_stops_the_run_with_one_line_after(
    toy_overrides, calm, tmp_path
):
    """Before round 1 a new server actor redoes the start-up and the setup stage; from round 1 on its death is
    one line, the run's last checkpoint is complete, and resuming from it gives the undisturbed run's summary."""
    from fedsim.runtime.checkpoint import load_checkpoint
    from fedsim.runtime.simulator import default_callbacks

    config = load_config(None, toy_overrides + EXTRA)
    out = tmp_path / "run"
    killer = KillServer()
    with pytest.raises(UserError) as caught:
        run_experiment(config, out, callbacks=default_callbacks(config, out) + [killer])
    assert killer.kills == 2
    assert str(caught.value).startswith("the server actor died during run_round (ActorDiedError: ")
    assert "\n" not in str(caught.value)
    assert not (out / "summary.json").exists()
    checkpoint = load_checkpoint(out)
    assert [m["round"] for m in checkpoint["history"]] == [1]
    run_experiment(config, out, resume=checkpoint)
    assert _summary(out) == _summary(calm)
