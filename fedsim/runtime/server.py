"""Server: holds the method's global state, runs rounds through an executor, evaluates."""
from __future__ import annotations

import logging
import time

import numpy as np

from fedsim.data.scenario import Federation
from fedsim.messages import Reply
from fedsim.runtime.client_host import torch_threads

#: torch threads of the server half on every backend (the Ray ServerActor asks for no CPU and runs one
#: thread): float reductions depend on the thread count, so server-side training (centralized baselines,
#: FedOD distillation) gives the same numbers locally and on Ray
SERVER_THREADS = 1

log = logging.getLogger(__name__)


def summarize_evaluation(federation: Federation, replies: dict[int, Reply]) -> dict:
    """Pool correct/total counts per domain: target accuracy and per-domain source accuracy.

    A method reporting several predictors sends ``correct_<name>`` next to
    ``correct``; they become ``target_accuracy_<name>`` and ``source_accuracy_<name>``.
    """
    variants = sorted({k[len("correct_"):] for r in replies.values() for k in r.metrics if k.startswith("correct_")})
    metrics: dict = {}
    for suffix in [""] + [f"_{v}" for v in variants]:
        correct: dict[str, float] = {}
        total: dict[str, float] = {}
        for cid, reply in replies.items():
            domain = federation.info(cid).domain
            correct[domain] = correct.get(domain, 0.0) + reply.metrics[f"correct{suffix}"]
            total[domain] = total.get(domain, 0.0) + reply.metrics["total"]
        accuracy = {d: correct[d] / total[d] for d in correct if total[d] > 0}
        sources = {d: accuracy[d] for d in federation.source_domains if d in accuracy}
        metrics[f"source_accuracy{suffix}"] = sources
        if sources:
            metrics[f"mean_source_accuracy{suffix}"] = float(np.mean(list(sources.values())))
        if federation.target in accuracy:
            metrics[f"target_accuracy{suffix}"] = accuracy[federation.target]
    return metrics


class Server:
    """The server half of a run, in whatever process holds it (the driver or a Ray ServerActor)."""

    def __init__(self, config, federation: Federation, executor):
        from fedsim.registry import METHODS

        self.config = config
        self.federation = federation
        self.executor = executor
        self.method = METHODS.get(config.method.name)(config, federation, device="cpu")
        self.state = self.method.init_server()
        self._restarts_seen = 0

    def standardize_clients(self) -> None:
        """Before round 1: the data standardization of ``data.normalization`` (its bytes count in round 1).

        ``federated``: clients send (count, sum, sum of squares) of their training
        inputs, the server combines them into one mean/std and sends it back.
        ``per-domain``: each client standardizes by its own statistics (nothing sent).
        """
        from fedsim.data import normalization
        from fedsim.data.scenario import resolve_normalization
        from fedsim.messages import Instruction
        from fedsim.runtime.client_host import DATA_STANDARDIZE, DATA_STATS

        how = resolve_normalization(self.config.data)
        clients = self.federation.client_ids
        if how == "federated":
            replies = self.executor.run({cid: Instruction(DATA_STATS) for cid in clients})
            stats = normalization.combine_stats(normalization.FeatureStats.from_tensors(r.tensors) for r in replies.values())
            mean, std = normalization.mean_std(stats)
            shared = {"mean": mean.astype(np.float32), "std": std.astype(np.float32)}
            self.executor.run({cid: Instruction(DATA_STANDARDIZE, shared) for cid in clients})
        elif how == "per-domain":
            self.executor.run({cid: Instruction(DATA_STANDARDIZE, {}, {"own_statistics": True}) for cid in clients})

    def run_round(self, rnd: int, evaluate: bool) -> dict:
        started = time.perf_counter()
        sent, received = self.executor.bytes_sent, self.executor.bytes_received
        self.executor.current_round = rnd
        if rnd == 1:
            self.standardize_clients()
        with torch_threads(SERVER_THREADS):  # clients set their own thread count inside the executor
            self.state, metrics = self.method.run_round(rnd, self.state, self.executor)
            metrics = {"round": rnd, **metrics}
            if evaluate:
                replies = self.executor.run(self.method.configure_evaluate(rnd, self.state))
                metrics.update(self.method.summarize_evaluation(rnd, replies))
                metrics["evaluated"] = True
        restarts = getattr(self.executor, "restarts", 0)
        if restarts != self._restarts_seen:
            metrics["actor_restarts"], self._restarts_seen = restarts - self._restarts_seen, restarts
        failures = self.executor.take_failure_events()
        if failures:
            metrics["client_failures"] = failures
        metrics["bytes_sent"] = self.executor.bytes_sent - sent
        metrics["bytes_received"] = self.executor.bytes_received - received
        metrics["round_seconds"] = time.perf_counter() - started
        return metrics

    def export_state(self) -> dict:
        """Server half of a checkpoint: the method's state and the byte counters."""
        return {"method_state": self.state, "bytes": (self.executor.bytes_sent, self.executor.bytes_received)}

    def restore_state(self, saved: dict) -> None:
        """Continue from a checkpoint: redo the (deterministic) data standardization, then restore."""
        self.standardize_clients()
        self.state = saved["method_state"]
        self.executor.bytes_sent, self.executor.bytes_received = saved["bytes"]

    def export_client_states(self) -> dict:
        return self.executor.export_client_states()

    def import_client_states(self, states: dict) -> None:
        self.executor.import_client_states(states)

    def global_tensors(self) -> dict[str, np.ndarray]:
        return self.method.global_tensors(self.state)

    def close(self) -> None:
        self.executor.close()
