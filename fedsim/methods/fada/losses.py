"""The losses of FADA (Peng et al., "Federated Adversarial Domain Adaptation", ICLR 2020, Sec. 3).

* Domain identification and confusion (Sec. 3.2, Eq. 3): a domain identifier DI
  learns source = 1 / target = 0 by binary cross-entropy; the feature generators
  are then trained to *confuse* it, i.e. towards the uniform prediction 1/2
  (the domain-confusion loss of Tzeng et al., ICCV 2015), so that source and
  target generators, which both move, meet instead of swapping labels.
* Entropy of the class identifier (Sec. 3.3, Eq. 5): the disentangler maximizes
  ``H(softmax(CI(f_ds)))`` so that the domain-specific part carries no class information.
* Mutual information (Sec. 3.3, Eq. 6): MINE (Belghazi et al., ICML 2018), the
  Donsker-Varadhan lower bound of Eq. 10,
  ``I(X; Z) >= E_joint[T] - log E_marginal[e^T]``, with the bias-corrected
  gradient of their Sec. 3.2: the denominator ``E[e^T]`` of the gradient is
  replaced by an exponential moving average over batches.
* Reconstruction (Eq. 7): mean squared error between the generator features and
  the reconstructor's output from both parts.

:class:`AdversarialAlignment` runs Eq. 3 on a source's batches, :class:`Disentanglement` the four
updates of Sec. 3.3 on one batch of generator features.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedsim.optim import Optimizer


def domain_identifier_loss(source_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of DI, source = 1 and target = 0, each domain weighted 1/2 (Eq. 3)."""
    loss_s = F.binary_cross_entropy_with_logits(source_logits, torch.ones_like(source_logits))
    loss_t = F.binary_cross_entropy_with_logits(target_logits, torch.zeros_like(target_logits))
    return 0.5 * (loss_s + loss_t)


def domain_confusion_loss(logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of DI's prediction against the uniform 1/2 (minimum log 2 at logit 0)."""
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, 0.5))


