"""Amazon Review loader on tiny files in every supported layout; FADA on Amazon Review and Office-Caltech10 files."""

import numpy as np
import pytest
import scipy.io
import scipy.sparse

from fedsim.api import run_experiment
from fedsim.config import data_config, load_config
from fedsim.data.benchmarks.amazon_review import DOMAINS, AmazonReviewBenchmark
from fedsim.data.benchmarks.office_caltech import DOMAINS as OC_DOMAINS
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS

SIZES = (20, 24, 16, 20)  # documents per domain, in the release's order
VOCABULARY = 30


def corpus(seed: int = 0):
    """Word counts whose class shows in a few words, domains shifted by their own vocabulary; labels -1/1 as
    released."""
    rng = np.random.default_rng(seed)
    n = sum(SIZES)
    y = np.where(np.arange(n) % 2 == 0, 1, -1)
    counts = rng.poisson(0.3, size=(n, VOCABULARY)).astype(np.float64)
    counts[y == 1, :3] += rng.poisson(2.0, size=(int((y == 1).sum()), 3))
    counts[y == -1, 3:6] += rng.poisson(2.0, size=(int((y == -1).sum()), 3))
    start = 0
    for d, size in enumerate(SIZES):
        counts[start : start + size, 10 + 4 * d : 14 + 4 * d] += 1
        start += size
    return counts, y


def write_mat(root, one_based: bool = True, **changes):
    counts, y = corpus()
    starts = np.cumsum((0,) + SIZES[:-1]) + (1 if one_based else 0)
    variables = {"xx": scipy.sparse.csc_matrix(counts.T), "yy": y.reshape(-1, 1), "offset": starts.reshape(-1, 1)}
    variables.update(changes)
    variables = {k: v for k, v in variables.items() if v is not None}
    scipy.io.savemat(str(root / "amazon.mat"), variables)
    return counts, y


def write_npz(root):
    counts, y = corpus()
    start = 0
    for domain, size in zip(DOMAINS, SIZES):
        np.savez(
            root / f"{domain}.npz", x=counts[start : start + size], y=(y[start : start + size] > 0).astype(np.int64)
        )
        start += size
    return counts, y


def write_400(root, electronics: str = "elec"):
    """The 400-d release: <domain>_400.mat (elec_400.mat for electronics), fts N x D, labels N x 1 as 0/1."""
    counts, y = corpus()
    start = 0
    for domain, size in zip(DOMAINS, SIZES):
        name = electronics if domain == "electronics" else domain
        labels = (y[start : start + size] > 0).astype(np.uint8).reshape(-1, 1)
        scipy.io.savemat(str(root / f"{name}_400.mat"), {"fts": counts[start : start + size], "labels": labels})
        start += size
    return counts, y


def bench(root, **kwargs):
    return AmazonReviewBenchmark(data_config(benchmark="amazon_review", root=str(root), **kwargs))


def test_registered():
    assert "amazon_review" in BENCHMARKS.names()


@pytest.mark.parametrize("layout", ["mat-one-based", "mat-zero-based", "npz", "400", "400-electronics"])
def test_layouts_give_the_same_domains(tmp_path, layout):
    if layout == "npz":
        counts, y = write_npz(tmp_path)
    elif layout.startswith("400"):
        counts, y = write_400(tmp_path, electronics=layout[4:] or "elec")
    else:
        counts, y = write_mat(tmp_path, one_based=layout == "mat-one-based")
    benchmark = bench(tmp_path)
    assert benchmark.domains() == ["books", "dvd", "electronics", "kitchen"]
    start = 0
    for domain, size in zip(DOMAINS, SIZES):
        dom = benchmark.load(domain)
        assert dom.num_classes == 2 and dom.input_shape == (VOCABULARY,)
        assert len(dom.train_y) + len(dom.test_y) == size and len(dom.test_y) == round(0.2 * size)
        assert dom.train_x.dtype == np.float32 and set(np.unique(dom.train_y)) == {0, 1}
        block, labels = counts[start : start + size], (y[start : start + size] > 0).astype(int)
        for x_row, label in zip(dom.test_x, dom.test_y):  # features and labels stay paired, each in its own domain
            match = np.flatnonzero(np.all(block == x_row, axis=1))
            assert len(match) >= 1 and label in labels[match]
        start += size


