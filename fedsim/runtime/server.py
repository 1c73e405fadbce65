"""Server: holds the method's global state, runs rounds through an executor, evaluates."""
from __future__ import annotations

import logging
import time

import numpy as np

from fedsim.data.scenario import Federation
from fedsim.messages import Reply

log = logging.getLogger(__name__)


def summarize_evaluation(federation: Federation, replies: dict[int, Reply]) -> dict:
    """Pool correct/total counts per domain: target accuracy and per-domain source accuracy."""
    per_domain: dict[str, list[float]] = {}
    for cid, reply in replies.items():
        counts = per_domain.setdefault(federation.info(cid).domain, [0.0, 0.0, 0.0])
        counts[0] += reply.metrics["correct"]
        counts[1] += reply.metrics["total"]
        counts[2] += reply.metrics.get("loss_sum", 0.0)
    accuracy = {d: c[0] / c[1] for d, c in per_domain.items() if c[1] > 0}
    sources = {d: accuracy[d] for d in federation.source_domains if d in accuracy}
    metrics = {"source_accuracy": sources}
    if sources:
        metrics["mean_source_accuracy"] = float(np.mean(list(sources.values())))
    if federation.target in accuracy:
        metrics["target_accuracy"] = accuracy[federation.target]
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

    def run_round(self, rnd: int, evaluate: bool) -> dict:
        started = time.perf_counter()
        sent, received = self.executor.bytes_sent, self.executor.bytes_received
        self.state, metrics = self.method.run_round(rnd, self.state, self.executor)
        metrics = {"round": rnd, **metrics}
        if evaluate:
            replies = self.executor.run(self.method.configure_evaluate(rnd, self.state))
            metrics.update(summarize_evaluation(self.federation, replies))
        metrics["bytes_sent"] = self.executor.bytes_sent - sent
        metrics["bytes_received"] = self.executor.bytes_received - received
        metrics["round_seconds"] = time.perf_counter() - started
        return metrics

    def global_tensors(self) -> dict[str, np.ndarray]:
        return self.method.global_tensors(self.state)

    def close(self) -> None:
        self.executor.close()
