"""The Method interface: one class holds both halves of a federated algorithm.

Server half (runs where the global state lives):
    ``init_server() -> state``
    ``run_round(ctx, state) -> (state, metrics)``: the round as a sequence of stages, each one exchange
    ``ctx.call(operation, tensors, clients, values) -> {client_id: Reply}`` (see
    :class:`fedsim.runtime.context.RoundContext`), in the order of the paper's algorithm box.
    ``evaluate_round(ctx, state) -> metrics``: by default every client evaluates ``evaluation_tensors(state)``.
    :class:`SingleExchange` gives ``run_round`` to methods that are one exchange per round
    (``configure`` / ``aggregate``, Flower's pairing); :class:`PooledReference` gives the pooled references (the
    centralized ones) their models and the sources' upload.

Client half (runs where the client's data lives):
    ``init_client(data) -> private state``
    operations marked ``@client_operation``, each ``(instruction, private_state, data) -> (Reply, private_state)``;
    the instruction carries the round, the seed and the local update's settings (``client_settings``) as typed
    fields (:class:`fedsim.messages.Instruction`).

Private client state (a personalized head, norm statistics, barycentric
coordinates) stays in the client's process and never appears in a Reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, ClassVar, Iterable, Mapping

import numpy as np

from fedsim.config import ExperimentConfig, NoParams
from fedsim.data.base import ClientData
from fedsim.data.scenario import Federation
from fedsim.messages import Instruction, LocalSettings, Reply, Tensors
from fedsim.methods.common.evaluation import summarize_evaluation
from fedsim.methods.common.pooling import labeled_upload
from fedsim.methods.common.selection_hooks import density_payload, requested_scores
from fedsim.seeding import derive_seed

ServerState = dict
Replies = Mapping[int, Reply]
ClientOperation = Callable[[Any, Instruction, Any, ClientData], tuple[Reply, Any]]


def client_operation(function: ClientOperation) -> ClientOperation:
    """Declare a method function as a client operation that the server may call by name."""
    function.is_client_operation = True  # type: ignore[attr-defined]
    return function


class Method:
    """Base class; subclasses register with ``@METHODS.register(name)``. Class attributes, all read by the runtime:"""

    Params: ClassVar[type] = NoParams
    """The method's own frozen parameter dataclass, set by ``method.<field>`` keys (FedProx's ``method.mu``, the
    proximal weight of Li et al., MLSys 2020, Eq. 2); its ``__post_init__`` validates it. Default: no parameters."""
    task: ClassVar[str] = "classification"
    """The task of the benchmarks the method runs on, "classification" or "detection" (a method and a benchmark of
    different tasks are refused before anything starts)."""
    transient_state_keys: ClassVar[tuple[str, ...]] = ("model",)
    """Client-state keys that are caches rebuilt on demand (e.g. a model shared by the clients of a process), not
    private state: checkpoints, actor recovery and the privacy contract leave them out."""
    disclosed_state_keys: ClassVar[tuple[str, ...]] = ()
    """Client-state keys whose content the protocol sends on purpose: FADA's client models (Peng et al., ICLR 2020,
    Alg. 1: the target sends w_t, a source its delta w_i - w_t), FedOD's fine-tuned w_i, uploaded as teachers every
    round (Su et al. 2022), FedBN/FedRep's personal parts in evaluation-only exchanges. The privacy contract test
    leaves them out; checkpoints keep them."""
    centralized: ClassVar[bool] = False
    """True for references that move client data to the server on purpose (pooled training): their replies carry
    inputs, which the privacy contract test otherwise forbids."""
    server_needs_torch: ClassVar[bool] = True
    """False when the server half (``run_round``, ``aggregate``, evaluation summaries) is numpy only, as FedAvg's
    weighted mean (McMahan et al., AISTATS 2017, Alg. 1): on Ray the server actor then never imports torch (its
    ``init_server`` state, the seeded initial model, is computed in a client actor and handed over, as Flower asks
    one client for the initial parameters). Declared by each class itself, never inherited: a subclass that does not
    declare it gets True, so new server-side torch work cannot run unprepared."""
    config_defaults: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    """Config values this method changes from the library's defaults, per section (e.g. FedOD's 3 rounds, as in
    Su et al. 2022); a user's file or override still wins."""
    copes_with_missing_replies: ClassVar[bool] = False
    """True when the server half aggregates whatever replies arrive, so that sources that drop out, fail or miss a
    deadline (the ``clients`` section) can apply to it. Declared by each class itself, never inherited: a subclass
    that does not declare it gets False, so a method that needs every reply is never given fewer."""
    registry_name: ClassVar[str] = ""
    """The name it is registered under (set by the registry)."""
    operations: ClassVar[frozenset[str]] = frozenset()
    """The names of its ``@client_operation`` functions, inherited ones included (collected when the class is
    defined)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "server_needs_torch" not in vars(cls):
            cls.server_needs_torch = True
        if "copes_with_missing_replies" not in vars(cls):
            cls.copes_with_missing_replies = False
        cls.operations = frozenset(
            name
            for klass in cls.__mro__
            for name, value in vars(klass).items()
            if getattr(value, "is_client_operation", False)
        )

    def __init__(self, config: ExperimentConfig, federation: Federation, device: str = "cpu"):
        self.config = config
        """The experiment's config."""
        self.federation = federation
        """The run's clients: their domains, roles and sizes."""
        self.params = config.method.params
        """The method's own parameters: ``config.method.params``, an instance of :attr:`Params`."""
        self.device = device

    @property
    def device(self):
        """The torch device of the client half (torch is imported on first use: a numpy server never asks)."""
        import torch

        if not isinstance(self._device, torch.device):
            self._device = torch.device(self._device)
        return self._device

    @device.setter
    def device(self, value) -> None:
        self._device = value

    @classmethod
    def description(cls) -> str:
        """One line for ``fedsim list``: the first line of the class or module docstring."""
        import sys

        doc = cls.__doc__ or sys.modules[cls.__module__].__doc__ or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    @classmethod
    def check_setting(cls, config: ExperimentConfig, federation: Federation) -> None:
        """Refuse a scenario this method cannot run (raise UserError); called before anything is written."""

    # ---- helpers ----------------------------------------------------------
    def client_settings(self, rnd: int) -> LocalSettings:
        """The settings of the local update in round ``rnd`` (epochs, batch size, SGD's rate, momentum, weight
        decay), which every instruction of the round carries, as Flower's fit config does.
        Default: the ``method`` section's values in every round; override to vary them by round."""
        return LocalSettings.from_method(self.config.method)

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
        """The bound client operation ``name`` (a ``@client_operation``), as a client host runs an
        :class:`fedsim.messages.Instruction`; another name raises ValueError."""
        if name not in self.operations:
            raise ValueError(
                f"method {type(self).__name__} has no client operation {name!r} (has {sorted(self.operations)})"
            )
        return getattr(self, name)

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        """The server's state before round 1, a dict (e.g. ``{"weights": ...}``, the seeded initial model); each
        round returns the next one, and checkpoints save it."""
        raise NotImplementedError

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """One round, stage by stage, each stage one ``ctx.call`` (:class:`fedsim.runtime.context.RoundContext`)
        in the order of the paper's algorithm box: the new state and the round's metrics."""
        raise NotImplementedError

    def evaluation_tensors(self, state: ServerState) -> Tensors:
        """What every client receives to evaluate (default: the global weights)."""
        return state["weights"]

    def evaluate_round(self, ctx, state: ServerState) -> dict:
        """Every client evaluates; the replies become the round's accuracy and selection-score metrics."""
        tensors = self.selection_payload(ctx, self.evaluation_tensors(state))
        replies = ctx.call("evaluate", tensors, self.federation.client_ids)
        return self.summarize_evaluation(ctx.round, replies)

    @cached_property
    def selection_scores(self) -> tuple[str, ...]:
        """The model-selection scores every evaluation reports (``run.scores`` resolved; none for detection)."""
        return requested_scores(self.config, self.task)

    def selection_payload(self, ctx, tensors, values=None):
        """What the evaluation sends: ``tensors`` (shared, or a function of the client id), with the density ratio
        of iwv/dev added for the sources when those scores are requested, after one exchange of feature moments
        (``evaluate`` with ``values``; :func:`fedsim.methods.common.selection_hooks.density_payload`). A method
        that overrides :meth:`evaluate_round` passes its evaluation's tensors through it."""
        return density_payload(self, ctx, tensors, values)

    def summarize_evaluation(self, rnd: int, replies: Replies) -> dict:
        """Evaluation replies -> round metrics (default: pooled accuracy per domain and the ``score_*`` of
        :attr:`selection_scores`; detection overrides it)."""
        return summarize_evaluation(self.federation, replies, self.selection_scores)

    def global_tensors(self, state: ServerState) -> dict:
        """The tensors that define the global model (compared across backends in tests)."""
        return dict(state.get("weights", {}))

    def close(self) -> None:
        """The run is over, finished or not: release what the server half holds (files, locks). Default: nothing.
        The local backend calls it; on the Ray backend the server actor is killed instead, and the end of its
        process releases the same (files closed, locks freed)."""

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        """A client's private state, built from its own data in the process that hosts it (default: None). Each of
        the client's operations gets it and returns the next one; it stays in that process (checkpoints save it)."""
        return None


