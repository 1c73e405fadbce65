"""What each method's training exchanges send, and how its server uses the replies (``docs/privacy.md``).

The privacy layer reads this table to know, per method: its training stages (the operations whose replies it may
noise), what each one sends, who sends it (the population the sampling rate is counted over), how the server uses
the replies (which decides each reply's noise in the central mode), and the stages each round calls (the
calibration of a target epsilon). A method that is not in the table, or whose exchanges cannot take the noise, is
refused in one line naming why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

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
    training does not bound: a stage that sends some is refused under ``privacy.unit=record``."""


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

    def record_refusal(self) -> str:
        """Why ``privacy.unit=record`` cannot apply (empty: it can): a stage that sends records' values, or
        :attr:`record_level`."""
        for stage in self.stages:
            if stage.records:
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


def _fit(sends: str, sampled: bool = True, record_level: str = "") -> Exchanges:
    """One ``fit`` per round, its replies averaged by sample count (FedAvg, FedProx, FedBN, FedRep); its local
    update runs DP-SGD under ``privacy.unit=record`` unless ``record_level`` says why not."""
    stage = Stage("fit", SOURCES, sends, WEIGHTED)
    return Exchanges((stage,), lambda rnd, method: (("fit", sampled),), record_level)


MODEL_UPDATE = (
    "the model after its local epochs, every float tensor of the state dict (batch-norm statistics included), sent as "
    "it is and clipped as its difference from the global model; not in the data's space"
)


def _feature_alignment(config) -> Exchanges:
    """FedDANN and FedMMD (:mod:`fedsim.methods.alignment.base`): target features, then FedAvg on the sources."""
    batch = config.method.params.target_batch
    features = Stage(
        "features",
        TARGETS,
        f"encoded features of {batch} of its unlabeled training inputs ({batch} x model.hidden), the encoder's output "
        "for the target's own rows: the data's features, sent on to every source",
        EACH,
        records=f"the target's encoded features, one vector per unlabeled row ({batch} rows)",
    )
    fit = Stage("fit", SOURCES, MODEL_UPDATE, WEIGHTED)
    return Exchanges((features, fit), lambda rnd, method: (("features", False), ("fit", False)))


def _fada(config) -> Exchanges:
    """FADA (Peng et al., ICLR 2020, Alg. 1; :mod:`fedsim.methods.fada.method`): every reply is used on its own,
    by the target (deltas, gradients) or by the sources (features)."""
    p = config.method.params
    last = "disentangle" if p.disentangle else "adversarial" if p.adversarial else "fit"
    delta = "Delta_i = w_i - w_t, one tensor per model tensor (already a difference: clipped as it is)"
    stages = (
        Stage("fit", SOURCES, f"{delta} when it is the round's last source stage (model I); nothing otherwise", EACH),
        Stage(
            "features",
            TARGETS,
            f"G_t's features of {p.target_batch} of its unlabeled inputs ({p.target_batch} x feature width): the "
            "data's features, sent on to every source",
            EACH,
            records=f"G_t's features of the target's rows, one vector per row ({p.target_batch} rows)",
        ),
        Stage(
            "adversarial",
            SOURCES,
            f"the gradient of the confusion loss w.r.t. the target features ({p.target_batch} x feature width), and "
            f"{delta} at the last step when disentanglement is off",
            EACH,
            records="the confusion loss's gradient at each of the target's feature rows",
        ),
        Stage("align", TARGETS, "no tensor (a gradient norm, as a metric)", EACH),
        Stage("disentangle", SOURCES, delta, EACH),
        Stage(
            "update",
            TARGETS,
            "the new target model w_t, clipped as its difference from the w_t the server sent in the round",
            EACH,
        ),
    )

    def calls(rnd: int, method) -> tuple[tuple[str, bool], ...]:
        made: list[tuple[str, bool]] = [("fit", True)] if last == "fit" else []
        if p.adversarial:
            made += [("features", False), ("adversarial", True)] * p.adversarial_steps
        if p.disentangle:
            made.append(("disentangle", True))
        return (*made, ("update", False))

    return Exchanges(stages, calls)


def _feddadil(config) -> Exchanges:
    """FedDaDiL (Castellon et al., ICASSP 2024; :mod:`fedsim.methods.dictionary.feddadil.method`): the encoder
    stage's FedAvg rounds, then the atoms' rows every round."""
    p = config.method.params
    combined = UNIFORM if p.aggregation == "avg" else EACH
    rows = "the whole dictionary" if p.exchange == "full" else "the round's mini-batch of rows of every atom"
    standardization = p.feature_standardization  # "none": no sums travel; "all": the target's too
    stats = Stage(
        "feature_stats",
        CLIENTS if standardization == "all" else SOURCES,
        "count (an integer), sum and sum of squares of its encoded training features (d each): the encoded "
        "features' standardization, once",
        UNIFORM,
        setup=True,
        integers="the sample count",
    )
    stages = (
        Stage("fit", SOURCES, f"encoder stage: {MODEL_UPDATE}", WEIGHTED),
        *((stats,) if standardization != "none" else ()),
        Stage(
            "dil",
            CLIENTS,
            f"its version of {rows}: features (K x rows x d, in the data's own space, or the frozen encoder's) and "
            "label logits (K x rows x C, floats: soft labels), clipped as their difference from the rows sent",
            combined,
            records="atom rows fitted to its encoded batches of records (synthetic rows in the data's space)",
        ),
    )

    def calls(rnd: int, method) -> tuple[tuple[str, bool], ...]:
        encoder = method.encoder
        if encoder.is_encoder_round(rnd):
            return (("fit", True),)
        first = encoder.uses_encoder and rnd == encoder.rounds + 1  # encoder and standardization reach every client
        return (("dil", not first),)

    return Exchanges(stages, calls)


