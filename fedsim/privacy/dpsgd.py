"""Record-level differential privacy: DP-SGD inside each client's local training (``privacy.unit=record``,
``docs/privacy.md``).

One step (Abadi et al., *Deep Learning with Differential Privacy*, CCS 2016, Alg. 1): a batch is drawn by Poisson
sampling, each of the client's n records joining it independently with probability q = batch_size / n (the
sampling the accountant assumes); every record's gradient is computed on its own (torch.func's vmap over grad of a
functional call) and clipped to L2 norm C over all parameters; the clipped gradients are summed, Gaussian noise
N(0, (z C)^2) is added to every entry, and the sum is divided by the expected batch size q n. The optimizer then
steps as usual (momentum and weight decay are post-processing).

A client takes ceil(n / batch_size) steps per local epoch. Its noise multiplier z is calibrated so that all its
steps of all rounds (steps per epoch x local epochs x rounds, each a Poisson-subsampled Gaussian) spend at most
``privacy.epsilon`` at ``privacy.delta`` by dp_accounting's accountant (``privacy.accountant``): the same
computation on the client, which noises, and on the server, which reports the epsilon spent. The model update a
client sends is a function of its noised steps: by post-processing it needs no noise of its own.

Per-example gradients need no coupling between a batch's examples: a model under ``privacy.unit=record`` has its
batch norms replaced by group norms (:func:`fedsim.models.normalization.replace_batch_norm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import torch
from torch import nn

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class RecordPlan:
    """One client's DP-SGD: its sampling rate, steps and noise multiplier."""

    records: int
    """n: the client's training records."""
    rate: float
    """q = batch_size / n (at most 1): each record's probability of joining a batch."""
    steps_per_epoch: int
    """ceil(n / batch_size): the steps of one local epoch."""
    steps_per_round: int
    """steps per epoch x local epochs: the steps of one local update."""
    total_steps: int
    """steps per round x rounds: the steps the budget covers."""
    noise_multiplier: float
    """z: the noise on a step's sum of clipped gradients has std z C."""
    clip: float
    """C: the L2 bound of one record's gradient."""

    @property
    def expected_batch(self) -> float:
        """q n: what a step's noised sum is divided by."""
        return self.rate * self.records

    def epsilon(self, steps: int, delta: float, kind: str = "rdp") -> float:
        """The epsilon at ``delta`` that ``steps`` of this client's steps spend."""
        return record_epsilon(self.rate, self.noise_multiplier, steps, delta, kind)


def record_epsilon(rate: float, noise_multiplier: float, steps: int, delta: float, kind: str = "rdp") -> float:
    """The epsilon at ``delta`` of ``steps`` Poisson-subsampled Gaussian steps (rate q, multiplier z), composed by
    dp_accounting's accountant ``kind`` (0 for no step)."""
    from fedsim.privacy.accountant import spent_epsilon

    return spent_epsilon([(rate,)] * steps, noise_multiplier, delta, kind) if steps else 0.0


@lru_cache(maxsize=64)
def record_noise_multiplier(rate: float, steps: int, epsilon: float, delta: float, kind: str = "rdp") -> float:
    """The smallest z whose ``steps`` Poisson-subsampled Gaussian steps at rate q spend at most ``epsilon`` at
    ``delta`` (:func:`fedsim.privacy.accountant.calibrate_noise_multiplier` on these events)."""
    from fedsim.privacy.accountant import calibrate_noise_multiplier

    return calibrate_noise_multiplier([(rate,)] * steps, epsilon, delta, kind)


