"""ClientActor: a long-lived Ray actor hosting one or more clients.

It builds its clients' data itself from (benchmark config, client id), keeps
their private state across rounds, and returns only Replies: raw inputs,
labels and private state never leave it.

Test hook (inert unless set): ``FEDSIM_TEST_KILL="<phase>[,<phase>...]@<marker dir>"`` in the driver's
environment makes the first client actor that reaches a named phase (``KILL_PHASES``) exit at once, as a
crash would. A marker file ``<marker dir>/<phase>`` records each kill, so every phase kills one actor once
and the actor that replaces it carries on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from fedsim.messages import Instruction, Reply

KILL_ENV = "FEDSIM_TEST_KILL"
#: where the hook can kill: constructor, first data build, initial-model hand-off, setup stage, round
#: operation, evaluation, checkpoint export
KILL_PHASES = ("create", "data", "handoff", "setup", "round", "evaluate", "checkpoint")


def die_at(kill: str, phase: str) -> None:
    """Exit this process when ``kill`` (the hook's value) names ``phase`` and no actor died there yet."""
    phases, _, marker_dir = kill.partition("@")
    if phase not in phases.split(","):
        return
    try:
        os.close(os.open(os.path.join(marker_dir, phase), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    logging.getLogger(__name__).warning("test hook %s: client actor exits at phase %r", KILL_ENV, phase)
    os._exit(1)


def phase_of(operation: str) -> str:
    """The hook's phase of a client operation."""
    from fedsim.runtime.client_host import HOST_OPERATIONS

    if operation in HOST_OPERATIONS:
        return "setup"
    return "evaluate" if operation == "evaluate" else "round"


class ClientActor:
    """torch, the method's client half and the data load here, in the actor, never in a process that only
    refers to the class (the server actor holds the executor that creates these actors)."""

    def __init__(self, config, federation, client_ids: list[int], device: str, kill: str = ""):
        """``kill``: the value of the ``FEDSIM_TEST_KILL`` hook ("" leaves it off)."""
        self.kill = kill
        if kill:
            die_at(kill, "create")
        import torch

        from fedsim.runtime.client_host import ClientHost, threads_for

        logging.basicConfig(level=logging.WARNING)
        torch.set_num_threads(threads_for(config.resources.cpus_per_client))
        self.host = ClientHost(config, federation, client_ids, device=device)
        self._built: set[int] = set()  # clients whose data this actor has built (for the hook's "data" phase)

    def ready(self) -> list[int]:
        return self.host.client_ids

    def initial_server_state(self) -> dict:
        """The method's ``init_server()`` state, built here for a server half that needs no torch (the seeded
        initial model: the same on every backend, as a server would build it, on CPU)."""
        from fedsim.registry import METHODS

        if self.kill:
            die_at(self.kill, "handoff")
        config, federation = self.host.config, self.host.federation
        return METHODS.get(config.method.name)(config, federation, device="cpu").init_server()

    def execute(self, batch: list[tuple[int, int, Instruction]], *payloads) -> tuple[list[Reply], dict]:
        """Run a batch of (client_id, payload index, the client's instruction without its tensors).

        ``payloads`` are the round's shared tensor dicts, passed as top-level
        ObjectRefs so Ray resolves each one once per actor (zero-copy numpy).
        Returns the replies and, as a second object kept in the object store for
        recovery, the batch clients' private states after the call.
        """
        items = []
        for client_id, payload_index, bare in batch:
            if self.kill:
                self._hook(client_id, bare.operation)
            items.append((client_id, replace(bare, tensors=payloads[payload_index])))
        replies = self.host.execute_batch(items)  # one call: the host may train these clients batched
        worked = {item[0] for item in batch}
        states = {cid: st for cid, st in self.host.export_states().items() if cid in worked}
        return replies, states

    def _hook(self, client_id: int, operation: str) -> None:
        """The test hook's phases of one operation: the client's first data build, then the operation's own."""
        if client_id not in self._built:
            self.host.private_state(client_id)  # builds the client's data (lazily, as its first operation would)
            self._built.add(client_id)
            die_at(self.kill, "data")
        die_at(self.kill, phase_of(operation))

    def import_state_objects(self, client_ids: list[int], *state_dicts) -> None:
        """Restore from the state objects of earlier calls (oldest first; later ones win)."""
        for states in state_dicts:
            self.host.import_states({cid: st for cid, st in states.items() if cid in client_ids})

    def export_states(self) -> dict:
        if self.kill:
            die_at(self.kill, "checkpoint")
        return self.host.export_states()

    def import_states(self, states: dict) -> None:
        self.host.import_states(states)

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()
