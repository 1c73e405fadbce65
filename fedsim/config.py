"""Experiment configuration: frozen dataclasses, YAML in, dotted overrides.

    cfg = load_config("experiments/configs/digits-fedavg.yaml", ["method.lr=0.01", "run.rounds=5"])

Unknown keys are rejected with the closest valid name. Method-specific
parameters live in ``method.<name>`` and are checked against the method's own
``Params`` dataclass (for example ``method.mu`` for FedProx); a benchmark's own
options live in ``data.<name>`` and are checked against its ``Options``
dataclass (for example ``data.variant`` for TEP).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Optional

import yaml

from fedsim.coercion import NoOptions, bare_off, build_checked, closest
from fedsim.errors import UserError
from fedsim.privacy.accountant import ACCOUNTANTS
from fedsim.recipes import apply_recipe
from fedsim.validation import validate


def default_cache_dir() -> str:
    """``data.cache_dir``'s default: the ``FEDSIM_CACHE`` environment variable, else ``~/.cache/fedsim``."""
    return os.environ.get("FEDSIM_CACHE", str(Path.home() / ".cache" / "fedsim"))


def check_all(checks: Iterable[tuple[bool, str]]) -> None:
    """Raise the message of the first failing ``(ok, message)`` check as a :class:`fedsim.errors.UserError`."""
    for ok, message in checks:
        if not ok:
            raise UserError(message)


def positive_number(value) -> bool:
    """Whether ``value`` is a finite number above 0 (a bool is not a number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


@dataclass(frozen=True)
class DataConfig:
    """What every benchmark shares; ``options`` holds the benchmark's own frozen ``Options`` dataclass."""

    benchmark: str = "digits"
    """The benchmark's registered name (``--benchmark``; see :data:`fedsim.registry.BENCHMARKS`)."""
    target: str = "auto"
    """The target domain, unlabeled for training (``--target``); "auto": the benchmark's ``default_target``
    (digits: mnistm)."""
    clients_per_domain: int = 1
    """The clients that share each domain's data (``--clients-per-domain``)."""
    partition: str = "iid"
    """How a domain's training split is shared out among its clients: "iid" or "dirichlet" (label skew); the test
    split is always shared out IID."""
    dirichlet_alpha: float = 0.5
    """The concentration of the "dirichlet" partition: each class is spread over a domain's clients by proportions
    drawn from Dir(alpha) (Hsu et al. 2019); the smaller, the stronger the skew."""
    seed: int = 0
    """Fixes domain construction, train/test splits and partitions; independent of ``run.seed``."""
    root: Optional[str] = None
    """The folder of the user's own files (npz files, the real-file loaders' data)."""
    cache_dir: str = field(default_factory=default_cache_dir)
    """Where built domains are cached on disk (:func:`default_cache_dir`)."""
    max_train_per_domain: Optional[int] = None
    """At most this many training samples per domain, class proportions kept (for quick runs); None: all."""
    sources: tuple[str, ...] = ()
    """The source domains (``--sources``); empty: every domain but the target."""
    normalization: str = "auto"
    """Feature standardization: "auto" (the benchmark's ``default_normalization``), "none", "federated" (one mean
    and spread from the clients' summed statistics) or "per-domain" (:mod:`fedsim.data.normalization`)."""
    validation_fraction: float = 0.0
    """The share of each source client's training part held out as its validation split
    (``ClientData.validation``), in [0, 1): each class keeps round(fraction x its rows) of the client's rows apart,
    drawn from ``seed`` and the domain; the target holds none. 0: none, every source row trains, as the papers'
    protocols train on the whole source split. A model-selection score read on the sources' validation parts
    (source_accuracy, source_loss, iwv, dev: ``run.scores``, ``fedsim sweep --select``) needs it set; DomainBed's
    training-domain validation holds out 20 % (Gulrajani & Lopez-Paz, ICLR 2021): ``--set
    data.validation_fraction=0.2``."""
    options: Any = field(default_factory=NoOptions)
    """The benchmark's own frozen dataclass (``Benchmark.Options``), set by ``data.<field>`` keys."""

    def __post_init__(self):
        check_all(
            [
                (
                    self.clients_per_domain > 0,
                    f"data.clients_per_domain must be positive, got {self.clients_per_domain}: "
                    "pass --clients-per-domain 1 or more",
                ),
                (
                    self.partition in ("iid", "dirichlet"),
                    f"data.partition must be 'iid' or 'dirichlet', got {self.partition!r}",
                ),
                (
                    self.normalization in ("auto", "none", "federated", "per-domain"),
                    f"data.normalization must be auto, none, federated or per-domain, got {self.normalization!r}",
                ),
                (self.target not in self.sources, f"data.sources must not contain the target {self.target!r}"),
                (self.dirichlet_alpha > 0, f"data.dirichlet_alpha must be positive, got {self.dirichlet_alpha}"),
                (
                    self.max_train_per_domain is None or self.max_train_per_domain > 0,
                    "data.max_train_per_domain must be positive",
                ),
                (
                    0 <= self.validation_fraction < 1,
                    f"data.validation_fraction must be in [0, 1), got {self.validation_fraction}: the share of each "
                    "source client's training part held out for validation (0: none; DomainBed holds out 0.2)",
                ),
            ]
        )


