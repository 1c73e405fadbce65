"""Model-selection scores inside a method's evaluation: each client's statistics, and their combination.

The scores (``run.scores``, :mod:`fedsim.selection`) are computed where the data lives. Each classification method's
``evaluate`` client operation, after its test metrics, hands its deployed predictor(s) to :func:`selection_reply`:

* a source client scores its held-out validation part (``data.validation``, ``data.validation_fraction``): logits
  and labels -> :func:`fedsim.selection.source_statistics` (source_accuracy, source_loss; iwv and dev);
* a target client scores its unlabeled training inputs (``data.train.x``): logits only ->
  :func:`fedsim.selection.target_statistics` (entropy, snd, mano). ``data.train.y`` is None and is never read.

The statistics are a few floats in the reply's ``metrics``, under ``selection.<statistic>`` (a predictor variant,
reported as ``correct_<name>`` beside ``correct``: ``selection_<name>.<statistic>``). The server
(:func:`combine_selection`, from :func:`fedsim.methods.common.evaluation.summarize_evaluation`) pools them into the
round's ``score_<score>`` metrics (``score_<score>_<name>`` for a variant), with
:func:`fedsim.selection.combine_statistics`.

iwv (Sugiyama et al., JMLR 2007) and dev (You et al., ICML 2019) weigh the sources' validation losses by the density
ratio w = p_target / p_source, which takes one exchange before the evaluation (:func:`density_payload`, run by
:meth:`fedsim.methods.base.Method.selection_payload`): every client runs its ``evaluate`` with
``values[STAGE] = MOMENTS`` and replies with the moments of its predictor's features (count, sum, scatter: 1 + d +
d*d numbers per predictor, as reply tensors; a source's on its validation rows, a target's on its training inputs);
the server fits :func:`fedsim.selection.fit_density_ratio` and sends (beta, intercept), d + 1 numbers per predictor,
to the sources with the evaluation (instruction tensors ``selection<suffix>.density.*``, which
:func:`model_tensors` strips before a model loads its weights). The features are the predictor's own:
``model.features(x)`` of a :class:`fedsim.models.classifier.Classifier`, else its logits (:class:`Predictor`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Mapping, Optional, Sequence

import numpy as np

from fedsim.coercion import read_values
from fedsim.messages import Instruction, Reply, Tensors
from fedsim.selection import (
    SCORES,
    DensityRatio,
    combine_statistics,
    fit_density_ratio,
    moment_statistics,
    source_statistics,
    target_statistics,
)

if TYPE_CHECKING:
    from fedsim.data.base import ClientData
    from fedsim.data.scenario import Federation

#: the instruction value that marks the moments exchange of iwv/dev
STAGE = "selection_stage"
#: its value: reply with feature moments instead of statistics
MOMENTS = "moments"
#: the prefix of every selection key, in reply metrics, reply tensors and instruction tensors
PREFIX = "selection"


@dataclass(frozen=True)
class SelectionValues:
    """What an ``evaluate`` instruction's values say to the selection hook (beside the method's own values)."""

    selection_stage: Optional[Literal["moments"]] = None
    """:data:`MOMENTS` in the moments exchange of iwv/dev (reply with feature moments); None: a plain evaluation."""


def requested_scores(config, task: str) -> tuple[str, ...]:
    """The score names ``run.scores`` resolves to for a method of ``task`` (none for detection: its evaluation
    has no classifier logits; :func:`fedsim.validation.check_scores` refuses naming any there)."""
    from fedsim.selection import resolve_scores

    if task != "classification":
        return ()
    return resolve_scores(config.run.scores, has_validation=config.data.validation_fraction > 0)


def needs_density(scores: Sequence[str]) -> bool:
    """Whether ``scores`` hold iwv or dev (the moments exchange before the evaluation)."""
    return any(SCORES[name].needs_density for name in scores)


def prefix(variant: str = "") -> str:
    """``selection.`` for the main predictor, ``selection_<variant>.`` for a variant (``correct_<variant>``)."""
    return f"{PREFIX}_{variant}." if variant else f"{PREFIX}."


def is_selection_key(key: str) -> bool:
    return key.startswith((f"{PREFIX}.", f"{PREFIX}_"))


def model_tensors(instruction: Instruction) -> Tensors:
    """The instruction's tensors without the density ratio of iwv/dev (the same mapping when it carries none)."""
    tensors = instruction.tensors
    if not any(is_selection_key(key) for key in tensors):
        return tensors
    return {key: value for key, value in tensors.items() if not is_selection_key(key)}


