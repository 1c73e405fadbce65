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
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def domain_identifier_loss(source_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of DI, source = 1 and target = 0, each domain weighted 1/2 (Eq. 3)."""
    loss_s = F.binary_cross_entropy_with_logits(source_logits, torch.ones_like(source_logits))
    loss_t = F.binary_cross_entropy_with_logits(target_logits, torch.zeros_like(target_logits))
    return 0.5 * (loss_s + loss_t)


def domain_confusion_loss(logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of DI's prediction against the uniform 1/2 (minimum log 2 at logit 0)."""
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, 0.5))


@torch.no_grad()
def domain_accuracy(source_logits: torch.Tensor, target_logits: torch.Tensor) -> float:
    """Balanced accuracy of DI (0.5: the domains are indistinguishable)."""
    return float(0.5 * ((source_logits > 0).float().mean() + (target_logits <= 0).float().mean()))


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
        if torch.isnan(self.log_average) or self.rate == 1.0:
            self.log_average = current.clone()
        else:
            self.log_average = torch.logaddexp(self.log_average + math.log1p(-self.rate), current + math.log(self.rate))
        return self.log_average

    def surrogate(self, joint: torch.Tensor, marginal: torch.Tensor) -> torch.Tensor:
        log_average = self.update_average(marginal)
        return joint.mean() - torch.exp(log_mean_exp(marginal) - log_average.detach())

    @staticmethod
    def estimate(joint: torch.Tensor, marginal: torch.Tensor) -> torch.Tensor:
        return mine_lower_bound(joint, marginal)