@dataclass(frozen=True)
class ModelConfig:
    """The ``model`` section: which registered model the methods build, its width, and the model's own options."""

    name: str = "auto"
    """The model's registered name (:data:`fedsim.registry.MODELS`); "auto" chooses from the input shape: ``cnn``
    for images, ``cnn1d`` for multichannel signals (channels x length), ``mlp`` for feature vectors."""
    hidden: int = 128
    """The width of the encoder's output, the features the head classifies (the model function's ``hidden``)."""
    options: Any = field(default_factory=NoOptions)
    """The model's own frozen dataclass (its ``Options``, :func:`fedsim.models.declares`), set by ``model.<field>``
    keys (a ResNet's ``weights``, ``backbone`` and ``head``)."""


@dataclass(frozen=True)
class NoParams:
    """A method without parameters of its own."""


@dataclass(frozen=True)
class MethodConfig:
    """The ``method`` section: the method, the settings of its local update (:class:`fedsim.messages.LocalSettings`)
    and its own ``Params``. A method may change these defaults (``Method.config_defaults``)."""

    name: str = "fedavg"
    """The method's registered name (``--method``; see :data:`fedsim.registry.METHODS`)."""
    local_epochs: int = 1
    """Epochs over a client's training split per local update (``--local-epochs``)."""
    batch_size: int = 32
    """The mini-batch size of local training."""
    lr: float = 0.05
    """SGD's learning rate in local training."""
    momentum: float = 0.9
    """SGD's momentum in local training (a fresh optimizer every local update)."""
    weight_decay: float = 0.0
    """SGD's L2 weight decay in local training."""
    params: Any = field(default_factory=NoParams)
    """The method's own frozen dataclass (``Method.Params``), set by ``method.<field>`` keys (``method.mu`` for
    FedProx)."""

    def __post_init__(self):
        check_all(
            [
                (
                    self.local_epochs > 0,
                    f"method.local_epochs must be positive, got {self.local_epochs}: pass --local-epochs 1 or more",
                ),
                (self.batch_size > 0, f"method.batch_size must be positive, got {self.batch_size}"),
                (self.lr > 0, f"method.lr must be positive, got {self.lr}"),
            ]
        )


@dataclass(frozen=True)
class RunConfig:
    """The ``run`` section: rounds, seed, backend, evaluation, checkpoints and what a run writes or shows."""

    rounds: int = 20
    """The federated rounds to run (``--rounds``)."""
    seed: int = 0
    """The run's root seed (``--seed``): the model's initialization, client sampling and every client operation's
    seed derive from it (:mod:`fedsim.seeding`); independent of ``data.seed``."""
    backend: str = "ray"
    """The backend (``--backend``): "ray" (client actors on a Ray cluster) or "local" (every client in this process,
    one after the other)."""
    precision: str = "fp32"
    """The clients' forward passes in training and evaluation: "fp32" (float32 throughout) or "bf16" (bfloat16
    autocast on the CPU or the GPU, weights and optimizer in float32; :mod:`fedsim.methods.common.precision`,
    ``docs/gpu.md``)."""
    address: Optional[str] = None
    """The Ray cluster: None starts a fresh local one; "auto" or host:port joins a running one."""
    out: Optional[str] = None
    """Not read by a run: ``fedsim run`` takes its run directory from ``--out`` and :func:`fedsim.api.run` from its
    ``out`` argument; ``fedsim sweep`` refuses the key."""
    eval_every: int = 1
    """Evaluate every this many rounds; the last round is always evaluated."""
    clients_per_round: Optional[float] = None
    """The clients that work in a round (``--clients-per-round``), drawn from the seed: None, all; an integer
    >= 1, that many; a fraction in (0, 1), that share."""
    checkpoint_every: int = 5
    """Rounds between checkpoints in the run directory (0: none); ``fedsim run --resume DIR`` continues from the
    last one."""
    early_stop_patience: Optional[int] = None
    """Stop after this many evaluated rounds without a gain of the mean source accuracy (None: never); target
    labels are never used."""
    tensorboard: bool = True
    """Write TensorBoard events to ``tb/`` in the run directory."""
    progress: bool = True
    """Show a progress bar over the rounds."""
    scores: str = "auto"
    """The model-selection scores each evaluation reports as ``score_<name>`` (:data:`fedsim.selection.SCORES`,
    every one higher-is-better and computed without target labels): "auto", the cheap scores whose inputs exist
    (source_accuracy and source_loss only with ``data.validation_fraction`` above 0); "none"; or a comma list of
    names (iwv and dev, on request only, add one exchange of feature moments to the evaluation). Detection methods
    report none."""
    recipe: str = "auto"
    """"auto": the keys of the method and benchmark's recipe that the config leaves unset take the recipe's values
    (the paper protocol's settings, :mod:`fedsim.recipes`); "none": the bare defaults."""
    cache_dir: Optional[str] = None
    """Where stages that runs share are kept once computed (FedDaDiL's and DaDiL's encoder stage;
    :mod:`fedsim.methods.common.stage_cache`), keyed by all they depend on; the numbers, bytes included, are the
    same with or without it. None: no such cache (``fedsim sweep`` and ``fedsim reproduce`` give each grid
    ``<out>/cache``)."""

    def __post_init__(self):
        check_all(
            [
                (self.rounds > 0, f"run.rounds must be a positive integer, got {self.rounds}: pass --rounds 1 or more"),
                (
                    self.backend in ("ray", "local"),
                    f"run.backend must be 'ray' or 'local', got {self.backend!r}: "
                    "pass --backend ray or --backend local",
                ),
                (
                    self.clients_per_round is None or self.clients_per_round > 0,
                    f"run.clients_per_round must be positive, got {self.clients_per_round}: pass a count or a fraction",
                ),
                (
                    self.checkpoint_every >= 0,
                    f"run.checkpoint_every must be 0 (off) or positive, got {self.checkpoint_every}",
                ),
                (self.eval_every > 0, f"run.eval_every must be positive, got {self.eval_every}"),
                (
                    self.precision in ("fp32", "bf16"),
                    f"run.precision must be 'fp32' or 'bf16', got {self.precision!r}: e.g. --set run.precision=bf16",
                ),
            ]
        )


