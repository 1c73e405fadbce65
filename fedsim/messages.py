"""Typed messages between server and clients: named tensors + config + metrics.

Tensors are numpy arrays (cheap to send through Ray's object store, zero-copy
on read). ``nbytes`` is what a real deployment would put on the wire for this
message (the tensors' buffers); it is computed once and used for the
communication accounting in ``metrics.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

import numpy as np

Tensors = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Instruction:
    """Server -> client: run ``operation`` with these tensors and config.

    ``tensors`` is usually shared by every client of a round (the global model);
    the executors detect that and serialize it once.
    """

    operation: str
    tensors: Tensors = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

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
