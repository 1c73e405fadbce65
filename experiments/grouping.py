"""Records grouped over seeds, and their means ± sample standard deviations (reports and reproduce tables)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np


def group_key(record: dict) -> tuple:
    """A record's parameters without the seed: records that differ only by seed share it."""
    return tuple((k, v) for k, v in record["params"].items() if k != "seed")


def group_label(key: tuple) -> str:
    """('method', 'fedavg'), ('local_epochs', 5), ('method.lr', 0.1) -> 'fedavg, E=5, method.lr=0.1'."""
    parts = []
    for name, value in key:
        if name == "method":
            parts.insert(0, str(value))
        elif name == "local_epochs":
            parts.append(f"E={value}")
        else:
            parts.append(f"{name}={value}")
    return ", ".join(parts) if parts else "run"


def groups(records: list[dict]) -> dict[tuple, list[dict]]:
    """Records with the same parameters except the seed, in first-seen order."""
    out: dict[tuple, list[dict]] = {}
    for r in records:
        out.setdefault(group_key(r), []).append(r)
    return out


def mean_std(values: list) -> tuple[Optional[float], Optional[float], int]:
    """Mean, sample standard deviation (None below two values) and count of the values that are numbers."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None, None, 0
    std = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
    return float(np.mean(vals)), std, len(vals)


def format_mean_std(mean: Optional[float], std: Optional[float], digits: int = 4) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"