@dataclass(frozen=True)
class ResourcesConfig:
    """The ``resources`` section: what a client gets, and whether clients' steps are batched together."""

    cpus_per_client: float = 1.0
    """The CPUs a Ray client actor reserves (a cluster holds at most its CPUs / this many actors), and a client's
    torch threads on either backend (rounded down, at least 1)."""
    gpus_per_client: float = 0.0
    """The GPUs a Ray client actor reserves (a fraction shares one); above 0 the clients run on CUDA, on either
    backend (the local backend runs them, and its server half, on this process's GPU). Without CUDA (a Ray cluster
    without GPUs, a machine without one) they run on the CPU, with a warning."""
    vectorize: str = "off"
    """Batched clients: "off", each client's operation runs alone (the committed results); "auto", the local SGD of
    the clients in one call runs as one batched computation where it is faster
    (:mod:`fedsim.methods.common.vectorized`, ``docs/performance.md``)."""
    groups: Optional[dict] = field(default=None, hash=False)
    """Other ``cpus_per_client`` and ``gpus_per_client`` for a group of clients: ``{group: {key: value}}``, a group
    being a role ("source", "target") or a domain of the benchmark, e.g.
    ``--set 'resources.groups={target: {gpus_per_client: 0.5}}'``. Key by key, a client takes its domain's value,
    else its role's, else the section's. They place work only: Ray client actors reserve them (clients of different
    resources never share an actor, ``docs/cluster.md``), while every client's torch threads follow the section's
    ``cpus_per_client`` on both backends, so that the numbers do not depend on the groups."""

    GROUP_ROLES: ClassVar[tuple[str, ...]] = ("source", "target")
    """The roles ``groups`` may name (beside the benchmark's domains)."""
    GROUP_KEYS: ClassVar[tuple[str, ...]] = ("cpus_per_client", "gpus_per_client")
    """The keys a group may override."""

    def __post_init__(self):
        object.__setattr__(self, "vectorize", bare_off(self.vectorize))  # YAML reads a bare `off` as false
        check_all(
            [
                (
                    self.cpus_per_client > 0,
                    f"resources.cpus_per_client must be positive, got {self.cpus_per_client}: "
                    "pass --cpus-per-client 0.5 or more",
                ),
                (self.gpus_per_client >= 0, f"resources.gpus_per_client must be 0 or more, got {self.gpus_per_client}"),
                (
                    self.vectorize in ("off", "auto"),
                    f"resources.vectorize must be 'off' or 'auto', got {self.vectorize!r}: "
                    "e.g. --set resources.vectorize=auto",
                ),
            ]
        )
        self._check_groups()

    def _check_groups(self) -> None:
        """``groups`` maps names to overrides of ``cpus_per_client`` (positive) and ``gpus_per_client`` (0 or more),
        and of nothing else; whether a name is a role or a domain of the benchmark is checked with the data
        (:func:`fedsim.validation.check_resource_groups`)."""
        groups, keys = self.groups, list(self.GROUP_KEYS)
        example = "e.g. --set 'resources.groups={target: {gpus_per_client: 0.5}}'"
        if groups is None:
            return
        if not isinstance(groups, dict):
            raise UserError(f"resources.groups must map client groups to resources, got {groups!r}: {example}")
        for name, overrides in groups.items():
            where = f"resources.groups.{name}"
            if not isinstance(overrides, dict):
                raise UserError(f"{where} must map {' and '.join(keys)} to numbers, got {overrides!r}: {example}")
            for key, value in overrides.items():
                if key not in keys:
                    match = difflib.get_close_matches(str(key), keys, n=1)
                    hint = f": did you mean {match[0]!r}?" if match else ""
                    raise UserError(f"unknown config key '{where}.{key}': a group sets {' and '.join(keys)} only{hint}")
                number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                if key == "cpus_per_client" and not (number and value > 0):
                    raise UserError(f"{where}.{key} must be a positive number, got {value!r}")
                if key == "gpus_per_client" and not (number and value >= 0):
                    raise UserError(f"{where}.{key} must be 0 or a positive number, got {value!r}")

    @property
    def asks_gpus(self) -> bool:
        """Whether some client may ask for GPUs: ``gpus_per_client`` or a group's is above 0."""
        return self.gpus_per_client > 0 or any(
            (g or {}).get("gpus_per_client", 0) > 0 for g in (self.groups or {}).values()
        )

    def of_client(self, domain: str, role: str) -> tuple[float, float]:
        """The (CPUs, GPUs) a client of ``domain`` in ``role`` asks for: the section's values, replaced key by key
        by its role's group, then by its domain's."""
        values = {key: getattr(self, key) for key in self.GROUP_KEYS}
        for group in (role, domain):
            values.update((self.groups or {}).get(group) or {})
        return float(values["cpus_per_client"]), float(values["gpus_per_client"])


