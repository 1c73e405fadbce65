"""FADA's dynamic attention (Peng et al., ICLR 2020, Sec. 3.1) does not depend on the scale of the target features."""

import numpy as np
import pytest

from fedsim.methods.fada.attention import dynamic_attention, gap_statistic

CLASSES, PER_CLASS = 3, 30
ROWS = CLASSES * PER_CLASS
_rng = np.random.default_rng(0)
# each input: its class centre (3 dims) and a spread (3 dims); the features are scale * (centre + s * spread)
POOL = np.concatenate([5.0 * np.eye(CLASSES)[np.arange(ROWS) % CLASSES], 3.0 * _rng.normal(size=(ROWS, CLASSES))], 1)
CURRENT = {"s": np.array(1.0)}  # the target model: loose, overlapping clusters


def encoder(scale):
    """The features of a model {"s": s} at the constant ``scale``."""
    return lambda weights, x: scale * (x[:, :CLASSES] + float(weights["s"]) * x[:, CLASSES:])


def attention(form, scale, tighten, seed=4):
    """(weights, gains) of two sources: one whose delta shrinks the spread by ``tighten``, one whose delta is 0."""
    deltas = [{"s": np.array(-tighten)}, {"s": np.array(0.0)}]
    weights, _, gains = dynamic_attention(encoder(scale), CURRENT, deltas, POOL, ROWS, CLASSES, 3, 1.0, seed, form)
    return weights, np.asarray(gains)


@pytest.mark.parametrize("form", ["share", "tibshirani"])
@pytest.mark.parametrize("tighten", [0.9, 1.0])  # the clusters 10x tighter, or collapsed to their centres
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_the_source_that_tightens_the_clusters_gets_more_attention_at_any_scale(form, tighten, scale):
    weights, gains = attention(form, scale, tighten)
    assert gains[0] > 0 and abs(gains[1]) < 1e-9  # a zero delta changes nothing
    assert weights[0] > weights[1] and np.isclose(weights.sum(), 1.0)
    reference_weights, reference_gains = attention(form, 1.0, tighten)
    np.testing.assert_allclose(gains, reference_gains, rtol=1e-6, atol=1e-9)  # the same numbers at every scale
    np.testing.assert_allclose(weights, reference_weights, rtol=1e-6, atol=1e-12)


def test_gap_statistic_of_collapsed_clusters_is_scale_free():
    """Clusters that collapse to points have W_k = 0: its floor is taken relative to the features' scale."""
    points = 5.0 * np.eye(CLASSES)[np.arange(ROWS) % CLASSES]
    uniform = np.random.default_rng(1).random((3, ROWS, CLASSES))
    gaps = [gap_statistic(scale * points, CLASSES, uniform, seed=2) for scale in (1e-3, 1.0, 1e3)]
    np.testing.assert_allclose(gaps, gaps[1], rtol=1e-9)
    assert gaps[1] > 10  # far more clustered than uniform noise over the same box
