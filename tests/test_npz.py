"""The npz benchmark: user-provided domains, and one clear error per bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedsim.config import DataConfig
from fedsim.data.benchmarks.npz import NpzBenchmark
from fedsim.errors import UserError


def _domain(seed: int, n: int = 50, d: int = 6, classes: int = 3):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    x = rng.normal(size=(n, d)) + y[:, None]
    return x, y


def _folder(tmp_path: Path, **overrides) -> Path:
    """A valid two-domain folder; ``overrides`` maps a domain to the dict of arrays to save instead."""
    root = tmp_path / "domains"
    root.mkdir(exist_ok=True)
    for seed, name in enumerate(("alpha", "beta")):
        x, y = _domain(seed)
        arrays = overrides.get(name, {"x": x, "y": y})
        np.savez(root / f"{name}.npz", **arrays)
    return root


def _bench(root, **kw) -> NpzBenchmark:
    return NpzBenchmark(
        DataConfig(benchmark="npz", root=None if root is None else str(root), cache_dir="/nonexistent", **kw)
    )


def _error(bench: NpzBenchmark) -> str:
    with pytest.raises(UserError) as err:
        bench.validate()
        for name in bench.domains():
            bench.load(name)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_valid_folder_loads(tmp_path):
    root = _folder(tmp_path)
    bench = _bench(root)
    assert bench.domains() == ["alpha", "beta"]
    d = bench.load("alpha")
    assert d.num_classes == 3 and bench.num_classes == 3
    assert d.train_x.dtype == np.float32 and d.test_x.dtype == np.float32
    assert d.train_y.dtype == np.int64 and d.test_y.dtype == np.int64
    assert d.input_shape == (6,)
    assert len(d.train_y) == 40 and len(d.test_y) == 10
    assert list(np.bincount(d.test_y)) in ([4, 3, 3], [3, 4, 3], [3, 3, 4])
    # the split is a partition of the file's rows
    x, _ = _domain(0)
    rows = np.concatenate([d.train_x, d.test_x])
    assert np.array_equal(np.sort(rows[:, 0]), np.sort(x[:, 0].astype(np.float32)))
    # deterministic across instances, seed-dependent
    again = _bench(root).load("alpha")
    assert np.array_equal(again.train_x, d.train_x) and np.array_equal(again.test_y, d.test_y)
    other = _bench(root, seed=5).load("alpha")
    assert not np.array_equal(other.train_x, d.train_x)
    assert bench.load("alpha") is d  # kept in memory


def test_explicit_test_split_images_and_subsample(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "imgs"
    root.mkdir()
    for name in ("a", "b"):
        np.savez(
            root / f"{name}.npz",
            x=rng.random((30, 1, 4, 4)),
            y=np.arange(30) % 5,
            x_test=rng.random((7, 1, 4, 4)),
            y_test=np.arange(7) % 5,
        )
    bench = _bench(root, max_train_per_domain=10)
    d = bench.load("b")
    assert d.input_shape == (1, 4, 4) and d.num_classes == 5
    assert len(d.train_y) == 10 and list(np.bincount(d.train_y)) == [2] * 5
    assert len(d.test_y) == 7 and list(d.test_y) == list(np.arange(7) % 5)


def test_labels_as_integral_floats_and_max_label_over_domains(tmp_path):
    x, y = _domain(0)
    x2, y2 = _domain(1, classes=4)
    root = _folder(tmp_path, alpha={"x": x, "y": y.astype(np.float64)}, beta={"x": x2, "y": y2})
    bench = _bench(root)
    assert bench.load("alpha").num_classes == 4 and bench.load("alpha").train_y.dtype == np.int64


def test_root_not_set():
    message = _error(_bench(None))
    assert "--set data.root=DIR" in message


def test_root_missing(tmp_path):
    message = _error(_bench(tmp_path / "nowhere"))
    assert "nowhere" in message and "does not exist" in message


def test_root_is_a_file(tmp_path):
    f = tmp_path / "file.npz"
    f.write_bytes(b"x")
    assert "not a folder" in _error(_bench(f))


def test_no_npz_files(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    message = _error(_bench(tmp_path))
    assert "no .npz files" in message and str(tmp_path) in message and "<domain>.npz" in message


def test_single_domain(tmp_path):
    x, y = _domain(0)
    np.savez(tmp_path / "only.npz", x=x, y=y)
    assert "only.npz" in _error(_bench(tmp_path))


def test_unknown_domain(tmp_path):
    bench = _bench(_folder(tmp_path))
    with pytest.raises(UserError) as err:
        bench.load("gamma")
    assert "gamma" in str(err.value) and "alpha" in str(err.value) and "beta" in str(err.value)


x0, y0 = _domain(0)
BAD = {
    "missing_x": {"y": y0},
    "missing_y": {"x": x0},
    "length_mismatch": {"x": x0, "y": y0[:-3]},
    "x_3d": {"x": x0.reshape(50, 2, 3), "y": y0},
    "x_1d": {"x": x0[:, 0], "y": y0},
    "x_strings": {"x": np.array([["a"] * 6] * 50), "y": y0},
    "y_2d": {"x": x0, "y": y0[:, None]},
    "y_fractional": {"x": x0, "y": y0 + 0.5},
    "y_nan": {"x": x0, "y": np.where(y0 == 1, np.nan, y0)},
    "y_negative": {"x": x0, "y": y0 - 1},
    "y_strings": {"x": x0, "y": np.array(["cat"] * 50)},
    "one_sample": {"x": x0[:1], "y": y0[:1]},
    "x_nan": {"x": np.where(np.arange(6) == 2, np.nan, x0), "y": y0},
    "x_inf": {"x": np.where(np.arange(6) == 2, np.inf, x0), "y": y0},
    "x_overflow_float32": {"x": x0 * 1e300, "y": y0},
    "x_test_without_y_test": {"x": x0, "y": y0, "x_test": x0},
    "x_test_shape": {"x": x0, "y": y0, "x_test": x0[:, :3], "y_test": y0},
    "object_arrays": None,  # written specially below
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_names_the_file(tmp_path, case):
    if case == "object_arrays":
        root = _folder(tmp_path)
        np.savez(root / "beta.npz", x=np.array([object()] * 3, dtype=object), y=y0[:3])
    else:
        root = _folder(tmp_path, beta=BAD[case])
    message = _error(_bench(root))
    assert "beta.npz" in message, message


def test_shapes_differ_across_domains(tmp_path):
    x, y = _domain(1, d=7)
    root = _folder(tmp_path, beta={"x": x, "y": y})
    message = _error(_bench(root))
    assert "alpha.npz" in message and "beta.npz" in message and "(6,)" in message and "(7,)" in message


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_file(tmp_path, damage):
    root = _folder(tmp_path)
    path = root / "beta.npz"
    data = path.read_bytes()
    path.write_bytes({"garbage": b"this is not an npz file", "truncated": data[: len(data) // 2], "empty": b""}[damage])
    message = _error(_bench(root))
    assert "beta.npz" in message and "cannot read" in message


def test_all_labels_zero(tmp_path):
    x, y = _domain(0)
    root = _folder(tmp_path, alpha={"x": x, "y": np.zeros_like(y)}, beta={"x": x, "y": np.zeros_like(y)})
    assert "at least two classes" in _error(_bench(root))
