"""Shared local-training pieces: weights <-> numpy, SGD epochs, evaluation, weighted means."""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ArraySplit


def model_to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """state_dict as numpy copies (parameters and buffers, e.g. batch-norm statistics)."""
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def load_numpy(model: nn.Module, tensors: Mapping[str, np.ndarray], strict: bool = True) -> None:
    state = {name: torch.tensor(np.asarray(value)) for name, value in tensors.items()}  # copy: object-store arrays are read-only
    model.load_state_dict(state, strict=strict)


def weighted_average(tensor_sets: Iterable[Mapping[str, np.ndarray]], weights: Iterable[float]) -> dict[str, np.ndarray]:
    """sum_k w_k T_k / sum_k w_k per named tensor (McMahan et al. 2017, Alg. 1), in float64, cast back."""
    tensor_sets = list(tensor_sets)
    weights = np.asarray(list(weights), dtype=np.float64)
    if len(tensor_sets) == 0 or weights.sum() <= 0:
        raise ValueError("weighted_average needs at least one tensor set with positive weight")
    weights = weights / weights.sum()
    out = {}
    for name in tensor_sets[0]:
        total = sum(w * np.asarray(ts[name], dtype=np.float64) for w, ts in zip(weights, tensor_sets))
        dtype = np.asarray(tensor_sets[0][name]).dtype
        out[name] = (np.rint(total) if np.issubdtype(dtype, np.integer) else total).astype(dtype)
    return out


def make_optimizer(model: nn.Module, method_config) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        model.parameters(), lr=method_config.lr, momentum=method_config.momentum, weight_decay=method_config.weight_decay
    )


def train_epochs(
    model: nn.Module,
    split: ArraySplit,
    epochs: int,
    batch_size: int,
    optimizer: torch.optim.Optimizer,
    seed: int,
    device: torch.device,
    extra_loss: Optional[Callable[[nn.Module], torch.Tensor]] = None,
) -> float:
    """Mini-batch SGD on (x, y) for ``epochs``; returns the mean training loss of the last epoch."""
    if split.y is None:
        raise ValueError("train_epochs needs labels: the target client's training inputs are unlabeled")
    model.train()
    x = torch.from_numpy(split.x)
    y = torch.from_numpy(split.y)
    generator = torch.Generator().manual_seed(seed)
    loss_fn = nn.CrossEntropyLoss()
    last = 0.0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        total, count = 0.0, 0
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            if len(idx) < 2 and len(x) >= 2:
                continue  # batch norm needs two samples
            xb, yb = x[idx].to(device), y[idx].to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            if extra_loss is not None:
                loss = loss + extra_loss(model)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        last = total / max(count, 1)
    return last


@torch.no_grad()
def evaluate_model(model: nn.Module, split: ArraySplit, device: torch.device, batch_size: int = 512) -> dict[str, float]:
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
