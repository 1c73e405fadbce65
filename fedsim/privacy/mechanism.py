"""The privacy mechanisms (:class:`Mechanism`), and the Gaussian mechanism on one client's reply: its contribution
clipped in L2, then Gaussian noise.

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

import math
from typing import ClassVar, Mapping, Optional

import numpy as np

from fedsim.errors import UserError
from fedsim.messages import Tensors
from fedsim.privacy.exchanges import EACH, WEIGHTED, sampling_rate
from fedsim.registry import MECHANISMS

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


class Mechanism:
    """A privacy mechanism (``privacy.mode``): how each reply of a noised stage is noised, and how one noised
    exchange is accounted.

    A mechanism is a class, built-in or in the user's package, named by ``privacy.mode``: a registered name, a dotted
    path ``mypkg.privacy:MyMechanism`` or an entry point of group ``fedsim.privacy``; fedsim makes one with no
    argument. ``combined`` is how the server uses a stage's replies (:data:`fedsim.privacy.exchanges.WEIGHTED`,
    ``UNIFORM`` or ``EACH``), ``weights`` each reply's sample count. The built-ins are the Gaussian mechanism of
    DP-FedAvg, split over the replies (:class:`CentralGaussian`) or on every reply (:class:`LocalGaussian`).
    """

    description: ClassVar[str] = ""
    """One line: what the mechanism adds and whom it protects against."""
    registry_name: ClassVar[str] = ""
    """The name it is registered under (set by the registry)."""

    def check(self, settings) -> None:
        """Raise :class:`fedsim.errors.UserError` (one line) for ``privacy`` settings the mechanism cannot take."""

    def noise_stds(
        self, combined: str, noise_multiplier: float, clip: float, weights: Mapping[int, float]
    ) -> dict[int, float]:
        """Each of the m replies' noise scale, by client id."""
        raise NotImplementedError(f"{type(self).__name__} must define noise_stds")

    def rate(self, combined: str, senders: int, called: int) -> float:
        """The sampling rate an exchange is accounted at (1: no amplification by sampling)."""
        return 1.0

    def privatize(
        self,
        tensors: Tensors,
        reference: Optional[Mapping[str, np.ndarray]],
        bound: float,
        noise_std: float,
        rng: np.random.Generator,
    ) -> tuple[dict[str, np.ndarray], float]:
        """One reply's tensors clipped and noised (:func:`privatize`); returns them and the norm before clipping."""
        return privatize(tensors, reference, bound, noise_std, rng)

    def event(self, rate: float, noise_multiplier: float):
        """The dp_accounting event of one noised exchange: a Gaussian of multiplier z, Poisson-subsampled at
        ``rate`` when it is below 1."""
        from fedsim.privacy.accountant import exchange_event

        return exchange_event(rate, noise_multiplier)


@MECHANISMS.register("central")
class CentralGaussian(Mechanism):
    """Client-level DP-FedAvg (McMahan et al., ICLR 2018): the noise of std z C that DP-FedAvg adds to the sum of the
    m clipped contributions, split among the m replies (std z C / sqrt(m) each; z C max(w) / (w_k sqrt(m)) on a sum
    weighted by w); a stage whose replies are used one by one gives each the full z C. A summed stage is accounted at
    the share of its population called."""

    description = "Gaussian noise of std z C on the sum the server aggregates (client-level DP-FedAvg)"

    def noise_stds(self, combined, noise_multiplier, clip, weights):
        z, m = noise_multiplier, len(weights)
        if combined == EACH:
            return {cid: z * clip for cid in weights}
        own = {cid: float(w) if combined == WEIGHTED else 1.0 for cid, w in weights.items()}
        heaviest = max(own.values())
        return {cid: z * clip * heaviest / (w * math.sqrt(m)) for cid, w in own.items()}

    def rate(self, combined, senders, called):
        return 1.0 if combined == EACH else sampling_rate(senders, called)


@MECHANISMS.register("local")
class LocalGaussian(Mechanism):
    """Gaussian noise of std z C on every reply, each one private against the server that reads it."""

    description = "Gaussian noise of std z C on every reply, private against the server itself"

    def noise_stds(self, combined, noise_multiplier, clip, weights):
        return {cid: noise_multiplier * clip for cid in weights}


def make_mechanism(settings) -> Mechanism:
    """The mechanism ``privacy.mode`` names, made and given the ``privacy`` section to check."""
    made = MECHANISMS.get(settings.mode)()
    if not isinstance(made, Mechanism):
        raise UserError(
            f"privacy mechanism {settings.mode!r} made an object of type {type(made).__name__}, not a "
            "fedsim.privacy.Mechanism: subclass it"
        )
    made.check(settings)
    return made
