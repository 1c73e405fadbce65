"""Several clients' local SGD as one batched computation (``torch.func``: ``functional_call``, ``vmap``).

The clients' parameters and momentum buffers are stacked along a leading client axis; each step is one
``vmap`` of the forward pass over clients and one backward pass (faster on CPU than ``vmap`` of ``grad``).
Each client keeps what :func:`fedsim.methods.common.training.train_epochs` gives it: its own batch order
(:func:`minibatches` from its own seeded generator), SGD with momentum and weight decay as ``torch.optim.SGD``
computes it, and the last epoch's mean loss. Uneven client sizes are handled by masking: every batch is padded
to ``batch_size`` rows whose loss weight is 0, and a client that has run all its steps keeps its parameters and
momentum while the others go on, so a small client costs padded steps, never a different result. The weights
equal the loop's within float rounding (batched products sum in another order; tests/test_vectorized.py).

``resources.vectorize: auto`` uses it where it is faster (:func:`use_vectorized`): a method that declares a
batched counterpart of an operation in its own class (``vectorized_operations``, never inherited), a model of
``Linear`` and ``ReLU`` layers only (convolutions are slower under ``vmap`` on CPU and keep the loop), on CPU,
for two clients or more in one call. ``off`` (the default) always runs the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from fedsim.methods.common.training import minibatches

VECTORIZE_MODES = ("off", "auto")
#: layer types of a model that ``auto`` vectorizes (containers hold no computation of their own)
VECTORIZABLE_LAYERS = (nn.Linear, nn.ReLU)


@dataclass(frozen=True)
class ClientJob:
    """One client's local update: its training inputs and labels, starting weights, seed and proximal anchor."""

    x: np.ndarray
    y: np.ndarray
    weights: Mapping[str, np.ndarray]
    seed: int
    anchor: Optional[Mapping[str, np.ndarray]] = None  # FedProx's w_global (None: no proximal term)


def vectorized_operations(method) -> Mapping[str, str]:
    """Operation name -> name of its batched counterpart, as the method's own class declares it."""
    return vars(type(method)).get("vectorized_operations", {})


def vectorizable_model(model: nn.Module, device) -> bool:
    """The rule of ``auto``: on CPU, every layer a Linear or a ReLU (or a container of them), no buffers."""
    if torch.device(device).type != "cpu" or any(True for _ in model.buffers()):
        return False
    return all(
        isinstance(m, VECTORIZABLE_LAYERS) or (any(m.children()) and not any(True for _ in m.parameters(recurse=False)))
        for m in model.modules()
    )


def use_vectorized(mode: str, method, operation: str, count: int) -> bool:
    """Whether ``count`` clients' ``operation`` in one call run batched (``mode`` is ``resources.vectorize``)."""
    if mode == "off" or count < 2 or operation not in vectorized_operations(method):
        return False
    return bool(method.vectorizable(operation))


def stacked_arrays(arrays: Sequence, device) -> torch.Tensor:
    """The clients' arrays of one tensor along a client axis: one numpy stack, one torch tensor."""
    return torch.from_numpy(np.stack([np.asarray(a) for a in arrays])).to(device)


def client_schedules(jobs: Sequence[ClientJob], epochs: int, batch_size: int) -> list[list[list[torch.Tensor]]]:
    """Each client's index batches, per epoch, as ``train_epochs`` draws them from the client's seed."""
    out = []
    for job in jobs:
        generator = torch.Generator().manual_seed(job.seed)
        out.append([list(minibatches(len(job.x), batch_size, generator)) for _ in range(epochs)])
    return out


