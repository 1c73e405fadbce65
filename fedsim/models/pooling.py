"""A faster 2x2 max pooling on CPU with the same bits as ``nn.MaxPool2d(2)``, forward and backward.

On CPU, torch's ``max_pool2d`` with a 2x2 window walks each window element by element: in a LeNet-5 client
epoch at batch 32 it is a quarter of the time (docs/performance.md). :class:`PairMaxPool2d` takes the maximum
of the four strided quarters of the input (``a b / c d``) with three vectorized ``torch.maximum`` calls, and
rebuilds the indices ``max_pool2d`` would have kept (the first maximum in the order a, b, c, d) for torch's
own ``max_pool2d_with_indices_backward``. So the output and the input gradient are the same tensors, bit for
bit, ties included, with one exception: where a window's maximum is a zero present with both signs, the
output's zero may carry the other sign (``torch.maximum`` does not fix which of two equal values it returns);
the gradient still goes where ``max_pool2d`` sends it. Inputs it does not cover (not on CPU, not a contiguous
float tensor, NaN in a window, inside ``torch.func`` transforms) take torch's own kernel; it has no double
backward.

:func:`use_pair_pooling` swaps every ``nn.MaxPool2d`` with a 2x2 window, stride 2, no padding, no dilation,
floor mode and no returned indices for this module; :func:`fedsim.models.build_model` applies it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

_WINDOW = [2, 2]


def _quarters(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four strided views a, b (top row of each window), c, d (bottom row), cropped as floor mode does."""
    rows, cols = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    x = x[..., :rows, :cols]
    return x[..., 0::2, 0::2], x[..., 0::2, 1::2], x[..., 1::2, 0::2], x[..., 1::2, 1::2]


def _window_corners(out_rows: int, out_cols: int, width: int) -> torch.Tensor:
    """The flat index (over the input's H x W plane) of each window's top-left element."""
    return torch.arange(out_rows).mul_(2 * width).unsqueeze(1) + torch.arange(out_cols).mul_(2)


class _PairMaxPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        a, b, c, d = _quarters(x)
        top, bottom = torch.maximum(a, b), torch.maximum(c, d)
        ctx.save_for_backward(x, top, bottom)
        return torch.maximum(top, bottom)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        x, top, bottom = ctx.saved_tensors
        a, b, c, d = _quarters(x)
        lower = bottom > top  # strictly greater: a tie keeps the earlier row, as max_pool2d's scan does
        right = b > a
        right ^= lower & (right ^ (d > c))  # the column of the winner within its row
        width = x.shape[-1]
        offset = lower.long().mul_(width).add_(right)
        indices = _window_corners(*grad.shape[-2:], width) + offset
        return torch.ops.aten.max_pool2d_with_indices_backward(
            grad, x, _WINDOW, _WINDOW, [0, 0], [1, 1], False, indices
        )


def _covered(x: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and x.dim() in (3, 4)
        and x.is_contiguous()
        and not torch._C._are_functorch_transforms_active()
    )


class PairMaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d(2)`` with the same bits, faster on CPU (module docstring)."""

    def __init__(self):
        super().__init__(kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _covered(x):
            return F.max_pool2d(x, 2, 2)
        out = _PairMaxPool.apply(x)
        if out.isnan().any():  # max_pool2d keeps the last NaN of a window: its own kernel decides
            return F.max_pool2d(x, 2, 2)
        return out


def _is_pair_pool(module: nn.Module) -> bool:
    def pair(value) -> bool:
        return value in (2, (2, 2))

    return (
        type(module) is nn.MaxPool2d
        and pair(module.kernel_size)
        and pair(module.stride)
        and module.padding in (0, (0, 0))
        and module.dilation in (1, (1, 1))
        and not module.ceil_mode
        and not module.return_indices
    )


def use_pair_pooling(model: nn.Module) -> nn.Module:
    """``model`` with each plain 2x2 ``nn.MaxPool2d`` (stride 2, no padding) replaced by :class:`PairMaxPool2d`."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_pair_pool(child):
                setattr(parent, name, PairMaxPool2d())
    return model
