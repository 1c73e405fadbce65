"""Batch-norm layers of any model: the part FedBN (classification and detection) keeps private, and their
replacement by group norms under record-level privacy."""

from __future__ import annotations

import math

from torch import nn


def bn_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every batch-norm layer."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def bn_keys(model: nn.Module) -> frozenset[str]:
    """State-dict keys of every batch-norm layer (weight, bias, running statistics, batch counter)."""
    return frozenset(
        f"{name}.{key}" if name else key for name, module in bn_layers(model) for key in module.state_dict()
    )


def group_norm_for(layer: nn.modules.batchnorm._BatchNorm) -> nn.GroupNorm:
    """The group norm that replaces ``layer`` (Opacus' ``ModuleValidator.fix``): gcd(32, C) groups over its C
    channels, affine when the batch norm is."""
    channels = layer.num_features
    return nn.GroupNorm(math.gcd(32, channels), channels, eps=layer.eps, affine=layer.affine)


def replace_batch_norm(model: nn.Module) -> nn.Module:
    """``model`` with every batch-norm layer replaced in place by a group norm (:func:`group_norm_for`): a group
    norm normalizes each example on its own, so per-example gradients (record-level DP-SGD) need no coupling
    between a batch's examples, and it has no running statistics to leak or to noise."""
    for name, layer in bn_layers(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, group_norm_for(layer))
    return model
