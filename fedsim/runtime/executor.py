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

import logging
from abc import ABC, abstractmethod
from typing import Callable, Iterable, Mapping, Optional

from fedsim.messages import Instruction, Reply

log = logging.getLogger(__name__)

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


def cuda_available() -> bool:
    """Whether this process can run on CUDA (torch is imported here: the local backend trains in this process)."""
    import torch

    return torch.cuda.is_available()


def local_devices(config, federation) -> dict[int, str]:
    """client id -> the device the local backend runs it on: ``cuda`` where its ``gpus_per_client`` (the
    section's, or its group's, :meth:`fedsim.config.ResourcesConfig.of_client`) is above 0, as a Ray client actor
    with GPUs runs it; ``cpu`` otherwise, and for every client when CUDA is not available (said in one log line)."""
    wanted = {
        cid: config.resources.of_client(federation.info(cid).domain, federation.info(cid).role)[1] > 0
        for cid in federation.client_ids
    }
    if any(wanted.values()) and not cuda_available():
        log.warning(
            "resources.gpus_per_client asks for a GPU but CUDA is not available here: the local backend runs every "
            "client on the CPU"
        )
        return dict.fromkeys(wanted, "cpu")
    return {cid: "cuda" if gpu else "cpu" for cid, gpu in wanted.items()}


class LocalExecutor(Executor):
    """Serial and deterministic: all clients live in this process (for debugging and tests), each on the device its
    resources give it (:func:`local_devices`): one :class:`~fedsim.runtime.client_host.ClientHost` per device."""

    def __init__(self, config, federation, device: Optional[str] = None):
        """``device``: every client and the server half on it (a check's or a test's choice); None: as the
        resources say."""
        super().__init__()
        from fedsim.runtime.client_host import ClientHost

        devices = local_devices(config, federation) if device is None else dict.fromkeys(federation.client_ids, device)
        self.hosts = {
            device: ClientHost(config, federation, [cid for cid, d in devices.items() if d == device], device=device)
            for device in sorted(set(devices.values()))
        }
        self._host_of = {cid: self.hosts[device] for cid, device in devices.items()}
        server_gpu = config.resources.gpus_per_client > 0 and "cuda" in self.hosts
        self.server_device = device or ("cuda" if server_gpu else "cpu")
        """The device of the server half in this process (the centralized references train on it): ``cuda`` when
        the section's ``gpus_per_client`` is above 0 and CUDA is available."""

    @property
    def host(self):
        """The host of every client when they share one device (the usual case: one host)."""
        if len(self.hosts) != 1:
            raise AttributeError(f"the clients run on {sorted(self.hosts)}: use hosts[device]")
        return next(iter(self.hosts.values()))

    def _dispatch(self, instructions: dict[int, Instruction], rnd: int, replay: bool) -> dict[int, Reply]:
        """One host call per device for its clients, as a Ray actor gets one call for the batch of its clients."""
        replies: dict[int, Reply] = {}
        for host in self.hosts.values():
            items = [(cid, ins) for cid, ins in instructions.items() if self._host_of[cid] is host]
            if items:
                replies.update((reply.client_id, reply) for reply in host.execute_batch(items))
        return replies

    def export_client_states(self) -> dict:
        return {cid: state for host in self.hosts.values() for cid, state in host.export_states().items()}

    def import_client_states(self, states: dict) -> None:
        for host in self.hosts.values():
            host.import_states(states)
