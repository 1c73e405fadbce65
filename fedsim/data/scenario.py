"""Scenario: which clients exist, which domain each holds, which is the target.

One target domain (unlabeled for training), the other domains are labeled
sources. ``clients_per_domain = K`` splits every domain's train part across K
clients, IID or with Dirichlet label skew; the test part is split IID so that
a domain's accuracy is the pooled accuracy over its clients.

``build_federation`` returns only descriptions (sizes, roles); the arrays are
built by ``load_client_data`` in whatever process hosts the client.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fedsim.data.base import ArraySplit, Benchmark, ClientData, Domain
from fedsim.data.detection import DetectionDomain
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS, unknown_name_message
from fedsim.seeding import numpy_rng


@dataclass(frozen=True)
class ClientInfo:
    """One client, described without its data: which domain it holds, its role and its split sizes."""

    client_id: int
    """The client's id: its index in :attr:`Federation.clients`."""
    domain: str
    """The domain whose data the client holds."""
    role: str
    """The client's role: "source" (labeled) or "target" (unlabeled for training)."""
    num_train: int
    """The client's training samples."""
    num_test: int
    """The client's test samples."""
    num_validation: int = 0
    """The client's validation samples, held out of its training part (``data.validation_fraction``; 0 for the
    target)."""


@dataclass(frozen=True)
class Federation:
    """The clients of a run, described without their data (:func:`build_federation`): what the server and every
    process know of the scenario."""

    benchmark: str
    """The benchmark's name (``data.benchmark``)."""
    target: str
    """The target domain (``data.target``)."""
    domains: tuple[str, ...]
    """The run's domains, the target's included, in the benchmark's order (limited to ``data.sources`` and the
    target when sources are named)."""
    clients: tuple[ClientInfo, ...]
    """Every client, by id: ``data.clients_per_domain`` per domain, domain after domain."""
    input_shape: tuple[int, ...]
    """The shape of one input (features or C x H x W)."""
    num_classes: int
    """The number of classes (the largest of the domains')."""

    @property
    def client_ids(self) -> list[int]:
        """Every client's id, in order."""
        return [c.client_id for c in self.clients]

    @property
    def source_ids(self) -> list[int]:
        """The ids of the source clients (labeled)."""
        return [c.client_id for c in self.clients if c.role == "source"]

    @property
    def target_ids(self) -> list[int]:
        """The ids of the target's clients (unlabeled for training)."""
        return [c.client_id for c in self.clients if c.role == "target"]

    @property
    def source_domains(self) -> list[str]:
        """Every domain but the target, in order."""
        return [d for d in self.domains if d != self.target]

    def info(self, client_id: int) -> ClientInfo:
        """The description of client ``client_id``."""
        return self.clients[client_id]


@functools.lru_cache(maxsize=4)
def get_benchmark(data_config) -> Benchmark:
    """The configured benchmark object, built once per process for a given ``data`` section (the last four are
    kept), so that the clients a process hosts share its built domains."""
    return BENCHMARKS.get(data_config.benchmark)(data_config)


def get_domain(data_config, domain: str) -> Domain:
    """One domain of the configured benchmark, kept in memory by the benchmark until ``forget_domain_data``.

    Benchmarks apply ``max_train_per_domain`` themselves.
    """
    return get_benchmark(data_config).load(domain)


def forget_domain_data(data_config, domain: str | None = None) -> None:
    """Free a built domain (every domain when ``domain`` is None) once its clients hold their own copies."""
    get_benchmark(data_config).forget(domain)


def _partition(
    labels: np.ndarray, num_clients: int, data_config, domain: str, part: str, skew: bool
) -> list[np.ndarray]:
    rng = numpy_rng(data_config.seed, domain, part, "partition")
    if num_clients == 1:
        return [np.arange(len(labels))]
    if not skew:
        return [np.sort(chunk) for chunk in np.array_split(rng.permutation(len(labels)), num_clients)]
    # Dirichlet label skew (Hsu et al. 2019): each class spread over clients by proportions ~ Dir(alpha).
    shards: list[list[int]] = [[] for _ in range(num_clients)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        proportions = rng.dirichlet(np.full(num_clients, data_config.dirichlet_alpha))
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(int)
        for shard, chunk in zip(shards, np.split(members, cuts)):
            shard.extend(chunk.tolist())
    return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]


def _hold_out(labels: np.ndarray, indices: np.ndarray, fraction: float, rng, where: str) -> tuple[np.ndarray, ...]:
    """(training, validation) rows of one source client's training ``indices``: each class keeps
    round(fraction x its rows) apart, drawn from ``rng``, so that the validation part has the client's class
    proportions (DomainBed's training-domain validation, Gulrajani & Lopez-Paz, ICLR 2021, stratified)."""
    held = []
    for cls in np.unique(labels[indices]):
        members = indices[labels[indices] == cls]
        count = int(np.floor(fraction * len(members) + 0.5))
        if count >= len(members):
            raise UserError(
                f"class {int(cls)} has only {len(members)} training row(s) on {where}: data.validation_fraction="
                f"{fraction} would hold out every one; lower data.validation_fraction (or --clients-per-domain)"
            )
        held.append(rng.permutation(members)[:count])
    validation = np.sort(np.concatenate(held)).astype(np.int64)
    if len(validation) == 0:
        raise UserError(
            f"{where} has {len(indices)} training rows, too few to hold out data.validation_fraction={fraction} of "
            "any class: raise data.validation_fraction or lower --clients-per-domain"
        )
    return np.setdiff1d(indices, validation), validation


