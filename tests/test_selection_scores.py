"""The model-selection scores of fedsim.selection: per-client statistics combined on the server equal the
centralized definitions (tests/selection_reference.py), which equal skada 0.4.0's scorers where skada has the score.

Compared with skada: PredictionEntropyScorer (skada's "mean" reduction averages p log p over all n*K entries, so its
value times K is the mean per-row entropy), SoftNeighborhoodDensity, and DeepEmbeddedValidation with its domain
classifier replaced by one whose odds give our density ratio exactly (DEV's estimator is then the same) and its loss
given as an [n, 1] column: skada 0.4.0's default loss returns an [n] array, which broadcasts against its [n, 1]
weights into an n x n "weighted error" matrix. skada 0.4.0 passes ``force_all_finite`` to scikit-learn's check_array,
which scikit-learn 1.8 renamed; the fixture ``skada_input_checks`` translates that one keyword.
Not compared: skada 0.4.0 has no MaNoScorer (its development version's ``_get_criterion`` shifts the logits in place
by their row maximum before the Taylor normalization, which the authors' code does not, so the reference follows the
authors' code); ImportanceWeightedScorer fits kernel density estimates, normalizes the weights to sum 1 and scores
with the estimator's own ``score`` (accuracy by default), a self-normalized estimate sum w l / sum w where iwv is
Sugiyama et al.'s (1/n) sum w l: the two agree only when the weights average exactly 1.
"""

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import selection_reference as reference
from scipy.special import expit, log_softmax, softmax

from fedsim.errors import NumericalError, UserError
from fedsim.selection import (
    SCORES,
    DensityRatio,
    combine_statistics,
    fit_density_ratio,
    moment_statistics,
    resolve_scores,
    source_statistics,
    statistics,
    target_statistics,
)

try:
    import skada.metrics as skada_metrics
    import skada.utils as skada_utils
    from sklearn.base import BaseEstimator
    from sklearn.utils import check_array
except ImportError:
    skada_metrics = None
    BaseEstimator = object

needs_skada = pytest.mark.skipif(skada_metrics is None, reason="skada is not installed (the comparison needs 0.4.0)")

K = 4
TOL = 1e-10
SOURCE_SIZES = (37, 52, 41)
TARGET_SIZES = (60, 45)


def _split(array, sizes):
    return np.split(array, np.cumsum(sizes)[:-1])


def _labeled_logits(rng, n, scale):
    labels = rng.integers(0, K, n)
    logits = rng.normal(size=(n, K)) * scale
    logits[np.arange(n), labels] += 1.5 * scale
    return logits, labels


@pytest.fixture
def pooled():
    """Sources' validation rows and the targets' rows, pooled; features shifted between the two sides."""
    rng = np.random.default_rng(7)
    source_logits, source_labels = _labeled_logits(rng, sum(SOURCE_SIZES), 2.0)
    target_logits, _ = _labeled_logits(rng, sum(TARGET_SIZES), 1.5)
    mixing = rng.normal(size=(5, 5))
    source_features = rng.normal(size=(sum(SOURCE_SIZES), 5)) @ mixing
    target_features = rng.normal(size=(sum(TARGET_SIZES), 5)) @ mixing + np.array([0.8, -0.4, 0.3, 0.0, 0.5])
    return SimpleNamespace(
        source_logits=source_logits,
        source_labels=source_labels,
        source_features=source_features,
        target_logits=target_logits,
        target_features=target_features,
    )


def _source_stats(data, scores, ratio=None):
    parts = zip(
        _split(data.source_logits, SOURCE_SIZES),
        _split(data.source_labels, SOURCE_SIZES),
        _split(data.source_features, SOURCE_SIZES),
    )
    return [
        source_statistics(logits, labels, scores, None if ratio is None else ratio.log_weights(features))
        for logits, labels, features in parts
    ]


def _federated(scores, source_stats, target_logits, target_sizes):
    targets = [target_statistics(logits, scores) for logits in _split(target_logits, target_sizes)]
    return combine_statistics(scores, source_stats, targets)


def _federated_ratio(data, ridge=1e-3):
    return fit_density_ratio(
        [moment_statistics(x) for x in _split(data.source_features, SOURCE_SIZES)],
        [moment_statistics(x) for x in _split(data.target_features, TARGET_SIZES)],
        ridge,
    )