@dataclass(frozen=True)
class RayConfig:
    """Settings of the Ray backend only (read by ``actors/``; the local backend ignores them)."""

    max_restarts: int = 3
    """Attempts to recreate a dead client actor within one operation."""
    call_timeout_s: float = 0.0
    """A client call silent this long counts as failed (0: wait forever)."""
    max_actors: Optional[int] = None
    """The most client actors (None: as many as the cluster's CPUs allow, at most one per client)."""
    inject_faults: int = 0
    """Kill this many client actors at seeded rounds (recovery demo and tests)."""
    runtime_env: Optional[dict] = field(default=None, hash=False)
    """The Ray runtime environment of the run's workers (``pip``, ``py_modules``, ``env_vars``, ...) when fedsim
    starts or joins the cluster; fedsim adds what the workers need to import the run's plugins."""

    def __post_init__(self):
        env = self.runtime_env
        if env is not None and not (isinstance(env, dict) and all(isinstance(key, str) for key in env)):
            raise UserError(
                f"ray.runtime_env must be a mapping of Ray runtime-environment fields, got {env!r}: "
                "e.g. --set 'ray.runtime_env={pip: [mypkg]}'"
            )
        check_all(
            [
                (self.max_restarts >= 0, f"ray.max_restarts must be 0 or more, got {self.max_restarts}"),
                (
                    self.call_timeout_s >= 0,
                    f"ray.call_timeout_s must be 0 (wait forever) or more, got {self.call_timeout_s}",
                ),
                (
                    self.max_actors is None or self.max_actors > 0,
                    f"ray.max_actors must be positive, got {self.max_actors}",
                ),
                (
                    self.inject_faults >= 0,
                    f"ray.inject_faults must be 0 or more, got {self.inject_faults}: pass --inject-faults 0 or more",
                ),
            ]
        )


def _trace_check(key: str, path) -> tuple[bool, str]:
    ok = path is None or str(path).lower().endswith((".csv", ".json"))
    return ok, f"clients.{key} must name a .csv or .json file, got {path!r}: see docs/unreliable.md for the format"


@dataclass(frozen=True)
class ClientsConfig:
    """The ``clients`` section: source clients that are unavailable, fail mid-round or lag, on a simulated clock
    (:mod:`fedsim.runtime.unreliable`, ``docs/unreliable.md``). The defaults turn it all off."""

    availability: float = 1.0
    """The probability that a source client is available in a round, drawn per round and client from the seed;
    a sampled client that is unavailable gets nothing and sends nothing. ``clients.dropout`` p, the probability
    that a source sits out a round, may be given instead: it sets this to 1 - p."""
    availability_trace: Optional[str] = None
    """A CSV (``round,client`` rows) or JSON (``{"round": [client ids]}``) file of the clients available in each
    round it lists; rounds it does not list have every client available. Applies together with ``availability``."""
    failure_rate: float = 0.0
    """The probability that a source client fails in a call after it received its instruction, drawn per round,
    client and call: its reply is lost."""
    on_failure: str = "drop"
    """After a failure: "drop" (the method aggregates the replies that arrived; the client is gone for the rest of
    the round) or "wait" (the client redoes the work until it answers: same numbers, more time and bytes)."""
    speed_spread: float = 0.0
    """The spread (sigma of the log) of the lognormal factors, median 1, of each client's compute and link speed,
    drawn once per run and client from the seed; 0: every client equal."""
    speed_trace: Optional[str] = None
    """A CSV (``client,speed,link_mbps`` rows) or JSON (``{"client": {"speed": s, "link_mbps": m}}``) file of
    per-client compute speed factors and link speeds; it replaces the drawn values of the clients it lists."""
    seconds_per_sample: float = 0.001
    """Simulated compute seconds for one training sample and local epoch on a client of speed 1."""
    link_mbps: float = 100.0
    """The median link speed of a client in megabits per second (both directions)."""
    deadline_seconds: Optional[float] = None
    """The simulated seconds a call waits for its sources' replies: a later reply is discarded (the source is a
    dropped straggler for the rest of the round). None: wait for every reply."""
    clock: bool = False
    """Report the simulated clock and who answered (``virtual_seconds``, ``clients_answered``) with every other
    key of this section at its default; any other setting reports them too."""

    def __post_init__(self):
        check_all(
            [
                (
                    0 < self.availability <= 1,
                    f"clients.availability must be in (0, 1], got {self.availability}: the probability that a "
                    "source client is available in a round (1: always)",
                ),
                (
                    0 <= self.failure_rate < 1,
                    f"clients.failure_rate must be in [0, 1), got {self.failure_rate}: the probability that a "
                    "call's reply is lost (0: never)",
                ),
                (
                    self.on_failure in ("drop", "wait"),
                    f"clients.on_failure must be 'drop' or 'wait', got {self.on_failure!r}",
                ),
                (
                    self.speed_spread >= 0,
                    f"clients.speed_spread must be 0 (equal clients) or more, got {self.speed_spread}",
                ),
                (
                    self.seconds_per_sample > 0,
                    f"clients.seconds_per_sample must be positive, got {self.seconds_per_sample}",
                ),
                (self.link_mbps > 0, f"clients.link_mbps must be positive, got {self.link_mbps}"),
                (
                    self.deadline_seconds is None or self.deadline_seconds > 0,
                    f"clients.deadline_seconds must be positive, got {self.deadline_seconds}: or leave it out "
                    "(no deadline)",
                ),
                _trace_check("availability_trace", self.availability_trace),
                _trace_check("speed_trace", self.speed_trace),
            ]
        )

    @property
    def active(self) -> bool:
        """Whether any key differs from its default (the simulation and its metrics are on)."""
        return self != ClientsConfig()

    @property
    def drops_replies(self) -> bool:
        """Whether a source's reply can go missing (unavailable, failed and dropped, or late)."""
        return (
            self.availability < 1
            or self.availability_trace is not None
            or (self.failure_rate > 0 and self.on_failure == "drop")
            or self.deadline_seconds is not None
        )


