"""Batch-norm layers of any model: the part FedBN (classification and detection) keeps private."""

from __future__ import annotations

from torch import nn


def bn_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every batch-norm layer."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def bn_keys(model: nn.Module) -> frozenset[str]:
    """State-dict keys of every batch-norm layer (weight, bias, running statistics, batch counter)."""
    return frozenset(
        f"{name}.{key}" if name else key for name, module in bn_layers(model) for key in module.state_dict()
    )