@torch.no_grad()
def balanced_accuracy(source_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Balanced accuracy of DI (0.5: the domains are indistinguishable), a tensor on the logits' device."""
    return 0.5 * ((source_logits > 0).float().mean() + (target_logits <= 0).float().mean())


def domain_accuracy(source_logits: torch.Tensor, target_logits: torch.Tensor) -> float:
    """:func:`balanced_accuracy` as a number."""
    return float(balanced_accuracy(source_logits, target_logits))


def host_mean(values: list[torch.Tensor]) -> float:
    """The mean of 0-dim tensors, read back in one copy and summed in float64 (nan for none)."""
    if not values:
        return float("nan")
    return float(np.mean(torch.stack(values).detach().double().cpu().numpy()))


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean Shannon entropy (nats) of softmax(logits) over the batch; log K at the uniform prediction."""
    log_p = F.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p).sum(-1).mean()


def log_mean_exp(scores: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(scores.reshape(-1), dim=0) - math.log(scores.numel())


def mine_lower_bound(joint: torch.Tensor, marginal: torch.Tensor) -> torch.Tensor:
    """Donsker-Varadhan bound mean(T(x, z)) - log mean(exp T(x, z')) (Belghazi et al. 2018, Eq. 10).

    ``joint`` are the statistics network's scores on paired samples, ``marginal``
    on samples whose second part was shuffled (draws from the product of marginals).
    """
    return joint.mean() - log_mean_exp(marginal)


def reconstruction_loss(reconstruction: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Mean squared error between the reconstruction and the features (Eq. 7); the features are not moved by it."""
    return F.mse_loss(reconstruction, features.detach())


class MINELoss(nn.Module):
    """MINE with the moving-average gradient correction (Belghazi et al. 2018, Sec. 3.2).

    The gradient of the bound, ``E[grad T] - E[e^T grad T] / E[e^T]``, is biased
    on mini-batches because of the denominator; it is replaced by a moving
    average ``m <- (1 - rate) m + rate * mean(e^T)`` over batches. ``surrogate``
    returns ``mean(T_joint) - mean(e^T_marginal) / m`` (with m detached), whose
    gradient is exactly that corrected estimate; the statistics network
    *maximizes* it. The average is kept in the log domain (no overflow); the
    first batch initializes it. ``estimate`` is the bound itself (Eq. 10).
    """

    def __init__(self, rate: float = 0.01):
        super().__init__()
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"the MINE moving-average rate must be in (0, 1], got {rate}")
        self.rate = float(rate)
        self.register_buffer("log_average", torch.tensor(float("nan")))

    def update_average(self, marginal: torch.Tensor) -> torch.Tensor:
        """Fold this batch's log mean(e^T) into the moving average; returns the updated log average."""
        current = log_mean_exp(marginal.detach())
        if self.rate == 1.0:
            self.log_average = current.clone()
        else:  # the first batch (nan) starts the average: chosen on the device, not read back
            blended = torch.logaddexp(self.log_average + math.log1p(-self.rate), current + math.log(self.rate))
            self.log_average = torch.where(torch.isnan(self.log_average), current, blended)
        return self.log_average

    def surrogate(self, joint: torch.Tensor, marginal: torch.Tensor) -> torch.Tensor:
        log_average = self.update_average(marginal)
        return joint.mean() - torch.exp(log_mean_exp(marginal) - log_average.detach())

    @staticmethod
    def estimate(joint: torch.Tensor, marginal: torch.Tensor) -> torch.Tensor:
        return mine_lower_bound(joint, marginal)


class AdversarialAlignment:
    """Eq. 3 on a source's batches: DI_i learns source (1) vs target (0) features, then G_i confuses it.

    ``net`` is the source's model (G_i = ``features``, D_inv = ``invariant``, C_i = ``head``). Each
    :meth:`step` gets the target features of that step (FADA sends fresh ones for every alternation), of
    which the batch draws as many as it has rows (``generator``). G_i's step keeps the classification loss
    of the same batch: cross-entropy + weight * confusion (Alg. 1 trains G_i and C_i by cross-entropy
    throughout; ``docs/fada.md``). :meth:`target_gradient` is d(weight * confusion)/d(target features): the
    direction G_t follows. The optimizers live as long as the object (one round). Puts ``net`` and ``identifier`` in
    training mode.
    """

    def __init__(
        self, net: nn.Module, identifier: nn.Module, identifier_optimizer: Optimizer, generator_optimizer: Optimizer
    ):
        self.net, self.identifier = net, identifier
        self.identifier_optimizer, self.generator_optimizer = identifier_optimizer, generator_optimizer
        self.accuracies: list[torch.Tensor] = []  # per batch, on the device: read back by metrics()
        self.confusions: list[torch.Tensor] = []

    def step(
        self,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        weight: float,
        target: torch.Tensor,
        generator: torch.Generator,
    ) -> None:
        net, identifier = self.net, self.identifier
        net.train()
        identifier.train()
        source = net.features(inputs)
        picked = target[torch.randperm(len(target), generator=generator)[: len(inputs)].to(target.device)]
        source_logits, target_logits = identifier(source.detach()), identifier(picked)
        self.identifier_optimizer.zero_grad(set_to_none=True)
        domain_identifier_loss(source_logits, target_logits).backward()
        self.identifier_optimizer.step()
        self.accuracies.append(balanced_accuracy(source_logits, target_logits))
        identifier.requires_grad_(False)
        confusion = domain_confusion_loss(identifier(source))
        task = F.cross_entropy(net.head(net.invariant(source)), labels)
        self.generator_optimizer.zero_grad(set_to_none=True)
        (task + weight * confusion).backward()
        self.generator_optimizer.step()
        identifier.requires_grad_(True)
        self.confusions.append(confusion.detach())

    def target_gradient(self, weight: float, target: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(d(weight * confusion)/d(target features), the confusion loss of the target features)."""
        features = target.clone().requires_grad_(True)
        confusion = domain_confusion_loss(self.identifier(features))
        (gradient,) = torch.autograd.grad(weight * confusion, features)
        return gradient, float(confusion.detach())

    def alternate(
        self, batch: tuple | None, weight: float, target: torch.Tensor, generator: torch.Generator
    ) -> tuple[np.ndarray, dict[str, float]]:
        """One alternation: :meth:`step` on ``batch`` (``None``: no step), then the target gradient (float32) and
        :meth:`metrics` with the target features' confusion loss."""
        if batch is not None:
            self.step(*batch, weight, target, generator)
        gradient, target_confusion = self.target_gradient(weight, target)
        metrics = {**self.metrics(), "target_confusion_loss": target_confusion}
        return gradient.cpu().numpy().astype(np.float32), metrics

    def metrics(self) -> dict[str, float]:
        """DI's balanced accuracy and the confusion loss, means over the batches."""
        return {"domain_identifier_accuracy": host_mean(self.accuracies), "confusion_loss": host_mean(self.confusions)}


class Disentanglement:
    """The updates of Sec. 3.3 (Eq. 4-7) on the batches of a source.

    With ``train_generator`` (the paper: the disentangler is trained end to end with G_i), Eq. 4 also
    updates G_i; the MI and reconstruction terms (Eq. 6-7) move D_i and R_i only, as in the authors' DAL
    code (Peng et al., ICML 2019, ``solver_disentangle.py``), which never steps G with them. Without
    ``train_generator`` G_i is fixed throughout (features under ``no_grad``).

    ``net`` has the invariant branch D_inv and the classifier C; ``parts`` the specific branch D_spec,
    the class identifier CI, the reconstructor R and the MINE statistics network T
    (:class:`fedsim.methods.fada.networks.SourceParts`). One optimizer per update, from ``make_optimizer``
    (a list of parameters -> optimizer): ``classify`` (D_inv, C, D_spec, CI; + G_i), ``entropy`` (D_spec),
    ``disentangle`` (D_inv, D_spec, R); T has its own ``statistics_optimizer`` (Adam, kept across
    rounds; ``docs/fada.md``). D_i minimizes the positive part of the MI estimate: mutual information is never
    negative, and a D_i that pushes a fixed T's bound below zero only exploits T. Puts ``net`` and ``parts`` in
    training mode.
    """

    METRICS = ("mine_estimate", "class_identifier_accuracy", "class_identifier_entropy", "reconstruction_loss")

    def __init__(
        self,
        net: nn.Module,
        parts: nn.Module,
        mine: MINELoss,
        statistics_optimizer: Optimizer,
        make_optimizer: Callable[[list], Optimizer],
        lambda_entropy: float,
        lambda_mi: float,
        lambda_recon: float,
        train_generator: bool = True,
    ):
        self.net, self.parts, self.mine, self.train_generator = net, parts, mine, train_generator
        self.lambda_entropy, self.lambda_mi, self.lambda_recon = lambda_entropy, lambda_mi, lambda_recon
        generator = list(net.encoder.parameters()) if train_generator else []
        self.optimizers = {
            "classify": make_optimizer(
                [
                    *generator,
                    *net.invariant.parameters(),
                    *net.head.parameters(),
                    *parts.specific.parameters(),
                    *parts.class_identifier.parameters(),
                ]
            ),
            "entropy": make_optimizer(list(parts.specific.parameters())),
            "statistics": statistics_optimizer,
            "disentangle": make_optimizer(
                [*net.invariant.parameters(), *parts.specific.parameters(), *parts.reconstructor.parameters()]
            ),
        }
        self.sums: dict = dict.fromkeys(self.METRICS, 0.0)  # float64 tensors on the device after the first batch
        self.batches = 0
        net.train()
        parts.train()

    def update(self, name: str, loss: torch.Tensor) -> None:
        self.net.zero_grad(set_to_none=True)
        self.parts.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizers[name].step()

    def generate(self, inputs: torch.Tensor, fixed: bool = False) -> torch.Tensor:
        """G_i(inputs), through which the backward pass reaches G_i unless it is fixed."""
        if self.train_generator and not fixed:
            return self.net.features(inputs)
        with torch.no_grad():
            return self.net.features(inputs)

    def step(self, inputs: torch.Tensor, labels: torch.Tensor, generator: torch.Generator) -> None:
        """One batch; ``generator`` draws the shuffle that pairs invariant with other specific parts (the marginals)."""
        net, parts = self.net, self.parts
        generated = self.generate(inputs)
        # Eq. 4: C_i on the invariant part and CI_i on the specific part learn the labels
        ci_logits = parts.class_identifier(parts.specific(generated))
        self.update(
            "classify", F.cross_entropy(net.head(net.invariant(generated)), labels) + F.cross_entropy(ci_logits, labels)
        )
        # Eq. 5-7 leave G_i fixed: its features after Eq. 4's step
        generated = self.generate(inputs, fixed=True) if self.train_generator else generated
        # Eq. 5: the specific branch makes CI_i maximally uncertain
        ci_logits = parts.class_identifier(parts.specific(generated))
        self.update("entropy", -self.lambda_entropy * entropy(ci_logits))
        # Eq. 6: T maximizes the bias-corrected MINE bound on I(f_di; f_ds)
        invariant, specific = net.invariant(generated), parts.specific(generated)
        permutation = torch.randperm(len(inputs), generator=generator).to(inputs.device)
        joint, marginal = parts.mine_scores(invariant.detach(), specific.detach(), permutation)
        self.update("statistics", -self.mine.surrogate(joint, marginal))
        # Eq. 6-7: D_i minimizes the MI estimate and R_i rebuilds G_i(x) from both parts (DAL: G is not moved)
        parts.statistics.requires_grad_(False)
        joint, marginal = parts.mine_scores(invariant, specific, permutation)
        estimate = mine_lower_bound(joint, marginal)
        rebuilt = reconstruction_loss(parts.reconstruct(invariant, specific), generated)
        self.update("disentangle", self.lambda_mi * torch.relu(estimate) + self.lambda_recon * rebuilt)
        parts.statistics.requires_grad_(True)
        with torch.no_grad():
            values = (estimate, (ci_logits.argmax(1) == labels).float().mean(), entropy(ci_logits), rebuilt)
            for name, value in zip(self.METRICS, values):
                self.sums[name] = self.sums[name] + value.double()
        self.batches += 1

    def metrics(self) -> dict[str, float]:
        """Means over the batches of the MI estimate, CI's accuracy and entropy, and the reconstruction loss."""
        return {
            name: float(total) / self.batches if self.batches else float("nan") for name, total in self.sums.items()
        }
