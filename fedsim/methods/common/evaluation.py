"""The round's accuracy and selection-score metrics from the clients' evaluation replies: the default summary of
every method."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from fedsim.data.scenario import Federation
from fedsim.messages import Reply
from fedsim.methods.common.selection_hooks import combine_selection


def summarize_evaluation(federation: Federation, replies: Mapping[int, Reply], scores: Sequence[str] = ()) -> dict:
    """Pool correct/total counts per domain: target accuracy and per-domain source accuracy; and the
    model-selection ``scores`` from the replies' statistics (``score_<name>``,
    :func:`fedsim.methods.common.selection_hooks.combine_selection`).

    A method reporting several predictors sends ``correct_<name>`` next to
    ``correct``; they become ``target_accuracy_<name>`` and ``source_accuracy_<name>`` (and its selection
    statistics ``score_<score>_<name>``).
    """
    variants = sorted({k[len("correct_") :] for r in replies.values() for k in r.metrics if k.startswith("correct_")})
    metrics: dict = {}
    for suffix in [""] + [f"_{v}" for v in variants]:
        correct: dict[str, float] = {}
        total: dict[str, float] = {}
        for cid, reply in replies.items():
            domain = federation.info(cid).domain
            correct[domain] = correct.get(domain, 0.0) + reply.metrics[f"correct{suffix}"]
            total[domain] = total.get(domain, 0.0) + reply.metrics["total"]
        accuracy = {d: correct[d] / total[d] for d in correct if total[d] > 0}
        sources = {d: accuracy[d] for d in federation.source_domains if d in accuracy}
        metrics[f"source_accuracy{suffix}"] = sources
        if sources:
            metrics[f"mean_source_accuracy{suffix}"] = float(np.mean(list(sources.values())))
        if federation.target in accuracy:
            metrics[f"target_accuracy{suffix}"] = accuracy[federation.target]
    metrics.update(combine_selection(federation, replies, scores))
    return metrics