def record_plan(config, records: int, epochs: Optional[int] = None) -> Optional[RecordPlan]:
    """The DP-SGD of a client of ``records`` training records under ``config`` (None unless privacy is on with
    ``privacy.unit=record``); z given by ``privacy.noise_multiplier`` or calibrated to ``privacy.epsilon`` over every
    round's ``epochs`` of local steps (default ``method.local_epochs``; ``method.batch_size``, ``run.rounds``)."""
    privacy = config.privacy
    if not privacy.active or privacy.unit != "record" or records < 1:
        return None
    batch_size = config.method.batch_size
    per_epoch = math.ceil(records / batch_size)
    per_round = per_epoch * (config.method.local_epochs if epochs is None else int(epochs))
    total = per_round * config.run.rounds
    rate = min(1.0, batch_size / records)
    if privacy.noise_multiplier is not None:
        z = float(privacy.noise_multiplier)
    else:
        z = record_noise_multiplier(rate, total, float(privacy.epsilon), privacy.target_delta, privacy.accountant)
    return RecordPlan(records, rate, per_epoch, per_round, total, z, float(privacy.clip))


class _Objective(nn.Module):
    """``loss(model, x, y)`` as a module, so that a functional call reaches the parameters the loss reads."""

    def __init__(self, model: nn.Module, loss: Loss):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model, x, y)


def per_example_gradients(
    model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, loss: Loss
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each example's gradient of ``loss`` w.r.t. every trainable parameter (name -> B x shape) and its loss (B),
    by torch.func: vmap over grad of a functional call on one example at a time."""
    from torch.func import functional_call, grad_and_value, vmap

    objective = _Objective(model, loss)
    params = {f"model.{name}": p.detach() for name, p in model.named_parameters() if p.requires_grad}
    buffers = {f"model.{name}": b for name, b in model.named_buffers()}

    def one(p, x, y):
        return functional_call(objective, {**p, **buffers}, (x.unsqueeze(0), y.unsqueeze(0)))

    grads, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0))(params, xb, yb)
    return {name[len("model.") :]: g for name, g in grads.items()}, losses


def clipped_sum(grads: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    """The sum over the batch of every example's gradient scaled by min(1, C / its L2 norm over all parameters)."""
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
    factors = (clip / norms.clamp_min(1e-12)).clamp(max=1.0)
    return {name: torch.tensordot(factors, g, dims=1) for name, g in grads.items()}


def dp_sgd_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    plan: RecordPlan,
    optimizer,
    seed: int,
    device: torch.device,
    loss: Loss,
    before_step: Optional[Callable[[int], None]] = None,
) -> torch.Tensor:
    """``epochs`` of DP-SGD steps on (x, y) (the module docstring); the last epoch's mean loss over the sampled
    records as a float64 tensor on ``device``. The Poisson draws and the noise come from a CPU generator seeded
    with ``seed``, so every device takes the same steps. ``model`` is every trained parameter (a module holding
    the network and, say, a domain discriminator); ``before_step(step)``, step counted from 1 over the epochs, runs
    before each step's gradients (a schedule, a fresh batch of other data the loss reads)."""
    generator = torch.Generator().manual_seed(seed)
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    std = plan.noise_multiplier * plan.clip
    model.train()
    last = torch.zeros((), dtype=torch.float64, device=device)
    for epoch in range(epochs):
        total, count = torch.zeros((), dtype=torch.float64, device=device), 0
        for position in range(plan.steps_per_epoch):
            if before_step is not None:
                before_step(epoch * plan.steps_per_epoch + position + 1)
            chosen = (torch.rand(len(x), generator=generator) < plan.rate).nonzero().squeeze(1)
            noise = {name: torch.normal(0.0, std, p.shape, generator=generator) for name, p in params}
            summed: dict[str, torch.Tensor] = {}
            if len(chosen):
                idx = chosen.to(x.device)
                grads, losses = per_example_gradients(model, x[idx].to(device), y[idx].to(device), loss)
                summed = clipped_sum(grads, plan.clip)
                total += losses.detach().double().sum()
                count += len(chosen)
            for name, p in params:
                step = noise[name].to(device)
                if name in summed:
                    step = step + summed[name]
                p.grad = (step / plan.expected_batch).to(p.dtype)
            optimizer.step()
        last = total / max(count, 1)
    return last
