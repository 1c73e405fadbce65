"""The embedded digits benchmark and the domain cache."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from fedsim.config import DataConfig
from fedsim.data import cache
from fedsim.data.benchmarks.digits import DigitsBenchmark
from fedsim.data.benchmarks.digits_render import BUILDERS, mnist_halves
from fedsim.data.benchmarks.package_images import mnist_source
from fedsim.data.benchmarks.splits import limit_train, stratified_split, stratified_subsample
from fedsim.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
DOMAINS = ["mnist", "usps", "mnistm", "synth"]
KEYS = ("train_x", "train_y", "test_x", "test_y")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("digits-cache")
    bench = DigitsBenchmark(DataConfig(cache_dir=str(cache_dir)))
    domains = {name: bench.load(name) for name in bench.domains()}
    return cache_dir, bench, domains


def test_domains_and_description(built):
    _, bench, _ = built
    assert bench.domains() == DOMAINS
    assert bench.describe() == "Embedded digits: mnist, usps, mnistm, synth (28x28 RGB, 10 classes, no download)"


def test_shapes_types_ranges(built):
    _, _, domains = built
    for name, d in domains.items():
        assert d.name == name and d.num_classes == 10
        for x, y in ((d.train_x, d.train_y), (d.test_x, d.test_y)):
            assert x.dtype == np.float32 and y.dtype == np.int64
            assert x.shape[1:] == (3, 28, 28) and len(x) == len(y)
            assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.5
            assert set(np.unique(y)) == set(range(10))
        n = len(d.train_y) + len(d.test_y)
        assert abs(len(d.test_y) / n - 0.2) < 0.01
    assert len(domains["mnist"].train_y) + len(domains["mnist"].test_y) == 2500
    assert len(domains["mnistm"].train_y) + len(domains["mnistm"].test_y) == 2500
    assert len(domains["synth"].train_y) + len(domains["synth"].test_y) == 2500
    assert len(domains["usps"].train_y) + len(domains["usps"].test_y) == 1797
    # grey domains are replicated to three channels, coloured ones are not
    for name in ("mnist", "usps"):
        x = domains[name].train_x
        assert np.array_equal(x[:, 0], x[:, 1]) and np.array_equal(x[:, 0], x[:, 2])
    for name in ("mnistm", "synth"):
        x = domains[name].train_x
        assert not np.array_equal(x[:, 0], x[:, 1])


def test_balanced(built):
    _, _, domains = built
    for name, d in domains.items():
        for y in (d.train_y, d.test_y):
            counts = np.bincount(y, minlength=10)
            assert counts.max() <= counts.min() * 1.1 + 1, (name, counts)


def test_mnist_and_mnistm_use_disjoint_digits(built):
    _, _, domains = built
    first, second = mnist_halves(0)
    assert len(np.intersect1d(first, second)) == 0
    assert len(first) == len(second) == 2500
    assert len(np.union1d(first, second)) == 5000
    source, _ = mnist_source()

    def digest(img: np.ndarray) -> bytes:
        return hashlib.sha1(np.ascontiguousarray(img).tobytes()).digest()

    mnistm_sources = {digest(source[i]) for i in second}
    mnist_images = np.concatenate([domains["mnist"].train_x, domains["mnist"].test_x])[:, 0]
    mnist_digests = {digest(np.rint(img * 255).astype(np.uint8)) for img in mnist_images}
    assert len(mnist_digests) == 2500
    assert mnist_digests <= {digest(source[i]) for i in first}
    assert not (mnist_digests & mnistm_sources)


def test_deterministic_across_processes_and_cache_dirs(built, tmp_path):
    cache_dir, bench, _ = built
    other = tmp_path / "other-cache"
    code = (
        "from fedsim.config import DataConfig\n"
        "from fedsim.data.benchmarks.digits import DigitsBenchmark\n"
        f"b = DigitsBenchmark(DataConfig(cache_dir={str(other)!r}))\n"
        "[b.load(d) for d in b.domains()]\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=120)
    for name in DOMAINS:
        mine = cache.load_arrays(cache_dir, bench.cache_name(name))
        theirs = cache.load_arrays(other, bench.cache_name(name))
        assert mine is not None and theirs is not None
        for key in KEYS:
            assert np.array_equal(mine[key], theirs[key]), (name, key)
            assert mine[key].dtype == theirs[key].dtype


def test_other_seed_differs(built, tmp_path):
    _, _, domains = built
    other = DigitsBenchmark(DataConfig(cache_dir=str(tmp_path), seed=1)).load("mnist")
    assert not np.array_equal(other.train_y, domains["mnist"].train_y)


def test_cache_hit_returns_identical_arrays(built, monkeypatch):
    cache_dir, _, domains = built

    def fail(seed):
        raise AssertionError("built again although cached")

    for name in DOMAINS:
        monkeypatch.setitem(BUILDERS, name, fail)
    again = DigitsBenchmark(DataConfig(cache_dir=str(cache_dir)))
    for name in DOMAINS:
        d = again.load(name)
        for attr in KEYS:
            assert np.array_equal(getattr(d, attr), getattr(domains[name], attr))
            assert getattr(d, attr).dtype == getattr(domains[name], attr).dtype


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_corrupted_cache_is_rebuilt(built, tmp_path, damage):
    cache_dir, bench, domains = built
    name = bench.cache_name("mnist")
    src = cache.cache_path(cache_dir, name)
    dst = cache.cache_path(tmp_path, name)
    data = bytearray(src.read_bytes())
    if damage == "flip":
        for i in range(len(data) // 3, len(data) // 3 + 64):
            data[i] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray(b"not a zip file at all")
    dst.write_bytes(bytes(data))
    assert cache.load_arrays(tmp_path, name) is None
    rebuilt = DigitsBenchmark(DataConfig(cache_dir=str(tmp_path))).load("mnist")
    for attr in KEYS:
        assert np.array_equal(getattr(rebuilt, attr), getattr(domains["mnist"], attr))
    assert cache.load_arrays(tmp_path, name) is not None  # rewritten, valid again


def test_max_train_per_domain(built):
    cache_dir, _, domains = built
    small = DigitsBenchmark(DataConfig(cache_dir=str(cache_dir), max_train_per_domain=305))
    for name in ("mnist", "usps"):
        d = small.load(name)
        assert len(d.train_y) == 305
        counts = np.bincount(d.train_y, minlength=10)
        assert counts.max() - counts.min() <= 3
        assert np.array_equal(d.test_y, domains[name].test_y)  # the test split is untouched
        again = DigitsBenchmark(DataConfig(cache_dir=str(cache_dir), max_train_per_domain=305)).load(name)
        assert np.array_equal(again.train_x, d.train_x)
    large = DigitsBenchmark(DataConfig(cache_dir=str(cache_dir), max_train_per_domain=10**6)).load("usps")
    assert np.array_equal(large.train_x, domains["usps"].train_x)


def test_unknown_domain(built):
    _, bench, _ = built
    with pytest.raises(UserError) as err:
        bench.load("svhn")
    message = str(err.value)
    assert "svhn" in message and all(name in message for name in DOMAINS) and "\n" not in message
    assert "svhn" not in bench._loaded


def test_domains_really_differ(built):
    """A classifier trained on mnist does clearly worse on the shifted domains."""
    from sklearn.linear_model import LogisticRegression

    def features(x: np.ndarray) -> np.ndarray:  # 2x2 average pooling keeps colour, runs fast
        return x.reshape(len(x), 3, 14, 2, 14, 2).mean(axis=(3, 5)).reshape(len(x), -1)

    _, _, domains = built
    mnist = domains["mnist"]
    clf = LogisticRegression(max_iter=200, C=0.1)
    clf.fit(features(mnist.train_x), mnist.train_y)
    acc = {name: clf.score(features(d.test_x), d.test_y) for name, d in domains.items()}
    print("accuracy of an mnist-trained logistic regression:", acc)
    assert acc["mnist"] > 0.8
    assert acc["mnist"] > acc["mnistm"] + 0.3
    assert acc["mnist"] > acc["synth"] + 0.3
    assert acc["mnist"] > acc["usps"] + 0.1


# ----------------------------------------------------------------------------- cache helpers


def test_cache_roundtrip_and_checksum(tmp_path):
    arrays = {"a": np.arange(12, dtype=np.uint8).reshape(3, 4), "b": np.array([1.5, -2.0], dtype=np.float32)}
    path = cache.save_arrays(tmp_path, "thing", arrays)
    assert path == tmp_path / "thing.npz"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    back = cache.load_arrays(tmp_path, "thing")
    assert back is not None and set(back) == {"a", "b"}
    for key in arrays:
        assert np.array_equal(back[key], arrays[key]) and back[key].dtype == arrays[key].dtype
    assert cache.load_arrays(tmp_path, "missing") is None
    # a readable npz whose content does not match its stored checksum
    stale = dict(back, __sha256__=np.array(cache.checksum({"a": arrays["a"]})))
    np.savez(tmp_path / "stale.npz", **stale)
    assert cache.load_arrays(tmp_path, "stale") is None
    np.savez(tmp_path / "nosum.npz", **arrays)
    assert cache.load_arrays(tmp_path, "nosum") is None


def test_cache_concurrent_writers(tmp_path):
    arrays = {"x": np.random.default_rng(0).integers(0, 255, (200, 3, 28, 28), dtype=np.uint8)}
    errors = []

    def writer():
        try:
            for _ in range(10):
                cache.save_arrays(tmp_path, "shared", arrays)
                back = cache.load_arrays(tmp_path, "shared")
                assert back is not None and np.array_equal(back["x"], arrays["x"])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [p.name for p in tmp_path.iterdir()] == ["shared.npz"]


def test_split_helpers():
    y = np.repeat(np.arange(3), [10, 5, 1])
    train, test = stratified_split(y, np.random.default_rng(0))
    assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == len(y)
    assert list(np.bincount(y[test], minlength=3)) == [2, 1, 0]
    train, test = stratified_split(np.array([0, 1]), np.random.default_rng(0))
    assert len(train) == 1 and len(test) == 1
    y = np.repeat(np.arange(4), 25)
    keep = stratified_subsample(y, 10, np.random.default_rng(0))
    assert len(keep) == 10 and np.all(np.diff(keep) > 0)
    assert list(np.bincount(y[keep], minlength=4)) == [3, 3, 2, 2]  # largest remainder, ties by class order
    x = np.arange(len(y))
    assert limit_train(x, y, None, 0, 1)[0] is x and limit_train(x, y, 100, 0, 1)[0] is x  # no limit, or not below N
    small_x, small_y = limit_train(x, y, 10, 0, 1)
    assert np.array_equal(small_y, y[small_x]) and list(np.bincount(small_y, minlength=4)) == [3, 3, 2, 2]
