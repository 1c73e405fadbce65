"""Record-level privacy of an exchange that sends records' own values (``privacy.unit=record``, ``docs/privacy.md``).

Some exchanges carry one row per record: the target's encoded features that FedDANN's target client sends on to
every source. DP-SGD inside a client's training does not bound them, so the sender privatizes each row itself
before it leaves (local differential privacy; the Gaussian mechanism of Dwork & Roth, *The Algorithmic Foundations
of Differential Privacy*, 2014, Thm. A.1, as the local randomizer of Duchi et al., FOCS 2013, Sec. 1): every row is
clipped to L2 norm C and Gaussian noise N(0, (2 z C)^2) is added to each of its entries. Replacing one record by
any other moves its row by at most 2 C (the sensitivity) and no other row, so one release is a Gaussian mechanism
of noise multiplier z on that record under substitution ("replace one") adjacency; a record is released at most once
a call, and the run's R calls compose as R such mechanisms, counted by dp_accounting's accountant with no
amplification by the sampling (the subset drawn each call is not assumed secret). What is computed from the noised
rows afterwards (the sources' training against them) is post-processing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class RowsPlan:
    """One sender's per-row mechanism: its clip, noise multiplier and the releases its budget covers."""

    clip: float
    """C: the L2 bound of one row."""
    noise_multiplier: float
    """z: each entry's noise has std z times the sensitivity 2 C."""
    releases: int
    """R: the calls of the run in which a record's row may be sent."""

    @property
    def std(self) -> float:
        """The noise's standard deviation per entry: 2 z C."""
        return 2.0 * self.noise_multiplier * self.clip

    def epsilon(self, releases: int, delta: float, kind: str = "rdp") -> float:
        """The epsilon at ``delta`` that ``releases`` calls spend on one record."""
        return rows_epsilon(self.noise_multiplier, releases, delta, kind)


def rows_epsilon(noise_multiplier: float, releases: int, delta: float, kind: str = "rdp") -> float:
    """The epsilon at ``delta`` of ``releases`` Gaussian mechanisms of multiplier z composed (0 for none)."""
    from fedsim.privacy.accountant import spent_epsilon

    return spent_epsilon([(1.0,)] * releases, noise_multiplier, delta, kind) if releases else 0.0


@lru_cache(maxsize=64)
def rows_noise_multiplier(releases: int, epsilon: float, delta: float, kind: str = "rdp") -> float:
    """The smallest z whose ``releases`` Gaussian mechanisms spend at most ``epsilon`` at ``delta``."""
    from fedsim.privacy.accountant import calibrate_noise_multiplier

    return calibrate_noise_multiplier([(1.0,)] * releases, epsilon, delta, kind)


def rows_plan(config, stage: str, releases: Optional[int] = None) -> Optional[RowsPlan]:
    """The per-row mechanism of ``stage`` under ``config`` (None unless privacy is on with ``privacy.unit=record``):
    C is ``privacy.stage_clip[stage]``, else ``privacy.clip``; z is ``privacy.noise_multiplier``, else calibrated to
    spend ``privacy.epsilon`` over ``releases`` calls (default ``run.rounds``: one call a round, as FedDANN's and
    FedMMD's ``features``)."""
    privacy = config.privacy
    if not privacy.active or privacy.unit != "record":
        return None
    releases = config.run.rounds if releases is None else releases
    clip = float((privacy.stage_clip or {}).get(stage, privacy.clip))
    if privacy.noise_multiplier is not None:
        z = float(privacy.noise_multiplier)
    else:
        z = rows_noise_multiplier(int(releases), float(privacy.epsilon), privacy.target_delta, privacy.accountant)
    return RowsPlan(clip, z, int(releases))


def privatize_rows(rows: np.ndarray, plan: RowsPlan, rng: np.random.Generator) -> np.ndarray:
    """Each row of ``rows`` (n x d) scaled to L2 norm at most C, plus N(0, (2 z C)^2) noise on every entry
    (float32, as the features travel)."""
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    clipped = rows * np.minimum(1.0, plan.clip / np.maximum(norms, 1e-12))
    return (clipped + rng.normal(0.0, plan.std, size=rows.shape)).astype(np.float32)