# (a) federated statistics equal the centralized reference


def test_source_scores_pooled_over_three_sources_equal_the_reference(pooled):
    scores = ("source_accuracy", "source_loss")
    combined = _federated(scores, _source_stats(pooled, scores), pooled.target_logits, TARGET_SIZES)
    logits, labels = pooled.source_logits, pooled.source_labels
    assert combined["score_source_accuracy"] == pytest.approx(reference.source_accuracy_score(logits, labels), abs=TOL)
    assert combined["score_source_loss"] == pytest.approx(reference.source_loss_score(logits, labels), abs=TOL)
    assert 0.3 < combined["score_source_accuracy"] < 1.0


@pytest.mark.parametrize("scale", [0.5, 8.0], ids=["taylor", "softmax"])
def test_target_scores_on_one_target_client_equal_the_reference(pooled, scale):
    logits = pooled.target_logits * scale
    phi = -np.mean(log_softmax(logits, axis=1))
    assert (phi > statistics.MANO_THRESHOLD) == (scale > 1), "the data should exercise the named MaNo branch"
    combined = _federated(("entropy", "snd", "mano"), _source_stats(pooled, ()), logits, (len(logits),))
    assert combined["score_entropy"] == pytest.approx(reference.entropy_score(logits), abs=TOL)
    assert combined["score_snd"] == pytest.approx(reference.snd_score(logits), abs=TOL)
    assert combined["score_mano"] == pytest.approx(reference.mano_score(logits), abs=TOL)


def test_snd_formed_in_blocks_equals_the_whole_matrix(pooled, monkeypatch):
    monkeypatch.setattr(statistics, "SND_BLOCK_ROWS", 7)
    stats = target_statistics(pooled.target_logits, ("snd",))
    assert stats["snd"] == pytest.approx(reference.snd_score(pooled.target_logits), abs=TOL)


@pytest.mark.parametrize("scale", [0.5, 8.0], ids=["taylor", "softmax"])
def test_entropy_and_mano_over_two_target_clients_equal_the_pooled_reference(pooled, scale):
    logits = pooled.target_logits * scale
    combined = _federated(("entropy", "mano"), [], logits, TARGET_SIZES)
    assert combined["score_entropy"] == pytest.approx(reference.entropy_score(logits), abs=TOL)
    assert combined["score_mano"] == pytest.approx(reference.mano_score(logits), abs=TOL)


def test_mano_chooses_its_normalization_on_the_pooled_criterion_not_each_clients(pooled):
    """One confident client (Phi > 5), one uncertain (Phi < 5): the pooled Phi decides for both."""
    confident, uncertain = _split(pooled.target_logits, TARGET_SIZES)
    logits = np.concatenate([confident * 12.0, uncertain * 0.5])
    phis = [-np.mean(log_softmax(part, axis=1)) for part in _split(logits, TARGET_SIZES)]
    assert phis[0] > statistics.MANO_THRESHOLD > phis[1]
    combined = _federated(("mano",), [], logits, TARGET_SIZES)
    assert combined["score_mano"] == pytest.approx(reference.mano_score(logits), abs=TOL)
    per_client = [reference.mano_score(part) for part in _split(logits, TARGET_SIZES)]
    assert abs(combined["score_mano"] - np.average(per_client, weights=TARGET_SIZES)) > 1e-3


def test_snd_over_two_target_clients_is_the_n_weighted_mean_of_their_values(pooled):
    combined = _federated(("snd",), [], pooled.target_logits, TARGET_SIZES)
    values = [reference.snd_score(part) for part in _split(pooled.target_logits, TARGET_SIZES)]
    assert combined["score_snd"] == pytest.approx(np.average(values, weights=TARGET_SIZES), abs=TOL)


def test_density_ratio_from_client_moments_equals_the_reference(pooled):
    ratio = _federated_ratio(pooled, ridge=1e-3)
    beta, intercept = reference.density_ratio_reference(pooled.source_features, pooled.target_features, 1e-3)
    np.testing.assert_allclose(ratio.beta, beta, rtol=TOL, atol=TOL)
    assert ratio.intercept == pytest.approx(intercept, abs=TOL)
    assert np.linalg.norm(beta) > 0.1, "the two sides differ, so the ratio is not flat"


