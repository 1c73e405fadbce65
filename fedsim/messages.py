"""Typed messages between server and clients: named tensors, the round, the seed, the local update's settings.

Tensors are numpy arrays (cheap to send through Ray's object store, zero-copy
on read). ``nbytes`` is what a real deployment would put on the wire for this
message (the tensors' buffers); it is computed once and used for the
communication accounting in ``metrics.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Mapping, Optional, Sequence, Union

import numpy as np

Tensors = Mapping[str, np.ndarray]
#: what an instruction names beside its tensors: a number, a string, a flag, or a list or mapping of them
Value = Union[None, bool, int, float, str, Sequence["Value"], Mapping[str, "Value"]]


@dataclass(frozen=True)
class LocalSettings:
    """The settings of a client's local update (Flower's fit config): epochs, batch size and SGD's settings.

    It has the attributes :func:`fedsim.methods.common.training.make_optimizer` reads.
    """

    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float

    @classmethod
    def from_method(cls, method_config) -> LocalSettings:
        """The values of the experiment's ``method`` section."""
        return cls(**{f.name: getattr(method_config, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Instruction:
    """Server -> client: run ``operation`` of round ``round``, drawing its random numbers from ``seed``.

    ``local`` holds the round's local-update settings (what a client trains with; None only in an instruction built
    outside a round); ``values`` the operation's own data, which its server half names (FADA's step, FedOD's
    teachers, the predictors a detection client scores). ``tensors`` is usually shared by every client of a round
    (the global model); the executors detect that and serialize it once.
    """

    operation: str
    tensors: Tensors = field(default_factory=dict)
    round: int = 0
    seed: int = 0
    local: Optional[LocalSettings] = None
    values: Mapping[str, Value] = field(default_factory=dict)

    def __post_init__(self):
        arrays = sorted(k for k, v in self.values.items() if isinstance(v, np.ndarray))
        if arrays:
            raise TypeError(f"instruction {self.operation!r}: {arrays} are arrays, which travel (and count) as tensors")

    @cached_property
    def nbytes(self) -> int:
        return tensors_nbytes(self.tensors)


@dataclass(frozen=True)
class Reply:
    """Client -> server: tensors (e.g. updated weights) and scalar metrics.

    Never carries raw inputs or labels: the contract tests check it.
    """

    client_id: int
    tensors: Tensors = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    num_examples: int = 0

    @cached_property
    def nbytes(self) -> int:
        return tensors_nbytes(self.tensors)


def tensors_nbytes(tensors: Tensors) -> int:
    return int(sum(np.asarray(t).nbytes for t in tensors.values()))
