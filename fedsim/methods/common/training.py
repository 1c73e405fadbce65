"""The one local-training loop and its pieces: weights <-> numpy, the optimizer, mini-batches, evaluation."""

from __future__ import annotations

from typing import Callable, Iterator, Mapping, Optional

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ArraySplit
from fedsim.messages import LocalSettings
from fedsim.optim import SGD, Optimizer

CHUNK = 512
"""Rows per forward pass when a whole split is encoded or evaluated without gradients (bounds memory)."""


def model_to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """state_dict as numpy copies (parameters and buffers, e.g. batch-norm statistics)."""
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def load_numpy(model: nn.Module, tensors: Mapping[str, np.ndarray], strict: bool = True) -> None:
    """Load named numpy arrays (:func:`model_to_numpy`'s form) into ``model``'s parameters and buffers, as copies;
    ``strict=False`` loads a part of the state dict and leaves the rest as it is (e.g. FedRep's representation
    without its head)."""
    state = {
        name: torch.tensor(np.asarray(value)) for name, value in tensors.items()
    }  # copy: object-store arrays are read-only
    model.load_state_dict(state, strict=strict)


def make_optimizer(model_or_params, settings: LocalSettings, lr: Optional[float] = None) -> SGD:
    """SGD with the local settings' rate, momentum and weight decay (``lr`` overrides ``settings.lr``): the update
    of ``torch.optim.SGD``, without its import of ``torch._dynamo`` (:mod:`fedsim.optim`)."""
    params = model_or_params.parameters() if isinstance(model_or_params, nn.Module) else model_or_params
    return SGD(
        params, lr=settings.lr if lr is None else lr, momentum=settings.momentum, weight_decay=settings.weight_decay
    )


def minibatches(count: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Index batches of one shuffled epoch over ``count`` samples; a final batch of one is skipped (batch norm
    needs two samples) unless the whole set is one sample."""
    order = torch.randperm(count, generator=generator)
    for start in range(0, count, batch_size):
        idx = order[start : start + batch_size]
        if len(idx) < 2 and count >= 2:
            continue
        yield idx


def classification_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's logits: the default local objective."""
    return nn.functional.cross_entropy(model(xb), yb)


StepLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def train_epochs(
    model: nn.Module,
    split: ArraySplit,
    epochs: int,
    batch_size: int,
    optimizer: Optimizer,
    seed: int,
    device: torch.device,
    step_loss: Optional[StepLoss] = None,
) -> float:
    """Mini-batch training on (x, y) for ``epochs``; returns the mean training loss of the last epoch.

    ``step_loss(model, xb, yb)`` is the loss of one batch (default: cross-entropy); FedProx, the alignment
    methods, FADA and FedBN pass their own objective and share the loop.
    """
    if split.y is None:
        raise ValueError("train_epochs needs labels: the target client's training inputs are unlabeled")
    step_loss = step_loss or classification_loss
    model.train()
    x = torch.from_numpy(split.x)
    y = torch.from_numpy(split.y)
    generator = torch.Generator().manual_seed(seed)
    last = 0.0
    for _ in range(epochs):
        total, count = 0.0, 0
        for idx in minibatches(len(x), batch_size, generator):
            xb, yb = x[idx].to(device), y[idx].to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = step_loss(model, xb, yb)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        last = total / max(count, 1)
    return last


def encode_in_chunks(
    encode: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray, device: torch.device, chunk: int = CHUNK
) -> torch.Tensor:
    """``encode`` applied to ``x`` in chunks of ``chunk`` rows (bounded memory), concatenated on the CPU."""
    return torch.cat([encode(torch.from_numpy(x[i : i + chunk]).to(device)).cpu() for i in range(0, len(x), chunk)])


@torch.no_grad()
def evaluate_model(
    model: nn.Module, split: ArraySplit, device: torch.device, batch_size: int = CHUNK
) -> dict[str, float]:
    """Correct count, sample count and summed cross-entropy on a labeled split."""
    model.eval()
    x = torch.from_numpy(split.x)
    y = torch.from_numpy(split.y)
    correct, loss = 0, 0.0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        logits = model(xb)
        loss += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return {"correct": float(correct), "total": float(len(x)), "loss_sum": loss}
