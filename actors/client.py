"""ClientActor: a long-lived Ray actor hosting one or more clients.

It builds its clients' data itself from (benchmark config, client id), keeps
their private state across rounds, and returns only Replies: raw inputs,
labels and private state never leave it.
"""

from __future__ import annotations

import logging

from fedsim.messages import Instruction, Reply


class ClientActor:
    """torch, the method's client half and the data load here, in the actor, never in a process that only
    refers to the class (the server actor holds the executor that creates these actors)."""

    def __init__(self, config, federation, client_ids: list[int], device: str):
        import torch

        from fedsim.runtime.client_host import ClientHost, threads_for

        logging.basicConfig(level=logging.WARNING)
        torch.set_num_threads(threads_for(config.resources.cpus_per_client))
        self.host = ClientHost(config, federation, client_ids, device=device)

    def ready(self) -> list[int]:
        return self.host.client_ids

    def initial_server_state(self) -> dict:
        """The method's ``init_server()`` state, built here for a server half that needs no torch (the seeded
        initial model: the same on every backend, as a server would build it, on CPU)."""
        from fedsim.registry import METHODS

        config, federation = self.host.config, self.host.federation
        return METHODS.get(config.method.name)(config, federation, device="cpu").init_server()

    def execute(self, batch: list[tuple[int, str, int, dict]], *payloads) -> tuple[list[Reply], dict]:
        """Run a batch of (client_id, operation, payload index, per-client config).

        ``payloads`` are the round's shared tensor dicts, passed as top-level
        ObjectRefs so Ray resolves each one once per actor (zero-copy numpy).
        Returns the replies and, as a second object kept in the object store for
        recovery, the batch clients' private states after the call.
        """
        replies = []
        for client_id, operation, payload_index, config in batch:
            instruction = Instruction(operation, payloads[payload_index], config)
            replies.append(self.host.execute(client_id, instruction))
        worked = {item[0] for item in batch}
        states = {cid: st for cid, st in self.host.export_states().items() if cid in worked}
        return replies, states

    def import_state_objects(self, client_ids: list[int], *state_dicts) -> None:
        """Restore from the state objects of earlier calls (oldest first; later ones win)."""
        for states in state_dicts:
            self.host.import_states({cid: st for cid, st in states.items() if cid in client_ids})

    def export_states(self) -> dict:
        return self.host.export_states()

    def import_states(self, states: dict) -> None:
        self.host.import_states(states)

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()