PRIVACY_ACCOUNTANTS: tuple[str, ...] = tuple(ACCOUNTANTS)
"""The values of ``privacy.accountant``, the default first (:data:`fedsim.privacy.accountant.ACCOUNTANTS`)."""
PRIVACY_UNITS = ("client", "record")
"""The values of ``privacy.unit``, the default first."""
DEFAULT_DELTA = 1e-5
"""``privacy.delta`` when only ``privacy.noise_multiplier`` is given: the delta the spent epsilon is reported at."""


@dataclass(frozen=True)
class PrivacyConfig:
    """The ``privacy`` section: clipping and Gaussian noise on what clients send in the training exchanges, and the
    privacy spent (:mod:`fedsim.privacy`, ``docs/privacy.md``). Off by default: no key set."""

    noise_multiplier: Optional[float] = None
    """z: the noise's standard deviation in units of the clip (z x ``clip``); None with ``epsilon`` unset: off."""
    epsilon: Optional[float] = None
    """The whole run's privacy budget: z is calibrated by the accountant so that every round together spends at
    most this at ``delta`` (instead of ``noise_multiplier``, never both)."""
    delta: Optional[float] = None
    """The delta of the (epsilon, delta) guarantee; required with ``epsilon``; 1e-5 when only ``noise_multiplier``
    is given."""
    clip: Optional[float] = None
    """C: the L2 bound of one client's contribution to one exchange (its float tensors, or their difference from
    the model the server sent); required when on."""
    stage_clip: Optional[dict] = field(default=None, hash=False)
    """``{operation: C}``: another bound for the stages it names (a feature matrix is not on a model update's
    scale), e.g. ``--set 'privacy.stage_clip={features: 50}'``; under ``privacy.unit=record`` the bound of one row
    of a stage that sends records' rows (FedDANN's ``features``)."""
    mode: str = "central"
    """Whom the noise protects against: "central", client-level DP-FedAvg (McMahan et al., ICLR 2018), noise of
    std z C on the sum the server aggregates, for whoever sees what the server releases; "local", noise of std z C
    on every reply, private against the server itself; or a plugin mechanism, ``module.path:Class`` or an entry
    point of group ``fedsim.privacy`` (:class:`fedsim.privacy.mechanism.Mechanism`)."""
    stages: tuple[str, ...] = ()
    """The operations whose replies are noised; empty: every training exchange of the method (evaluation and setup
    stages never are)."""
    accountant: str = "rdp"
    """How the spent budget is counted: "rdp" (Renyi DP, Mironov 2017) or "pld" (privacy loss distributions),
    both from Google's dp_accounting."""
    unit: str = "client"
    """What one unit of privacy is: "client", one client's whole data in every exchange (the noise on its replies,
    as above); "record", one training record, protected by DP-SGD inside each client's local training
    (:mod:`fedsim.privacy.dpsgd`: per-example clipping to ``clip``, Gaussian noise, Poisson-sampled batches)."""

    @property
    def active(self) -> bool:
        """Whether clients' replies are noised (a noise multiplier or a budget is given)."""
        return self.noise_multiplier is not None or self.epsilon is not None

    @property
    def target_delta(self) -> float:
        """The delta the spent epsilon is reported at (:data:`DEFAULT_DELTA` when none is given)."""
        return DEFAULT_DELTA if self.delta is None else self.delta

    def __post_init__(self):
        """The section's own rules; whether the method's stages can take the noise is checked with the method
        (:func:`fedsim.validation.check_privacy`)."""
        z, epsilon, delta, clip, stage_clip = (
            self.noise_multiplier,
            self.epsilon,
            self.delta,
            self.clip,
            self.stage_clip,
        )
        given = sorted(f"privacy.{f.name}" for f in fields(self) if getattr(self, f.name) != f.default)
        check_all(
            [
                (
                    self.active or not given,
                    f"{', '.join(given)} set but privacy is off: give privacy.noise_multiplier or privacy.epsilon "
                    "(or leave the section out)",
                ),
                (
                    z is None or epsilon is None,
                    "privacy.noise_multiplier and privacy.epsilon are two ways to set the noise: give one, not both",
                ),
                (z is None or positive_number(z), f"privacy.noise_multiplier must be a positive number, got {z}"),
                (
                    epsilon is None or positive_number(epsilon),
                    f"privacy.epsilon must be a positive number, got {epsilon}",
                ),
                (
                    epsilon is None or delta is not None,
                    "privacy.epsilon needs privacy.delta, the delta of the (epsilon, delta) budget: e.g. "
                    "privacy.delta=1e-5",
                ),
                (delta is None or 0 < delta < 1, f"privacy.delta must be in (0, 1), got {delta}"),
                (
                    not self.active or clip is not None,
                    "privacy.clip is required with privacy on: the L2 bound of one client's contribution to an "
                    "exchange, e.g. privacy.clip=1.0",
                ),
                (clip is None or positive_number(clip), f"privacy.clip must be a positive number, got {clip}"),
                (
                    stage_clip is None
                    or (isinstance(stage_clip, dict) and all(positive_number(v) for v in stage_clip.values())),
                    f"privacy.stage_clip must map stages to positive bounds, got {stage_clip!r}: e.g. "
                    "--set 'privacy.stage_clip={features: 50}'",
                ),
            ]
            + self._choice_rules()
        )
        if self.active:
            from fedsim.privacy.mechanism import make_mechanism

            make_mechanism(self)  # the mechanism privacy.mode names, found and checking its own settings

    def _choice_rules(self) -> list:
        """The accountant and unit named, and what privacy.unit=record leaves out."""
        return [
            (
                self.accountant in PRIVACY_ACCOUNTANTS,
                f"privacy.accountant must be one of {', '.join(PRIVACY_ACCOUNTANTS)}, got {self.accountant!r}",
            ),
            (self.unit in PRIVACY_UNITS, f"privacy.unit must be one of {', '.join(PRIVACY_UNITS)}, got {self.unit!r}"),
            (
                self.unit != "record" or (not self.stages and self.mode == "central"),
                "privacy.stages and privacy.mode choose how replies are noised, which privacy.unit=record does not "
                "do (DP-SGD noises each client's gradient steps): leave them out",
            ),
        ]


