"""The networks of FADA (Peng et al., ICLR 2020, Sec. 3 and Fig. 1).

Task model (what a client classifies with, and what the target aggregates):
:class:`FADANet` = feature generator G (the encoder of the configured model),
the domain-invariant branch of the disentangler D, and the classifier C on the
invariant features. Its ``features`` are G's outputs: the vectors that the
adversarial alignment exchanges.

Private parts of a source client (:class:`SourceParts`, never sent): the
domain-specific branch of D, the class identifier CI (predicts labels from the
domain-specific part), the reconstructor R (rebuilds G's features from both
parts), the MINE statistics network T (scores pairs of invariant and specific
features) and the domain identifier DI (source vs target features), the
:class:`fedsim.losses.DomainDiscriminator` MLP.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

import numpy as np
import torch
from torch import nn

from fedsim.losses.dann import DomainDiscriminator
from fedsim.models.classifier import Classifier
from fedsim.optim import Optimizer
from fedsim.seeding import numpy_rng


def branch(in_features: int, out_features: int) -> nn.Sequential:
    """One disentangler branch: Linear + ReLU."""
    return nn.Sequential(nn.Linear(in_features, out_features), nn.ReLU())


def mlp(in_features: int, hidden: int, out_features: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))


class FADANet(Classifier):
    """G -> D_invariant -> C. ``features`` = G(x) (aligned), ``invariant_features`` = D_inv(G(x)) (classified)."""

    def __init__(self, encoder: nn.Module, invariant: nn.Module, head: nn.Module):
        super().__init__(encoder, head)
        self.invariant = invariant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.invariant(self.encoder(x)))

    def invariant_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.invariant(self.encoder(x))


@contextlib.contextmanager
def preserved_buffers(model: nn.Module) -> Iterator[None]:
    """Restore the buffers (batch-norm running statistics) after training-mode forward passes."""
    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(saved[name])


def follow_feature_gradient(
    net: FADANet, inputs: np.ndarray, gradient: torch.Tensor, optimizer: Optimizer, chunk: int, device: torch.device
) -> None:
    """One ``optimizer`` step of G along ``gradient`` = dL/dG(inputs), in training mode.

    Chunk by chunk of ``chunk`` rows, each back-propagated as it is encoded, the parameter gradients
    accumulating in that order (one backward pass through the concatenation would sum them in another).
    """
    net.train()
    optimizer.zero_grad(set_to_none=True)
    rows = torch.from_numpy(inputs).to(device)  # one copy to the device, not one per chunk
    for start in range(0, len(rows), chunk):
        part = net.features(rows[start : start + chunk])
        (part * gradient[start : start + chunk]).sum().backward()
    optimizer.step()


def align_generator(
    net: FADANet,
    x: np.ndarray,
    gradients: Mapping[str, np.ndarray],
    count: int,
    seed: int,
    optimizer: Optimizer,
    chunk: int,
    device: torch.device,
) -> float:
    """The target's G_t step: the mean of the sources' ``gradients`` (by client id) w.r.t. the features of the
    ``count`` seeded rows of ``x`` (drawn as ``encode_subset`` draws them), followed with the batch statistics
    of the features' pass (buffers restored). Returns the mean gradient's norm."""
    ordered = [np.asarray(gradients[k]) for k in sorted(gradients, key=int)]
    gradient = torch.stack([torch.tensor(g, device=device) for g in ordered]).mean(0)
    index = np.sort(numpy_rng(seed).choice(len(x), size=min(count, len(x)), replace=False))
    if len(index) != len(gradient):
        raise ValueError(f"align got gradients for {len(gradient)} target features, expected {len(index)}")
    with preserved_buffers(net):
        follow_feature_gradient(net, x[index], gradient, optimizer, chunk, device)
    return float(gradient.norm())


def feature_width(encoder: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Width of the encoder's output, from one forward pass of zeros in eval mode on the encoder's device (the
    shape only: nothing is read back)."""
    encoder.eval()
    device = next(encoder.parameters()).device
    with torch.no_grad():
        return int(encoder(torch.zeros((1, *input_shape), device=device)).shape[-1])


def build_fada_net(base: Classifier, input_shape: tuple[int, ...]) -> FADANet:
    """Wrap a registered classifier (encoder + linear head) as G, D_invariant (width -> width) and C."""
    width = feature_width(base.encoder, input_shape)
    return FADANet(base.encoder, branch(width, width), base.head)


class SourceParts(nn.Module):
    """The private modules of one source client (Peng et al. 2020, Sec. 3.2-3.3)."""

    def __init__(
        self, width: int, num_classes: int, hidden: int = 128, identifier_hidden: int = 256, identifier_layers: int = 2
    ):
        super().__init__()
        if min(width, num_classes, hidden, identifier_hidden) <= 0 or identifier_layers < 0:
            raise ValueError(
                f"SourceParts needs positive sizes, got width={width}, classes={num_classes}, hidden={hidden}"
            )
        self.specific = branch(width, width)  # D's domain-specific branch
        self.class_identifier = mlp(width, hidden, num_classes)  # CI
        self.reconstructor = nn.Linear(2 * width, width)  # R
        self.statistics = mlp(2 * width, hidden, 1)  # MINE's T(f_di, f_ds)
        self.domain_identifier = DomainDiscriminator(width, identifier_hidden, identifier_layers)  # DI

    def mine_scores(
        self, invariant: torch.Tensor, specific: torch.Tensor, permutation: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """T on the joint pairs and on pairs with the specific part shuffled (product of the marginals)."""
        joint = self.statistics(torch.cat([invariant, specific], dim=1)).squeeze(-1)
        marginal = self.statistics(torch.cat([invariant, specific[permutation]], dim=1)).squeeze(-1)
        return joint, marginal

    def reconstruct(self, invariant: torch.Tensor, specific: torch.Tensor) -> torch.Tensor:
        return self.reconstructor(torch.cat([invariant, specific], dim=1))