def padded_steps(schedules, offsets: list[int], batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows into the clients' concatenated data [steps, clients, batch_size] and their weights (1 or 0)."""
    flat = [[idx for epoch in schedule for idx in epoch] for schedule in schedules]
    steps = max((len(f) for f in flat), default=0)
    rows = torch.tensor(offsets, dtype=torch.long).view(1, -1, 1).repeat(steps, 1, batch_size)
    mask = torch.zeros(steps, len(flat), batch_size)  # padding points at a real row of the client; its weight is 0
    for k, batches in enumerate(flat):
        if batches:
            real = torch.arange(batch_size) < torch.tensor([len(idx) for idx in batches]).view(-1, 1)
            rows[: len(batches), k][real] = torch.cat(batches) + offsets[k]
            mask[: len(batches), k] = real.float()
    return rows, mask


def _batched_step(model: nn.Module, mu: float):
    """Per-client losses and gradients of one padded batch each: ``vmap`` of the model's forward over the
    stacked parameters, then one backward of the summed losses (client k's loss depends on its parameters
    only, so each client gets its own gradient). Each loss is the mean cross-entropy over the client's real
    rows, plus mu/2 ||w - anchor||^2 (FedProx)."""
    forward = vmap(lambda params, xb: functional_call(model, params, (xb,)))

    def step(params, anchors, xb, yb, weight):
        live = {n: p.detach().requires_grad_(True) for n, p in params.items()}
        logits = forward(live, xb)
        per_row = nn.functional.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none").view(yb.shape)
        losses = (per_row * weight).sum(1) / weight.sum(1).clamp(min=1.0)
        if mu:
            losses = losses + 0.5 * mu * sum(((live[n] - anchors[n]) ** 2).flatten(1).sum(1) for n in live)
        grads = torch.autograd.grad(losses.sum(), list(live.values()))
        return dict(zip(live, grads)), losses.detach()

    return step


def _sgd_step(params, buffers, grads, active, settings) -> None:
    """``torch.optim.SGD``'s update (weight decay, momentum without dampening) on the active clients only."""
    everyone = bool(active.all())
    for name, p in params.items():
        d_p = grads[name]
        if settings.weight_decay != 0:
            d_p = d_p.add(p, alpha=settings.weight_decay)
        if everyone:  # in place: the common case, cheaper than a select
            if settings.momentum != 0:
                d_p = buffers[name].mul_(settings.momentum).add_(d_p)
            p.add_(d_p, alpha=-settings.lr)
            continue
        keep = active.view(-1, *([1] * (p.dim() - 1)))
        if settings.momentum != 0:
            buffers[name] = torch.where(keep, buffers[name].mul(settings.momentum).add(d_p), buffers[name])
            d_p = buffers[name]
        params[name] = torch.where(keep, p.add(d_p, alpha=-settings.lr), p)


def last_epoch_means(schedules, losses: torch.Tensor) -> list[float]:
    """Each client's mean of a per-step value (losses [steps, clients]) over its last epoch's batches, weighted by
    batch size (as ``train_epochs`` averages its loss)."""
    values = losses.tolist()
    out = []
    for k, schedule in enumerate(schedules):
        first = sum(len(epoch) for epoch in schedule[:-1])
        total, count = 0.0, 0
        for t, idx in enumerate(schedule[-1] if schedule else [], start=first):
            total += values[t][k] * len(idx)
            count += len(idx)
        out.append(total / max(count, 1))
    return out


def train_clients(
    model: nn.Module, jobs: Sequence[ClientJob], settings, device, mu: float = 0.0
) -> tuple[list[dict[str, np.ndarray]], list[float]]:
    """``settings.local_epochs`` epochs of SGD for every job at once; each job's weights and last-epoch loss.

    ``model`` gives the architecture only (its own weights are not read nor changed); ``settings`` has the
    attributes of :class:`fedsim.methods.common.settings.LocalSettings`.
    """
    if any(j.y is None for j in jobs):
        raise ValueError("train_clients needs labels: the target client's training inputs are unlabeled")
    names = [name for name, _ in model.named_parameters()]
    params = {n: stacked_arrays([j.weights[n] for j in jobs], device) for n in names}
    buffers = {n: torch.zeros_like(p) for n, p in params.items()}
    anchors = {n: stacked_arrays([(j.anchor or j.weights)[n] for j in jobs], device) for n in names} if mu else {}
    x = torch.from_numpy(np.concatenate([j.x for j in jobs])).to(device)
    y = torch.from_numpy(np.concatenate([j.y for j in jobs])).to(device)
    offsets = np.concatenate([[0], np.cumsum([len(j.x) for j in jobs])[:-1]]).tolist()
    schedules = client_schedules(jobs, settings.local_epochs, settings.batch_size)
    rows, mask = padded_steps(schedules, offsets, settings.batch_size)
    rows, mask = rows.to(device), mask.to(device)
    step = _batched_step(model, mu)
    losses = []
    for t in range(len(rows)):
        grads, loss = step(params, anchors, x[rows[t]], y[rows[t]], mask[t])
        _sgd_step(params, buffers, grads, mask[t].sum(1) > 0, settings)
        losses.append(loss)
    stacked = {n: params[n].detach().cpu().numpy().copy() for n in names}  # one copy per tensor, a view per client
    weights = [{n: stacked[n][k] for n in names} for k in range(len(jobs))]
    return weights, last_epoch_means(schedules, torch.stack(losses) if losses else torch.zeros(0, len(jobs)))


def in_groups(keys: Sequence, train) -> tuple[list, list]:
    """``train(key, members)`` -> (weights, per-client values) once per distinct key (hashable) over the members
    (indices) that share it; both lists back in the members' original order."""
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    weights: list = [None] * len(keys)
    values: list = [None] * len(keys)
    for key, members in groups.items():
        for i, w, value in zip(members, *train(key, members)):
            weights[i], values[i] = w, value
    return weights, values


def train_grouped(
    model: nn.Module, jobs: Sequence[ClientJob], settings: Sequence, device, mu: float = 0.0
) -> tuple[list[dict[str, np.ndarray]], list[float]]:
    """:func:`train_clients` over the jobs that share their local settings (``settings[i]`` is job i's, hashable),
    results in the jobs' order."""
    return in_groups(
        settings, lambda setting, members: train_clients(model, [jobs[i] for i in members], setting, device, mu)
    )
