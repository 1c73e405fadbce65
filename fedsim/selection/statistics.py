"""Each client's sufficient statistics of the selection scores, and their combination on the server.

A source client computes :func:`source_statistics` on its held-out validation part; a target client computes
:func:`target_statistics` on its training inputs and is given no labels at all (the function has no parameter for
them). Both return a few plain floats; :func:`combine_statistics` adds them over clients (``math.fsum``) and forms
each score, higher is better. For one target client and any number of sources every score equals its centralized
definition on the pooled rows (the tests' reference); with several target clients the sums-based scores
(entropy, MaNo) still do, and SND is the n-weighted mean of the clients' values (it needs every pair of rows).

The statistics (keys of the returned dicts):

* sources: ``n_validation``; ``correct`` (source_accuracy); ``loss_sum`` (source_loss); ``weighted_loss_sum``
  = sum w(x) l(x) (iwv, dev); ``weight_sum``, ``weight_sq_sum``, ``weighted_loss_weight_sum`` = sum w l w (dev);
* targets: ``n_target``; ``entropy_sum`` (entropy); ``snd`` (the client's own SND value); ``n_classes``,
  ``mano_neg_log_softmax_sum``, ``mano_softmax_power_sum``, ``mano_taylor_power_sum`` (mano).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Optional, Sequence

import numpy as np

from fedsim.errors import NumericalError, first_values
from fedsim.registry import SCORES
from fedsim.selection.scores import Score, checked_scores

logger = logging.getLogger(__name__)

#: SND's temperature tau (Saito et al., ICCV 2021, Eq. 2; the authors' code and skada use 0.05)
SND_TEMPERATURE = 0.05
#: MaNo's norm order p (Xie et al., NeurIPS 2024, Eq. 2; the authors' default)
MANO_NORM_ORDER = 4
#: MaNo's threshold eta on the criterion Phi (Eq. 6): softmax above it, the order-2 Taylor normalization otherwise
MANO_THRESHOLD = 5.0
#: DEV's Var(W) counts as zero (eta = 0) below this fraction of sum W^2: float64 rounding of a zero centred sum
DEV_ZERO_VARIANCE = 1e-12
#: rows of SND's similarity matrix formed at once (memory: this many times n float64 numbers)
SND_BLOCK_ROWS = 512


def _as_logits(logits) -> np.ndarray:
    array = np.asarray(logits, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"logits must be an [n, K] array with K >= 1, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise NumericalError(
            "the logits of a selection score",
            first_values(array[~np.isfinite(array)]),
            "the model's outputs overflowed: lower the learning rate",
        )
    return array


def _as_labels(labels, logits: np.ndarray) -> np.ndarray:
    array = np.asarray(labels)
    if array.ndim != 1 or len(array) != len(logits):
        raise ValueError(f"labels must be an [n] array matching the logits' {len(logits)} rows, got {array.shape}")
    if len(array) and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels must be integer class indices, got dtype {array.dtype}")
    if len(array) and (array.min() < 0 or array.max() >= logits.shape[1]):
        raise ValueError(f"labels must lie in [0, {logits.shape[1]}), got [{array.min()}, {array.max()}]")
    return array.astype(np.int64)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax by rows, shifted by the row maximum (no overflow, no log of an underflowed zero)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def source_statistics(
    logits: np.ndarray, labels: np.ndarray, scores: Sequence[str], log_weights: Optional[np.ndarray] = None
) -> dict[str, float]:
    """The sums a source client sends for ``scores``, from its validation part's logits [n, K] and labels [n].

    source_accuracy (Gulrajani & Lopez-Paz, ICLR 2021): the count of rows whose argmax is the label; source_loss:
    the sum of the cross-entropies l(x) = -log softmax(z)_y; iwv (Sugiyama et al., JMLR 2007, the importance-weighted
    risk (1/n) sum w(x) l(x)) and dev (You et al., ICML 2019, Algorithm 1) need ``log_weights`` = log w(x) per row
    (:meth:`fedsim.selection.DensityRatio.log_weights` of the rows' features). Target scores in ``scores`` are
    skipped here.
    """
    chosen = checked_scores(scores)
    logits = _as_logits(logits)
    labels = _as_labels(labels, logits)
    stats = {"n_validation": float(len(labels))}
    loss = -_log_softmax(logits)[np.arange(len(labels)), labels]
    for score in chosen:
        if score.needs_validation:
            stats.update(score.source_statistics(logits, labels, loss, log_weights))
    return stats


def _weighted_loss_sums(loss: np.ndarray, log_weights, with_dev: bool) -> dict[str, float]:
    """iwv's sums of w l and w, and DEV's sums of W = w, L = w l, W^2 and L W (You et al., ICML 2019, Algorithm 1),
    each on the client's own scale: the weights divided by exp(M), M = the client's largest log w (sent as
    ``log_weight_max``), so that neither an overflow nor an underflow of exp(log w) loses them (on separable features
    every w can be below float64's smallest number); the server brings the clients to a common scale."""
    if log_weights is None:
        raise ValueError("iwv and dev need log_weights: log w(x) of each validation row (DensityRatio.log_weights)")
    log_w = np.asarray(log_weights, dtype=np.float64)
    if log_w.shape != loss.shape:
        raise ValueError(f"log_weights must be an [n] array matching the {len(loss)} rows, got shape {log_w.shape}")
    if not np.all(np.isfinite(log_w)):
        raise NumericalError(
            "the importance weights w(x) = exp(log w(x)) of iwv/dev",
            f"log w {first_values(log_w[~np.isfinite(log_w)])}",
            "the density ratio is not finite on these features: fit it with a larger ridge",
        )
    top = float(log_w.max())
    weights = np.exp(log_w - top)  # in (0, 1], the largest exactly 1
    weighted = weights * loss
    sums = {"log_weight_max": top, "weighted_loss_sum": math.fsum(weighted), "weight_sum": math.fsum(weights)}
    if with_dev:
        sums.update(weight_sq_sum=math.fsum(weights * weights), weighted_loss_weight_sum=math.fsum(weighted * weights))
    return sums


def _common_scale(sources: Sequence[dict], score: str) -> tuple[float, list[float]]:
    """The largest ``log_weight_max`` M over the clients, and each client's factor exp(M_i - M) that brings its
    scaled sums to the common scale exp(-M) (squares: the factor squared)."""
    tops = _values(sources, "log_weight_max", score)
    top = max(tops)
    return top, [math.exp(t - top) for t in tops]


def _scaled_total(sources: Sequence[dict], key: str, score: str, factors: list[float], power: int = 1) -> float:
    return math.fsum(v * f**power for v, f in zip(_values(sources, key, score), factors))


def target_statistics(logits: np.ndarray, scores: Sequence[str]) -> dict[str, float]:
    """The statistics a target client sends for ``scores``, from the logits [n, K] of its unlabeled training inputs.

    entropy (Morerio et al., ICLR 2018): the sum over rows of H(p) = -sum_k p_k log p_k; snd: the client's whole
    :func:`soft_neighborhood_density`; mano: the two power sums of :func:`mano_power_sums` and the sum of -log
    softmax that chooses between them on the server. Takes no labels. Source scores in ``scores`` are skipped.
    """
    chosen = checked_scores(scores)
    logits = _as_logits(logits)
    log_p = _log_softmax(logits)
    stats = {"n_target": float(len(logits))}
    for score in chosen:
        stats.update(score.target_statistics(logits, log_p))
    return stats


def soft_neighborhood_density(probabilities: np.ndarray, temperature: float = SND_TEMPERATURE) -> float:
    """SND (Saito et al., ICCV 2021): the mean entropy of each row's softmax over its similarities to the others.

    The rows (softmax outputs) are L2-normalized; s_ij = <p_i, p_j> / tau; the diagonal is set to -1/tau (the lowest
    cosine similarity, as the authors' code and skada do: weight e^{-2/tau}, about 4e-18, against a perfect
    neighbour, so a row's own similarity is left out); q_i = softmax(s_i) (Eq. 2) and SND = mean_i H(q_i).
    Formed in blocks of :data:`SND_BLOCK_ROWS` rows, so memory grows as n, not n^2.
    """
    unit = probabilities / np.linalg.norm(probabilities, axis=1, keepdims=True)
    entropies = []
    for start in range(0, len(unit), SND_BLOCK_ROWS):
        similarity = unit[start : start + SND_BLOCK_ROWS] @ unit.T / temperature
        rows = np.arange(len(similarity))
        similarity[rows, start + rows] = -1.0 / temperature
        log_q = _log_softmax(similarity)
        entropies.append(-np.sum(np.exp(log_q) * log_q, axis=1))
    return math.fsum(np.concatenate(entropies)) / len(unit)


def taylor_normalized(logits: np.ndarray) -> np.ndarray:
    """MaNo's order-2 Taylor normalization (Xie et al., NeurIPS 2024, Eq. 6), as the authors' code computes it.

    v = 1 + z + z^2 / 2 on the raw logits, minus its row minimum, divided by its row sum; a row whose logits are all
    equal has a zero sum and stays zero (as ``torch.nn.functional.normalize`` leaves it in the authors' code).
    """
    values = 1.0 + logits + logits * logits / 2.0
    values = values - values.min(axis=1, keepdims=True)
    totals = values.sum(axis=1, keepdims=True)
    return np.divide(values, totals, out=np.zeros_like(values), where=totals > 0)


def mano_power_sums(logits: np.ndarray) -> dict[str, float]:
    """MaNo's sums on one client (Xie et al., NeurIPS 2024, Eqs. 2 and 6), decomposable over target clients.

    The criterion Phi = -(1/(nK)) sum_ik log softmax(z_i)_k (the cross-entropy between the uniform distribution and
    the softmax, the authors' code's form) is a dataset-level mean, and it chooses the normalization of every row; so
    each client sends both sums, sum_ik softmax^p and sum_ik taylor^p, with the sum of -log softmax, and the server
    picks one after pooling Phi (:func:`combine_statistics`).
    """
    logits = _as_logits(logits)
    log_p = _log_softmax(logits)
    return {
        "n_classes": float(logits.shape[1]),
        "mano_neg_log_softmax_sum": math.fsum(-log_p.ravel()),
        "mano_softmax_power_sum": math.fsum((np.exp(log_p) ** MANO_NORM_ORDER).ravel()),
        "mano_taylor_power_sum": math.fsum((taylor_normalized(logits) ** MANO_NORM_ORDER).ravel()),
    }


def _values(stats: Sequence[dict], key: str, score: str) -> list[float]:
    missing = [i for i, client in enumerate(stats) if key not in client]
    if missing:
        raise ValueError(f"{score}: the statistic {key!r} is missing from clients {missing} (computed without {score})")
    return [float(client[key]) for client in stats]


def _total(stats: Sequence[dict], key: str, score: str) -> float:
    return math.fsum(_values(stats, key, score))


def _rows(stats: Sequence[dict], key: str, score: str) -> float:
    rows = _total(stats, key, score)
    if rows <= 0:
        raise ValueError(f"{score}: the clients' statistics hold no rows ({key} sums to {rows:g})")
    return rows


_DOMAINBED = "Gulrajani & Lopez-Paz, In Search of Lost Domain Generalization, ICLR 2021 (training-domain validation)"


@SCORES.register("source_accuracy")
class SourceAccuracy(Score):
    """Accuracy on the sources' validation parts, pooled: sum correct / sum n."""

    paper = _DOMAINBED
    description = "accuracy on the sources' validation parts, pooled: sum correct / sum n"
    needs_validation = True
    cheap = True

    def source_statistics(self, logits, labels, losses, log_weights) -> dict:
        return {"correct": float(np.count_nonzero(np.argmax(logits, axis=1) == labels))}

    def combine(self, sources: Sequence[dict], targets: Sequence[dict]) -> float:
        return _total(sources, "correct", "source_accuracy") / _rows(sources, "n_validation", "source_accuracy")


@SCORES.register("source_loss")
class SourceLoss(Score):
    """Minus the mean cross-entropy on the sources' validation parts: -sum l / sum n."""

    paper = _DOMAINBED
    description = "minus the mean cross-entropy on the sources' validation parts"
    needs_validation = True
    cheap = True

    def source_statistics(self, logits, labels, losses, log_weights) -> dict:
        return {"loss_sum": math.fsum(losses)}

    def combine(self, sources: Sequence[dict], targets: Sequence[dict]) -> float:
        return -_total(sources, "loss_sum", "source_loss") / _rows(sources, "n_validation", "source_loss")


@SCORES.register("entropy")
class Entropy(Score):
    """Minus the mean prediction entropy on the target's unlabeled inputs (Morerio et al., ICLR 2018): each target
    sends sum H(p), H(p) = -sum_k p_k log p_k."""

    paper = (
        "Morerio, Cavazza & Murino, Minimal-Entropy Correlation Alignment for Unsupervised Deep Domain Adaptation, "
        "ICLR 2018"
    )
    description = "minus the mean prediction entropy on the target's unlabeled inputs"
    cheap = True

    def target_statistics(self, logits, log_probabilities) -> dict:
        return {"entropy_sum": math.fsum(-np.sum(np.exp(log_probabilities) * log_probabilities, axis=1))}

    def combine(self, sources: Sequence[dict], targets: Sequence[dict]) -> float:
        return -_total(targets, "entropy_sum", "entropy") / _rows(targets, "n_target", "entropy")


@SCORES.register("snd")
class SoftNeighborhoodDensity(Score):
    """Soft neighborhood density (Saito et al., ICCV 2021): each target client's whole
    :func:`soft_neighborhood_density`, combined as the n-weighted mean."""

    paper = (
        "Saito, Kim, Teterwak, Sclaroff, Darrell & Saenko, Tune it the Right Way: Unsupervised Validation of "
        "Domain Adaptation via Soft Neighborhood Density, ICCV 2021"
    )
    description = (
        "soft neighborhood density of the target's softmax outputs (temperature 0.05); on request: its cost grows "
        "with the square of the target client's rows"
    )
    cheap = False  # its similarity matrix grows with the square of the target's rows (digits: a minute)

    def target_statistics(self, logits, log_probabilities) -> dict:
        return {"snd": soft_neighborhood_density(np.exp(log_probabilities)) if len(logits) else 0.0}

    def combine(self, sources: Sequence[dict], targets: Sequence[dict]) -> float:
        rows = _values(targets, "n_target", "snd")
        values = _values(targets, "snd", "snd")
        return math.fsum(n * value for n, value in zip(rows, values)) / _rows(targets, "n_target", "snd")


@functools.cache
def _warn_constant_mano() -> None:
    """Logged once per process (the score is evaluated every round)."""
    logger.warning(
        "mano on 2 classes with the Taylor normalization carries no information: each row minus its minimum is "
        "(0, 1) after normalizing, so the score is 2 ** -0.25 for every model; compare by another score"
    )


@SCORES.register("mano")
class MaNo(Score):
    """MaNo (Xie et al., NeurIPS 2024, Eqs. 2 and 6): (sum Q^p / (n K))^(1/p), Q the softmax when the pooled
    criterion Phi > 5 and the Taylor normalization otherwise; each target sends :func:`mano_power_sums`."""

    paper = (
        "Xie, Odonnat, Feofanov, Deng, Zhang & An, MaNo: Exploiting Matrix Norm for Unsupervised Accuracy "
        "Estimation Under Distribution Shifts, NeurIPS 2024"
    )
    description = "scaled L4 matrix norm of the target's normalized logits (softmax or Taylor, by a criterion)"
    cheap = True

    def target_statistics(self, logits, log_probabilities) -> dict:
        return mano_power_sums(logits)

    def combine(self, sources: Sequence[dict], targets: Sequence[dict]) -> float:
        rows = _rows(targets, "n_target", "mano")
        classes = set(_values(targets, "n_classes", "mano"))
        if len(classes) != 1:
            raise ValueError(f"mano: the target clients' logits have different class counts {sorted(classes)}")
        entries = rows * classes.pop()
        criterion = _total(targets, "mano_neg_log_softmax_sum", "mano") / entries
        normalization = "softmax" if criterion > MANO_THRESHOLD else "taylor"
        logger.debug(
            "MaNo: criterion Phi = %.4g against %g: %s normalization", criterion, MANO_THRESHOLD, normalization
        )
        if entries == 2 * rows and normalization == "taylor":
            _warn_constant_mano()
        power_sum = _total(targets, f"mano_{normalization}_power_sum", "mano")
        return (power_sum / entries) ** (1.0 / MANO_NORM_ORDER)


@SCORES.register("iwv")
class ImportanceWeightedValidation(Score):
    """IWV (Sugiyama et al., JMLR 2007), self-normalized as skada's ImportanceWeightedScorer: -sum w l / sum w (the
    common scale cancels)."""

    paper = (
        "Sugiyama, Krauledat & Mueller, Covariate Shift Adaptation by Importance Weighted Cross Validation, JMLR 2007"
    )
    description = "minus the self-normalized importance-weighted loss on the sources' validation parts, sum w l / sum w"
    needs_validation = True
    needs_density = True

    def source_statistics(self, logits, labels, losses, log_weights) -> dict:
        return _weighted_loss_sums(losses, log_weights, with_dev=False)

    def combine(self, sources: Sequence[dict], targets: Sequence[dict]) -> float:
        _, factors = _common_scale(sources, "iwv")
        return -_scaled_total(sources, "weighted_loss_sum", "iwv", factors) / _scaled_total(
            sources, "weight_sum", "iwv", factors
        )


@SCORES.register("dev")
class DeepEmbeddedValidation(Score):
    """DEV (You et al., ICML 2019, Algorithm 1): -(mean L + eta mean W - eta), eta = -Cov(L, W) / Var(W), L = w l,
    W = w, from the pooled sums (the ddof cancels; eta = 0 when Var(W) is zero up to :data:`DEV_ZERO_VARIANCE`, as
    skada sets it for an exact zero). The sums are on the common scale exp(-M) (:func:`_common_scale`): eta does not
    depend on it, the means are multiplied back by exp(M); a product that overflows is a NumericalError naming the
    ridge."""

    paper = "You, Wang, Long & Wang, Towards Accurate Model Selection in Deep Unsupervised Domain Adaptation, ICML 2019"
    description = "minus the deep-embedded-validation risk (importance weights with a control variate)"
    needs_validation = True
    needs_density = True

    def source_statistics(self, logits, labels, losses, log_weights) -> dict:
        return _weighted_loss_sums(losses, log_weights, with_dev=True)

    def combine(self, sources: Sequence[dict], targets: Sequence[dict]) -> float:
        rows = _rows(sources, "n_validation", "dev")
        top, factors = _common_scale(sources, "dev")
        weight = _scaled_total(sources, "weight_sum", "dev", factors)
        loss = _scaled_total(sources, "weighted_loss_sum", "dev", factors)
        weight_sq = _scaled_total(sources, "weight_sq_sum", "dev", factors, power=2)
        centred_weight_sq = weight_sq - weight * weight / rows
        centred_cross = (
            _scaled_total(sources, "weighted_loss_weight_sum", "dev", factors, power=2) - loss * weight / rows
        )
        eta = 0.0 if centred_weight_sq <= DEV_ZERO_VARIANCE * weight_sq else -centred_cross / centred_weight_sq
        try:
            scale = math.exp(top)
        except OverflowError:
            scale = math.inf
        risk = (loss / rows + eta * weight / rows) * scale - eta
        if not math.isfinite(risk):
            raise NumericalError(
                "the DEV risk of the importance weights w(x) = exp(log w(x))",
                f"log w up to {top:.4g}",
                "the sources' and targets' features are nearly separable: fit the density ratio with a larger ridge",
            )
        return -risk


def combine_statistics(
    scores: Sequence[str], source_stats: Sequence[dict[str, float]], target_stats: Sequence[dict[str, float]]
) -> dict[str, float]:
    """``{"score_<name>": value}`` for each of ``scores`` (higher is better), from the clients' statistics.

    source_accuracy = sum correct / sum n; source_loss = -sum l / sum n; entropy = -sum H / sum n_target;
    snd = the n-weighted mean of the target clients' SND; mano = (sum Q^p / (n K))^(1/p), Q the softmax when the
    pooled Phi > 5 and the Taylor normalization otherwise (Xie et al., NeurIPS 2024, Eqs. 2 and 6); iwv = -sum w l /
    sum w (Sugiyama et al., JMLR 2007, self-normalized as skada's ImportanceWeightedScorer); dev = -(mean L +
    eta mean W - eta), eta = -Cov(L, W) / Var(W), L = w l, W = w (You et al., ICML 2019, Algorithm 1; eta = 0 when
    Var(W) is zero up to :data:`DEV_ZERO_VARIANCE`, as skada sets it for an exact zero). A missing statistic or no
    rows is a ValueError.
    """
    sources, targets = list(source_stats), list(target_stats)
    return {score.column(): score.combine(sources, targets) for score in checked_scores(scores)}
