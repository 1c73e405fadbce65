"""Several FedMMD source clients' local epochs as one batched computation (``resources.vectorize: auto``).

Each client gets what :meth:`fedsim.methods.alignment.base.FeatureAlignment.fit` gives it in the loop: its
batch order (:func:`~fedsim.methods.common.training.minibatches` from its seed), one target batch per trained batch
(as many rows of the received target features as the batch has, drawn with ``randperm`` from its own
``derive_seed(seed, "target-batch")`` generator), lambda and the learning-rate factor of each of its steps
(:class:`~fedsim.methods.alignment.objective.AlignmentObjective`'s step count), SGD as ``torch.optim.SGD`` computes it
and its last epoch's ``train_loss``, ``domain_loss`` and ``lr``. The objective per client is cross-entropy over
its real rows + lambda * MK-MMD^2 (:func:`fedsim.losses.mmd.gaussian_mmd2`, Gretton et al. 2012, Eq. 3) between
its real source and target rows, the median heuristic over its own pooled points. Uneven clients are masked as in
:mod:`fedsim.methods.common.vectorized`. Equal to the loop within float rounding (tests/test_vectorized_alignment.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from fedsim.methods.alignment.objective import steps_per_epoch
from fedsim.methods.common.vectorized import (
    ClientJob,
    client_schedules,
    flat_batches,
    in_groups,
    last_epoch_means,
    padded_steps,
    stacked_arrays,
)


@dataclass(frozen=True)
class AlignmentJob:
    """One source client's fit: its data, weights and seeds, and its (lambda, lr factor) of step ``s`` (1-based)."""

    job: ClientJob
    target_seed: int
    schedule: Callable[[int], tuple[float, float]]


