"""Model selection inside runs: the sources' validation parts (``data.validation_fraction``) and the scores every
evaluation reports (``run.scores``), checked against the centralized references on pooled arrays."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError


def _clients(overrides):
    config = load_config(None, overrides)
    federation = build_federation(config.data)
    return config, federation, {cid: load_client_data(config.data, federation, cid) for cid in federation.client_ids}


def _rows(x: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in np.ascontiguousarray(x)}


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_validation_part_is_stratified_disjoint_and_taken_from_the_training_rows(toy_overrides, partition):
    common = toy_overrides + ["data.clients_per_domain=2", f"data.partition={partition}", "data.dirichlet_alpha=5"]
    _, _, before = _clients(common)
    config, federation, after = _clients(common + ["data.validation_fraction=0.2"])
    for cid, data in after.items():
        info = federation.info(cid)
        if data.is_target:
            assert data.validation is None and info.num_validation == 0
            np.testing.assert_array_equal(data.train.x, before[cid].train.x)
            continue
        held, kept, everything = data.validation, data.train, before[cid].train
        assert (len(kept), len(held)) == (info.num_train, info.num_validation)
        assert len(kept) + len(held) == len(everything)
        assert not _rows(kept.x) & _rows(held.x), "no validation row trains"
        assert _rows(kept.x) | _rows(held.x) == _rows(everything.x), "the training part is split, nothing else"
        classes, counts = np.unique(everything.y, return_counts=True)
        expected = np.floor(0.2 * counts + 0.5).astype(int)  # round(fraction x rows) of each class
        np.testing.assert_array_equal([np.sum(held.y == c) for c in classes], expected)
        np.testing.assert_array_equal(data.test.x, before[cid].test.x)


def test_validation_part_is_seeded_by_the_data_seed(toy_overrides):
    overrides = toy_overrides + ["data.validation_fraction=0.3"]
    _, federation, first = _clients(overrides)
    _, _, again = _clients(overrides)
    _, _, other = _clients(overrides + ["data.seed=1"])
    source = federation.source_ids[0]
    np.testing.assert_array_equal(first[source].validation.x, again[source].validation.x)
    assert _rows(first[source].validation.x) != _rows(other[source].validation.x)


def test_fraction_zero_leaves_the_training_data_as_it_was(toy_overrides):
    _, federation, default = _clients(toy_overrides)
    _, _, zero = _clients(toy_overrides + ["data.validation_fraction=0"])
    for cid, data in default.items():
        assert data.validation is None and zero[cid].validation is None
        np.testing.assert_array_equal(data.train.x, zero[cid].train.x)
        assert (data.train.y is None) == data.is_target
        if data.train.y is not None:
            np.testing.assert_array_equal(data.train.y, zero[cid].train.y)
        assert federation.info(cid).num_validation == 0


@pytest.mark.parametrize("fraction", ["1", "-0.1", "1.5"])
def test_fraction_outside_the_unit_interval_is_one_line(toy_overrides, fraction):
    with pytest.raises(UserError, match=r"data.validation_fraction must be in \[0, 1\)"):
        load_config(None, toy_overrides + [f"data.validation_fraction={fraction}"])


def test_a_class_too_small_to_split_is_one_line(toy_overrides):
    # 50 rows of each class per domain over 40 clients: a client holds one or two rows of a class, and
    # a fraction of 0.9 would hold out every one of them
    config = load_config(None, toy_overrides + ["data.clients_per_domain=40", "data.validation_fraction=0.9"])
    with pytest.raises(UserError, match="lower data.validation_fraction"):
        build_federation(config.data)


def test_standardization_is_fitted_on_what_trains_and_applied_to_the_validation_part(toy_overrides):
    from fedsim.data import normalization
    from fedsim.runtime import LocalExecutor, Server

    config = load_config(None, toy_overrides + ["data.normalization=per-domain", "data.validation_fraction=0.2"])
    federation = build_federation(config.data)
    raw = {cid: load_client_data(config.data, federation, cid) for cid in federation.source_ids}
    executor = LocalExecutor(config, federation)
    Server(config, federation, executor).setup(1)
    for cid, before in raw.items():
        scaled = executor.host._client(cid)
        mean, std = normalization.mean_std(normalization.feature_stats(before.train.x))
        np.testing.assert_allclose(scaled.train.x.mean(0), 0, atol=1e-4)
        np.testing.assert_array_equal(scaled.validation.x, normalization.standardize(before.validation.x, mean, std))
        np.testing.assert_array_equal(scaled.validation.y, before.validation.y)
