"""ServerActor: holds the method's global state and aggregates, next to the client actors."""
from __future__ import annotations

import logging

import torch

from actors.executor import RayExecutor
from fedsim.runtime.server import Server


class ServerActor:
    def __init__(self, config, federation, client_actors: list, assignment: dict[int, int]):
        logging.basicConfig(level=logging.WARNING)
        torch.set_num_threads(1)
        self.server = Server(config, federation, RayExecutor(client_actors, assignment))

    def run_round(self, rnd: int, evaluate: bool) -> dict:
        return self.server.run_round(rnd, evaluate)

    def global_tensors(self) -> dict:
        return self.server.global_tensors()

    def export_state(self) -> dict:
        return self.server.export_state()

    def restore_state(self, saved: dict) -> None:
        self.server.restore_state(saved)
