"""Dynamic attention from gap-statistic gains (FADA: Peng, Huang, Zhu & Saenko, ICLR 2020, Sec. 3.1, Eq. 1-2).

The target scores each source's model delta Delta_i by how much better k-means clusters its features
with w_t + Delta_i than with w_t; the attention is the softmax of those gains (temperature 1 in the paper),
and the target moves to w_t + sum_i a_i Delta_i (:func:`apply_deltas`: the weights multiply the sources'
updates, as Alg. 1 weighs their gradients). Three forms of the gain (``form``):

* ``share`` (FADA's default): the paper's dispersion I (below) of the features scaled to unit total
  scatter, I / sum_i ||x_i - mean||^2 (in [0, 1]), gain_i = share(w_t) - share(w_t + Delta_i). A
  rescaling of one model's features leaves its share unchanged, so the gains stay in [-1, 1] and the
  softmax cannot turn one-hot on feature scale alone.
* ``dispersion``: the within-cluster dispersion I = sum_r D_r / (2 n_r) of k-means on the target
  features (Sec. 3.1; D_r the sum of pairwise squared distances in cluster r, so I is the k-means
  inertia), gain_i = (I(w_t) - I(w_t + Delta_i)) / I(w_t), the relative drop. Free of the scale of w_t's
  features but not of a delta's: features scaled by c give gain 1 - c^2, so a delta that enlarges the
  features loses whatever their clustering (``docs/fada.md``).
* ``tibshirani``: Gap(w_t + Delta_i) - Gap(w_t), Gap the gap statistic (Tibshirani, Walther & Hastie,
  J. R. Statist. Soc. B 2001), log-scaled and normalized by uniform reference sets (below).

Cost of ``tibshirani``, with FADA's settings: ``gap_samples`` target inputs (eval mode), k = ``gap_clusters`` (0: the
number of classes), ``gap_references`` uniform reference sets drawn over the box aligned with the
features' principal components (Tibshirani's method (b)), the same uniform draws for "before" and
every "after" (common random numbers, so the gains do not carry reference noise), scikit-learn KMeans
with one k-means++ initialization, a random_state derived from the seed, and one thread (identical on
every backend): (sources + 1) x (gap_references + 1) k-means fits per round on the target.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fedsim.seeding import numpy_rng

Weights = Mapping[str, np.ndarray]
GAIN_FORMS = ("dispersion", "share", "tibshirani")
DELTA = "delta:"  # the prefix of a model delta among a reply's tensors


def subset_rows(pool: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """``samples`` rows of ``pool`` (all when fewer), drawn by ``rng`` without replacement, in pool order."""
    return pool[np.sort(rng.choice(len(pool), size=min(samples, len(pool)), replace=False))]


def kmeans_inertia(points: np.ndarray, k: int, seed: int) -> float:
    """W_k = sum_r D_r / (2 n_r), the k-means within-cluster sum of squares (Tibshirani et al. 2001, Eq. 2;
    FADA's dispersion I), one k-means++ start with a seeded random_state."""
    from sklearn.cluster import KMeans

    k = max(1, min(int(k), len(points)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer distinct points than clusters: inertia 0
        return float(KMeans(n_clusters=k, n_init=1, max_iter=100, random_state=seed % (1 << 31)).fit(points).inertia_)


def kmeans_log_inertia(points: np.ndarray, k: int, seed: int) -> float:
    """log W_k, floored at log 1e-12."""
    return float(np.log(max(kmeans_inertia(points, k, seed), 1e-12)))


def dispersion(features: np.ndarray, k: int, seed: int) -> float:
    """FADA's I = sum_r D_r / (2 n_r) of k-means with k clusters on ``features`` (one thread: the same sums
    everywhere)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return kmeans_inertia(np.asarray(features, dtype=np.float64), k, seed)


def dispersion_share(features: np.ndarray, k: int, seed: int) -> float:
    """I / the total scatter sum_i ||x_i - mean||^2 (0 when the features do not vary)."""
    points = np.asarray(features, dtype=np.float64)
    total = float(((points - points.mean(0)) ** 2).sum())
    return dispersion(points, k, seed) / total if total > 0 else 0.0


def dispersion_gain(before: float, after: float) -> float:
    """The relative drop (I_before - I_after) / I_before (0 when I_before is 0)."""
    return (before - after) / before if before > 0 else 0.0


def gap_statistic(features: np.ndarray, k: int, uniform: np.ndarray, seed: int) -> float:
    """Gap_n(k) = mean_b log W*_kb - log W_k (Tibshirani et al. 2001, Eq. 3).

    Reference sets by their method (b): uniform over the box aligned with the
    principal components of the centered features (X = U D V^T, ranges of X V,
    back-transformed by V^T). ``uniform`` holds B draws U[0, 1) of shape
    (B, n, d), scaled here to that box. Larger = the features cluster better
    than uniform noise over the same box. Gap is unchanged by a rescaling of
    the features; they are divided by their root-mean-square first, so that
    the floor of log W_k is relative to their scale and Gap stays scale-free
    for clusters that collapse to points.
    """
    from threadpoolctl import threadpool_limits

    points = np.asarray(features, dtype=np.float64)
    if points.ndim != 2 or uniform.shape[1:] != points.shape:
        raise ValueError(
            f"gap_statistic needs n x d features and B x n x d draws, got {points.shape} and {uniform.shape}"
        )
    with threadpool_limits(1):  # one thread: the same sums on every backend
        centered = points - points.mean(0)
        rms = float(np.sqrt((centered**2).mean())) if centered.size else 0.0
        centered = centered / rms if rms > 0 else centered
        _, _, vt = np.linalg.svd(centered, full_matrices=False)
        rotated = centered @ vt.T
        low, high = rotated.min(0), rotated.max(0)
        reference = [kmeans_log_inertia((low + u[:, : len(low)] * (high - low)) @ vt, k, seed) for u in uniform]
        return float(np.mean(reference) - kmeans_log_inertia(centered, k, seed))


def softmax(values: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(values, dtype=np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def apply_deltas(current: Weights, deltas: Sequence[Weights], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """current + sum_i w_i delta_i per named tensor (in float64; integer buffers rounded)."""
    out = {}
    for name, value in current.items():
        total = value.astype(np.float64) + sum(float(w) * d[name].astype(np.float64) for w, d in zip(weights, deltas))
        out[name] = (np.rint(total) if np.issubdtype(value.dtype, np.integer) else total).astype(value.dtype)
    return out


def delta_tensors(start: Weights, current: Weights) -> dict[str, np.ndarray]:
    """A source's reply tensors Delta_i = w_i - w_t, each named ``DELTA + <tensor name>``."""
    return {DELTA + name: value - start[name] for name, value in current.items()}


def gather_deltas(replies: Mapping[int, Any]) -> dict[str, np.ndarray]:
    """The deltas of every reply as one payload, each named ``<client id>:<tensor name>``."""
    return {
        f"{cid}:{name[len(DELTA) :]}": t
        for cid, reply in replies.items()
        for name, t in reply.tensors.items()
        if name.startswith(DELTA)
    }


def split_deltas(tensors: Weights, sources: Sequence[int], names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """The payload of :func:`gather_deltas` back as one {tensor name: Delta_i} per source, in ``sources``' order."""
    return [{name: np.asarray(tensors[f"{cid}:{name}"]) for name in names} for cid in sources]


def dynamic_attention(
    encode: Callable[[Weights, np.ndarray], np.ndarray],
    current: Weights,
    deltas: Sequence[Weights],
    pool: np.ndarray,
    samples: int,
    k: int,
    references: int,
    temperature: float,
    seed: int,
    form: str = "dispersion",
) -> tuple[np.ndarray, float, list[float]]:
    """(attention a_i, the score of ``current``, gains); ``encode(weights, inputs)`` gives the features of a
    model on inputs. ``form="dispersion"``: score I(current), gains the relative drops of I (the paper);
    ``"share"``: score I(current) / its total scatter, gains its drops; ``"tibshirani"``: score Gap(current), gains
    Gap(current + delta_i) - Gap(current).

    Every score uses the same ``samples`` seeded rows of ``pool`` and the same k-means seed; the gaps also
    the same ``references`` uniform draws (common random numbers, so the gains carry no reference noise).
    """
    if form not in GAIN_FORMS:
        raise ValueError(f"the attention gain is one of {GAIN_FORMS}, got {form!r}")
    rng = numpy_rng(seed)
    inputs = subset_rows(pool, samples, rng)
    before_features = encode(current, inputs)
    if form == "dispersion":
        before = dispersion(before_features, k, seed)
        gains = [
            dispersion_gain(before, dispersion(encode(apply_deltas(current, [d], [1.0]), inputs), k, seed))
            for d in deltas
        ]
        return softmax(np.asarray(gains), temperature), before, gains
    if form == "share":
        before = dispersion_share(before_features, k, seed)
        gains = [before - dispersion_share(encode(apply_deltas(current, [d], [1.0]), inputs), k, seed) for d in deltas]
        return softmax(np.asarray(gains), temperature), before, gains
    uniform = rng.random((references, *before_features.shape))
    before = gap_statistic(before_features, k, uniform, seed)
    gains = [
        gap_statistic(encode(apply_deltas(current, [delta], [1.0]), inputs), k, uniform, seed) - before
        for delta in deltas
    ]
    return softmax(np.asarray(gains), temperature), before, gains


def weigh_sources(
    encode: Callable[[Weights, np.ndarray], np.ndarray],
    current: Weights,
    deltas: Sequence[Weights],
    pool: np.ndarray,
    sources: Sequence[int],
    seed: int,
    gap: tuple[int, int, int, float, str] | None,
) -> tuple[np.ndarray, dict[str, float]]:
    """(a_i, metrics) of the sources' ``deltas``: with ``gap`` = (samples, k, references, temperature, form),
    :func:`dynamic_attention` and the metrics ``gap_gain:<source>`` and ``gap_statistic``; with ``gap`` None, the
    uniform weights 1/n. Both add ``attention:<source>``."""
    weights, metrics = np.full(len(sources), 1.0 / len(sources)), {}
    if gap is not None:
        samples, k, references, temperature, form = gap
        weights, before, gains = dynamic_attention(
            encode, current, deltas, pool, samples, k, references, temperature, seed, form
        )
        metrics.update({f"gap_gain:{cid}": gain for cid, gain in zip(sources, gains)}, gap_statistic=before)
    metrics.update({f"attention:{cid}": float(w) for cid, w in zip(sources, weights)})
    return weights, metrics
