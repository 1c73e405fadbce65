"""Executors run client operations; LocalExecutor serially in this process.

Every executor implements ``run({client_id: Instruction}, round, replay) -> {client_id: Reply}``
(replies sorted by client id, whatever order they arrive in) and counts the
bytes of what crosses the wire: each client receives its instruction's
tensors, each reply's tensors come back; in all (``bytes_sent``,
``bytes_received``) and per operation (``stage_bytes``). Methods never call it directly: they
go through :class:`fedsim.runtime.context.RoundContext`. ``replay=True`` marks a
setup exchange (data standardization) that a backend must redo on a client
process it recreates.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Iterable, Mapping, Optional

from fedsim.messages import Instruction, Reply

#: the replies a caller keeps of those that came back (a deadline discards late ones): client ids
Keep = Callable[[Mapping[int, Reply]], Iterable[int]]


class Executor(ABC):
    def __init__(self):
        self.bytes_sent = 0
        self.bytes_received = 0
        self.stage_bytes: dict[str, list[int]] = {}  # operation -> [bytes sent, bytes received, calls]
        self.restarts = 0  # client processes recreated after a failure (the Ray backend)

    def take_failure_events(self) -> list[dict]:
        """Clients that could not answer (after retries) since the last call; recorded in metrics.jsonl."""
        return []

    def run(
        self, instructions: Mapping[int, Instruction], rnd: int = 0, replay: bool = False, keep: Optional[Keep] = None
    ) -> dict[int, Reply]:
        """The replies to ``instructions``; ``keep`` chooses those the caller receives (the others are not counted
        as received)."""
        if not instructions:
            return {}
        replies = self._dispatch(dict(sorted(instructions.items())), rnd, replay)
        replies = {cid: replies[cid] for cid in sorted(instructions) if cid in replies}
        if keep is not None:
            kept = set(keep(replies))
            replies = {cid: reply for cid, reply in replies.items() if cid in kept}
        for operation in sorted({ins.operation for ins in instructions.values()}):
            sent = sum(ins.nbytes for ins in instructions.values() if ins.operation == operation)
            received = sum(reply.nbytes for cid, reply in replies.items() if instructions[cid].operation == operation)
            self.count(operation, sent, received)
        return replies

    def count(self, operation: str, sent: int, received: int = 0) -> None:
        """Add one call's bytes of ``operation`` to the totals and to its stage."""
        self.bytes_sent += sent
        self.bytes_received += received
        stage = self.stage_bytes.setdefault(operation, [0, 0, 0])
        stage[0], stage[1], stage[2] = stage[0] + sent, stage[1] + received, stage[2] + 1

    @abstractmethod
    def _dispatch(self, instructions: dict[int, Instruction], rnd: int, replay: bool) -> dict[int, Reply]:
        """Run each instruction on its client; any order."""

    def placement(self) -> dict:
        """Where the clients run, recorded in the first round's metrics (the Ray backend: ``client_nodes``)."""
        return {}

    def export_client_states(self) -> dict:
        """Every client's private state, for checkpoints (it never goes to the server's method)."""
        raise NotImplementedError

    def import_client_states(self, states: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalExecutor(Executor):
    """Serial and deterministic: all clients live in this process (for debugging and tests)."""

    def __init__(self, config, federation):
        super().__init__()
        from fedsim.runtime.client_host import ClientHost

        self.host = ClientHost(config, federation, federation.client_ids, device="cpu")

    def _dispatch(self, instructions: dict[int, Instruction], rnd: int, replay: bool) -> dict[int, Reply]:
        """One host call for every client, as a Ray actor gets one call for the batch of its clients."""
        replies = self.host.execute_batch(list(instructions.items()))
        return {reply.client_id: reply for reply in replies}

    def export_client_states(self) -> dict:
        return self.host.export_states()

    def import_client_states(self, states: dict) -> None:
        self.host.import_states(states)
