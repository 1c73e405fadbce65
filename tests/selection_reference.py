"""Centralized references of the selection scores, on pooled arrays, written from the papers' definitions.

The tests' reference: the per-client statistics of :mod:`fedsim.selection.statistics` and the moments of
:mod:`fedsim.selection.density` must give these values (tests/test_selection_scores.py). Nothing here calls them:
each function forms its whole matrix at once, as the definition reads, in plain numpy (float64).
"""

from __future__ import annotations

import numpy as np


def _probabilities(logits) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _log_probabilities(logits) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    top = z.max(axis=1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(axis=1, keepdims=True))


def _cross_entropies(logits, labels) -> np.ndarray:
    labels = np.asarray(labels)
    return -_log_probabilities(logits)[np.arange(len(labels)), labels]


def source_accuracy_score(logits, labels) -> float:
    """The fraction of rows whose most probable class is the label (Gulrajani & Lopez-Paz, ICLR 2021)."""
    return float(np.mean(np.argmax(_probabilities(logits), axis=1) == np.asarray(labels)))


def source_loss_score(logits, labels) -> float:
    """Minus the mean cross-entropy -log softmax(z)_y."""
    return float(-np.mean(_cross_entropies(logits, labels)))


def entropy_score(logits) -> float:
    """Minus the mean over rows of H(p) = -sum_k p_k log p_k (Morerio et al., ICLR 2018)."""
    p = _probabilities(logits)
    return float(-np.mean(-np.sum(p * _log_probabilities(logits), axis=1)))


def snd_score(logits, temperature: float = 0.05) -> float:
    """Soft neighborhood density (Saito et al., ICCV 2021) with the whole n x n similarity matrix.

    p = softmax(z), L2-normalized by rows; S = p p^T / tau with its diagonal set to -1/tau (the authors' code);
    the mean over rows of the entropy of softmax(S_i) (Eq. 2).
    """
    p = _probabilities(logits)
    p = p / np.sqrt(np.sum(p**2, axis=1, keepdims=True))
    similarity = p @ p.T / temperature
    np.fill_diagonal(similarity, -1.0 / temperature)
    return float(np.mean(-np.sum(_probabilities(similarity) * _log_probabilities(similarity), axis=1)))


def mano_score(logits, norm_order: int = 4, threshold: float = 5.0) -> float:
    """MaNo (Xie et al., NeurIPS 2024): (mean_ik Q_ik^p)^(1/p), Eq. 2, with Q normalized by Eq. 6.

    Phi = mean_ik -log softmax(z)_ik; Q = softmax(z) when Phi > threshold, else the order-2 Taylor expansion
    1 + z + z^2/2 shifted to a zero row minimum and divided by its row sum (the authors' code).
    """
    z = np.asarray(logits, dtype=np.float64)
    if -np.mean(_log_probabilities(z)) > threshold:
        q = _probabilities(z)
    else:
        taylor = 1.0 + z + z**2 / 2.0
        taylor = taylor - taylor.min(axis=1, keepdims=True)
        sums = taylor.sum(axis=1, keepdims=True)
        q = np.where(sums > 0, taylor / np.where(sums > 0, sums, 1.0), 0.0)
    return float(np.mean(q**norm_order) ** (1.0 / norm_order))


def iwv_score(logits, labels, log_weights) -> float:
    """Minus the self-normalized importance-weighted loss sum_i w(x_i) l(x_i) / sum_i w(x_i) (Sugiyama et al., JMLR
    2007; normalized by the weights' sum as skada's ImportanceWeightedScorer, so that the scale of an estimated
    density ratio, which differs from one model's features to another's, does not decide a comparison)."""
    weights = np.exp(np.asarray(log_weights, dtype=np.float64))
    return float(-np.sum(weights * _cross_entropies(logits, labels)) / np.sum(weights))


def dev_score(logits, labels, log_weights) -> float:
    """Minus the DEV risk (You et al., ICML 2019, Algorithm 1), as the authors' get_dev_risk computes it.

    L = w l, W = w; eta = -Cov(L, W) / Var(W) (sample estimates; eta = 0 when Var(W) = 0, as skada);
    risk = mean(L) + eta mean(W) - eta.
    """
    weights = np.exp(np.asarray(log_weights, dtype=np.float64))
    weighted_loss = weights * _cross_entropies(logits, labels)
    covariance = np.cov(np.stack([weighted_loss, weights]))[0, 1]
    variance = np.var(weights, ddof=1)
    eta = -covariance / variance if variance > 0 else 0.0
    return float(-(np.mean(weighted_loss) + eta * np.mean(weights) - eta))


def _gaussian_log_density(x: np.ndarray, mean: np.ndarray, covariance: np.ndarray) -> float:
    offset = x - mean
    _, log_det = np.linalg.slogdet(covariance)
    quadratic = offset @ np.linalg.solve(covariance, offset)
    return float(-0.5 * (len(x) * np.log(2 * np.pi) + log_det + quadratic))


def density_ratio_reference(source_features, target_features, ridge: float) -> tuple[np.ndarray, float]:
    """(beta, c) with beta . x + c = log N(x; mu_T, S) - log N(x; mu_S, S), read off the definition.

    S = the pooled within-domain covariance ((n_S - 1) Cov(X_S) + (n_T - 1) Cov(X_T)) / (n_S + n_T - 2) plus
    ridge times its mean variance on the diagonal; log w is affine in x, so c = log w(0) and beta_j = log w(e_j) - c.
    """
    xs = np.asarray(source_features, dtype=np.float64)
    xt = np.asarray(target_features, dtype=np.float64)
    d = xs.shape[1]
    pooled = (len(xs) - 1) * np.atleast_2d(np.cov(xs, rowvar=False)) + (len(xt) - 1) * np.atleast_2d(
        np.cov(xt, rowvar=False)
    )
    pooled = pooled / (len(xs) + len(xt) - 2)
    mean_variance = np.mean(np.diag(pooled))
    shared = pooled + ridge * (mean_variance if mean_variance > 0 else 1.0) * np.eye(d)

    def log_ratio(x: np.ndarray) -> float:
        return _gaussian_log_density(x, xt.mean(axis=0), shared) - _gaussian_log_density(x, xs.mean(axis=0), shared)

    intercept = log_ratio(np.zeros(d))
    beta = np.array([log_ratio(np.eye(d)[j]) - intercept for j in range(d)])
    return beta, intercept
