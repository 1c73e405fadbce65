"""The optimizer of every local update: stochastic gradient descent with momentum and weight decay, computed as
``torch.optim.SGD`` computes it.

The update is ``torch.optim.SGD``'s per-tensor one (what it runs on the CPU; no dampening, no Nesterov): for each
parameter ``g = grad + weight_decay * p``; the momentum buffer starts as a copy of ``g`` and is then
``b = momentum * b + g``; ``p -= lr * b`` (``p -= lr * g`` without momentum). The same tensor operations in the same
order, so the weights are the same bits (``tests/test_sgd.py``).

:class:`SGD` does not derive from ``torch.optim.Optimizer``, whose first parameter group and step import
``torch._dynamo`` in every process that trains (docs/performance.md). It keeps the part of that interface the
methods use: ``param_groups`` (dicts with ``params``, ``lr``, ``momentum``, ``weight_decay``; a group may set its
own), ``defaults``, ``state`` (parameter -> ``{"momentum_buffer": tensor}``), ``zero_grad`` and ``step``.
"""

from __future__ import annotations

from typing import Iterable

import torch


class SGD:
    def __init__(self, params: Iterable, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        """``params``: tensors, or dicts with ``params`` and any of ``lr``, ``momentum``, ``weight_decay``."""
        params = list(params)
        if not params:
            raise ValueError("SGD got an empty parameter list: give it the tensors it is to train (as torch.optim)")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        self.param_groups = [{**self.defaults, **group, "params": list(group["params"])} for group in groups]
        for group in self.param_groups:
            if group["lr"] < 0 or group["momentum"] < 0 or group["weight_decay"] < 0:
                raise ValueError(f"SGD needs lr, momentum and weight_decay >= 0, got {group}")
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, momentum, weight_decay = float(group["lr"]), group["momentum"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if weight_decay != 0:
                    grad = grad.add(param, alpha=weight_decay)
                if momentum != 0:
                    state = self.state.setdefault(param, {})
                    buffer = state.get("momentum_buffer")
                    if buffer is None:
                        buffer = state["momentum_buffer"] = grad.detach().clone()
                    else:
                        buffer.mul_(momentum).add_(grad, alpha=1)
                    grad = buffer
                param.add_(grad, alpha=-lr)


#: what the local loops accept: fedsim's SGD, or an optimizer of ``torch.optim`` (FADA's and FedDaDiL's Adam)
Optimizer = SGD | torch.optim.Optimizer
