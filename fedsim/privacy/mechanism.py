"""The Gaussian mechanism on one client's reply: its contribution clipped in L2, then Gaussian noise.

A reply's contribution is the concatenation of its float tensors. When every one of them has a tensor of the same
name and shape among what the server sent (a model update), the contribution is their difference from it: clipped,
noised and added back, so that the reply keeps its form. Otherwise (features, atoms, gradients, deltas) the tensors
themselves are clipped and noised. The clip and the noise follow DP-FedAvg (McMahan, Ramage, Talwar & Zhang, ICLR
2018, Alg. 1: Delta <- Delta * min(1, S / ||Delta||), then N(0, sigma^2 I)), computed in float64 and cast back.

A batch-norm layer's step counter (``num_batches_tracked``, an integer) counts the local batches, a function of the
sample count the reply states anyway: it passes as it is. Any other integer or boolean tensor (labels, counts)
cannot be noised: :func:`privatize` refuses it.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from fedsim.errors import UserError
from fedsim.messages import Tensors

BN_COUNTER = "num_batches_tracked"
"""The suffix of a batch-norm layer's step counter in a state dict."""


def is_float(value) -> bool:
    """Whether ``value`` is a floating-point array (what noise can be added to)."""
    return isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating)


def float_names(tensors: Tensors) -> list[str]:
    """The names of the float tensors of ``tensors``, sorted: the order of the contribution's entries."""
    return sorted(name for name, value in tensors.items() if is_float(np.asarray(value)))


def unnoisable(tensors: Tensors) -> list[str]:
    """The tensors noise cannot protect: integer or boolean ones other than batch-norm step counters."""
    return sorted(
        name
        for name, value in tensors.items()
        if not is_float(np.asarray(value)) and not str(name).endswith(BN_COUNTER)
    )


def update_reference(tensors: Tensors, sent: Mapping[str, np.ndarray]) -> Optional[dict[str, np.ndarray]]:
    """What the reply's float tensors are an update of: the tensors of the same names and shapes in ``sent`` when
    every one has such a float tensor there, else None (the reply is clipped as it is)."""
    names = float_names(tensors)
    reference = {}
    for name in names:
        base = sent.get(name)
        if not is_float(base) or base.shape != np.shape(tensors[name]):
            return None
        reference[name] = base
    return reference if names else None


def clip_factor(norm: float, bound: float) -> float:
    """min(1, bound / norm): the factor that brings a contribution of L2 norm ``norm`` within ``bound``."""
    return 1.0 if norm <= bound else bound / norm


def privatize(
    tensors: Tensors,
    reference: Optional[Mapping[str, np.ndarray]],
    bound: float,
    noise_std: float,
    rng: np.random.Generator,
) -> tuple[dict[str, np.ndarray], float]:
    """``tensors`` with their contribution (less ``reference`` when given) clipped to L2 norm ``bound`` and noised
    with N(0, noise_std^2) per entry drawn from ``rng``; returns the new tensors and the contribution's norm before
    clipping. Integer tensors other than batch-norm step counters raise UserError."""
    refused = unnoisable(tensors)
    if refused:
        raise UserError(f"integer or boolean tensors {refused} cannot be noised")
    names = float_names(tensors)
    parts = []
    for name in names:
        value = np.asarray(tensors[name], dtype=np.float64).ravel()
        parts.append(value - np.asarray(reference[name], dtype=np.float64).ravel() if reference else value)
    flat = np.concatenate(parts) if parts else np.zeros(0)
    norm = float(np.linalg.norm(flat))
    noised = flat * clip_factor(norm, bound) + noise_std * rng.standard_normal(flat.size)
    out = dict(tensors)
    start = 0
    for name in names:
        original = np.asarray(tensors[name])
        piece = noised[start : start + original.size].reshape(original.shape)
        start += original.size
        if reference:
            piece = piece + np.asarray(reference[name], dtype=np.float64)
        out[name] = piece.astype(original.dtype)
    return out, norm
