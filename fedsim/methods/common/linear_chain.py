"""One SGD step of many clients' Linear/ReLU chains, forward and backward written out as batched matrix products.

A model whose forward pass is a chain of ``nn.Linear`` and ``nn.ReLU`` layers (the ``mlp`` model, a linear head)
has a gradient simple enough to write by hand: for the mean cross-entropy over a batch of B rows the gradient of
the logits is ``(softmax - onehot) / B``; a Linear layer ``h = a W^T + b`` passes back ``dh W`` and has
``dW = dh^T a``, ``db = sum_rows dh``; a ReLU passes back ``dh`` where its output is positive. With the clients'
weights stacked along a leading axis every product is one ``bmm`` over all clients, without ``vmap``'s batching
rules or autograd's graph, and the momentum update is folded into the weight gradient's product
(``baddbmm(buffer, dh^T, a, beta=momentum)`` computes ``momentum * buffer + dW`` in one pass). The update is
``torch.optim.SGD``'s (weight decay, momentum without dampening, the buffer starting as the first gradient), so
each client's weights equal the loop's within float rounding (tests/test_vectorized.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch
from torch import nn

CHAIN_LAYERS = (nn.Linear, nn.ReLU)


@dataclass(frozen=True)
class ChainLayer:
    """One layer of a chain: a Linear layer's parameter names (``weight`` set), or a ReLU (``weight`` None)."""

    weight: Optional[str] = None
    bias: Optional[str] = None


def _called_layers(model: nn.Module, probe: torch.Tensor) -> tuple[list[nn.Module], torch.Tensor]:
    """The Linear/ReLU modules in the order ``model(probe)`` calls them, and its output."""
    order: list[nn.Module] = []
    hooks = [
        m.register_forward_hook(lambda m, i, o: order.append(m)) for m in model.modules() if isinstance(m, CHAIN_LAYERS)
    ]
    try:
        output = model(probe)
    finally:
        for hook in hooks:
            hook.remove()
    return order, output


@torch.no_grad()
def chain_of(model: nn.Module) -> Optional[list[ChainLayer]]:
    """The model's layers as a chain, or None when its forward pass is not one: every leaf module a Linear or a
    ReLU, and on a probe batch the composition of the called layers must give the model's output bit for bit, each
    Linear called once and every parameter a Linear's."""
    leaves = [m for m in model.modules() if not any(m.children())]
    linears = [m for m in leaves if isinstance(m, nn.Linear)]
    if not linears or not all(isinstance(m, CHAIN_LAYERS) for m in leaves):  # no Flatten, Dropout, norms, ...
        return None
    probe = torch.randn(3, linears[0].in_features, generator=torch.Generator().manual_seed(0))
    try:
        order, output = _called_layers(model, probe)
        composed = probe
        for layer in order:
            composed = layer(composed)
    except (RuntimeError, ValueError, TypeError, IndexError):  # not a forward a flat feature batch can take
        return None
    called = [m for m in order if isinstance(m, nn.Linear)]
    names = {id(p): n for n, p in model.named_parameters()}
    covered = sorted(names[id(p)] for m in called for p in m.parameters())
    if len(set(map(id, called))) != len(called) or covered != sorted(names.values()):
        return None
    if composed.shape != output.shape or not torch.equal(composed, output):
        return None
    return [
        ChainLayer(names[id(m.weight)], names[id(m.bias)] if m.bias is not None else None)
        if isinstance(m, nn.Linear)
        else ChainLayer()
        for m in order
    ]


def _forward(chain: list[ChainLayer], params: Mapping[str, torch.Tensor], xb: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's input and, last, the logits [K, B, C] of the clients' batches ``xb`` [K, B, d]."""
    acts = [xb]
    for layer in chain:
        h = acts[-1]
        if layer.weight is None:
            acts.append(h.clamp_min(0.0))
        elif layer.bias is None:
            acts.append(torch.bmm(h, params[layer.weight].transpose(1, 2)))
        else:
            acts.append(torch.baddbmm(params[layer.bias].unsqueeze(1), h, params[layer.weight].transpose(1, 2)))
    return acts


@torch.no_grad()
def chain_sgd_step(
    chain: list[ChainLayer],
    params: dict,
    buffers: dict,
    xb: torch.Tensor,
    yb: torch.Tensor,
    settings,
    first: bool,
    anchors: Optional[Mapping[str, torch.Tensor]] = None,
    mu: float = 0.0,
) -> torch.Tensor:
    """One step for every client of the batch (``xb`` [K, B, d], ``yb`` [K, B], all rows real): the clients'
    losses [K] (mean cross-entropy, plus mu/2 ||w - anchor||^2 for FedProx), ``params`` and ``buffers`` (momentum,
    one per parameter) updated in place. ``first``: the clients' first step (the buffer becomes the gradient)."""
    acts = _forward(chain, params, xb)
    logp = torch.log_softmax(acts[-1], 2)
    picked = yb.unsqueeze(2)
    losses = -logp.gather(2, picked).squeeze(2).mean(1)
    if mu:
        losses += 0.5 * mu * sum(((params[n] - anchors[n]) ** 2).flatten(1).sum(1) for n in params)
    grad = logp.exp_().scatter_add_(2, picked, torch.full_like(picked, -1.0, dtype=logp.dtype)).div_(yb.shape[1])
    beta = 0.0 if first or settings.momentum == 0 else settings.momentum
    for i in range(len(chain) - 1, -1, -1):
        layer, inputs = chain[i], acts[i]
        if layer.weight is None:
            grad = torch.ops.aten.threshold_backward(grad, acts[i + 1], 0.0)  # autograd's ReLU backward
            continue
        passed = torch.bmm(grad, params[layer.weight]) if i > 0 else None
        torch.baddbmm(buffers[layer.weight], grad.transpose(1, 2), inputs, beta=beta, out=buffers[layer.weight])
        if layer.bias is not None:
            buffers[layer.bias].mul_(beta).add_(grad.sum(1))
        grad = passed
    for name, p in params.items():
        if mu:
            buffers[name].add_(p - anchors[name], alpha=mu)
        if settings.weight_decay:
            buffers[name].add_(p, alpha=settings.weight_decay)
        p.add_(buffers[name], alpha=-settings.lr)
    return losses
