"""RoundContext: the one way a method's server half talks to its clients.

    replies = ctx.call("fit", weights, clients)          # {client_id: Reply}, sorted by client id

``call`` builds one Instruction per client with the round, the seed derived from (root seed, round, client,
operation) and the round's local-update settings, runs them through the executor (serially, or on Ray actors),
and counts the bytes of what crossed the wire. It behaves the same on every backend, so a method never sees which
one it runs on. With unreliable clients (the ``clients`` section, :mod:`fedsim.runtime.unreliable`) a training
call's missing sources are left out of the replies; setup stages and the evaluation (``evaluating``) never are.
With the ``privacy`` section on (:mod:`fedsim.privacy`), a training call's replies are clipped and noised here, in
the server's process, once they arrived; setup stages and the evaluation never are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional, TypeVar, Union

from fedsim.messages import Instruction, LocalSettings, Reply, Tensors, Value
from fedsim.runtime.unreliable import RoundClients
from fedsim.seeding import derive_seed

if TYPE_CHECKING:
    from fedsim.privacy.protocol import RoundPrivacy  # imported by a run with privacy on: it loads dp_accounting

T = TypeVar("T")
PerClient = Union[T, Callable[[int], T], None]  # one value for every client, or a function of the client id
NO_TENSORS: Tensors = {}  # one shared object: a backend serializes a payload once per call


class RoundContext:
    """One round's exchanges. ``local`` is the round's local-update settings, which every instruction carries;
    ``setup=True`` marks a setup stage (data standardization) that a backend replays on a client process it has
    to recreate; ``clients`` the round's unreliable clients (None: every client answers); ``privacy`` the round's
    privacy layer (:class:`fedsim.privacy.protocol.RoundPrivacy`; None: replies as they arrive)."""

    def __init__(
        self,
        executor,
        root_seed: int,
        rnd: int,
        local: Optional[LocalSettings] = None,
        setup: bool = False,
        clients: Optional[RoundClients] = None,
        privacy: Optional[RoundPrivacy] = None,
    ):
        self.executor = executor
        self.root_seed = root_seed
        self.round = rnd
        self.local = local
        self.setup = setup
        self.clients = clients
        self.privacy = privacy
        self.evaluating = False  # set by the server around the evaluation: every client answers it

    def seed(self, client_id: int, operation: str) -> int:
        """Seed of one client operation in this round, independent of scheduling (also for server-side steps)."""
        return derive_seed(self.root_seed, self.round, client_id, operation)

    def call(
        self,
        operation: str,
        tensors: PerClient[Tensors] = None,
        clients: Iterable[int] = (),
        values: PerClient[Mapping[str, Value]] = None,
        *,
        seed: PerClient[int] = None,
        local: Optional[LocalSettings] = None,
    ) -> dict[int, Reply]:
        """Run ``operation`` on ``clients`` with ``tensors`` and the operation's own ``values``.

        Each instruction carries the round, the seed ``ctx.seed(cid, operation)`` (``seed`` gives another
        stream) and the round's local settings (``local`` gives others, e.g. an encoder stage's epochs).
        ``tensors``, ``values`` and ``seed`` are shared, or functions of the client id.
        """
        instructions = {}
        for cid in clients:
            payload = _for_client(tensors, cid)
            own_seed = _for_client(seed, cid)
            instructions[int(cid)] = Instruction(
                operation,
                NO_TENSORS if payload is None else payload,
                round=self.round,
                seed=self.seed(cid, operation) if own_seed is None else int(own_seed),
                local=self.local if local is None else local,
                values=_for_client(values, cid) or {},
            )
        if self.clients is None or self.setup or self.evaluating or not instructions:
            replies = self.executor.run(instructions, self.round, replay=self.setup)
        else:
            replies = self.clients.call(self.executor, operation, instructions)
        if self.privacy is None or self.setup or self.evaluating:
            return replies
        return self.privacy.protect(operation, instructions, replies)

    def bytes_of(self, operation: str) -> tuple[int, int]:
        """The bytes sent and received so far by the calls of ``operation`` (the executor's count, all rounds)."""
        sent, received, _ = self.executor.stage_bytes.get(operation, (0, 0, 0))
        return sent, received

    def count_replayed(self, operation: str, sent: int, received: int) -> None:
        """Count the bytes of an exchange that a run replays from a stage cache instead of running it: the
        simulated federation made that exchange, so its bytes are the run's as if it had."""
        self.executor.count(operation, sent, received)


def _for_client(value: PerClient[T], client_id: int) -> Optional[T]:
    if callable(value):
        return value(client_id)
    return value
