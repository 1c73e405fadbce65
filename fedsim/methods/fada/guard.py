"""The consensus guard of FADA's target update: the round's alignment of G_t is kept only if it does not lower the
target model's agreement with the sources' consensus (fedsim's safeguard; Peng et al., ICLR 2020, have none).

At the target's ``update`` (Alg. 1, Eq. 1-2) the target holds w_start (its weights at the round's start, before the
adversarial steps of Sec. 3.2 moved G_t), the aligned weights w_aligned, the sources' deltas Delta_i = w_i - w_start
and their attention a_i. Two candidates:

* A = w_aligned + sum_i a_i Delta_i (FADA's update);
* B = w_start + sum_i a_i Delta_i (the same attention update without this round's alignment).

On seeded unlabeled target inputs, the consensus is argmax of the mean softmax of the source models
w_start + Delta_i, and a model's agreement the fraction of inputs it labels as the consensus. The target keeps B if
agreement(A) < agreement(B) or the domain identifiers won the round (the alignment lost its adversarial game), A
otherwise. No label is read: only inputs and the models' predictions.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from fedsim.methods.fada.attention import apply_deltas, subset_rows
from fedsim.seeding import numpy_rng

Weights = Mapping[str, np.ndarray]
GUARDS = ("consensus", "off")
GUARD_METRICS = ("consensus_agreement", "guard_kept_alignment")  # the target's update reports both when it guards


def guard_inputs(pool: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """``samples`` rows of ``pool`` (all when fewer), drawn without replacement from ``seed``, in pool order."""
    return subset_rows(pool, samples, numpy_rng(seed))


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def consensus_labels(predict: Callable[[Weights, np.ndarray], np.ndarray], models: Sequence[Weights], inputs):
    """argmax over classes of the mean softmax of ``predict(model, inputs)`` over ``models`` (first class on ties)."""
    return np.mean([softmax_rows(predict(model, inputs)) for model in models], axis=0).argmax(axis=1)


def agreement(predict: Callable[[Weights, np.ndarray], np.ndarray], model: Weights, inputs, consensus) -> float:
    """The fraction of ``inputs`` on which ``model``'s argmax equals ``consensus``."""
    return float(np.mean(np.asarray(predict(model, inputs)).argmax(axis=1) == consensus))


def consensus_guard(
    predict: Callable[[Weights, np.ndarray], np.ndarray],
    start: Weights,
    aligned: Weights,
    deltas: Sequence[Weights],
    attention: Sequence[float],
    inputs: np.ndarray,
    identifiers_won: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """(the kept model, metrics): A = ``aligned`` + sum_i a_i Delta_i unless agreement(A) < agreement(B) or
    ``identifiers_won``, then B = ``start`` + sum_i a_i Delta_i. ``predict(weights, inputs)`` gives a model's logits.
    Metrics: ``consensus_agreement`` (of the kept model), ``guard_kept_alignment`` (1.0: A, 0.0: B)."""
    consensus = consensus_labels(predict, [apply_deltas(start, [d], [1.0]) for d in deltas], inputs)
    with_alignment = apply_deltas(aligned, deltas, attention)
    without_alignment = apply_deltas(start, deltas, attention)
    agree_a = agreement(predict, with_alignment, inputs, consensus)
    agree_b = agreement(predict, without_alignment, inputs, consensus)
    keep = not identifiers_won and agree_a >= agree_b
    metrics = {"consensus_agreement": agree_a if keep else agree_b, "guard_kept_alignment": 1.0 if keep else 0.0}
    return (with_alignment if keep else without_alignment), metrics