def test_variants_and_dense_documents_by_features(tmp_path):
    counts, y = write_mat(tmp_path, xx=None)
    scipy.io.savemat(
        str(tmp_path / "amazon.mat"), {"xx": counts, "yy": (y > 0).astype(int), "offset": np.array([0, 20, 44, 60, 80])}
    )
    plain = bench(tmp_path).load("dvd")
    binary = bench(tmp_path, variant="binary").load("dvd")
    log1p = bench(tmp_path, variant="log1p").load("dvd")
    np.testing.assert_array_equal(binary.train_x, (plain.train_x > 0).astype(np.float32))
    np.testing.assert_allclose(log1p.train_x, np.log1p(plain.train_x), rtol=1e-6)
    assert plain.train_x.max() > 1
    with pytest.raises(UserError, match="variant"):
        bench(tmp_path, variant="tfidf").load("dvd")


@pytest.mark.parametrize(
    "case, message",
    [
        ("no_root", "data.root"),
        ("empty", "amazon.mat"),
        ("partial_npz", "kitchen.npz"),
        ("corrupt_mat", "amazon.mat"),
        ("no_offset", "lacks offset"),
        ("bad_offset", "offset"),
        ("bad_labels", "labels"),
        ("shape", "one dimension of xx"),
        ("npz_no_y", "lacks the expected arrays"),
        ("npz_vocabulary", "different vocabularies"),
        ("partial_400", "no amazon.mat and no elec_400.mat in"),
        ("400_no_labels", "dvd_400.mat lacks the expected variables .found: fts, y.: expected fts"),
        ("400_bad_labels", "dvd_400.mat: 'labels' holds labels 0.0, 1.0, 2.0"),
        ("unknown_domain", "did you mean 'books'"),
    ],
)
def test_bad_files_give_one_line_naming_the_problem(tmp_path, case, message):
    root = tmp_path
    domain = "dvd"
    if case == "no_root":
        root = tmp_path / "missing"
    elif case == "partial_npz":
        write_npz(tmp_path)
        (tmp_path / "kitchen.npz").unlink()
    elif case == "corrupt_mat":
        (tmp_path / "amazon.mat").write_bytes(b"not a matlab file")
    elif case == "no_offset":
        write_mat(tmp_path, offset=None)
    elif case == "bad_offset":
        write_mat(tmp_path, offset=np.array([0, 30, 20, 60]))
    elif case == "bad_labels":
        counts, y = corpus()
        write_mat(tmp_path, yy=(np.arange(len(y)) % 3).reshape(-1, 1))
    elif case == "shape":
        write_mat(tmp_path, yy=np.ones((7, 1)))
    elif case == "npz_no_y":
        write_npz(tmp_path)
        np.savez(tmp_path / "dvd.npz", x=np.ones((5, VOCABULARY)))
    elif case == "npz_vocabulary":
        write_npz(tmp_path)
        np.savez(tmp_path / "dvd.npz", x=np.ones((6, 7)), y=np.array([0, 1] * 3))
    elif case == "partial_400":
        write_400(tmp_path)
        (tmp_path / "elec_400.mat").unlink()
    elif case in ("400_no_labels", "400_bad_labels"):
        write_400(tmp_path)
        labels = np.arange(SIZES[1]).reshape(-1, 1) % 3
        wrong = {"y": labels} if case == "400_no_labels" else {"labels": labels}
        scipy.io.savemat(str(tmp_path / "dvd_400.mat"), {"fts": np.ones((SIZES[1], VOCABULARY)), **wrong})
    elif case == "unknown_domain":
        write_npz(tmp_path)
        domain = "book"
    with pytest.raises(UserError, match=message) as error:
        bench(root).load(domain)
    assert "\n" not in str(error.value)


def _office_caltech_files(root):
    rng = np.random.default_rng(3)
    for d in OC_DOMAINS:
        labels = np.arange(40) % 10 + 1
        scipy.io.savemat(
            str(root / f"{d}_decaf.mat"),
            {"feas": rng.normal(size=(40, 12)) + labels[:, None], "labels": labels.reshape(-1, 1)},
        )


@pytest.mark.parametrize("benchmark, target", [("amazon_review", "kitchen"), ("office_caltech", "dslr")])
def test_fada_runs_on_feature_benchmarks(tmp_path, benchmark, target):
    data = tmp_path / "data"
    data.mkdir()
    write_npz(data) if benchmark == "amazon_review" else _office_caltech_files(data)
    config = load_config(
        None,
        [
            f"data.benchmark={benchmark}",
            f"data.root={data}",
            f"data.target={target}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "method.name=fada",
            "method.batch_size=8",
            "method.gap_references=2",
            "run.rounds=1",
            "run.backend=local",
            "run.progress=false",
            "run.tensorboard=false",
        ],
    )
    result = run_experiment(config)
    metrics = result.history[-1]
    assert 0.0 <= result.summary["target_accuracy"] <= 1.0
    assert set(metrics["attention"]) == set(result.federation.source_domains)
    assert np.isfinite(metrics["gap_statistic"]) and metrics["mine_estimate"]
