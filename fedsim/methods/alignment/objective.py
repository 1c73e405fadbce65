"""Pieces of feature alignment against a target domain: the step objective cross-entropy + lambda * domain loss,
the optimizer over a model and a domain loss's parameters, and the steps of an epoch; the target's encoded subset
is :mod:`fedsim.methods.common.target_features`.

The schedule follows Ganin et al. (JMLR 2016, Sec. 5.2.2): lambda ramps as 2 / (1 + exp(-10 p)) - 1 and the
learning rate anneals as mu_0 / (1 + 10 p)^0.75, p the training progress in [0, 1].
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from fedsim.losses import DomainLoss
from fedsim.messages import LocalSettings
from fedsim.methods.common.training import make_optimizer
from fedsim.optim import Optimizer

SCHEDULES = ("dann", "constant")  # lambda ramp and learning-rate annealing: Ganin et al.'s, or none


def feature_dim(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Width of the encoder's output, from one forward pass of zeros in eval mode."""
    model.eval()
    with torch.no_grad():
        device = next(model.parameters()).device
        return int(model.features(torch.zeros((1, *input_shape), device=device)).shape[-1])


def steps_per_epoch(count: int, batch_size: int) -> tuple[int, int]:
    """(batches of one epoch, batches that train): :func:`~fedsim.methods.common.training.minibatches`
    skips a final batch of one, which still counts as a step of the lambda ramp."""
    batches = -(-count // batch_size)
    return batches, batches - int(count % batch_size == 1 and count >= 2)


class AlignmentObjective:
    """The ``step_loss`` of a source's local epochs: cross-entropy(head(f_s), y_s) + lambda * domain loss.

    Each call draws a batch of the target (its own generator), asks ``schedule(step)`` for
    (lambda, learning-rate factor) (``step`` counts the batches of the epochs so far, skipped ones
    included), sets every param group of ``optimizer`` to its ``initial_lr`` times the factor (the step
    that follows uses it) and keeps the per-sample means of the last epoch's task loss, domain loss and
    the loss's diagnostics. ``target`` holds features, or inputs when ``encode_target`` (the centralized
    references: the target batch goes through the encoder in its own forward pass, so its gradient is trained too).
    """

    def __init__(
        self,
        domain_loss: DomainLoss,
        target: torch.Tensor,
        generator: torch.Generator,
        schedule: Callable[[int], tuple[float, float]],
        batches: int,
        trained: int,
        optimizer: Optional[Optimizer] = None,
        encode_target: bool = False,
    ):
        self.domain_loss, self.target, self.generator, self.schedule = domain_loss, target, generator, schedule
        self.batches, self.trained, self.optimizer, self.encode_target = batches, trained, optimizer, encode_target
        self.calls, self.count = 0, 0
        self.sums: dict[str, float] = {}

    def __call__(self, model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        epoch, position = divmod(self.calls, self.trained)
        self.calls += 1
        if position == 0:  # a new epoch: the metrics are the last epoch's
            self.sums, self.count = {}, 0
        weight, lr_factor = self.schedule(epoch * self.batches + position + 1)
        for group in self.optimizer.param_groups if self.optimizer is not None else ():
            group["lr"] = group["initial_lr"] * lr_factor
        pick = torch.randperm(len(self.target), generator=self.generator)[: len(xb)]
        target = self.target[pick].to(xb.device)
        source_features = model.features(xb)
        target_features = model.features(target) if self.encode_target else target
        task = nn.functional.cross_entropy(model.head(source_features), yb)
        term, value = self.domain_loss.objective(source_features, target_features, weight)
        batch = {
            "train_loss": float(task.detach()),
            "domain_loss": float(value.detach()),
            **self.domain_loss.last_metrics,
        }
        batch.update({"lr": float(self.optimizer.param_groups[0]["lr"])} if self.optimizer is not None else {})
        for key, number in batch.items():
            self.sums[key] = self.sums.get(key, 0.0) + number * len(xb)
        self.count += len(xb)
        return task + term

    def metrics(self) -> dict[str, float]:
        """Per-sample means over the last epoch."""
        return {key: value / max(self.count, 1) for key, value in self.sums.items()}


def alignment_optimizer(
    model: nn.Module, domain_loss: DomainLoss, settings: LocalSettings, domain_lr_scale: float
) -> Optimizer:
    """SGD over the model (``settings.lr``) and the domain loss's parameters (``settings.lr * domain_lr_scale``);
    each group keeps its base rate as ``initial_lr`` for the annealing."""
    groups = [{"params": list(model.parameters()), "initial_lr": settings.lr}]
    extra = list(domain_loss.parameters())
    if extra:
        groups.append({"params": extra, "initial_lr": settings.lr * domain_lr_scale})
    optimizer = make_optimizer(groups, settings)
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"]
    return optimizer


class AlignmentModules(nn.Module):
    """The network and the domain loss as one module: DP-SGD's per-example gradients reach both (the discriminator
    stays on the source, but the model it helps train leaves it)."""

    def __init__(self, model: nn.Module, domain_loss: DomainLoss):
        super().__init__()
        self.model = model
        self.domain_loss = domain_loss


class PrivateAlignmentObjective:
    """:class:`AlignmentObjective` for DP-SGD (``privacy.unit=record``): ``before_step(step)`` sets the step's
    lambda and learning rate (the same schedule) and draws its target batch; the call is one source record's loss,
    cross-entropy + the domain loss's :meth:`~fedsim.losses.DomainLoss.per_record_objective` against that batch,
    for torch.func's vmap over the sampled records (:func:`fedsim.privacy.dpsgd.dp_sgd_epochs`)."""

    def __init__(
        self,
        target: torch.Tensor,
        generator: torch.Generator,
        schedule: Callable[[int], tuple[float, float]],
        batch_size: int,
        optimizer: Optimizer,
    ):
        self.target, self.generator, self.schedule = target, generator, schedule
        self.batch_size, self.optimizer = batch_size, optimizer
        self.weight = 0.0
        self.batch = target[:0]

    def before_step(self, step: int) -> None:
        self.weight, lr_factor = self.schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lr_factor
        pick = torch.randperm(len(self.target), generator=self.generator)[: self.batch_size]
        self.batch = self.target[pick]

    def __call__(self, modules: AlignmentModules, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        features = modules.model.features(xb)
        task = nn.functional.cross_entropy(modules.model.head(features), yb)
        return task + modules.domain_loss.per_record_objective(features, self.batch.to(xb.device), self.weight)
