"""The Method interface: one class holds both halves of a federated algorithm.

Server half (runs where the global state lives):
    ``init_server() -> state``
    ``configure_round(round, state) -> {client_id: Instruction}``
    ``aggregate(round, state, replies) -> (state, metrics)``
    ``run_round(round, state, executor)``: configure -> executor -> aggregate; a
    method with several exchanges per round overrides it and calls the executor
    once per stage.
    ``configure_evaluate(round, state)``: instructions for the ``evaluate`` operation.

Client half (runs where the client's data lives):
    ``init_client(data) -> private state``
    named operations listed in ``operations``, each
    ``(instruction, private_state, data) -> (Reply, private_state)``.

Private client state (a personalized head, norm statistics, barycentric
coordinates) stays in the client's process and never appears in a Reply.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import torch

from fedsim.config import ExperimentConfig, NoParams
from fedsim.data.base import ClientData
from fedsim.data.scenario import Federation
from fedsim.messages import Instruction, Reply
from fedsim.seeding import derive_seed

ServerState = dict
Replies = Mapping[int, Reply]


class Method:
    """Base class; subclasses register with ``@METHODS.register(name)``."""

    Params: ClassVar[type] = NoParams
    task: ClassVar[str] = "classification"  # or "detection": which benchmarks the method runs on
    operations: ClassVar[tuple[str, ...]] = ("fit", "evaluate")
    #: client-state keys that are caches rebuilt on demand (e.g. a model shared by the clients of a
    #: process), not private state: checkpoints and actor recovery leave them out
    transient_state_keys: ClassVar[tuple[str, ...]] = ("model",)

    def __init__(self, config: ExperimentConfig, federation: Federation, device: str = "cpu"):
        self.config = config
        self.federation = federation
        self.params = config.method.params
        self.device = torch.device(device)

    # ---- helpers ----------------------------------------------------------
    def client_seed(self, rnd: int, client_id: int, operation: str) -> int:
        """Seed of one client operation in one round, independent of scheduling."""
        return derive_seed(self.config.run.seed, rnd, client_id, operation)

    def sample_clients(self, rnd: int, candidates: list[int]) -> list[int]:
        """The clients that work in round ``rnd`` (``run.clients_per_round``), drawn from the seed alone."""
        wanted = self.config.run.clients_per_round
        if wanted is None:
            return list(candidates)
        count = int(wanted) if wanted >= 1 else max(1, round(wanted * len(candidates)))
        if count >= len(candidates):
            return list(candidates)
        rng = np.random.default_rng(derive_seed(self.config.run.seed, rnd, "sample-clients"))
        return sorted(int(c) for c in rng.choice(np.asarray(candidates), count, replace=False))

    def operation(self, name: str) -> Callable[[Instruction, Any, ClientData], tuple[Reply, Any]]:
        if name not in self.operations:
            raise ValueError(f"method {type(self).__name__} has no client operation {name!r} (has {self.operations})")
        return getattr(self, name)

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        raise NotImplementedError

    def configure_round(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        raise NotImplementedError

    def aggregate(self, rnd: int, state: ServerState, replies: Replies) -> tuple[ServerState, dict]:
        raise NotImplementedError

    def run_round(self, rnd: int, state: ServerState, executor) -> tuple[ServerState, dict]:
        replies = executor.run(self.configure_round(rnd, state))
        return self.aggregate(rnd, state, replies)

    def configure_evaluate(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        raise NotImplementedError

    def summarize_evaluation(self, rnd: int, replies: Replies) -> dict:
        """Evaluation replies -> round metrics (default: pooled accuracy per domain; detection overrides it)."""
        from fedsim.runtime.server import summarize_evaluation

        return summarize_evaluation(self.federation, replies)

    def global_tensors(self, state: ServerState) -> dict:
        """The tensors that define the global model (compared across backends in tests)."""
        return dict(state.get("weights", {}))

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        return None

    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        raise NotImplementedError

    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        raise NotImplementedError
