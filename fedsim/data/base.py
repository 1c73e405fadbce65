"""Domains, benchmarks and the per-client view of data.

A *domain* is one data distribution (a camera, a plant mode, a font set) with a
deterministic train/test split. A *benchmark* is a named collection of domains
of the same task (same classes, same input shape).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from fedsim.coercion import NoOptions


@dataclass(frozen=True)
class Domain:
    """One domain's data. ``x`` arrays are float32, ``y`` arrays int64 in [0, num_classes)."""

    name: str
    """The domain's name, as ``data.target`` and ``data.sources`` name it."""
    train_x: np.ndarray
    """Training inputs, one row per sample (N x D features or N x C x H x W images)."""
    train_y: np.ndarray
    """Training labels, one per row of ``train_x`` (a detection domain: each image's index into its box table,
    :mod:`fedsim.data.detection`)."""
    test_x: np.ndarray
    """Test inputs, for evaluation only."""
    test_y: np.ndarray
    """Test labels, one per row of ``test_x``."""
    num_classes: int
    """The benchmark's number of classes (every domain of a benchmark has the same)."""

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one input (``train_x``'s without the sample axis)."""
        return tuple(self.train_x.shape[1:])


class Benchmark(ABC):
    """A set of domains sharing classes and input shape.

    Subclasses register with ``@BENCHMARKS.register(name)`` (or are named by a
    dotted path or an entry point, see :mod:`fedsim.registry`) and are built from
    the ``data`` section of the config (:class:`fedsim.config.DataConfig`): the
    keys every benchmark shares, and the benchmark's own ``Options``, a frozen
    dataclass whose fields are set as ``data.<field>`` and read as
    ``self.options.<field>`` (validate them in its ``__post_init__``; use tuples,
    not lists, so that the config stays hashable).
    ``load`` must be deterministic: the same config gives bit-identical arrays
    in every process, because Ray client actors rebuild their own data.
    """

    Options: ClassVar[type] = NoOptions
    """The benchmark's own frozen options dataclass, set by ``data.<field>`` keys (default: no options)."""

    default_normalization: ClassVar[str] = "none"
    """The normalization used when ``data.normalization`` is "auto": "none", "federated" or "per-domain"
    (:mod:`fedsim.data.normalization`)."""
    default_target: ClassVar[Optional[str]] = None
    """The target domain when ``data.target`` is "auto" (None: the user must name one)."""
    task: ClassVar[str] = "classification"
    """The benchmark's task, "classification" or "detection": a method runs only on benchmarks of its own task."""
    server_domain: ClassVar[Optional[str]] = None
    """Detection benchmarks: the domain of the FedOD server's own large labeled set (Su et al. 2022), hosted like
    a client's data (:mod:`fedsim.methods.detection.base`); None: no server domain."""
    registry_name: ClassVar[str] = ""
    """The name it is registered under (set by the registry)."""

    def __init__(self, data_config):
        self.config = data_config
        options = getattr(data_config, "options", None)
        self.options = options if isinstance(options, type(self).Options) else type(self).Options()
        """This benchmark's options: the config's, or the defaults when it holds none (``NoOptions``)."""
        if not isinstance(options, (type(self).Options, NoOptions, type(None))):
            raise TypeError(f"{type(self).__name__} takes {type(self).Options.__qualname__}, got {options!r}")
        #: domains built in this process, by name: ``load`` fills it, :meth:`forget` empties it
        self._loaded: dict[str, Domain] = {}

    @abstractmethod
    def domains(self) -> list[str]:
        """Names of the available domains, in a fixed order."""

    def load(self, domain: str) -> Domain:
        """Return one domain, built by :meth:`build_domain` on first use and kept in ``self._loaded``."""
        if domain not in self._loaded:
            self._loaded[domain] = self.build_domain(domain)
        return self._loaded[domain]

    @abstractmethod
    def build_domain(self, domain: str) -> Domain:
        """Build one domain (a UserError naming the domains for an unknown one); :meth:`load` caches it."""

    def forget(self, domain: Optional[str] = None) -> None:
        """Drop built domains from memory (all of them when ``domain`` is None).

        A later ``load`` rebuilds the domain (from the disk cache where the
        benchmark has one). Benchmarks keep built domains in ``self._loaded``.
        """
        if domain is None:
            self._loaded.clear()
        else:
            self._loaded.pop(domain, None)

    @classmethod
    def description(cls) -> str:
        """One line for ``fedsim list``: the first line of the class docstring."""
        return (cls.__doc__ or "").strip().splitlines()[0] if (cls.__doc__ or "").strip() else ""

    def describe(self) -> str:
        """One line about this benchmark as configured (default: :meth:`description`); a subclass may say more,
        such as what its options choose."""
        return self.description()


@dataclass(frozen=True)
class ArraySplit:
    """One client's train or test part: inputs, labels (when the client may see them) and detection boxes."""

    x: np.ndarray
    """The inputs, one row per sample (float32)."""
    y: Optional[np.ndarray]
    """The labels (int64), one per row (detection: each image's index into its domain's box table); None for the
    unlabeled target's training inputs."""
    targets: Optional[tuple[tuple[np.ndarray, np.ndarray], ...]] = None
    """Detection only: the (boxes x1 y1 x2 y2 in pixels, labels) of each image, in order; None for classification
    and for the unlabeled target's training images."""

    def __len__(self) -> int:
        return len(self.x)


@dataclass(frozen=True)
class ClientData:
    """What one client holds privately: never sent to the server.

    ``train.y`` is ``None`` for a target client: its labels are not available
    for training, structurally. ``test`` is labeled, used for evaluation only; a
    source's ``validation`` (when held out) for model selection only.
    """

    client_id: int
    """The client's id: its index in :attr:`fedsim.data.scenario.Federation.clients`."""
    domain: str
    """The domain whose data the client holds."""
    role: str
    """The client's role: "source" (labeled) or "target" (unlabeled for training)."""
    train: ArraySplit
    """The client's share of its domain's training split (``train.y`` None for a target)."""
    test: ArraySplit
    """The client's share of its domain's test split, labeled, for evaluation only."""
    num_classes: int
    """The federation's number of classes."""
    validation: Optional[ArraySplit] = None
    """A source client's validation part, labeled, held out of its training split (``data.validation_fraction``;
    :func:`fedsim.data.scenario.load_client_data`): model-selection scores read it, nothing trains on it. None for
    the target and when the fraction is 0."""

    @property
    def is_target(self) -> bool:
        """Whether the client holds the target domain (no training labels)."""
        return self.role == "target"
