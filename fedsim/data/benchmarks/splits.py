"""Seeded splits shared by the benchmarks: random streams, stratified train/test split, subsampling.

Every random decision draws from ``np.random.SeedSequence([data.seed, key])`` with a
key fixed per benchmark, domain and purpose, so every process builds the same bits.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from fedsim.data.base import Domain

TEST_FRACTION = 0.2
"""The share of a domain's samples held out for testing (the 80/20 split of :func:`split_domain`)."""


def rng_for(seed: int, key: int) -> np.random.Generator:
    """The random stream of one purpose: a generator seeded by ``SeedSequence([seed, key])`` (``seed`` is
    ``data.seed``, ``key`` fixed per benchmark, domain and purpose), the same in every process."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(key)]))


def domain_key(name: str) -> int:
    """A stable integer per domain name (Python's hash() differs between processes)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "little")


def stratified_split(
    y: np.ndarray, rng: np.random.Generator, test_fraction: float = TEST_FRACTION
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test), shuffled: ``round(f * N)`` test samples shared out by class.

    Each class gets ``f`` of its samples (largest remainder, ties by class order);
    every class with at least two samples keeps at least one sample in each part.
    With two or more samples overall, both parts are non-empty.
    """
    y = np.asarray(y)
    classes, counts = np.unique(y, return_counts=True)
    exact = counts * float(test_fraction)
    quota = np.floor(exact).astype(np.int64)
    remainder = int(round(test_fraction * len(y))) - int(quota.sum())
    if remainder > 0:
        order = np.lexsort((classes, -(exact - quota)))  # largest fraction first
        quota[order[:remainder]] += 1
    quota = np.where(counts >= 2, np.clip(quota, 1, counts - 1), 0)
    train, test = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for cls, n_test in zip(classes, quota):
        idx = np.flatnonzero(y == cls)
        idx = idx[rng.permutation(len(idx))]
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    train_idx, test_idx = np.concatenate(train), np.concatenate(test)
    if len(test_idx) == 0 and len(train_idx) >= 2:  # only one-sample classes: move one to test
        test_idx, train_idx = train_idx[-1:], train_idx[:-1]
    return train_idx[rng.permutation(len(train_idx))], test_idx[rng.permutation(len(test_idx))]


def stratified_subsample(y: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of at most ``n`` samples keeping class proportions (largest remainder), in original order."""
    y = np.asarray(y)
    if n >= len(y):
        return np.arange(len(y))
    classes, counts = np.unique(y, return_counts=True)
    exact = counts * (n / len(y))
    quota = np.floor(exact).astype(np.int64)
    remainder = n - int(quota.sum())
    order = np.lexsort((classes, -(exact - quota)))  # largest fraction first, ties by class
    quota[order[:remainder]] += 1
    keep = []
    for cls, q in zip(classes, quota):
        idx = np.flatnonzero(y == cls)
        keep.append(idx[rng.permutation(len(idx))[:q]])
    return np.sort(np.concatenate(keep))


def limit_train(
    x: np.ndarray, y: np.ndarray, limit: Optional[int], seed: int, key: int
) -> tuple[np.ndarray, np.ndarray]:
    """``data.max_train_per_domain``: at most ``limit`` training samples, class proportions kept."""
    if limit is None or limit >= len(y):
        return x, y
    keep = stratified_subsample(y, int(limit), rng_for(seed, key))
    return x[keep], y[keep]


def feature_domain(name: str, train_x, train_y, test_x, test_y, num_classes: int) -> Domain:
    """A :class:`Domain` of contiguous float32 inputs and int64 labels."""
    return Domain(
        name=name,
        train_x=np.ascontiguousarray(train_x, dtype=np.float32),
        train_y=np.ascontiguousarray(train_y, dtype=np.int64),
        test_x=np.ascontiguousarray(test_x, dtype=np.float32),
        test_y=np.ascontiguousarray(test_y, dtype=np.int64),
        num_classes=num_classes,
    )


def split_domain(
    name: str, x: np.ndarray, y: np.ndarray, num_classes: int, config, split_key: int, subsample_key: int
) -> Domain:
    """An 80/20 split stratified by label from ``data.seed``, then ``data.max_train_per_domain``."""
    seed = int(config.seed)
    train_idx, test_idx = stratified_split(y, rng_for(seed, split_key))
    train_x, train_y = limit_train(x[train_idx], y[train_idx], config.max_train_per_domain, seed, subsample_key)
    return feature_domain(name, train_x, train_y, x[test_idx], y[test_idx], num_classes)


def named_streams(name: str) -> tuple[int, int]:
    """The (split, subsample) stream keys of a domain known only by its name (the benchmarks that read your files)."""
    key = domain_key(name)
    return key * 4 + 1, key * 4 + 2


def split_named_domain(name: str, x: np.ndarray, y: np.ndarray, num_classes: int, config) -> Domain:
    """:func:`split_domain` with the streams of :func:`named_streams`."""
    split_key, subsample_key = named_streams(name)
    return split_domain(name, x, y, num_classes, config, split_key, subsample_key)