def masked_mmd2(pooled: torch.Tensor, real: torch.Tensor, half: int, bandwidths, multipliers) -> torch.Tensor:
    """MK-MMD^2 per client of ``pooled`` [K, 2B, d] (source rows, then target rows), over the rows ``real`` [K, 2B]
    marks; each client has as many real target rows as source rows (``half`` = B)."""
    norms = pooled.pow(2).sum(2)
    sq = (norms.unsqueeze(2) + norms.unsqueeze(1) - 2.0 * pooled @ pooled.transpose(1, 2)).clamp_min(0.0)
    if bandwidths:
        variances = torch.tensor([b**2 for b in bandwidths], dtype=pooled.dtype, device=pooled.device)
        variances = variances.expand(len(pooled), -1)
    else:
        variances = _median(sq.detach(), real) * torch.tensor(
            list(multipliers), dtype=pooled.dtype, device=pooled.device
        )
    scales = (-0.5 / variances).view(*variances.shape, 1, 1)
    kernel = torch.exp(sq.unsqueeze(1) * scales).mean(1)
    source, target = real.clone(), real.clone()
    source[:, half:], target[:, :half] = False, False
    s, t = source.to(kernel.dtype), target.to(kernel.dtype)
    m = s.sum(1)
    diagonal = kernel.diagonal(dim1=1, dim2=2)

    def form(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:  # left^T K right per client
        return (left.unsqueeze(1) @ kernel @ right.unsqueeze(2)).view(-1)

    pairs = (m * (m - 1)).clamp_min(1)
    within_s = (form(s, s) - (diagonal * s).sum(1)) / pairs
    within_t = (form(t, t) - (diagonal * t).sum(1)) / pairs
    return within_s + within_t - 2.0 * form(s, t) / (m * m).clamp_min(1)


def _target_rows(jobs: Sequence[AlignmentJob], schedules, target_count: int, batch_size: int) -> torch.Tensor:
    """Rows of the target features per step and client [steps, clients, batch_size], drawn as the loop draws them:
    one ``randperm`` per trained batch from the client's target generator, as many rows as the batch (0: padding)."""
    flat = flat_batches(schedules)
    rows = torch.zeros(max((len(f) for f in flat), default=0), len(jobs), batch_size, dtype=torch.long)
    for k, (job, batches) in enumerate(zip(jobs, flat)):
        generator = torch.Generator().manual_seed(job.target_seed)
        for t, idx in enumerate(batches):
            rows[t, k, : len(idx)] = torch.randperm(target_count, generator=generator)[: len(idx)]
    return rows


def _step_schedule(jobs: Sequence[AlignmentJob], steps: int, settings) -> torch.Tensor:
    """(lambda, learning rate) per step and client [2, steps, clients], counted as the loop's objective counts its
    steps (the skipped batch of one included); 0 where a client has no step."""
    out = torch.zeros(2, steps, len(jobs), dtype=torch.float64)
    for k, job in enumerate(jobs):
        batches, trained = steps_per_epoch(len(job.job.x), settings.batch_size)
        for t in range(settings.local_epochs * trained):
            epoch, position = divmod(t, trained)
            weight, factor = job.schedule(epoch * batches + position + 1)
            out[0, t, k], out[1, t, k] = weight, settings.lr * factor
    return out


def _objective_step(model: nn.Module, kernels: tuple):
    """Per-client (task loss, MMD^2) of one padded batch each and the gradients of task + lambda * MMD^2."""
    encoder = vmap(lambda params, xb: functional_call(model.encoder, params, (xb,)))
    head = vmap(lambda params, features: functional_call(model.head, params, (features,)))

    def part(live: dict, prefix: str) -> dict:
        return {name[len(prefix) :]: p for name, p in live.items() if name.startswith(prefix)}

    def step(params, xb, yb, target, weight, lam):
        live = {n: p.detach().requires_grad_(True) for n, p in params.items()}
        features = encoder(part(live, "encoder."), xb)
        logits = head(part(live, "head."), features)
        per_row = nn.functional.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none").view(yb.shape)
        task = (per_row * weight).sum(1) / weight.sum(1).clamp(min=1.0)
        real = weight > 0
        mmd = masked_mmd2(torch.cat([features, target], 1), torch.cat([real, real], 1), xb.shape[1], *kernels)
        losses = task + lam.to(task.dtype) * mmd
        grads = torch.autograd.grad(losses.sum(), list(live.values()))
        return dict(zip(live, grads)), task.detach(), mmd.detach()

    return step


def _sgd_rates(params: dict, buffers: dict, grads: dict, active: torch.Tensor, rates: torch.Tensor, settings):
    """SGD (momentum, weight decay) with each client's own learning rate of this step, active clients only."""
    for name, p in params.items():
        keep = active.view(-1, *([1] * (p.dim() - 1)))
        d_p = grads[name] if settings.weight_decay == 0 else grads[name].add(p, alpha=settings.weight_decay)
        if settings.momentum != 0:
            buffers[name] = torch.where(keep, buffers[name].mul(settings.momentum).add(d_p), buffers[name])
            d_p = buffers[name]
        params[name] = torch.where(keep, p - rates.to(p.dtype).view_as(keep) * d_p, p)


def _median(sq: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Each client's median (torch.median's: the lower one) of its off-diagonal squared distances between real
    points [K, 1], at least 1e-12. The matrices are symmetric, so the upper triangle holds each value once and its
    lower median is the whole matrix's (up to the product's rounding, which can leave sq_ij and sq_ji an ulp
    apart)."""
    n = sq.shape[1]
    upper = torch.triu_indices(n, n, offset=1, device=sq.device)
    pairs = real[:, upper[0]] & real[:, upper[1]]
    values = sq[:, upper[0], upper[1]]
    counts = pairs.sum(1)
    if bool(pairs.all()):  # every client's batch full: one rank for all, no sort
        median = values.kthvalue(int((counts[0] - 1) // 2) + 1, dim=1).values.view(-1, 1)
    else:
        values = torch.where(pairs, values, torch.full_like(values, float("inf"))).sort(1).values
        median = values.gather(1, ((counts - 1) // 2).clamp_min(0).view(-1, 1))
    return median.clamp_min(1e-12)


def train_alignment_clients(
    model: nn.Module, jobs: Sequence[AlignmentJob], settings, target: np.ndarray, device, kernels: tuple
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, float]]]:
    """Every job's local epochs against ``target`` (the received target features) at once: each client's weights
    and its last epoch's metrics. ``kernels`` = (bandwidths, multipliers) of the MMD; ``model`` gives the
    architecture (an encoder and a head) only."""
    plain = [job.job for job in jobs]
    if any(len(j.x) < 2 for j in plain):
        raise ValueError("domain losses need at least 2 sample(s) per domain: a source client has one sample")
    names = [name for name, _ in model.named_parameters()]
    params = {n: stacked_arrays([j.weights[n] for j in plain], device) for n in names}
    buffers = {n: torch.zeros_like(p) for n, p in params.items()}
    x = torch.from_numpy(np.concatenate([j.x for j in plain])).to(device)
    y = torch.from_numpy(np.concatenate([j.y for j in plain])).to(device)
    offsets = np.concatenate([[0], np.cumsum([len(j.x) for j in plain])[:-1]]).tolist()
    schedules = client_schedules(plain, settings.local_epochs, settings.batch_size)
    rows, mask = padded_steps(schedules, offsets, settings.batch_size)
    features = torch.tensor(np.asarray(target)).to(device)
    target_rows = _target_rows(jobs, schedules, len(features), settings.batch_size)
    lambdas, rates = _step_schedule(jobs, len(rows), settings)
    step = _objective_step(model, kernels)
    tasks, mmds = [], []
    for t in range(len(rows)):
        grads, task, mmd = step(params, x[rows[t]], y[rows[t]], features[target_rows[t]], mask[t], lambdas[t])
        _sgd_rates(params, buffers, grads, mask[t].sum(1) > 0, rates[t], settings)
        tasks.append(task)
        mmds.append(mmd)
    stacked = {n: params[n].detach().cpu().numpy().copy() for n in names}
    weights = [{n: stacked[n][k] for n in names} for k in range(len(jobs))]
    empty = torch.zeros(0, len(jobs))
    columns = [torch.stack(v) if v else empty for v in (tasks, mmds)] + [rates]
    means = [last_epoch_means(schedules, column) for column in columns]
    keys = ("train_loss", "domain_loss", "lr")
    trained = [any(len(epoch) for epoch in schedule) for schedule in schedules]  # no step: no metrics, as the loop
    return weights, [dict(zip(keys, values)) if ran else {} for values, ran in zip(zip(*means), trained)]


def train_alignment_grouped(
    model: nn.Module, jobs: Sequence[AlignmentJob], settings: Sequence, targets: Sequence[np.ndarray], device, kernels
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, float]]]:
    """:func:`train_alignment_clients` over the jobs that share their local settings and target features (one
    round's sources share both), results in the jobs' order."""

    def train(key, members):
        setting, _ = key
        group = [jobs[i] for i in members]
        return train_alignment_clients(model, group, setting, targets[members[0]], device, kernels)

    return in_groups([(setting, id(target)) for setting, target in zip(settings, targets)], train)
