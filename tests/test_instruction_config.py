"""The settings of the local update travel in the round's instruction, as Flower's fit config does."""

import numpy as np
import pytest

from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.methods.base import client_operation
from fedsim.methods.fedavg import FedAvg
from fedsim.registry import METHODS
from fedsim.runtime import LocalExecutor, Server

RECEIVED: list[tuple[int, dict]] = []  # (client id, instruction config) of every fit, in the order they ran


class RecordingFedAvg(FedAvg):
    """FedAvg whose client half records the config of every fit instruction it receives."""

    @client_operation
    def fit(self, instruction, state, data):
        RECEIVED.append((data.client_id, dict(instruction.config)))
        return super().fit(instruction, state, data)


class NoLocalEpochsInRoundTwo(RecordingFedAvg):
    """Varies a setting by round on the server half alone: round 2 sends zero local epochs."""

    def client_settings(self, rnd):
        return {**super().client_settings(rnd), "local_epochs": 0 if rnd == 2 else 3}


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


def test_local_epochs_of_the_config_arrive_in_the_instruction(register, toy_overrides):
    register("recording_fedavg", RecordingFedAvg)
    server, federation = _server(toy_overrides + ["method.local_epochs=3"], "recording_fedavg")
    server.run_round(1, evaluate=False)
    assert sorted(cid for cid, _ in RECEIVED) == sorted(federation.source_ids)
    for _, config in RECEIVED:
        assert config["local_epochs"] == 3 and config["batch_size"] == 16 and config["lr"] == pytest.approx(0.05)
        assert {"seed", "round", "momentum", "weight_decay"} <= set(config)


def test_the_client_trains_with_what_the_instruction_says(register, toy_overrides):
    register("no_epochs_in_round_two", NoLocalEpochsInRoundTwo)
    server, _ = _server(toy_overrides + ["method.local_epochs=1"], "no_epochs_in_round_two")
    server.run_round(1, evaluate=False)
    after_one = {k: v.copy() for k, v in server.state["weights"].items()}
    assert {config["local_epochs"] for _, config in RECEIVED} == {3}
    server.run_round(2, evaluate=False)
    assert {config["local_epochs"] for _, config in RECEIVED[-len(RECEIVED) // 2 :]} == {0}
    for key, value in server.state["weights"].items():  # zero epochs: every client returns the global weights
        np.testing.assert_allclose(value, after_one[key], rtol=1e-6, atol=1e-7)
