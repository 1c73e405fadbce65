"""The density ratio w(x) = p_target(x) / p_source(x) of iwv and dev, fitted on the server from feature moments.

Each client sends :func:`moment_statistics` of its features (count, sum, scatter matrix: 1 + d + d*d numbers, never
a row); :func:`fit_density_ratio` pools the sources' moments against the targets' and fits two Gaussians with one
shared covariance (a linear discriminant), so log w(x) = log N(x; mu_T, S) - log N(x; mu_S, S) = beta . x + c, the
form of a logistic domain classifier (the log posterior odds minus log(n_T / n_S)). The clients then weigh their
validation rows by :meth:`DensityRatio.log_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


def _as_features(features) -> np.ndarray:
    array = np.asarray(features, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"features must be an [n, d] array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError("features must be finite numbers")
    return array


def moment_statistics(features: np.ndarray) -> dict[str, np.ndarray]:
    """A client's feature moments: ``{"count": [1], "sum": [d], "scatter": [d, d]}`` (float64).

    ``scatter`` is the scatter matrix about the client's own mean, sum_i (x_i - m)(x_i - m)^T (Duda & Hart's
    within-class scatter); pooling it with the means' spread (:func:`fit_density_ratio`) is exact and, unlike raw
    second moments, loses no digits to features with a large mean. A client with no rows sends zeros.
    """
    x = _as_features(features)
    total = x.sum(axis=0)
    centred = x - total / len(x) if len(x) else x
    return {"count": np.array([float(len(x))]), "sum": total, "scatter": centred.T @ centred}


def _pooled(moments: Sequence[dict], side: str) -> tuple[float, np.ndarray, np.ndarray]:
    """(n, mean, scatter about the mean) of one side's clients pooled: S = sum_k S_k + n_k (m_k - m)(m_k - m)^T."""
    if not moments:
        raise ValueError(f"fit_density_ratio needs the moments of at least one {side} client")
    counts, sums, scatters = [], [], []
    for i, client in enumerate(moments):
        missing = {"count", "sum", "scatter"} - set(client)
        if missing:
            raise ValueError(f"the {side} moments of client {i} lack {sorted(missing)}")
        counts.append(float(np.asarray(client["count"], dtype=np.float64).reshape(-1)[0]))
        sums.append(np.asarray(client["sum"], dtype=np.float64))
        scatters.append(np.asarray(client["scatter"], dtype=np.float64))
    d = sums[0].shape[0] if sums[0].ndim == 1 else -1
    if d < 1:
        raise ValueError(f"the {side} moments of client 0 hold a sum of shape {sums[0].shape}, not [d] with d >= 1")
    if any(s.shape != (d,) for s in sums) or any(c.shape != (d, d) for c in scatters):
        raise ValueError(f"the {side} moments disagree in shape: sums {[s.shape for s in sums]}")
    n = sum(counts)
    if n <= 0:
        raise ValueError(f"the {side} clients hold no feature rows (their counts sum to {n:g})")
    mean = np.sum(sums, axis=0) / n
    scatter = np.sum(scatters, axis=0)
    for count, total in zip(counts, sums):
        if count > 0:
            offset = total / count - mean
            scatter = scatter + count * np.outer(offset, offset)
    return n, mean, scatter


@dataclass(frozen=True, eq=False)
class DensityRatio:
    """log w(x) = beta . x + intercept, the log density ratio p_target(x) / p_source(x) (read-only arrays)."""

    beta: np.ndarray
    intercept: float

    def __post_init__(self):
        beta = np.array(self.beta, dtype=np.float64)
        if beta.ndim != 1 or not np.all(np.isfinite(beta)):
            raise ValueError(f"beta must be a finite [d] array, got shape {beta.shape}")
        if not np.isfinite(self.intercept):
            raise ValueError(f"the intercept must be finite, got {self.intercept}")
        beta.setflags(write=False)
        object.__setattr__(self, "beta", beta)
        object.__setattr__(self, "intercept", float(self.intercept))

    def log_weights(self, features: np.ndarray) -> np.ndarray:
        """log w(x) of each row of ``features`` [n, d] -> [n]."""
        x = _as_features(features)
        if x.shape[1] != len(self.beta):
            raise ValueError(f"features have {x.shape[1]} columns, the density ratio {len(self.beta)}")
        return x @ self.beta + self.intercept

    def to_arrays(self) -> dict[str, np.ndarray]:
        """``{"beta": [d], "intercept": [1]}``, the form that crosses the wire."""
        return {"beta": self.beta.copy(), "intercept": np.array([self.intercept])}

    @classmethod
    def from_arrays(cls, arrays: dict) -> "DensityRatio":
        """The density ratio that :meth:`to_arrays` wrote."""
        missing = {"beta", "intercept"} - set(arrays)
        if missing:
            raise ValueError(f"density-ratio arrays lack {sorted(missing)}")
        intercept = np.asarray(arrays["intercept"], dtype=np.float64).reshape(-1)
        if intercept.shape != (1,):
            raise ValueError(f"the intercept must be one number, got shape {intercept.shape}")
        return cls(np.asarray(arrays["beta"], dtype=np.float64), float(intercept[0]))


def fit_density_ratio(
    source_moments: Sequence[dict], target_moments: Sequence[dict], ridge: float = 1e-3
) -> DensityRatio:
    """The Gaussian linear discriminant of the pooled targets against the pooled sources, as a density ratio.

    mu_S, mu_T: the pooled means; S = (scatter_S + scatter_T) / (n_S + n_T - 2), the pooled within-domain
    covariance, plus ``ridge`` times the mean variance trace(S)/d on the diagonal (1 in place of the mean variance
    when every feature is constant); then beta = S^-1 (mu_T - mu_S) and c = -beta . (mu_T + mu_S) / 2, so that
    beta . x + c = log N(x; mu_T, S) - log N(x; mu_S, S). Nothing is clipped or renormalized (a mean-1 weight
    normalization over the sources' validation rows would cost one more exchange).
    """
    if not np.isfinite(ridge) or ridge < 0:
        raise ValueError(f"ridge must be a finite number >= 0, got {ridge}")
    n_source, mean_source, scatter_source = _pooled(source_moments, "source")
    n_target, mean_target, scatter_target = _pooled(target_moments, "target")
    if mean_source.shape != mean_target.shape:
        raise ValueError(f"source features have {len(mean_source)} columns, target features {len(mean_target)}")
    if n_source + n_target <= 2:
        raise ValueError(f"the pooled covariance needs more than 2 rows, got {n_source + n_target:g}")
    d = len(mean_source)
    covariance = (scatter_source + scatter_target) / (n_source + n_target - 2)
    covariance = (covariance + covariance.T) / 2
    mean_variance = np.trace(covariance) / d
    shared = covariance + ridge * (mean_variance if mean_variance > 0 else 1.0) * np.eye(d)
    try:
        beta = np.linalg.solve(shared, mean_target - mean_source)
    except np.linalg.LinAlgError as error:
        raise ValueError(f"the shared feature covariance is singular: fit with a ridge > 0 (got {ridge})") from error
    return DensityRatio(beta, -0.5 * float(beta @ (mean_target + mean_source)))