MOVED_KEYS = {
    "run.inject_faults": "ray.inject_faults",
    "resources.max_restarts": "ray.max_restarts",
    "resources.call_timeout_s": "ray.call_timeout_s",
    "resources.max_actors": "ray.max_actors",
}
"""Keys that moved to the ``ray`` section -> their key there: a config that uses one gets one line naming it."""

KEYWORDS = {
    "method": "method.name",
    "benchmark": "data.benchmark",
    "target": "data.target",
    "sources": "data.sources",
    "rounds": "run.rounds",
    "local_epochs": "method.local_epochs",
    "clients_per_domain": "data.clients_per_domain",
    "clients_per_round": "run.clients_per_round",
    "seed": "run.seed",
    "backend": "run.backend",
    "address": "run.address",
    "cpus_per_client": "resources.cpus_per_client",
    "gpus_per_client": "resources.gpus_per_client",
    "inject_faults": "ray.inject_faults",
}
"""``fedsim run`` flags (argparse names) and :func:`fedsim.api.run` keywords -> config keys."""


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment, section by section as in its YAML file; built and checked by :func:`load_config`."""

    data: DataConfig = field(default_factory=DataConfig)
    """The ``data`` section: benchmark, target, clients and the benchmark's own options."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The ``model`` section: the model the methods build."""
    method: MethodConfig = field(default_factory=MethodConfig)
    """The ``method`` section: the method, its local update and its own parameters."""
    run: RunConfig = field(default_factory=RunConfig)
    """The ``run`` section: rounds, seed, backend, evaluation and checkpoints."""
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    """The ``resources`` section: CPUs and GPUs per client, batched clients."""
    ray: RayConfig = field(default_factory=RayConfig)
    """The ``ray`` section: settings of the Ray backend only."""
    clients: ClientsConfig = field(default_factory=ClientsConfig)
    """The ``clients`` section: unavailable, failing and slow source clients on a simulated clock (off by
    default)."""
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    """The ``privacy`` section: clipped, noised client replies and the privacy spent (off by default)."""

    def to_dict(self) -> dict:
        """Nested dicts of plain values, one per section (the form of ``config.yaml``; :func:`to_plain`)."""
        return to_plain(self)


SECTIONS = {f.name: f.type for f in fields(ExperimentConfig)}
"""The sections of a config file: the fields of :class:`ExperimentConfig` (name -> the field's annotation)."""


