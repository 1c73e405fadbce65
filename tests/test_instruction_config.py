"""The round, the seed and the local update's settings travel as typed fields of every instruction, as Flower's
fit config does; a method's own per-operation values travel beside them."""

import dataclasses

import numpy as np
import pytest

from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.messages import Instruction, LocalSettings
from fedsim.methods.base import client_operation
from fedsim.methods.fedavg import FedAvg
from fedsim.registry import METHODS
from fedsim.runtime import LocalExecutor, Server
from fedsim.runtime.context import RoundContext
from fedsim.seeding import derive_seed

RECEIVED: list[tuple[int, Instruction]] = []  # (client id, instruction) of every fit, in the order they ran


class RecordingFedAvg(FedAvg):
    """FedAvg whose client half records every fit instruction it receives."""

    @client_operation
    def fit(self, instruction, state, data):
        RECEIVED.append((data.client_id, instruction))
        return super().fit(instruction, state, data)


class NoLocalEpochsInRoundTwo(RecordingFedAvg):
    """Varies a setting by round on the server half alone: round 2 sends zero local epochs."""

    def client_settings(self, rnd):
        return dataclasses.replace(super().client_settings(rnd), local_epochs=0 if rnd == 2 else 3)


@pytest.fixture
def register(monkeypatch):
    def register(name, cls):
        monkeypatch.setattr(cls, "registry_name", name)
        monkeypatch.setitem(METHODS._entries, name, cls)
        RECEIVED.clear()

    return register


def _server(overrides, name):
    config = load_config(None, overrides + [f"method.name={name}", "run.backend=local"])
    federation = build_federation(config.data)
    server = Server(config, federation, LocalExecutor(config, federation))
    server.setup(1)
    return server, federation


def test_the_settings_of_the_config_arrive_in_the_instruction(register, toy_overrides):
    register("recording_fedavg", RecordingFedAvg)
    server, federation = _server(toy_overrides + ["method.local_epochs=3"], "recording_fedavg")
    server.run_round(1, evaluate=False)
    assert sorted(cid for cid, _ in RECEIVED) == sorted(federation.source_ids)
    for cid, instruction in RECEIVED:
        assert instruction.local == LocalSettings(local_epochs=3, batch_size=16, lr=0.05, momentum=0.9, weight_decay=0)
        assert (instruction.round, instruction.seed) == (1, derive_seed(server.config.run.seed, 1, cid, "fit"))


def test_the_client_trains_with_what_the_instruction_says(register, toy_overrides):
    register("no_epochs_in_round_two", NoLocalEpochsInRoundTwo)
    server, _ = _server(toy_overrides + ["method.local_epochs=1"], "no_epochs_in_round_two")
    server.run_round(1, evaluate=False)
    after_one = {k: v.copy() for k, v in server.state["weights"].items()}
    assert {ins.local.local_epochs for _, ins in RECEIVED} == {3}
    server.run_round(2, evaluate=False)
    assert {ins.local.local_epochs for _, ins in RECEIVED[-len(RECEIVED) // 2 :]} == {0}
    for key, value in server.state["weights"].items():  # zero epochs: every client returns the global weights
        np.testing.assert_allclose(value, after_one[key], rtol=1e-6, atol=1e-7)


class _Capture:
    def run(self, instructions, rnd, replay=False):
        self.instructions = instructions
        return {}


def test_a_call_may_give_other_settings_another_seed_stream_and_values_per_client():
    capture, settings = _Capture(), LocalSettings(local_epochs=1, batch_size=8, lr=0.1, momentum=0.0, weight_decay=0)
    ctx = RoundContext(capture, 5, 2, settings)
    ctx.call("fit", None, [0, 1], lambda cid: {"slot": f"s{cid}"}, seed=lambda cid: ctx.seed(cid, "other"))
    assert [(i.seed, i.values, i.local) for i in capture.instructions.values()] == [
        (ctx.seed(0, "other"), {"slot": "s0"}, settings),
        (ctx.seed(1, "other"), {"slot": "s1"}, settings),
    ]
    longer = dataclasses.replace(settings, local_epochs=4)
    ctx.call("fit", None, [3], seed=11, local=longer)
    assert (capture.instructions[3].seed, capture.instructions[3].local, capture.instructions[3].round) == (
        11,
        longer,
        2,
    )


def test_an_array_never_travels_as_a_value():
    """Values are not counted on the wire: an array belongs in ``tensors``."""
    with pytest.raises(TypeError, match=r"\['alpha'\] are arrays"):
        Instruction("evaluate", values={"alpha": np.ones(3), "step": 1})
    assert Instruction("evaluate", values={"alpha": [1.0, 2.0]}).nbytes == 0


def test_a_backend_ships_an_instruction_without_its_tensors_and_puts_them_back():
    """What the Ray backend does: one shared payload, the rest of each instruction beside it."""
    payload = {"w": np.arange(4, dtype=np.float32)}
    instruction = Instruction("fit", payload, round=2, seed=9, values={"step": 1})
    header = dataclasses.replace(instruction, tensors={})
    assert header.nbytes == 0 and dataclasses.replace(header, tensors=payload) == instruction