@dataclass(frozen=True)
class Exchange:
    """One round's single exchange: ``operation`` with ``tensors`` on ``clients`` (``values`` as in ctx.call)."""

    operation: str
    """The client operation to call (a ``@client_operation`` of the method)."""
    tensors: Any
    """The tensors sent: one mapping for every client, or a function of the client id."""
    clients: Iterable[int]
    """The ids of the clients called."""
    values: Any = field(default=None)
    """The operation's own values (as ``tensors``, shared or per client); None: none."""


class SingleExchange(Method):
    """Methods that are one exchange per round: ``configure`` what to send, ``aggregate`` the replies."""

    def configure(self, ctx, state: ServerState) -> Exchange:
        """What round ``ctx.round`` sends: the operation, its tensors and values, and the clients (e.g. FedAvg's
        global weights to the sampled sources, McMahan et al., AISTATS 2017, Alg. 1)."""
        raise NotImplementedError

    def aggregate(self, ctx, state: ServerState, replies: Replies) -> tuple[ServerState, dict]:
        """The new state and the round's metrics from the replies (e.g. FedAvg's mean of the clients' weights,
        weighted by their ``num_examples``)."""
        raise NotImplementedError

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """:meth:`configure`, the exchange, then :meth:`aggregate`."""
        exchange = self.configure(ctx, state)
        replies = ctx.call(exchange.operation, exchange.tensors, exchange.clients, exchange.values)
        return self.aggregate(ctx, state, replies)


class PooledReference(Method):
    """The references that move the sources' labeled data to the server on purpose and train there (centralized
    source-only, DANN and MMD on the pooled data): the clients' evaluation model and the server's model, each built
    as FedAvg's, and the sources' ``upload``. A subclass writes ``run_round`` over the pool and ``evaluate``."""

    centralized = True  # replies carry client data on purpose: the contract tests know this

    def __init__(self, config: ExperimentConfig, federation: Federation, device: str = "cpu"):
        from fedsim.methods.common.classifier import GlobalClassifier  # torch, needed only where the method runs

        super().__init__(config, federation, device)
        self.classifier = GlobalClassifier(config, federation, self.device)
        """The clients' evaluation model."""
        self.pooled = GlobalClassifier(config, federation, self.device)
        """The server's model, trained on the pool."""

    def init_server(self) -> ServerState:
        return {"weights": self.classifier.initial_weights()}

    def init_client(self, data: ClientData) -> Any:
        return {"model": self.classifier.shared()}  # "model" is transient (see Method.transient_state_keys)

    @client_operation
    def upload(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """A source client sends its (standardized) training inputs and labels to the server."""
        return labeled_upload(data), state
