"""Server-side aggregation in numpy alone, so a server half that only averages never imports torch."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np


def weighted_average(
    tensor_sets: Iterable[Mapping[str, np.ndarray]], weights: Iterable[float]
) -> dict[str, np.ndarray]:
    """sum_k w_k T_k / sum_k w_k per named tensor (McMahan et al. 2017, Alg. 1), in float64, cast back."""
    tensor_sets = list(tensor_sets)
    weights = np.asarray(list(weights), dtype=np.float64)
    if len(tensor_sets) == 0 or weights.sum() <= 0:
        raise ValueError("weighted_average needs at least one tensor set with positive weight")
    weights = weights / weights.sum()
    out = {}
    for name in tensor_sets[0]:
        first = np.asarray(tensor_sets[0][name])
        total, term = np.zeros(first.shape), np.empty(first.shape)
        for w, ts in zip(weights, tensor_sets):  # in place, in the clients' order: no temporaries per client
            np.multiply(ts[name], w, out=term, dtype=np.float64)
            total += term
        out[name] = (np.rint(total) if np.issubdtype(first.dtype, np.integer) else total).astype(first.dtype)
    return out


def federated_average(replies: Mapping[int, Any]) -> tuple[dict[str, np.ndarray], dict[str, dict[str, float]]]:
    """FedAvg's server step (McMahan et al. 2017, Alg. 1): the replies' tensors weighted by their sample counts,
    and each client's ``train_loss`` as the round's metric."""
    weights = weighted_average([r.tensors for r in replies.values()], [r.num_examples for r in replies.values()])
    return weights, {"train_loss": {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}}