def test_iwv_and_dev_over_three_sources_equal_the_reference(pooled):
    ratio = _federated_ratio(pooled)
    combined = _federated(("iwv", "dev"), _source_stats(pooled, ("iwv", "dev"), ratio), pooled.target_logits, (105,))
    beta, intercept = reference.density_ratio_reference(pooled.source_features, pooled.target_features, 1e-3)
    log_w = pooled.source_features @ beta + intercept
    logits, labels = pooled.source_logits, pooled.source_labels
    assert combined["score_iwv"] == pytest.approx(reference.iwv_score(logits, labels, log_w), abs=TOL)
    assert combined["score_dev"] == pytest.approx(reference.dev_score(logits, labels, log_w), abs=TOL)
    assert combined["score_iwv"] != pytest.approx(reference.source_loss_score(logits, labels), abs=1e-3)


# (b) the reference equals skada 0.4.0


class _FixedOutputs:
    """A trained model as skada sees a deep one: X's first column is a row index into fixed logits, the rest its
    features; it records the rows it was asked to predict."""

    def __init__(self, logits):
        self.logits = logits
        self.module_ = SimpleNamespace(layer_name="features")
        self.predicted_rows = []

    def _rows(self, X):
        rows = X[:, 0].astype(int)
        self.predicted_rows.append(rows)
        return rows

    def predict_proba(self, X, **params):
        return softmax(self.logits[self._rows(X)], axis=1)

    def predict_log_proba(self, X, **params):
        return log_softmax(self.logits[self._rows(X)], axis=1)

    def predict_features(self, X):
        return X[:, 1:]


class _FixedDomainOdds(BaseEstimator):
    """A domain classifier whose odds p(target | x) / p(source | x) are w(x) n_target / n_source, w = exp(beta.x + c):
    DEV's weights (n_train / n_target) p_target / p_source are then exactly w(x)."""

    def __init__(self, beta=None, intercept=0.0):
        self.beta = beta
        self.intercept = intercept

    def fit(self, X, y):
        self.log_prior_ = np.log(np.sum(y == 0) / np.sum(y == 1))
        return self

    def predict_proba(self, X):
        log_odds = X @ self.beta + self.intercept + self.log_prior_
        return np.column_stack([expit(log_odds), expit(-log_odds)])


@pytest.fixture
def skada_input_checks(monkeypatch):
    """skada 0.4.0's input check passes ``force_all_finite`` to sklearn's check_array, which scikit-learn 1.8
    renamed ``ensure_all_finite``: the name is translated there, and nothing else of skada is touched."""
    if "force_all_finite" in inspect.signature(check_array).parameters:
        return

    def translated(*args, force_all_finite=True, **kwargs):
        return check_array(*args, ensure_all_finite=force_all_finite, **kwargs)

    monkeypatch.setattr(skada_utils, "check_array", translated)


def _cross_entropy_column(labels, probabilities):
    """-log p_y as an [n, 1] column, the shape of DEV's weights (skada's default loss returns [n])."""
    return -np.log(probabilities[np.arange(len(labels)), labels.astype(int)])[:, None]


def _skada_inputs(data):
    n_source, n_target = len(data.source_logits), len(data.target_logits)
    features = np.concatenate([data.source_features, data.target_features])
    X = np.column_stack([np.arange(n_source + n_target), features])
    y = np.concatenate([data.source_labels, -np.ones(n_target, dtype=int)])
    domains = np.concatenate([np.ones(n_source, dtype=int), -2 * np.ones(n_target, dtype=int)])
    return X, y, domains, np.concatenate([data.source_logits, data.target_logits])


@needs_skada
def test_entropy_reference_is_skada_prediction_entropy_times_the_class_count(pooled, skada_input_checks):
    X, y, domains, logits = _skada_inputs(pooled)
    skada_value = skada_metrics.PredictionEntropyScorer()(_FixedOutputs(logits), X, y, sample_domain=domains)
    assert reference.entropy_score(pooled.target_logits) == pytest.approx(K * skada_value, abs=TOL)


@needs_skada
def test_snd_reference_is_skada_soft_neighborhood_density(pooled, skada_input_checks):
    X, y, domains, logits = _skada_inputs(pooled)
    skada_value = skada_metrics.SoftNeighborhoodDensity()(_FixedOutputs(logits), X, y, sample_domain=domains)
    assert reference.snd_score(pooled.target_logits) == pytest.approx(skada_value, abs=TOL)


