"""The one local-training loop and its pieces: weights <-> numpy, the optimizer, mini-batches, evaluation.

On an accelerator the loops read nothing back to the host per batch: a split's arrays are copied to the device once
per call (:func:`device_rows`), each epoch's batch order once per epoch, and losses and counts are summed on the
device in float64 (the same sums as Python floats), read once when the call returns. Their forward passes run in
the precision of the client operation (``run.precision``, :mod:`fedsim.methods.common.precision`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Optional

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ArraySplit
from fedsim.messages import LocalSettings
from fedsim.methods.common.precision import autocast, full
from fedsim.optim import SGD, Optimizer

if TYPE_CHECKING:
    from fedsim.privacy.dpsgd import RecordPlan

CHUNK = 512
"""Rows per forward pass when a whole split is encoded or evaluated without gradients (bounds memory)."""
DEVICE_COPY_BYTES = 1 << 30
"""A split's array up to this size goes to the device in one copy per call; a larger one batch by batch."""


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


def minibatches(
    count: int, batch_size: int, generator: torch.Generator, device: Optional[torch.device] = None
) -> Iterator[torch.Tensor]:
    """Index batches of one shuffled epoch over ``count`` samples; a final batch of one is skipped (batch norm
    needs two samples) unless the whole set is one sample. The order is drawn on the CPU (``generator``: the same
    batches on every device) and, with ``device``, copied there once for the epoch."""
    order = torch.randperm(count, generator=generator)
    if device is not None:
        order = order.to(device)
    for start in range(0, count, batch_size):
        idx = order[start : start + batch_size]
        if len(idx) < 2 and count >= 2:
            continue
        yield idx


def classification_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's logits: the default local objective."""
    return nn.functional.cross_entropy(model(xb), yb)


StepLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def device_rows(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` as the tensor batches are indexed from: copied to ``device`` once when it holds at most
    :data:`DEVICE_COPY_BYTES`, else left on the CPU (each batch then copied as it is drawn)."""
    rows = torch.from_numpy(array)
    return rows.to(device) if array.nbytes <= DEVICE_COPY_BYTES else rows


def train_epochs(
    model: nn.Module,
    split: ArraySplit,
    epochs: int,
    batch_size: int,
    optimizer: Optimizer,
    seed: int,
    device: torch.device,
    step_loss: Optional[StepLoss] = None,
    private: Optional[RecordPlan] = None,
) -> float:
    """Mini-batch training on (x, y) for ``epochs``; returns the mean training loss of the last epoch.

    ``step_loss(model, xb, yb)`` is the loss of one batch (default: cross-entropy); FedProx, the alignment
    methods, FADA and FedBN pass their own objective and share the loop. With ``private`` (record-level privacy,
    :func:`fedsim.privacy.dpsgd.record_plan`) the steps are DP-SGD's (:func:`fedsim.privacy.dpsgd.dp_sgd_epochs`).
    """
    return float(epochs_loss(model, split, epochs, batch_size, optimizer, seed, device, step_loss, private))


def epochs_loss(
    model: nn.Module,
    split: ArraySplit,
    epochs: int,
    batch_size: int,
    optimizer: Optimizer,
    seed: int,
    device: torch.device,
    step_loss: Optional[StepLoss] = None,
    private: Optional[RecordPlan] = None,
) -> torch.Tensor:
    """:func:`train_epochs`'s loop; the last epoch's mean loss as a float64 tensor on ``device``, not read back."""
    if split.y is None:
        raise ValueError("train_epochs needs labels: the target client's training inputs are unlabeled")
    step_loss = step_loss or classification_loss
    model.train()
    x, y = device_rows(split.x, device), device_rows(split.y, device)
    if private is not None:
        from fedsim.privacy.dpsgd import dp_sgd_epochs

        return dp_sgd_epochs(model, x, y, epochs, private, optimizer, seed, device, step_loss)
    generator = torch.Generator().manual_seed(seed)
    last = torch.zeros((), dtype=torch.float64, device=device)
    for _ in range(epochs):
        total, count = torch.zeros((), dtype=torch.float64, device=device), 0
        for idx in minibatches(len(x), batch_size, generator, x.device):
            xb, yb = x[idx].to(device), y[idx].to(device)
            optimizer.zero_grad(set_to_none=True)
            with autocast(device):
                loss = step_loss(model, xb, yb)
            loss.backward()
            optimizer.step()
            total += loss.detach().double() * len(idx)
            count += len(idx)
        last = total / max(count, 1)
    return last


def encode_in_chunks(
    encode: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray, device: torch.device, chunk: int = CHUNK
) -> torch.Tensor:
    """``encode`` applied to ``x`` in chunks of ``chunk`` rows (bounded memory), concatenated on the CPU; in the
    operation's precision, the result in float32."""
    with autocast(device):
        parts = [full(encode(torch.from_numpy(x[i : i + chunk]).to(device))).cpu() for i in range(0, len(x), chunk)]
    return torch.cat(parts)


def evaluate_model(
    model: nn.Module, split: ArraySplit, device: torch.device, batch_size: int = CHUNK
) -> dict[str, float]:
    """Correct count, sample count and summed cross-entropy on a labeled split."""
    correct, loss = evaluation_sums(model, split, device, batch_size)
    return {"correct": float(correct), "total": float(len(split.x)), "loss_sum": float(loss)}


@torch.no_grad()
def evaluation_sums(
    model: nn.Module, split: ArraySplit, device: torch.device, batch_size: int = CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`evaluate_model`'s loop: (correct count, summed cross-entropy in float64), tensors on ``device``."""
    model.eval()
    x, y = device_rows(split.x, device), device_rows(split.y, device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    loss = torch.zeros((), dtype=torch.float64, device=device)
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        with autocast(device):
            logits = full(model(xb))
        loss += nn.functional.cross_entropy(logits, yb, reduction="sum").double()
        correct += (logits.argmax(1) == yb).sum()
    return correct, loss
