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
"""Named numpy arrays: what a message carries on the wire (model weights, features, gradients)."""
Value = Union[None, bool, int, float, str, Sequence["Value"], Mapping[str, "Value"]]
"""What an instruction names beside its tensors: a number, a string, a flag, or a list or mapping of them."""


@dataclass(frozen=True)
class LocalSettings:
    """The settings of a client's local update (Flower's fit config): epochs, batch size and SGD's settings.

    It has the attributes :func:`fedsim.methods.common.training.make_optimizer` reads.
    """

    local_epochs: int
    """Epochs over the client's training split per local update (``method.local_epochs``)."""
    batch_size: int
    """Mini-batch size (``method.batch_size``)."""
    lr: float
    """SGD's learning rate (``method.lr``)."""
    momentum: float
    """SGD's momentum (``method.momentum``)."""
    weight_decay: float
    """SGD's L2 weight decay (``method.weight_decay``)."""

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
    """The name of the client operation to run (a ``@client_operation`` of the method, e.g. "fit")."""
    tensors: Tensors = field(default_factory=dict)
    """The named arrays sent to the client (e.g. the global weights); their bytes are the message's :attr:`nbytes`."""
    round: int = 0
    """The round the instruction belongs to (1 for the first; a setup stage carries the round it precedes)."""
    seed: int = 0
    """The seed the operation draws all its random numbers from: by default derived from (run seed, round, client,
    operation) (:meth:`fedsim.runtime.context.RoundContext.seed`), so a result never depends on scheduling."""
    local: Optional[LocalSettings] = None
    """The round's local-update settings (:meth:`fedsim.methods.base.Method.client_settings`); None only in an
    instruction built outside a round."""
    values: Mapping[str, Value] = field(default_factory=dict)
    """The operation's own data beside its tensors (numbers, strings, flags, lists or mappings of them; arrays are
    refused: they travel as tensors)."""

    def __post_init__(self):
        arrays = sorted(k for k, v in self.values.items() if isinstance(v, np.ndarray))
        if arrays:
            raise TypeError(f"instruction {self.operation!r}: {arrays} are arrays, which travel (and count) as tensors")

    @cached_property
    def nbytes(self) -> int:
        """The bytes of :attr:`tensors`: what the instruction puts on the wire in the communication accounting."""
        return tensors_nbytes(self.tensors)


@dataclass(frozen=True)
class Reply:
    """Client -> server: tensors (e.g. updated weights) and scalar metrics.

    Never carries raw inputs or labels: the contract tests check it.
    """

    client_id: int
    """The client that replies."""
    tensors: Tensors = field(default_factory=dict)
    """The named arrays sent back (e.g. the updated weights); their bytes are the reply's :attr:`nbytes`."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Scalar metrics of the operation (e.g. ``train_loss``, an evaluation's ``correct`` and ``total`` counts), which
    the server half summarizes."""
    num_examples: int = 0
    """The samples behind the reply (e.g. the training samples of an update: FedAvg's weight in the mean)."""

    @cached_property
    def nbytes(self) -> int:
        """The bytes of :attr:`tensors`: what the reply puts on the wire in the communication accounting."""
        return tensors_nbytes(self.tensors)


def tensors_nbytes(tensors: Tensors) -> int:
    """The total bytes of the arrays' buffers: what sending ``tensors`` costs on the wire."""
    return int(sum(np.asarray(t).nbytes for t in tensors.values()))
