"""The privacy a run spends, counted with Google's dp_accounting (``docs/privacy.md``).

Each noised exchange is one Gaussian mechanism of noise multiplier z on one client's clipped contribution. When its
senders are a sample of rate q < 1 that only the server knows (the central mode, on a summed stage) it is a
Poisson-subsampled Gaussian (DP-FedAvg, McMahan et al., ICLR 2018, which counts it with the moments accountant of
Abadi et al., CCS 2016); otherwise a plain Gaussian. A round composes its exchanges and the run
composes its rounds. The accountant is Renyi DP (Mironov, CSF 2017) by default, or privacy loss distributions.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections import Counter
from typing import Callable, Iterator, Sequence

from fedsim.errors import UserError

Rates = tuple[float, ...]
"""The sampling rates of one round's noised exchanges, in order (1: no sampling)."""
CALIBRATION_TOLERANCE = 1e-6
"""How close to the smallest admissible noise multiplier the calibration lands (in z)."""


@contextlib.contextmanager
def quiet_accounting() -> Iterator[None]:
    """dp_accounting warns through absl when an RDP order's series does not converge (that order is left out,
    which only loosens the bound): kept out of a run's log."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def exchange_event(rate: float, noise_multiplier: float):
    """One noised exchange: a Gaussian of multiplier z, Poisson-subsampled at ``rate`` when it is below 1."""
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent

    gaussian = GaussianDpEvent(noise_multiplier)
    return gaussian if rate >= 1 else PoissonSampledDpEvent(rate, gaussian)


Event = Callable[[float, float], object]
"""``event(rate, noise_multiplier)``: one noised exchange's dp_accounting event (a mechanism's ``event``)."""


def round_event(rates: Rates, noise_multiplier: float, event: Event = exchange_event):
    """One round: the composition of its noised exchanges."""
    from dp_accounting import ComposedDpEvent

    return ComposedDpEvent([event(rate, noise_multiplier) for rate in rates])


def run_event(rounds: Sequence[Rates], noise_multiplier: float, event: Event = exchange_event):
    """Every round composed, equal rounds as one self-composition (what the accountant computes once)."""
    from dp_accounting import ComposedDpEvent, SelfComposedDpEvent

    counts = Counter(tuple(rates) for rates in rounds if rates)
    return ComposedDpEvent(
        [SelfComposedDpEvent(round_event(rates, noise_multiplier, event), count) for rates, count in counts.items()]
    )


ACCOUNTANTS: dict[str, str] = {"rdp": "dp_accounting.rdp:RdpAccountant", "pld": "dp_accounting.pld:PLDAccountant"}
"""``privacy.accountant`` -> the dp_accounting class ("module:Class") counting the privacy spent, the default first:
Renyi DP at its default orders, or privacy loss distributions. The module is imported when the accountant is made."""


def make_accountant(kind: str):
    """A fresh accountant of :data:`ACCOUNTANTS` (``privacy.accountant``)."""
    module, _, name = ACCOUNTANTS[kind].partition(":")
    return getattr(importlib.import_module(module), name)()


def spent_epsilon(
    rounds: Sequence[Rates], noise_multiplier: float, delta: float, kind: str = "rdp", event: Event = exchange_event
) -> float:
    """The epsilon at ``delta`` of ``rounds`` of noised exchanges at multiplier ``noise_multiplier``."""
    with quiet_accounting():
        return float(make_accountant(kind).compose(run_event(rounds, noise_multiplier, event)).get_epsilon(delta))


def calibrate_noise_multiplier(
    rounds: Sequence[Rates], epsilon: float, delta: float, kind: str = "rdp", event: Event = exchange_event
) -> float:
    """The smallest noise multiplier (within :data:`CALIBRATION_TOLERANCE`) whose ``rounds`` spend at most
    ``epsilon`` at ``delta``: dp_accounting's ``calibrate_dp_mechanism`` (Brent's method on the epsilon gap over a
    bracket it searches from [0, 1]), then stepped up until the budget holds (epsilon falls as z grows)."""
    from dp_accounting import LowerEndpointAndGuess, calibrate_dp_mechanism

    if not any(rounds):
        raise UserError("privacy.epsilon: the run makes no noised exchange, so there is no noise to calibrate")
    with quiet_accounting():
        z = calibrate_dp_mechanism(
            lambda: make_accountant(kind),
            lambda value: run_event(rounds, value, event),
            epsilon,
            delta,
            LowerEndpointAndGuess(0.0, 1.0),
            tol=CALIBRATION_TOLERANCE,
        )
    z = float(z) + CALIBRATION_TOLERANCE
    while spent_epsilon(rounds, z, delta, kind, event) > epsilon:
        z += CALIBRATION_TOLERANCE
    return z


class Ledger:
    """The noised exchanges of the rounds so far and the epsilon they spend, at one noise multiplier. The epsilon is
    that of every round so far composed as :func:`run_event` composes them, the computation the calibration checks
    its budget with (a PLD accountant's discretization depends on the order of composition)."""

    def __init__(self, kind: str, noise_multiplier: float, delta: float, event: Event = exchange_event):
        self.kind = kind
        self.event = event
        self.noise_multiplier = noise_multiplier
        self.delta = delta
        self.rounds: list[Rates] = []

    def add_round(self, rates: Rates) -> None:
        """One round's exchanges (none: the round spends nothing)."""
        self.rounds.append(tuple(rates))

    def epsilon(self) -> float:
        """The epsilon spent so far at :attr:`delta` (0 before any noised exchange)."""
        if not any(self.rounds):
            return 0.0
        return spent_epsilon(self.rounds, self.noise_multiplier, self.delta, self.kind, self.event)

    def state(self) -> list[list[float]]:
        """What a checkpoint keeps: every round's rates."""
        return [list(rates) for rates in self.rounds]

    def restore(self, rounds: Sequence[Sequence[float]]) -> None:
        """Continue from a checkpoint's :meth:`state`."""
        self.rounds = [tuple(rates) for rates in rounds]
