"""Mini-batches counted in steps rather than epochs (FADA's adversarial and disentanglement stages).

Built on :func:`fedsim.methods.common.training.minibatches`, the one mini-batch generator: ``steps``
batches run over consecutive shuffled epochs, the last one cut short.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Optional

import torch

from fedsim.data.base import ArraySplit
from fedsim.methods.common.training import device_rows, minibatches


def batch_steps(
    count: int, batch_size: int, steps: int, generator: torch.Generator, device: Optional[torch.device] = None
) -> Iterator[torch.Tensor]:
    """Index batches of ``steps`` steps (one epoch when ``steps`` is 0); a skipped final batch of one
    (see :func:`minibatches`) still counts as a step. Each epoch draws its order when it starts (on ``device``
    with it)."""
    per_epoch = -(-count // batch_size)
    left = steps or per_epoch
    while left > 0 and per_epoch > 0:
        yield from itertools.islice(minibatches(count, batch_size, generator, device), min(left, per_epoch))
        left -= per_epoch


def labeled_batches(
    split: ArraySplit, batch_size: int, steps: int, generator: torch.Generator, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) on ``device`` for each index batch of :func:`batch_steps` (the split copied there once:
    :func:`fedsim.methods.common.training.device_rows`)."""
    x, y = device_rows(split.x, device), device_rows(split.y, device)
    for idx in batch_steps(len(x), batch_size, steps, generator, x.device):
        yield x[idx].to(device), y[idx].to(device)


def labeled_batch(
    split: ArraySplit, batch_size: int, steps: int, index: int, generator: torch.Generator, device: torch.device
) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The ``index``-th (0-based) batch of :func:`labeled_batches`, or None when that step is a skipped batch
    of one: FADA's alternations take one source batch per exchange, all from one seeded sequence. Only that
    batch is copied to ``device``."""
    idx = next(itertools.islice(batch_steps(len(split.x), batch_size, steps, generator), index, None), None)
    if idx is None:
        return None
    return torch.from_numpy(split.x)[idx].to(device), torch.from_numpy(split.y)[idx].to(device)
