"""Several clients' local SGD as one batched computation.

The clients' parameters and momentum buffers are stacked along a leading client axis; each step is one batched
forward and backward pass over the clients (:mod:`fedsim.methods.common.linear_chain`: hand-written ``bmm``
products, faster on CPU than ``vmap`` with autograd). Each client keeps what
:func:`fedsim.methods.common.training.train_epochs` gives it: its own batch order (:func:`minibatches` from its own
seeded generator), SGD with momentum and weight decay as ``torch.optim.SGD`` computes it, and the last epoch's mean
loss. Uneven client sizes are handled by grouping: at each step the clients whose batches have the same length
train in one call (one call for every client when all batches are alike, as on TEP's equal clients), and a client
that has run all its steps sits out, so no client computes on padding and none gets a different result. The weights
equal the loop's within float rounding (batched products sum in another order; tests/test_vectorized.py).

``resources.vectorize: auto`` uses it where it is faster (:func:`use_vectorized`): a method that declares a
batched counterpart of an operation in its own class (``vectorized_operations``, never inherited), a model whose
forward pass is a chain of ``Linear`` and ``ReLU`` layers (convolutions are slower batched on CPU and keep the
loop), on CPU, in float32, for two clients or more in one call. ``off`` (the default) always runs the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn

from fedsim.methods.common.linear_chain import chain_of, chain_sgd_step
from fedsim.methods.common.training import minibatches

VECTORIZE_MODES = ("off", "auto")


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
    """The rule of ``auto``: on CPU, no buffers, the forward pass a chain of Linear and ReLU layers
    (:func:`fedsim.methods.common.linear_chain.chain_of`)."""
    if torch.device(device).type != "cpu" or any(True for _ in model.buffers()):
        return False
    return chain_of(model) is not None


def use_vectorized(mode: str, method, operation: str, count: int) -> bool:
    """Whether ``count`` clients' ``operation`` in one call run batched (``mode`` is ``resources.vectorize``). Under
    ``run.precision=bf16`` the loop runs (it holds the autocast of :mod:`fedsim.methods.common.precision`; the
    batched products here compute in float32)."""
    if mode == "off" or count < 2 or operation not in vectorized_operations(method):
        return False
    if method.config.run.precision != "fp32":
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


def flat_batches(schedules) -> list[list[torch.Tensor]]:
    """Each client's index batches over all its epochs, in the order it trains them."""
    return [[idx for epoch in schedule for idx in epoch] for schedule in schedules]


def padded_steps(schedules, offsets: list[int], batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows into the clients' concatenated data [steps, clients, batch_size] and their weights (1 or 0)."""
    flat = flat_batches(schedules)
    steps = max((len(f) for f in flat), default=0)
    rows = torch.tensor(offsets, dtype=torch.long).view(1, -1, 1).repeat(steps, 1, batch_size)
    mask = torch.zeros(steps, len(flat), batch_size)  # padding points at a real row of the client; its weight is 0
    for k, batches in enumerate(flat):
        if batches:
            real = torch.arange(batch_size) < torch.tensor([len(idx) for idx in batches]).view(-1, 1)
            rows[: len(batches), k][real] = torch.cat(batches) + offsets[k]
            mask[: len(batches), k] = real.float()
    return rows, mask


def step_buckets(schedules, offsets: list[int]) -> list[list[tuple[Optional[torch.Tensor], torch.Tensor]]]:
    """Per step, the clients that train grouped by their batch's length: (members, or None for every client in
    order; rows into the concatenated data [members, length]). A client's rows and loss never include another's
    padding, so its result does not depend on which clients share its call."""
    flat = [[idx + offset for idx in batches] for batches, offset in zip(flat_batches(schedules), offsets)]
    plan = []
    for t in range(max((len(f) for f in flat), default=0)):
        by_length: dict[int, list[int]] = {}
        for k, batches in enumerate(flat):
            if t < len(batches):
                by_length.setdefault(len(batches[t]), []).append(k)
        if len(by_length) == 1 and len(next(iter(by_length.values()))) == len(flat):
            plan.append([(None, torch.stack([f[t] for f in flat]))])
            continue
        plan.append([(torch.tensor(ks), torch.stack([flat[k][t] for k in ks])) for ks in by_length.values()])
    return plan


def _train_bucket(chain, state: tuple, members, rows, data: tuple, settings, first: bool, mu: float) -> torch.Tensor:
    """One step of the clients ``members`` (None: all) on their ``rows``; their losses. ``state`` is (params,
    buffers, anchors), stacked over every client; a subset trains on copies written back after the step."""
    (params, buffers, anchors), (x, y) = state, data
    if members is None:
        return chain_sgd_step(chain, params, buffers, x[rows], y[rows], settings, first, anchors, mu)
    sub = [{n: t[members] for n, t in part.items()} for part in (params, buffers, anchors)]
    losses = chain_sgd_step(chain, sub[0], sub[1], x[rows], y[rows], settings, first, sub[2], mu)
    for part, copy in zip((params, buffers), sub):
        for name, tensor in part.items():
            tensor.index_copy_(0, members, copy[name])
    return losses


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
    attributes of :class:`fedsim.messages.LocalSettings`.
    """
    if any(j.y is None for j in jobs):
        raise ValueError("train_clients needs labels: the target client's training inputs are unlabeled")
    chain = chain_of(model)
    if chain is None:
        raise ValueError("train_clients trains a chain of Linear and ReLU layers; this model is not one")
    names = [name for name, _ in model.named_parameters()]
    params = {n: stacked_arrays([j.weights[n] for j in jobs], device) for n in names}
    buffers = {n: torch.zeros_like(p) for n, p in params.items()}
    anchors = {n: stacked_arrays([(j.anchor or j.weights)[n] for j in jobs], device) for n in names} if mu else {}
    x = torch.from_numpy(np.concatenate([j.x for j in jobs])).to(device)
    y = torch.from_numpy(np.concatenate([j.y for j in jobs])).to(device)
    offsets = np.concatenate([[0], np.cumsum([len(j.x) for j in jobs])[:-1]]).tolist()
    schedules = client_schedules(jobs, settings.local_epochs, settings.batch_size)
    plan = step_buckets(schedules, offsets)
    losses = torch.zeros(len(plan), len(jobs))
    for t, buckets in enumerate(plan):
        for members, rows in buckets:
            on_device = None if members is None else members.to(device)
            values = _train_bucket(
                chain, (params, buffers, anchors), on_device, rows.to(device), (x, y), settings, t == 0, mu
            )
            losses[t, slice(None) if members is None else members] = values.cpu()
    stacked = {n: params[n].detach().cpu().numpy().copy() for n in names}  # one copy per tensor, a view per client
    weights = [{n: stacked[n][k] for n in names} for k in range(len(jobs))]
    return weights, last_epoch_means(schedules, losses)


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