@needs_skada
def test_dev_reference_is_skada_deep_embedded_validation_with_the_same_weights(pooled, skada_input_checks):
    X, y, domains, logits = _skada_inputs(pooled)
    beta, intercept = reference.density_ratio_reference(pooled.source_features, pooled.target_features, 1e-3)
    model = _FixedOutputs(logits)
    scorer = skada_metrics.DeepEmbeddedValidation(
        domain_classifier=_FixedDomainOdds(beta, intercept), loss_func=_cross_entropy_column, random_state=0
    )
    skada_value = scorer(model, X, y, sample_domain=domains)
    (rows,) = model.predicted_rows
    log_w = pooled.source_features[rows] @ beta + intercept
    ours = reference.dev_score(pooled.source_logits[rows], pooled.source_labels[rows], log_w)
    assert ours == pytest.approx(skada_value, abs=TOL)


# (c) values known by hand


def test_uniform_predictions_score_minus_log_k_and_confident_ones_zero_entropy():
    uniform = np.zeros((30, K))
    confident = 1000.0 * np.eye(K)[np.arange(30) % K]
    for logits, expected in ((uniform, -np.log(K)), (confident, 0.0)):
        combined = combine_statistics(("entropy",), [], [target_statistics(logits, ("entropy",))])
        assert combined["score_entropy"] == pytest.approx(expected, abs=1e-15)
        assert reference.entropy_score(logits) == pytest.approx(expected, abs=1e-15)


def test_mano_of_confident_one_hot_predictions_is_k_to_the_minus_one_quarter():
    confident = 1000.0 * np.eye(K)[np.arange(30) % K]
    combined = combine_statistics(("mano",), [], [target_statistics(confident, ("mano",))])
    assert combined["score_mano"] == pytest.approx(K**-0.25, abs=1e-15)


def test_mano_on_two_classes_is_constant_under_the_taylor_normalization(caplog):
    """Two classes and the criterion under its threshold (logits near each other): the Taylor normalization
    subtracts each row's minimum, so every row becomes (0, 1) and MaNo is 2 ** -0.25 whatever the model predicts;
    the run's log says so once, not at every evaluation."""
    statistics._warn_constant_mano.cache_clear()
    rng = np.random.default_rng(3)
    for logits in (
        rng.normal(size=(40, 2)),
        0.1 * rng.normal(size=(40, 2)),
        np.c_[np.zeros(40), rng.uniform(1, 2, 40)],
    ):
        with caplog.at_level("WARNING", logger="fedsim.selection.statistics"):
            combined = combine_statistics(("mano",), [], [target_statistics(logits, ("mano",))])
        assert combined["score_mano"] == pytest.approx(2**-0.25, abs=1e-12)
    assert caplog.text.count("mano on 2 classes") == 1 and "carries no information" in caplog.text


def test_dev_and_iwv_with_unit_weights_are_minus_the_mean_loss(pooled):
    logits, labels = pooled.source_logits, pooled.source_labels
    stats = source_statistics(logits, labels, ("source_loss", "iwv", "dev"), np.zeros(len(labels)))
    combined = combine_statistics(("source_loss", "iwv", "dev"), [stats], [])
    mean_loss = -np.mean(-log_softmax(logits, axis=1)[np.arange(len(labels)), labels])
    for name in ("source_loss", "iwv", "dev"):
        assert combined[f"score_{name}"] == pytest.approx(mean_loss, abs=TOL)
    assert reference.dev_score(logits, labels, np.zeros(len(labels))) == pytest.approx(mean_loss, abs=TOL)


def test_density_ratio_of_identical_moments_is_one_everywhere(pooled):
    moments = moment_statistics(pooled.source_features)
    ratio = fit_density_ratio([moments], [moments])
    np.testing.assert_array_equal(np.exp(ratio.log_weights(pooled.target_features)), 1.0)


def test_density_ratio_crosses_the_wire_as_arrays(pooled):
    ratio = _federated_ratio(pooled)
    again = DensityRatio.from_arrays(ratio.to_arrays())
    np.testing.assert_array_equal(again.log_weights(pooled.source_features), ratio.log_weights(pooled.source_features))
    with pytest.raises(ValueError, match="columns"):
        ratio.log_weights(pooled.source_features[:, :3])


