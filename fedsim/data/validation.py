"""Checks shared by the loaders of user files: one clear message naming the file, the key and the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedsim.errors import UserError


def finite_float32(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    """``x`` (real numbers) as float32, refusing NaN, infinities and values float32 cannot hold."""
    if np.issubdtype(x.dtype, np.floating):
        bad = int(np.count_nonzero(~np.isfinite(x)))
        if bad:
            raise UserError(f"{path}: {key!r} has {bad} NaN or infinite values: replace or drop them")
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    if not np.all(np.isfinite(x32)):
        raise UserError(f"{path}: {key!r} has values too large for float32 (beyond ~3.4e38): rescale the features")
    return x32
