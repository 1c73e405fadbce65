"""The vocabulary in which a method declares what its training exchanges send (``docs/privacy.md``), and the
function that reads a method's declaration.

Each method class declares, next to its code, either ``privacy_exchanges``, a function of the run's config that
returns its :class:`Exchanges` (its training stages: what each one sends, who sends it, who reads it, how the server
uses the replies, which decides each reply's noise in the central mode; and the stages each round calls, for the
calibration of a target epsilon), or ``privacy_refusal``, why privacy cannot apply to it. A subclass inherits its
base's declaration; a method that declares neither is refused in one line naming what to declare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from fedsim.errors import UserError

WEIGHTED = "weighted"
"""The server sums the replies weighted by their sample counts (FedAvg's mean, McMahan et al. 2017, Alg. 1)."""
UNIFORM = "mean"
"""The server sums the replies with equal weights (FedDaDiL's ``avg`` aggregation)."""
EACH = "each"
"""The server, or the client it forwards them to, uses every reply on its own (features, deltas weighed one by one,
one version drawn): no sum hides a reply."""

SOURCES, TARGETS, CLIENTS = "sources", "targets", "clients"
"""Who sends in a stage: the labeled source clients, the target's clients, or every client."""

EVALUATION_STAGES = frozenset({"evaluate", "share_head", "share_personal", "share_own"})
"""Operations a method calls in its evaluation only: never noised (the simulator's measurement)."""
SETUP_STAGES = frozenset({"data_stats", "data_standardize"})
"""The data standardization run before round 1 (:mod:`fedsim.data.normalization`): never noised."""


NO_DP_SGD = "its local update is not declared to be DP-SGD steps of the shared training loop"
"""Why a method's exchanges do not admit ``privacy.unit=record`` unless they say otherwise."""


@dataclass(frozen=True)
class Stage:
    """One training exchange of a method."""

    operation: str
    """The client operation called."""
    senders: str
    """Who replies: :data:`SOURCES`, :data:`TARGETS` or :data:`CLIENTS`."""
    sends: str
    """What a reply carries, its shape, and whether it lives in the data's own space."""
    combined: str
    """How the server uses the replies: :data:`WEIGHTED`, :data:`UNIFORM` or :data:`EACH`."""
    setup: bool = False
    """A standardization of the encoded features: never noised, as the data's own standardization."""
    integers: str = ""
    """The integer tensors it sends, which noise cannot protect (a stage that sends some is refused)."""
    records: str = ""
    """The values of single records it sends (one feature vector per row, say), which DP-SGD inside the sender's
    training does not bound: a stage that sends some is refused under ``privacy.unit=record`` unless it has a
    :attr:`record_mechanism`."""
    record_mechanism: str = ""
    """The mechanism that bounds each record's influence on this stage's values under ``privacy.unit=record``
    (per-row clipping and Gaussian noise on the sender, say); empty: none."""
    readers: str = "the server"
    """Who reads each reply: the server, and whoever it forwards the replies to (the target's features sent on to
    every source)."""
    tensors: bool = True
    """Whether its replies carry float tensors (False: a metric only, nothing to noise and nothing spent)."""


@dataclass(frozen=True)
class Exchanges:
    """A method's training stages and the calls each round makes."""

    stages: tuple[Stage, ...]
    """Every training stage, in the order a round calls them."""
    calls: Callable[[int, Any], tuple[tuple[str, bool], ...]]
    """``calls(round, method)``: the (operation, sampled) of every call of that round whose replies carry float
    tensors, in order, repeats included; ``sampled``: ``run.clients_per_round`` draws its senders."""
    record_level: str = NO_DP_SGD
    """Why ``privacy.unit=record`` cannot apply to the method; empty when every local step is a step of the shared
    training loop (:meth:`fedsim.methods.common.classifier.GlobalClassifier.train`), which runs DP-SGD, and the
    stages send nothing but what those steps computed."""

    record_epochs: Optional[Callable[[Any], int]] = None
    """``record_epochs(config)``: the epochs of DP-SGD steps one local update takes under ``privacy.unit=record``
    (default ``method.local_epochs``; FedRep's head epochs and representation epochs), which the accountant plans."""

    def record_refusal(self) -> str:
        """Why ``privacy.unit=record`` cannot apply (empty: it can): a stage that sends records' values with no
        :attr:`Stage.record_mechanism` to bound them, or :attr:`record_level`."""
        for stage in self.stages:
            if stage.records and not stage.record_mechanism:
                return (
                    f"its {stage.operation!r} exchange sends {stage.records}, values of single records that DP-SGD "
                    "does not bound"
                )
        return self.record_level

    def stage(self, operation: str) -> Stage:
        return next(s for s in self.stages if s.operation == operation)

    @property
    def operations(self) -> tuple[str, ...]:
        return tuple(s.operation for s in self.stages)

    @property
    def default_stages(self) -> tuple[str, ...]:
        """The stages noised when ``privacy.stages`` is empty: every one but the setup stages."""
        return tuple(s.operation for s in self.stages if not s.setup)


MODEL_UPDATE = (
    "the model after its local epochs, every float tensor of the state dict (batch-norm statistics included), sent as "
    "it is and clipped as its difference from the global model; not in the data's space"
)


def fit_exchanges(
    sends: str, sampled: bool = True, record_level: str = "", record_epochs: Optional[Callable[[Any], int]] = None
) -> Exchanges:
    """One ``fit`` per round, its replies averaged by sample count (FedAvg, FedProx, FedBN, FedRep); its local
    update runs DP-SGD under ``privacy.unit=record`` unless ``record_level`` says why not."""
    stage = Stage("fit", SOURCES, sends, WEIGHTED)
    return Exchanges((stage,), lambda rnd, method: (("fit", sampled),), record_level, record_epochs)


def one_fit(config) -> Exchanges:
    """One ``fit`` per round on the sources, its model updates averaged by sample count: FedAvg's exchanges, for a
    plugin method to declare as ``privacy_exchanges = staticmethod(one_fit)``."""
    return fit_exchanges(MODEL_UPDATE)


def pooled_refusal(stages: str, rows: str = "training rows") -> str:
    """A centralized reference's ``privacy_refusal``: its upload ``stages`` ("'upload' stage") send each client's
    ``rows`` and their integer labels to the server."""
    verb = "sends" if stages.endswith("stage") else "send"
    return (
        f"is a centralized reference: its {stages} {verb} each client's {rows} and their integer labels to the "
        "server, and labels cannot be noised (a noised copy of the data is not the pooled reference either)"
    )


def method_exchanges(config) -> Exchanges:
    """The exchanges of ``config.method.name``, read from the first class of the method's MRO that declares
    ``privacy_exchanges`` (a function of the config returning :class:`Exchanges`: a staticmethod, a classmethod or a
    plain function) or ``privacy_refusal`` (why privacy cannot apply): a plugin that subclasses FedAvg inherits
    FedAvg's. A method that refuses, or one that declares nothing, raises UserError naming why."""
    from fedsim.registry import METHODS

    name = config.method.name
    method = METHODS.get(name)
    owner = declaring_class(method)
    if owner is None:
        raise UserError(
            f"privacy cannot apply to method {name!r}: fedsim does not know what its exchanges send (what to clip, "
            "how its server combines the replies); declare them as the class attribute privacy_exchanges = "
            "staticmethod(lambda config: fedsim.privacy.Exchanges(...)), subclass a method that has them, or use one "
            "of " + ", ".join(supported_methods())
        )
    if "privacy_refusal" in owner.__dict__:
        why = owner.__dict__["privacy_refusal"]
        raise UserError(
            f"privacy cannot apply to method {name!r}: it {why}; use one of {', '.join(supported_methods())}"
        )
    return owner.__dict__["privacy_exchanges"].__get__(None, method)(config)


def declaring_class(method: type) -> Optional[type]:
    """The first class of ``method``'s MRO that declares ``privacy_exchanges`` or ``privacy_refusal`` (None: none)."""
    return next((c for c in method.__mro__ if {"privacy_exchanges", "privacy_refusal"} & c.__dict__.keys()), None)


def supported_methods() -> list[str]:
    """The built-in methods whose class, or a base of it, declares its exchanges, sorted."""
    from fedsim.registry import METHODS

    owners = {name: declaring_class(METHODS.get(name)) for name in METHODS.builtin_names()}
    return sorted(name for name, owner in owners.items() if owner is not None and "privacy_exchanges" in owner.__dict__)


def sampling_rate(senders: int, called: int) -> float:
    """The share of a stage's population that one call asks: ``called`` of ``senders`` clients."""
    return min(1.0, called / senders) if senders else 1.0


def population(senders: str, federation) -> int:
    """How many clients can send in a stage of ``senders``."""
    ids = {SOURCES: federation.source_ids, TARGETS: federation.target_ids, CLIENTS: federation.client_ids}[senders]
    return len(ids)


def sample_size(config, candidates: int) -> int:
    """How many of ``candidates`` clients ``run.clients_per_round`` draws (:meth:`fedsim.methods.base.Method.
    sample_clients`'s count)."""
    wanted = config.run.clients_per_round
    if wanted is None:
        return candidates
    count = int(wanted) if wanted >= 1 else max(1, round(wanted * candidates))
    return min(count, candidates)