@pytest.mark.parametrize("shift", [-900.0, 0.0, 900.0])
def test_weights_beyond_float64_on_either_side_keep_iwv_and_dev_exact(pooled, shift):
    """exp(log w) under- or overflows at |log w| > 709: each client scales its sums by its own largest weight and the
    server brings them to a common scale, so nearly separable domains still give the exact iwv, and DEV where its
    risk is a float64 number (it is not when the weights' mean overflows: a NumericalError naming the ridge)."""
    logits, labels = pooled.source_logits[:60], pooled.source_labels[:60]
    log_w = np.random.default_rng(3).normal(0.0, 2.0, 60)
    log_w[:20] += 5.0  # one client's weights far above the others'
    parts = [slice(0, 20), slice(20, 40), slice(40, 60)]
    stats = [source_statistics(logits[p], labels[p], ("iwv", "dev"), log_w[p] + shift) for p in parts]
    iwv = combine_statistics(("iwv",), stats, [])["score_iwv"]
    assert iwv == pytest.approx(reference.iwv_score(logits, labels, log_w), abs=TOL)  # scale-free
    # DEV at weights e^shift w: eta does not change, the means scale by e^shift
    w = np.exp(log_w)
    weighted = w * -log_softmax(logits, axis=1)[np.arange(len(labels)), labels]
    eta = -np.cov(weighted, w)[0, 1] / np.var(w, ddof=1)
    if shift > 0:
        with pytest.raises(NumericalError, match="larger ridge"):
            combine_statistics(("dev",), stats, [])
        return
    expected = -(np.exp(shift) * (weighted.mean() + eta * w.mean()) - eta)
    assert combine_statistics(("dev",), stats, [])["score_dev"] == pytest.approx(expected, rel=1e-9, abs=TOL)
    if shift == 0:
        assert expected == pytest.approx(reference.dev_score(logits, labels, log_w), abs=TOL)


# (d) resolving a request


def test_auto_asks_for_the_cheap_scores_whose_inputs_exist():
    assert resolve_scores("auto", has_validation=True) == ("source_accuracy", "source_loss", "entropy", "mano")
    assert resolve_scores("auto", has_validation=False) == ("entropy", "mano")  # snd, iwv, dev: on request
    assert resolve_scores("none", has_validation=True) == ()
    assert resolve_scores(" snd, entropy,snd", has_validation=False) == ("snd", "entropy")
    assert resolve_scores(["dev", "iwv"], has_validation=True) == ("dev", "iwv")


def test_an_unknown_score_lists_the_known_ones():
    with pytest.raises(UserError) as error:
        resolve_scores("entropy,accuracy", has_validation=True)
    assert "'accuracy'" in str(error.value) and all(name in str(error.value) for name in SCORES)


@pytest.mark.parametrize("name", ["source_accuracy", "iwv", "dev"])
def test_a_score_that_needs_validation_names_the_setting_that_gives_it(name):
    with pytest.raises(UserError, match="--set data.validation_fraction=0.2"):
        resolve_scores(["entropy", name], has_validation=False)


def test_auto_in_a_list_of_names_is_refused():
    with pytest.raises(UserError, match="stands alone"):
        resolve_scores("auto,iwv", has_validation=True)


# (e) the structural guard and the shape checks


def test_target_statistics_has_no_labels_parameter():
    assert list(inspect.signature(target_statistics).parameters) == ["logits", "scores"]


def test_source_statistics_rejects_mismatched_lengths(pooled):
    logits, labels = pooled.source_logits, pooled.source_labels
    with pytest.raises(ValueError, match="labels"):
        source_statistics(logits, labels[:-1], ("source_accuracy",))
    with pytest.raises(ValueError, match="log_weights"):
        source_statistics(logits, labels, ("iwv",), np.zeros(len(labels) + 1))
    with pytest.raises(ValueError, match="log_weights"):
        source_statistics(logits, labels, ("dev",))
    with pytest.raises(ValueError, match="labels must lie"):
        source_statistics(logits, np.full(len(labels), K), ("source_loss",))


def test_combining_without_a_statistic_or_without_rows_is_refused(pooled):
    stats = target_statistics(pooled.target_logits, ("entropy",))
    with pytest.raises(ValueError, match="missing from clients"):
        combine_statistics(("mano",), [], [stats])
    with pytest.raises(ValueError, match="no rows"):
        combine_statistics(("source_accuracy",), [], [stats])
