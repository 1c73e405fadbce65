"""Adversarial domain loss: gradient reversal and a domain discriminator.

DANN (Ganin & Lempitsky, ICML 2015; Ganin et al., JMLR 2016): a discriminator
D learns to tell source features (label 1) from target features (label 0) by
binary cross-entropy; the features reach it through a gradient reversal layer,
identity forward and ``-lambda * grad`` backward (Eq. 9-10 of the JMLR paper),
so one backward pass trains D to separate the domains and the encoder to make
them inseparable.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from fedsim.losses.domain import DomainLoss, check_features


class GradientReversal(torch.autograd.Function):
    """R_lambda(x) = x forward, dR/dx = -lambda I backward (Ganin & Lempitsky 2015, Eq. 9-10)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, coefficient: float) -> torch.Tensor:
        ctx.coefficient = float(coefficient)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return -ctx.coefficient * grad_output, None


def grad_reverse(x: torch.Tensor, coefficient: float = 1.0) -> torch.Tensor:
    """Functional form of :class:`GradientReversal`."""
    return GradientReversal.apply(x, coefficient)


class GradientReversalLayer(nn.Module):
    """Module form of :class:`GradientReversal`; ``coefficient`` may change during training."""

    def __init__(self, coefficient: float = 1.0):
        super().__init__()
        self.coefficient = float(coefficient)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return grad_reverse(x, self.coefficient)

    def extra_repr(self) -> str:
        return f"coefficient={self.coefficient}"


class DomainDiscriminator(nn.Module):
    """MLP feature -> one logit (source vs target); ``layers`` hidden layers of ``hidden`` units with ReLU."""

    def __init__(self, in_features: int, hidden: int = 256, layers: int = 2):
        super().__init__()
        if in_features <= 0 or hidden <= 0 or layers < 0:
            raise ValueError(
                f"DomainDiscriminator needs positive sizes, got in_features={in_features}, hidden={hidden}, "
                f"layers={layers}"
            )
        blocks: list[nn.Module] = []
        width = in_features
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        blocks.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


class DANNLoss(DomainLoss):
    """Binary cross-entropy of D(GRL(features)), source = 1, target = 0, each domain weighted 1/2.

    ``coefficient`` is the gradient-reversal lambda (the weight the *features*
    see); the discriminator always gets the unscaled gradient. After each call
    ``last_metrics["discriminator_accuracy"]`` holds the balanced accuracy of D
    on the two batches (0.5 = domains indistinguishable).
    """

    def __init__(self, in_features: int, hidden: int = 256, layers: int = 2, coefficient: float = 1.0):
        super().__init__()
        self.discriminator = DomainDiscriminator(in_features, hidden, layers)
        self.reversal = GradientReversalLayer(coefficient)

    @property
    def coefficient(self) -> float:
        return self.reversal.coefficient

    @coefficient.setter
    def coefficient(self, value: float) -> None:
        self.reversal.coefficient = float(value)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        check_features(source, target)
        logits = self.discriminator(self.reversal(torch.cat([source, target])))
        logit_s, logit_t = logits[: len(source)], logits[len(source) :]
        loss_s = F.binary_cross_entropy_with_logits(logit_s, torch.ones_like(logit_s))
        loss_t = F.binary_cross_entropy_with_logits(logit_t, torch.zeros_like(logit_t))
        with torch.no_grad():
            accuracy = 0.5 * ((logit_s > 0).float().mean() + (logit_t <= 0).float().mean())
        self.last_metrics = {"discriminator_accuracy": float(accuracy)}
        return 0.5 * (loss_s + loss_t)

    def objective(self, source: torch.Tensor, target: torch.Tensor, weight: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The full discriminator loss with gradient-reversal coefficient ``weight`` (Ganin et al. 2016, Eq. 10)."""
        self.coefficient = weight
        value = self(source, target)
        return value, value

    per_record = True

    def per_record_objective(self, source: torch.Tensor, target: torch.Tensor, weight: float) -> torch.Tensor:
        """:meth:`objective`'s value with the reversal written as (1 + w) x.detach() - w x (the value x, the gradient
        -w I: Eq. 9-10 without the autograd Function, which vmap does not take); no metrics."""
        features = torch.cat([source, target])
        reversed_features = (1.0 + weight) * features.detach() - weight * features
        logits = self.discriminator(reversed_features)
        logit_s, logit_t = logits[: len(source)], logits[len(source) :]
        loss_s = F.binary_cross_entropy_with_logits(logit_s, torch.ones_like(logit_s))
        loss_t = F.binary_cross_entropy_with_logits(logit_t, torch.zeros_like(logit_t))
        return 0.5 * (loss_s + loss_t)