def one_fit(config) -> Exchanges:
    """One ``fit`` per round on the sources, its model updates averaged by sample count: FedAvg's exchanges, for a
    plugin method to declare as ``privacy_exchanges = staticmethod(one_fit)``."""
    return _fit(MODEL_UPDATE)


EXCHANGES: dict[str, Callable[[Any], Exchanges]] = {
    "fedavg": lambda config: _fit(MODEL_UPDATE),
    "fedprox": lambda config: _fit(MODEL_UPDATE),
    "fedbn": lambda config: _fit(
        "the model after its local epochs without its batch-norm layers (they stay on the source), clipped as its "
        "difference from the global model; not in the data's space",
        record_level="its batch-norm layers are what it keeps on each source, and record-level DP-SGD replaces "
        "batch norm with group norm (per-example gradients): it would be FedAvg",
    ),
    "fedrep": lambda config: _fit(
        "the representation after the head's and the representation's epochs (the model without its head, which "
        "stays on the source), clipped as its difference from the global one; not in the data's space",
        record_level="its head's and representation's epochs are a training loop of its own, whose steps the "
        "record-level accountant does not plan",
    ),
    "feddann": _feature_alignment,
    "fedmmd": _feature_alignment,
    "fada": _fada,
    "feddadil": _feddadil,
}
"""Method name -> its exchanges, from the run's config."""

_POOLED = (
    "is a centralized reference: its {stages} send{s} each client's {rows} and their integer labels to the server, "
    "and labels cannot be noised (a noised copy of the data is not the pooled reference either)"
)
_DETECTION = (
    "is a detection method, which fedsim's privacy layer does not cover: the server host trains on its own labeled "
    "images in the same exchanges as the clients, {why}"
)
_UPLOADS = "and the evaluation uploads {what}, which is never noised, so no guarantee would hold"
REFUSED: dict[str, str] = {
    "centralized": _POOLED.format(stages="'upload' stage", s="s", rows="training rows"),
    "dann": _POOLED.format(stages="'upload' and 'upload_inputs' stages", s="", rows="training rows"),
    "mmd": _POOLED.format(stages="'upload' and 'upload_inputs' stages", s="", rows="training rows"),
    "dadil": _POOLED.format(stages="'upload' stage", s="s", rows="training rows (or their encoded features)"),
    "fedavg_det": _DETECTION.format(
        why="and the sensitivity of an FCOS update (BN statistics, GroupNorm towers) is not analysed in fedsim"
    ),
    "fedbn_det": _DETECTION.format(why=_UPLOADS.format(what="each client's batch-norm part ('share_personal')")),
    "fedrep_det": _DETECTION.format(why=_UPLOADS.format(what="each client's head ('share_personal')")),
    "fedod": _DETECTION.format(
        why=_UPLOADS.format(
            what="each client's whole detector ('share_own', the paper's A_u, and the final fine-tunes)"
        )
    ),
}
"""Method name -> why privacy cannot apply to it."""


def method_exchanges(config) -> Exchanges:
    """The exchanges of ``config.method.name``: a built-in's entry of :data:`EXCHANGES`; for a plugin, the first
    class of its MRO that declares ``privacy_exchanges`` (a function of the config returning :class:`Exchanges`) or
    is a built-in (a plugin that subclasses FedAvg inherits FedAvg's entry). A method that cannot take the noise, or
    one that declares nothing, raises UserError naming why."""
    name = config.method.name
    supported = ", ".join(sorted(EXCHANGES))
    for owner in _owners(name):
        declared = owner.__dict__.get("privacy_exchanges") if isinstance(owner, type) else None
        builtin = owner if isinstance(owner, str) else owner.__dict__.get("registry_name")
        if declared is not None:
            return declared.__func__(config) if isinstance(declared, staticmethod) else declared(config)
        if builtin in REFUSED:
            raise UserError(f"privacy cannot apply to method {name!r}: it {REFUSED[builtin]}; use one of {supported}")
        if builtin in EXCHANGES:
            return EXCHANGES[builtin](config)
    raise UserError(
        f"privacy cannot apply to method {name!r}: fedsim does not know what its exchanges send (what to clip, how "
        "its server combines the replies); declare them as the class attribute privacy_exchanges = staticmethod("
        "lambda config: fedsim.privacy.Exchanges(...)), subclass a method that has them, or use one of " + supported
    )


def _owners(name: str) -> list:
    """A built-in's name alone (its module is not imported); a plugin's classes, most derived first."""
    if name in EXCHANGES or name in REFUSED:
        return [name]
    from fedsim.registry import METHODS

    return list(METHODS.get(name).__mro__)


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
