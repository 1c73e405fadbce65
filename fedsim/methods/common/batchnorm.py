"""Batch-norm helpers shared by the methods that evaluate with a domain's own statistics."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedsim.methods.common.training import CHUNK
from fedsim.models.normalization import bn_layers


@torch.no_grad()
def reestimate_bn(model: nn.Module, x: np.ndarray, device: torch.device, batch_size: int = CHUNK) -> None:
    """AdaBN (Li et al. 2016): replace every BN layer's running statistics by cumulative averages over ``x``
    (fixed order, train mode, no gradients, no labels)."""
    layers = [m for _, m in bn_layers(model)]
    momenta = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average
    model.train()
    inputs = torch.from_numpy(x)
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start : start + batch_size]
        if len(batch) < 2 and len(inputs) >= 2:
            continue  # batch statistics need two samples
        model(batch.to(device))
    for m, momentum in zip(layers, momenta):
        m.momentum = momentum
    model.eval()