# ---- client half -------------------------------------------------------------------------------------------------
class Predictor:
    """A client's deployed predictor as the scores see it: logits of inputs, and the features of the density
    ratio. Subclasses: :class:`ClassifierPredictor`, :class:`FixedOutputs`."""

    def logits(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def features(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class ClassifierPredictor(Predictor):
    """A torch model in eval mode, without gradients, in chunks: logits ``model(x)``; features ``model.features(x)``
    for a :class:`fedsim.models.classifier.Classifier`, else the logits."""

    def __init__(self, model, device):
        from fedsim.models.classifier import Classifier

        self.model, self.device = model, device
        self.feature_fn = model.features if isinstance(model, Classifier) else model

    def _apply(self, function, x: np.ndarray) -> np.ndarray:
        import torch

        from fedsim.methods.common.training import encode_in_chunks

        self.model.eval()
        with torch.no_grad():
            return encode_in_chunks(function, np.ascontiguousarray(x), self.device).double().numpy()

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self._apply(self.model, x)

    def features(self, x: np.ndarray) -> np.ndarray:
        return self._apply(self.feature_fn, x).reshape(len(x), -1)


class FixedOutputs(Predictor):
    """Logits already computed on the client's selection inputs (a predictor that is not a torch classifier, e.g.
    DaDiL-R and DaDiL-E); its features are those logits."""

    def __init__(self, logits):
        self.values = np.asarray(logits, dtype=np.float64)

    def logits(self, x: np.ndarray) -> np.ndarray:
        if len(x) != len(self.values):
            raise ValueError(f"outputs of {len(self.values)} rows for {len(x)} selection inputs")
        return self.values

    features = logits


def selection_inputs(scores: Sequence[str], data: ClientData) -> Optional[np.ndarray]:
    """The rows this client scores: a source's validation inputs when a source score is requested, a target's
    training inputs when a target score (or the density ratio) is; None when it scores nothing."""
    if data.is_target:
        wanted = any(not SCORES[name].needs_validation for name in scores) or needs_density(scores)
        return data.train.x if wanted else None
    wanted = any(SCORES[name].needs_validation for name in scores)
    return data.validation.x if wanted and data.validation is not None else None


def selection_reply(
    scores: Sequence[str], instruction: Instruction, data: ClientData, reply: Reply, predictors: Mapping[str, Predictor]
) -> Reply:
    """``reply`` with this client's selection statistics added to its metrics, one set per predictor (key: the
    variant's name, "" for the main one); in the moments exchange, a reply of feature moments instead."""
    x = selection_inputs(scores, data)
    if x is None:
        return reply
    values = read_values(SelectionValues, instruction.values, instruction.operation, shared=True)
    if values.selection_stage == MOMENTS:
        tensors = {}
        for variant, predictor in predictors.items():
            moments = moment_statistics(predictor.features(x))
            tensors.update({prefix(variant) + key: value for key, value in moments.items()})
        return Reply(data.client_id, tensors, {}, num_examples=len(x))
    metrics = dict(reply.metrics)
    for variant, predictor in predictors.items():
        if data.is_target:
            stats = target_statistics(predictor.logits(x), scores)
        else:
            ratio = received_density(instruction.tensors, variant)
            log_weights = None if ratio is None else ratio.log_weights(predictor.features(x))
            stats = source_statistics(predictor.logits(x), data.validation.y, scores, log_weights)
        metrics.update({prefix(variant) + key: value for key, value in stats.items()})
    return dataclasses.replace(reply, metrics=metrics)


def received_density(tensors: Tensors, variant: str) -> Optional[DensityRatio]:
    """The density ratio the server sent for ``variant``'s predictor (None when iwv/dev are not requested)."""
    head = prefix(variant) + "density."
    arrays = {key[len(head) :]: value for key, value in tensors.items() if key.startswith(head)}
    return DensityRatio.from_arrays(arrays) if arrays else None


# ---- server half -------------------------------------------------------------------------------------------------
def density_payload(method, ctx, tensors, values=None):
    """The evaluation's tensors, with the density ratio of iwv/dev for the sources when those are requested.

    One exchange first: every client ``evaluate``s ``tensors`` (and ``values``) with ``values[STAGE] = MOMENTS``
    and sends its features' moments; the server fits one ratio per predictor (sources pooled against targets) and
    returns a function of the client id: the sources' tensors carry it, the targets' are ``tensors`` as they were.
    Without iwv/dev, ``tensors`` itself (nothing more is sent)."""
    if not needs_density(method.selection_scores):
        return tensors
    federation = method.federation

    def moments_values(cid: int) -> dict:
        own = values(cid) if callable(values) else values
        return {**(own or {}), STAGE: MOMENTS}

    replies = ctx.call("evaluate", tensors, federation.client_ids, moments_values)
    density = {}
    for variant in _variants(reply.tensors for reply in replies.values()):
        head = prefix(variant)
        moments = {cid: _unprefixed(reply.tensors, head) for cid, reply in replies.items()}
        ratio = fit_density_ratio(
            [moments[cid] for cid in federation.source_ids], [moments[cid] for cid in federation.target_ids]
        )
        density.update({f"{head}density.{key}": value for key, value in ratio.to_arrays().items()})
    sources = set(federation.source_ids)

    def for_client(cid: int):
        own = tensors(cid) if callable(tensors) else tensors
        return {**(own or {}), **density} if cid in sources else own

    return for_client


def _variants(keyed: Sequence[Mapping]) -> list[str]:
    """The predictor variants named by selection keys ("" for ``selection.``), sorted."""
    found = set()
    for mapping in keyed:
        for key in mapping:
            if is_selection_key(key):
                head = key.split(".", 1)[0]
                found.add(head[len(PREFIX) + 1 :] if head != PREFIX else "")
    return sorted(found)


def _unprefixed(mapping: Mapping, head: str) -> dict:
    return {key[len(head) :]: value for key, value in mapping.items() if key.startswith(head)}


def combine_selection(federation: Federation, replies: Mapping[int, Reply], scores: Sequence[str]) -> dict:
    """``score_<score>`` (``score_<score>_<variant>`` for a predictor variant) from the evaluation replies'
    ``selection`` statistics: the sources' pooled against the targets' (:func:`fedsim.selection.combine_statistics`).
    Empty when no score is requested or no reply carries statistics."""
    if not scores:
        return {}
    metrics = {}
    for variant in _variants(reply.metrics for reply in replies.values()):
        head = prefix(variant)
        stats = {cid: _unprefixed(reply.metrics, head) for cid, reply in replies.items()}
        sources = [stats[cid] for cid in federation.source_ids if stats.get(cid)]
        targets = [stats[cid] for cid in federation.target_ids if stats.get(cid)]
        combined = combine_statistics(scores, sources, targets)
        metrics.update({f"{key}_{variant}" if variant else key: value for key, value in combined.items()})
    return metrics
