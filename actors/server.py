"""ServerActor: holds the method's global state and aggregates, next to the client actors."""
from __future__ import annotations

import logging

import torch

from actors.executor import ActorSpec, RayExecutor
from fedsim.runtime.server import Server


class ServerActor:
    def __init__(self, config, federation, client_actors: list, spec: ActorSpec):
        logging.basicConfig(level=logging.WARNING)
        torch.set_num_threads(1)
        executor = RayExecutor(
            client_actors, spec, max_restarts=config.resources.max_restarts, inject_faults=config.run.inject_faults,
            seed=config.run.seed, rounds=config.run.rounds, call_timeout=config.resources.call_timeout_s,
        )
        self.server = Server(config, federation, executor)

    def ready(self) -> bool:
        return True

    def run_round(self, rnd: int, evaluate: bool) -> dict:
        return self.server.run_round(rnd, evaluate)

    def global_tensors(self) -> dict:
        return self.server.global_tensors()

    def export_state(self) -> dict:
        return self.server.export_state()

    def restore_state(self, saved: dict) -> None:
        self.server.restore_state(saved)

    def export_client_states(self) -> dict:
        """Gathered for a checkpoint file: returned to the driver, not used by the server's method."""
        return self.server.export_client_states()

    def import_client_states(self, states: dict) -> None:
        self.server.import_client_states(states)

    def client_nodes(self) -> list[str]:
        import ray

        return ray.get([a.node_id.remote() for a in self.server.executor.actors])

    def restarts(self) -> int:
        return self.server.executor.restarts
