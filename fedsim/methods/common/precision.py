"""Mixed precision of the clients' forward passes (``run.precision``): "fp32" (the default) or "bf16".

With "bf16" every forward pass of a client's training and evaluation runs under ``torch.autocast`` with bfloat16
(Micikevicius et al., ICLR 2018, "Mixed precision training"; bfloat16 keeps float32's exponent, so no loss
scaling is needed): matrix products and convolutions compute in bfloat16, the weights, the optimizer's state, the
losses' reductions and everything outside the forward passes (the dictionary's optimal transport, k-means, the
aggregation) stay in float32. With "fp32" no autocast is entered at all: the numbers are the float32 ones, bit for
bit.

The precision is set per client operation by the process that runs it (:func:`using`, entered by
:class:`fedsim.runtime.client_host.ClientHost` and by the centralized references' server training) and read by
the loops of :mod:`fedsim.methods.common.training` and FADA's steps through :func:`autocast`, so that a loop takes
no extra argument and a loop called outside a run computes in float32.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import torch

PRECISIONS = ("fp32", "bf16")
"""The values of ``run.precision``."""

_current: contextvars.ContextVar[str] = contextvars.ContextVar("fedsim_precision", default="fp32")
_LOW = (torch.bfloat16, torch.float16)


@contextlib.contextmanager
def using(precision: str) -> Iterator[None]:
    """Run the block's client work in ``precision`` (one of :data:`PRECISIONS`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    token = _current.set(precision)
    try:
        yield
    finally:
        _current.reset(token)


def current() -> str:
    """The precision in force ("fp32" outside :func:`using`)."""
    return _current.get()


def autocast(device) -> contextlib.AbstractContextManager:
    """The context of one forward pass on ``device``: bfloat16 autocast under "bf16" (device type "cuda" or "cpu";
    torch's meta stand-in takes the CPU's), nothing under "fp32"."""
    if _current.get() != "bf16":
        return contextlib.nullcontext()
    kind = torch.device(device).type
    return torch.autocast("cuda" if kind == "cuda" else "cpu", dtype=torch.bfloat16)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32 when a bf16 forward pass left it in a low precision (features that leave the forward
    pass: encoded splits, selection statistics); any other tensor unchanged (the same object)."""
    return tensor.float() if tensor.dtype in _LOW else tensor
