"""RoundContext: the one way a method's server half talks to its clients.

    replies = ctx.call("fit", weights, clients)          # {client_id: Reply}, sorted by client id

``call`` builds one Instruction per client with the seed derived from (root seed,
round, client, operation) and the round number in its config, runs them through
the executor (serially, or on Ray actors), and counts the bytes of what crossed
the wire. It behaves the same on every backend, so a method never sees which one
it runs on.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Union

from fedsim.messages import Instruction, Reply, Tensors
from fedsim.seeding import derive_seed

PerClient = Union[Mapping[str, Any], Callable[[int], Mapping[str, Any]], None]
NO_TENSORS: Tensors = {}  # one shared object: a backend serializes a payload once per call


class RoundContext:
    """One round's exchanges. ``setup=True`` marks a setup stage (data standardization) that a backend
    replays on a client process it has to recreate."""

    def __init__(self, executor, root_seed: int, rnd: int, setup: bool = False):
        self.executor = executor
        self.root_seed = root_seed
        self.round = rnd
        self.setup = setup

    def seed(self, client_id: int, operation: str) -> int:
        """Seed of one client operation in this round, independent of scheduling (also for server-side steps)."""
        return derive_seed(self.root_seed, self.round, client_id, operation)

    def call(
        self, operation: str, tensors: PerClient = None, clients: Iterable[int] = (), config: PerClient = None
    ) -> dict[int, Reply]:
        """Run ``operation`` on ``clients``; ``tensors`` and ``config`` are shared, or functions of the client id.

        Each instruction's config is ``{"seed": ctx.seed(cid, operation), "round": ctx.round, **config}``:
        a method that wants another stream passes its own ``seed``.
        """
        instructions = {}
        for cid in clients:
            payload = _for_client(tensors, cid)
            extra = _for_client(config, cid) or {}
            settings = {"seed": self.seed(cid, operation), "round": self.round, **extra}
            instructions[int(cid)] = Instruction(operation, NO_TENSORS if payload is None else payload, settings)
        return self.executor.run(instructions, self.round, replay=self.setup)


def _for_client(value: PerClient, client_id: int) -> Optional[Mapping[str, Any]]:
    if callable(value):
        return value(client_id)
    return value