@functools.lru_cache(maxsize=16)
def _domain_partitions(data_config, domain: str) -> tuple[list[np.ndarray], list, list[np.ndarray]]:
    """Each client's (training, validation, test) row indices in the domain; validation None for the target's
    clients and with ``data.validation_fraction`` 0 (the training rows then untouched)."""
    loaded = get_domain(data_config, domain)
    k = data_config.clients_per_domain
    train = _partition(loaded.train_y, k, data_config, domain, "train", data_config.partition == "dirichlet")
    test = _partition(loaded.test_y, k, data_config, domain, "test", False)
    fraction = data_config.validation_fraction
    if fraction == 0 or domain == data_config.target:
        return train, [None] * k, test
    if isinstance(loaded, DetectionDomain):
        raise UserError(
            f"data.validation_fraction={fraction} holds out classification rows and benchmark "
            f"{data_config.benchmark!r} is a detection benchmark: leave data.validation_fraction at 0"
        )
    rng = numpy_rng(data_config.seed, domain, "train", "validation")
    parts = [
        _hold_out(loaded.train_y, rows, fraction, rng, f"client {i + 1} of {k} of domain {domain!r}")
        for i, rows in enumerate(train)
    ]
    return [p[0] for p in parts], [p[1] for p in parts], test


def build_federation(data_config) -> Federation:
    """Describe the clients of the scenario; raises UserError for an unknown target."""
    benchmark = get_benchmark(data_config)
    domains = tuple(benchmark.domains())
    if data_config.target not in domains:
        raise UserError(
            unknown_name_message(
                f"target domain of benchmark {data_config.benchmark!r}", data_config.target, list(domains), "--target"
            )
        )
    for source in data_config.sources:
        if source not in domains:
            raise UserError(
                unknown_name_message(
                    f"source domain of benchmark {data_config.benchmark!r}",
                    source,
                    list(domains),
                    "--set data.sources=a,b",
                )
            )
    if data_config.sources:
        domains = tuple(d for d in domains if d == data_config.target or d in data_config.sources)
    if len(domains) < 2:
        raise UserError(
            f"benchmark {data_config.benchmark!r} has only {len(domains)} domain(s): a source and a target are needed"
        )
    clients = []
    shape, classes = None, 0
    for domain in domains:
        loaded = get_domain(data_config, domain)
        shape = shape or loaded.input_shape
        classes = max(classes, loaded.num_classes)
        train_parts, validation_parts, test_parts = _domain_partitions(data_config, domain)
        if min(len(p) for p in train_parts) == 0:
            raise UserError(
                f"domain {domain!r} has too few training samples for {data_config.clients_per_domain} clients: lower "
                "--clients-per-domain"
            )
        for train_idx, validation_idx, test_idx in zip(train_parts, validation_parts, test_parts):
            role = "target" if domain == data_config.target else "source"
            held = 0 if validation_idx is None else len(validation_idx)
            clients.append(ClientInfo(len(clients), domain, role, len(train_idx), len(test_idx), held))
    return Federation(data_config.benchmark, data_config.target, domains, tuple(clients), tuple(shape), classes)


def resolve_normalization(data_config) -> str:
    """``data.normalization``, with "auto" replaced by the benchmark's default."""
    if data_config.normalization != "auto":
        return data_config.normalization
    return get_benchmark(data_config).default_normalization


def load_client_data(data_config, federation: Federation, client_id: int) -> ClientData:
    """Build one client's private data (in the process that hosts the client)."""
    info = federation.info(client_id)
    loaded = get_domain(data_config, info.domain)
    first = next(c.client_id for c in federation.clients if c.domain == info.domain)
    train_parts, validation_parts, test_parts = _domain_partitions(data_config, info.domain)
    train_idx, test_idx = train_parts[client_id - first], test_parts[client_id - first]
    validation_idx = validation_parts[client_id - first]
    train_y = None if info.role == "target" else loaded.train_y[train_idx]
    train_targets = test_targets = None
    if isinstance(loaded, DetectionDomain):  # each image's boxes travel with the client's images, never reloaded
        train_targets = None if train_y is None else tuple(loaded.train_annotations.per_image(train_y))
        test_targets = tuple(loaded.test_annotations.per_image(loaded.test_y[test_idx]))
    return ClientData(
        client_id=client_id,
        domain=info.domain,
        role=info.role,
        train=ArraySplit(loaded.train_x[train_idx], train_y, train_targets),
        test=ArraySplit(loaded.test_x[test_idx], loaded.test_y[test_idx], test_targets),
        num_classes=federation.num_classes,
        validation=None
        if validation_idx is None
        else ArraySplit(loaded.train_x[validation_idx], loaded.train_y[validation_idx]),
    )