def to_plain(obj: Any) -> Any:
    """Dataclasses -> nested dicts (method params flattened into the method section)."""
    if is_dataclass(obj):
        out = {}
        for f in fields(obj):
            value = getattr(obj, f.name)
            if (f.name == "params" and isinstance(obj, MethodConfig)) or (
                f.name == "options" and isinstance(obj, (DataConfig, ModelConfig))
            ):
                out.update(to_plain(value))
            else:
                out[f.name] = to_plain(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def _split_key(key: str) -> list[str]:
    path = [p for p in key.strip().split(".") if p]
    if len(path) != 2:
        raise UserError(f"bad override key {key!r}: write it as section.key=value, sections: {', '.join(SECTIONS)}")
    return path


def parse_override(text: str) -> tuple[list[str], Any]:
    """'method.lr=0.01' -> (['method', 'lr'], 0.01), values parsed as YAML scalars."""
    if "=" not in text:
        raise UserError(f"bad override {text!r}: write it as section.key=value, e.g. method.lr=0.01")
    key, raw = text.split("=", 1)
    path = _split_key(key)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def read_yaml(path: str | Path) -> dict:
    """A config file's sections, as a dict (empty for an empty file); a missing file, bad YAML or anything but a
    mapping raises :class:`fedsim.errors.UserError`."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file {str(p)!r} does not exist: pass an existing YAML file with --config")
    try:
        data = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"config file {str(p)!r} is not valid YAML ({first}): fix its syntax") from None
    if not isinstance(data, (dict, type(None))):
        raise UserError(f"config file {str(p)!r} must hold a mapping of sections ({', '.join(SECTIONS)})")
    return data or {}


def _check_sections(raw: dict) -> dict[str, dict]:
    sections: dict[str, dict] = {}
    for name, value in raw.items():
        if name not in SECTIONS:
            raise UserError(f"unknown config section {name!r}: {closest(str(name), list(SECTIONS))}")
        value = {} if value is None else value
        if not isinstance(value, dict):
            raise UserError(f"config section {name!r} must be a mapping of keys to values")
        sections[name] = dict(value)
    return sections


def _apply_method_defaults(method_cls: type, sections: dict[str, dict]) -> None:
    """The method's own defaults (``config_defaults``) under what the config gives."""
    for section, defaults in getattr(method_cls, "config_defaults", {}).items():
        sections[section] = {**defaults, **sections.get(section, {})}


def _benchmark_name(data_raw: dict) -> str:
    return str(data_raw.get("benchmark", DataConfig.benchmark))


def _resolve_target(data_raw: dict) -> None:
    """``data.target: auto`` -> the benchmark's default target domain."""
    from fedsim.registry import BENCHMARKS

    if str(data_raw.get("target", "auto")) != "auto":
        return
    default_target = getattr(BENCHMARKS.get(_benchmark_name(data_raw)), "default_target", None)
    if default_target is None:
        raise UserError(
            f"benchmark {_benchmark_name(data_raw)!r} has no default target domain: pass --target (see 'fedsim list')"
        )
    data_raw["target"] = default_target


def _resolve_dropout(clients_raw: dict) -> None:
    """``clients.dropout`` p, the probability that a source sits out a round, is ``clients.availability`` 1 - p."""
    if "dropout" not in clients_raw:
        return
    dropout = clients_raw.pop("dropout")
    if "availability" in clients_raw:
        raise UserError(
            "clients.dropout and clients.availability say the same thing (availability = 1 - dropout): give one"
        )
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise UserError(
            f"clients.dropout must be a number in [0, 1), got {dropout!r}: the probability that a source "
            "client sits out a round"
        )
    clients_raw["availability"] = 1.0 - dropout


def _with_options(section_cls: type, options_cls: type, raw: dict, where: str, owner: str) -> Any:
    """A section's shared keys into ``section_cls``, the rest into its owner's ``options_cls`` (a benchmark's or a
    model's own frozen dataclass), unknown keys refused naming the owner's."""
    shared = [f.name for f in fields(section_cls) if f.name != "options"]
    own = [f.name for f in fields(options_cls)]
    clash = sorted(set(shared) & set(own))
    if clash:
        raise TypeError(f"{options_cls.__qualname__} redefines shared {where} keys {clash}: use the shared ones")
    for key in raw:
        if key not in shared and key not in own:
            keys = f"its own keys: {', '.join(own)}" if own else "it has no keys of its own"
            raise UserError(
                f"unknown config key '{where}.{key}' for {owner} ({keys}): {closest(str(key), shared + own)}"
            )
    options = build_checked(options_cls, {k: v for k, v in raw.items() if k in own}, where)
    try:
        hash(options)
    except TypeError as exc:
        raise UserError(
            f"the options of {owner} hold an unhashable value ({exc}): declare a list option as a tuple[...] field"
        ) from None
    return dataclasses.replace(
        build_checked(section_cls, {k: v for k, v in raw.items() if k in shared}, where, moved=MOVED_KEYS),
        options=options,
    )


def _build_data(data_raw: dict) -> DataConfig:
    """The shared data keys into DataConfig, the rest into the benchmark's own ``Options``."""
    from fedsim.registry import BENCHMARKS

    options_cls = getattr(BENCHMARKS.get(_benchmark_name(data_raw)), "Options", NoOptions)
    return _with_options(DataConfig, options_cls, data_raw, "data", f"benchmark {_benchmark_name(data_raw)!r}")


def _build_model(model_raw: dict) -> ModelConfig:
    """The shared model keys (name, hidden) into ModelConfig, the rest into the model's own ``Options``."""
    from fedsim.registry import MODELS

    name = str(model_raw.get("name", ModelConfig.name))
    options_cls = NoOptions if name == "auto" else getattr(MODELS.get(name), "Options", NoOptions)
    return _with_options(ModelConfig, options_cls, model_raw, "model", f"model {name!r}")


def model_config(**values) -> ModelConfig:
    """A ModelConfig from ``model`` keys, shared ones and the model's own options, checked as a config file's
    (``model_config(name="resnet18", backbone="finetune")``)."""
    return _build_model(values)


def data_config(**values) -> DataConfig:
    """A DataConfig from ``data`` keys, shared ones and the benchmark's own options, checked as a config file's
    (``data_config(benchmark="tep", variant="hard")``); ``target`` stays "auto" unless given."""
    return _build_data(values)


def split_method_keys(
    method_cls: type, params_cls: type, method_raw: dict, common_keys: list[str]
) -> tuple[dict, dict]:
    """The method section -> (the keys every method has, the method's own ``Params`` keys), unknown keys refused."""
    common = set(common_keys) - {"params"}
    params_valid = [f.name for f in fields(params_cls)]
    clash = sorted(common & set(params_valid))
    if clash:
        raise TypeError(f"{method_cls.__name__}.Params redefines common method keys {clash}: use the common ones")
    for key in method_raw:
        if key not in common and key != "params" and key not in params_valid:
            raise UserError(
                f"unknown config key 'method.{key}' for method {method_cls.registry_name!r}: "
                f"{closest(key, sorted(common) + params_valid)}"
            )
    shared = {k: v for k, v in method_raw.items() if k in common}
    return shared, {k: v for k, v in method_raw.items() if k in params_valid}


def _build_method(method_cls: type, method_raw: dict) -> MethodConfig:
    """The common method keys into MethodConfig, the rest into the method's own ``Params``."""
    params_cls = getattr(method_cls, "Params", NoParams)
    common, params = split_method_keys(method_cls, params_cls, method_raw, [f.name for f in fields(MethodConfig)])
    extra = tuple(f.name for f in fields(params_cls))
    return dataclasses.replace(
        build_checked(MethodConfig, common, "method", extra, moved=MOVED_KEYS),
        params=build_checked(params_cls, params, "method", moved=MOVED_KEYS),
    )


def build_config(raw: dict) -> ExperimentConfig:
    """Nested dict (YAML, or typed values) -> ExperimentConfig, with every key checked: each section checks its own
    values, :func:`fedsim.validation.validate` the rules across sections."""
    from fedsim.registry import METHODS

    sections = _check_sections(raw)
    method_name = str(sections.get("method", {}).get("name", MethodConfig.name))
    apply_recipe(sections, method_name, _benchmark_name(sections.get("data", {})))  # over config_defaults
    method_cls = METHODS.get(method_name)
    _apply_method_defaults(method_cls, sections)
    data_raw = sections.setdefault("data", {})
    _resolve_target(data_raw)
    _resolve_dropout(sections.get("clients", {}))
    built = {
        name: build_checked(cls, sections.get(name, {}), name, moved=MOVED_KEYS)
        for name, cls in typing.get_type_hints(ExperimentConfig).items()
        if name not in ("method", "data", "model")
    }
    config = ExperimentConfig(
        method=_build_method(method_cls, sections.get("method", {})),
        data=_build_data(data_raw),
        model=_build_model(sections.get("model", {})),
        **built,
    )
    validate(config)
    return config


def keyword_values(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Flag or keyword names (``KEYWORDS``) -> ``{dotted config key: value}``; ``None`` values are left out."""
    unknown = sorted(name for name in settings if name not in KEYWORDS)
    if unknown:
        raise UserError(
            f"fedsim.run got unknown argument(s) {unknown}: use {', '.join(KEYWORDS)}, or set={{'section.key': value}}"
        )
    return {KEYWORDS[name]: value for name, value in settings.items() if value is not None}


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] | None = None,
    base: dict | None = None,
    values: Mapping[str, Any] | None = None,
) -> ExperimentConfig:
    """``base`` dict, then the YAML file, then dotted ``overrides`` (``"section.key=value"`` texts, values parsed as
    YAML scalars), then ``values`` (``{"section.key": value}``, typed values taken as they are) -> a validated
    ExperimentConfig. Every value is checked against its field's type."""
    raw: dict = {k: dict(v) for k, v in (base or {}).items()}
    if path is not None:
        for section, section_values in read_yaml(path).items():
            if isinstance(section_values, dict):
                raw.setdefault(section, {}).update(section_values)
            else:
                raw[section] = section_values
    pairs = [parse_override(text) for text in overrides or []]
    pairs += [(_split_key(key), value) for key, value in (values or {}).items()]
    for (section, key), value in pairs:
        if section not in SECTIONS:
            raise UserError(
                f"unknown config section {section!r} in {section}.{key}: {closest(section, list(SECTIONS))}"
            )
        if not isinstance(raw.get(section), dict):
            raw[section] = {}
        raw[section][key] = value
    return build_config(raw)


def dump_yaml(config: ExperimentConfig) -> str:
    """The config as YAML, sections in order (what a run directory's ``config.yaml`` holds, read back by
    :func:`load_config`)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
