"""Server: holds the method's global state, runs its setup and rounds through a RoundContext, evaluates."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Optional, Protocol

import numpy as np

from fedsim.data.scenario import Federation
from fedsim.errors import NumericalError, unwrapped
from fedsim.runtime.context import RoundContext
from fedsim.runtime.numerics import check_tensors
from fedsim.runtime.unreliable import NoClientAnswered, UnreliableClients

#: torch threads of the server half on every backend (the Ray ServerActor asks for no CPU and runs one
#: thread): float reductions depend on the thread count, so server-side training (centralized baselines,
#: FedOD distillation) gives the same numbers locally and on Ray
SERVER_THREADS = 1

log = logging.getLogger(__name__)


#: what the Simulator calls on a server, wherever it runs (a Server here, a Ray actor behind a forwarding proxy)
SERVER_HANDLE_METHODS = (
    "setup",
    "run_round",
    "global_tensors",
    "export_state",
    "restore_state",
    "export_client_states",
    "import_client_states",
)


class ServerHandle(Protocol):
    """The server as the Simulator sees it; ``fedsim.actors.server.RemoteServer`` forwards these to a Ray actor."""

    def setup(self, first_round: int) -> None: ...
    def run_round(self, rnd: int, evaluate: bool) -> dict: ...
    def global_tensors(self) -> dict[str, np.ndarray]: ...
    def export_state(self) -> dict: ...
    def restore_state(self, saved: dict) -> None: ...
    def export_client_states(self) -> dict: ...
    def import_client_states(self, states: dict) -> None: ...
    def close(self) -> None: ...


class Server:
    """The server half of a run, in whatever process holds it (the driver, or a Ray actor)."""

    def __init__(self, config, federation: Federation, executor, state: Optional[dict] = None):
        """``state``: the method's initial server state when it was computed elsewhere (the Ray backend computes
        it in a client actor for a method whose server half needs no torch); by default ``init_server()`` here."""
        from fedsim.registry import METHODS

        self.config = config
        self.federation = federation
        self.executor = executor
        device = getattr(executor, "server_device", "cpu")  # the local backend's GPU; elsewhere the CPU
        self.method = METHODS.get(config.method.name)(config, federation, device=device)
        self.state = self.method.init_server() if state is None else state
        self._restarts_seen = 0
        self._placement_recorded = False
        self._bytes_mark: Optional[tuple] = None  # counters before a setup stage: counted in the next round
        self.unreliable: Optional[UnreliableClients] = None  # the clients section's draws, made by unreliable_clients
        self.privacy = self._privacy()  # the privacy section's noise and budget (None when off)

    def unreliable_clients(self) -> Optional[UnreliableClients]:
        """The run's unreliable clients (None when the ``clients`` section is off); its trace files are read on
        first use (in :meth:`setup`, before a run writes anything)."""
        if self.unreliable is None and self.config.clients.active:
            self.unreliable = UnreliableClients(self.config.clients, self.federation, self.config.run.seed)
        return self.unreliable

    def _privacy(self):
        """The run's privacy layer (:class:`fedsim.privacy.protocol.RunPrivacy`, a target epsilon calibrated here)
        when the ``privacy`` section is on, else None."""
        if not self.config.privacy.active:
            return None
        from fedsim.privacy.protocol import make_privacy, warn_batch_norm

        warn_batch_norm(self.config, self.method.global_tensors(self.state))
        return make_privacy(self.config, self.federation, self.method)

    def context(self, rnd: int, setup: bool = False) -> RoundContext:
        unreliable = None if setup else self.unreliable_clients()
        clients = None if unreliable is None else unreliable.round(rnd)
        privacy = None if setup or self.privacy is None else self.privacy.round(rnd)
        local = self.method.client_settings(rnd)
        return RoundContext(
            self.executor, self.config.run.seed, rnd, local, setup=setup, clients=clients, privacy=privacy
        )

    def _counters(self) -> tuple:
        """The executor's byte counters: in all, and per stage."""
        stages = {operation: tuple(counts) for operation, counts in self.executor.stage_bytes.items()}
        return self.executor.bytes_sent, self.executor.bytes_received, stages

    def setup(self, first_round: int) -> None:
        """The setup stages before ``first_round`` (data standardization); their bytes count in that round."""
        from fedsim.data.normalization import standardize_federation
        from fedsim.data.scenario import resolve_normalization

        self.unreliable_clients()
        if self._bytes_mark is None:
            self._bytes_mark = self._counters()
        how = resolve_normalization(self.config.data)
        standardize_federation(self.context(first_round, setup=True), how, self.federation.client_ids)

    def run_round(self, rnd: int, evaluate: bool) -> dict:
        started = time.perf_counter()
        sent, received, stages = self._bytes_mark or self._counters()
        self._bytes_mark = None
        ctx = self.context(rnd)
        metrics = self._round(ctx, evaluate)
        if ctx.clients is not None:
            metrics.update(ctx.clients.metrics())
        if ctx.privacy is not None:
            metrics.update(self.privacy.close_round(ctx.privacy))  # privacy_epsilon spent so far, the multiplier
        if not self._placement_recorded:
            metrics.update(self.executor.placement())
            self._placement_recorded = True
        restarts = self.executor.restarts
        if restarts != self._restarts_seen:
            metrics["actor_restarts"], self._restarts_seen = restarts - self._restarts_seen, restarts
        failures = self.executor.take_failure_events()
        if failures:
            metrics["client_failures"] = failures
        metrics["bytes_sent"] = self.executor.bytes_sent - sent
        metrics["bytes_received"] = self.executor.bytes_received - received
        metrics["bytes_sent_by_stage"], metrics["bytes_received_by_stage"] = self._stage_bytes(stages)
        metrics["round_seconds"] = time.perf_counter() - started - metrics.get("eval_seconds", 0.0)
        return metrics

    def _stage_bytes(self, before: dict) -> tuple[dict[str, int], dict[str, int]]:
        """The bytes sent and received per operation since the counters ``before`` (the operations called)."""
        sent, received = {}, {}
        for operation, counts in sorted(self.executor.stage_bytes.items()):
            was = before.get(operation, (0, 0, 0))
            if tuple(counts) != tuple(was):
                sent[operation], received[operation] = counts[0] - was[0], counts[1] - was[1]
        return sent, received

    def _round(self, ctx: RoundContext, evaluate: bool) -> dict:
        """The method's round (and evaluation); a non-finite value, in a client's reply (its error unwrapped from
        the backend's) or in the new global tensors, is a NumericalError naming the method, round and client."""
        where = {"method": self.config.method.name, "round": ctx.round, "client": "server"}
        try:
            with self._threads():
                metrics = {"round": ctx.round, **self._train(ctx, where)}
                if evaluate:
                    ctx.evaluating = True
                    started = time.perf_counter()
                    metrics.update(self.method.evaluate_round(ctx, self.state))
                    metrics["evaluated"] = True
                    metrics["eval_seconds"] = time.perf_counter() - started
        except NumericalError as exc:
            raise unwrapped(exc).located(**where) from None
        return metrics

    def _train(self, ctx: RoundContext, where: dict) -> dict:
        """The method's round; when no client answered one of its calls, the state stays as it was."""
        try:
            self.state, metrics = self.method.run_round(ctx, self.state)
        except NoClientAnswered as exc:
            log.warning("round %d: %s: the round leaves the global state as it was", ctx.round, exc)
            return {"aggregation_skipped": True}
        check_tensors(self.method.global_tensors(self.state), "global tensor {name}", **where)
        return metrics

    def _threads(self):
        """SERVER_THREADS torch threads for a server half that uses torch (clients set their own inside the
        executor); a numpy-only one (``Method.server_needs_torch``) leaves torch unloaded."""
        if not self.method.server_needs_torch:
            return contextlib.nullcontext()
        from fedsim.runtime.client_host import torch_threads

        return torch_threads(SERVER_THREADS)

    def export_state(self) -> dict:
        """Server half of a checkpoint: the method's state, the byte counters and the privacy spent."""
        saved = {"method_state": self.state, "bytes": (self.executor.bytes_sent, self.executor.bytes_received)}
        if self.privacy is not None:
            saved["privacy"] = self.privacy.state()
        return saved

    def restore_state(self, saved: dict) -> None:
        """Continue from a checkpoint (after :meth:`setup` has redone the deterministic standardization)."""
        self.state = saved["method_state"]
        self.executor.bytes_sent, self.executor.bytes_received = saved["bytes"]
        if self.privacy is not None and "privacy" in saved:
            self.privacy.restore(saved["privacy"])
        self._bytes_mark = None

    def export_client_states(self) -> dict:
        return self.executor.export_client_states()

    def import_client_states(self, states: dict) -> None:
        self.executor.import_client_states(states)

    def global_tensors(self) -> dict[str, np.ndarray]:
        return self.method.global_tensors(self.state)

    def close(self) -> None:
        try:
            self.method.close()
        finally:
            self.executor.close()
