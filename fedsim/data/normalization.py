"""Feature standardization for federations: shared (computed federatedly) or per domain.

Federated standardization: every client sends the sufficient statistics of its
*training features* (count, sum, sum of squares; no labels, no raw rows), the server
adds them up and derives one mean and standard deviation that every client applies:

    stats = combine_stats([feature_stats(x) for x in client_train_features])
    mean, std = mean_std(stats)
    x_std = standardize(x, mean, std)

This equals the pooled-data mean and (population) standard deviation up to rounding,
without the server ever seeing pooled data. Per-domain standardization scales each
domain by its own training statistics instead (:func:`per_domain_standardize`): an
honest baseline on process data such as TEP, where the operating modes differ mostly
by offsets and scales. Features with (near) zero spread are only centered (their std
is reported as 1), so constant columns never produce NaN or huge values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

STAT_KEYS = ("count", "sum", "sum_sq")
MIN_STD = 1e-8  # below this (relative to the feature's magnitude, or absolutely) a feature counts as constant


@dataclass(frozen=True)
class FeatureStats:
    """Sufficient statistics of a set of feature vectors: n, sum x, sum x^2 (float64, per feature)."""

    count: int
    sum: np.ndarray
    sum_sq: np.ndarray

    def to_tensors(self) -> dict[str, np.ndarray]:
        """Named arrays for a :class:`fedsim.messages.Reply` (what a client sends)."""
        return {"count": np.array(self.count, dtype=np.int64), "sum": self.sum, "sum_sq": self.sum_sq}

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, np.ndarray]) -> "FeatureStats":
        missing = [k for k in STAT_KEYS if k not in tensors]
        if missing:
            raise ValueError(f"feature statistics lack {missing}")
        return cls(
            int(np.asarray(tensors["count"])),
            np.asarray(tensors["sum"], np.float64),
            np.asarray(tensors["sum_sq"], np.float64),
        )


def _as_matrix(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim < 1:
        raise ValueError("features must have a sample axis")
    return x.reshape(len(x), -1).astype(np.float64, copy=False)


def feature_stats(x: np.ndarray) -> FeatureStats:
    """Client side: statistics of one client's training features (N x ...; flattened per sample)."""
    m = _as_matrix(x)
    return FeatureStats(int(m.shape[0]), m.sum(axis=0), np.square(m).sum(axis=0))


def combine_stats(stats: Iterable[FeatureStats]) -> FeatureStats:
    """Server side: add the clients' statistics (they must describe the same features)."""
    stats = list(stats)
    if not stats:
        raise ValueError("no feature statistics to combine")
    shape = stats[0].sum.shape
    for s in stats[1:]:
        if s.sum.shape != shape or s.sum_sq.shape != shape:
            raise ValueError(f"feature statistics of different sizes: {shape} and {s.sum.shape}")
    return FeatureStats(
        sum(s.count for s in stats), np.sum([s.sum for s in stats], axis=0), np.sum([s.sum_sq for s in stats], axis=0)
    )


def mean_std(stats: FeatureStats) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population std (ddof=0) from statistics; constant features get std 1."""
    if stats.count < 1:
        raise ValueError("feature statistics over zero samples")
    mean = stats.sum / stats.count
    var = np.maximum(stats.sum_sq / stats.count - np.square(mean), 0.0)
    std = np.sqrt(var)
    # E[x^2] - E[x]^2 cancels about 1e-16 * mean^2: treat anything at that level as zero spread.
    floor = np.maximum(MIN_STD, 1e-7 * np.abs(mean))
    std = np.where(std > floor, std, 1.0)
    return mean, std


def standardize(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(x - mean) / std per feature, float32, in the shape of ``x``."""
    x = np.asarray(x)
    m = _as_matrix(x)
    if m.shape[1] != np.size(mean) or np.size(mean) != np.size(std):
        raise ValueError(f"features of size {m.shape[1]} but statistics of size {np.size(mean)}")
    out = (m - np.reshape(mean, -1)) / np.reshape(std, -1)
    return out.astype(np.float32).reshape(x.shape)


def federated_mean_std(train_features: Iterable[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The shared mean/std of several clients, through their statistics only."""
    return mean_std(combine_stats(feature_stats(x) for x in train_features))


def per_domain_standardize(train_x: np.ndarray, *others: np.ndarray) -> tuple[np.ndarray, ...]:
    """Standardize a domain by its own training statistics: returns (train_x, *others) scaled.

    For the unlabeled target this uses its training *features* only, never labels.
    """
    mean, std = mean_std(feature_stats(train_x))
    return (standardize(train_x, mean, std),) + tuple(standardize(o, mean, std) for o in others)


NORMALIZATIONS = ("none", "federated", "per-domain")


def normalize_domains(
    domains: Mapping[str, tuple[np.ndarray, np.ndarray]], how: str
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Apply one normalization to ``{domain: (train_x, test_x)}``.

    ``federated``: one mean/std from the sum of every domain's train statistics;
    ``per-domain``: each domain by its own train statistics; ``none``: unchanged (float32).
    """
    if how not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {how!r}: choose one of {', '.join(NORMALIZATIONS)}")
    if how == "none":
        return {d: (np.asarray(tr, np.float32), np.asarray(te, np.float32)) for d, (tr, te) in domains.items()}
    if how == "per-domain":
        return {d: per_domain_standardize(tr, te) for d, (tr, te) in domains.items()}
    mean, std = federated_mean_std(tr for tr, _ in domains.values())
    return {d: (standardize(tr, mean, std), standardize(te, mean, std)) for d, (tr, te) in domains.items()}


#: the two client operations of the standardization setup stage, answered by every client host for every method
DATA_STATS = "data_stats"
DATA_STANDARDIZE = "data_standardize"


def standardize_federation(ctx, how: str, clients: list[int]) -> None:
    """The setup stage of ``data.normalization`` (run once before round 1, its bytes counted in round 1).

    ``federated``: clients send (count, sum, sum of squares) of their training inputs, the server
    combines them into one mean/std and sends it back (no raw rows leave a client).
    ``per-domain``: each client standardizes by its own statistics (nothing sent). ``none``: nothing.
    """
    if how == "federated":
        replies = ctx.call(DATA_STATS, None, clients)
        mean, std = mean_std(combine_stats(FeatureStats.from_tensors(r.tensors) for r in replies.values()))
        ctx.call(DATA_STANDARDIZE, {"mean": mean.astype(np.float32), "std": std.astype(np.float32)}, clients)
    elif how == "per-domain":
        ctx.call(DATA_STANDARDIZE, None, clients, {"own_statistics": True})
