"""Federated/per-domain standardization, and the Office-Caltech10 file loader on tiny files (CWRU: test_cwru.py)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io

from fedsim.config import data_config
from fedsim.data import normalization as norm
from fedsim.data.benchmarks.office_caltech import DOMAINS as OC_DOMAINS
from fedsim.data.benchmarks.office_caltech import OfficeCaltechBenchmark
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS


def test_benchmarks_register():
    assert {"tep", "office_caltech", "cwru"} <= set(BENCHMARKS.names())


# ----------------------------------------------------------------------------- normalization


def _clients(seed=0):
    rng = np.random.default_rng(seed)
    sizes = (7, 40, 123)
    return [
        rng.normal(2700 + 10 * i, 3 + i, size=(n, 5)) * np.array([1, 1, 1, 0, 1]) + np.array([0, 0, 0, 4.2, 0])
        for i, n in enumerate(sizes)
    ]


def test_federated_statistics_equal_pooled_mean_std():
    clients = _clients()
    mean, std = norm.federated_mean_std(clients)
    pooled = np.concatenate(clients)
    np.testing.assert_allclose(mean, pooled.mean(0), rtol=1e-12)
    np.testing.assert_allclose(std[[0, 1, 2, 4]], pooled.std(0)[[0, 1, 2, 4]], rtol=1e-7)
    assert std[3] == 1.0  # a constant feature is centered, not divided by ~0
    scaled = norm.standardize(pooled, mean, std)
    assert scaled.dtype == np.float32 and np.all(np.isfinite(scaled))
    np.testing.assert_allclose(scaled.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(scaled[:, [0, 1, 2, 4]].std(0), 1, atol=1e-5)
    # What a client sends is its sums only, and they survive the message round trip.
    sent = norm.feature_stats(clients[1]).to_tensors()
    assert set(sent) == set(norm.STAT_KEYS) and sent["sum"].shape == (5,)
    back = norm.FeatureStats.from_tensors(sent)
    assert back.count == 40 and np.array_equal(back.sum_sq, norm.feature_stats(clients[1]).sum_sq)
    with pytest.raises(ValueError):
        norm.combine_stats([norm.feature_stats(clients[0]), norm.feature_stats(clients[0][:, :3])])


def test_per_domain_and_normalize_domains():
    clients = _clients()
    domains = {f"d{i}": (x[: len(x) // 2 + 1], x[len(x) // 2 + 1 :]) for i, x in enumerate(clients)}
    per = norm.normalize_domains(domains, "per-domain")
    for name, (train, _) in per.items():
        np.testing.assert_allclose(train.mean(0), 0, atol=1e-4)
        assert np.all(np.abs(train[:, 0].std() - 1) < 1e-4)
    shared = norm.normalize_domains(domains, "federated")
    mean, std = norm.federated_mean_std(tr for tr, _ in domains.values())
    np.testing.assert_allclose(shared["d1"][1], (domains["d1"][1] - mean) / std, rtol=1e-5, atol=1e-4)
    # Under one shared scaling the domains keep their offsets; per-domain scaling removes them.
    assert abs(shared["d2"][0][:, 0].mean() - shared["d0"][0][:, 0].mean()) > 1
    raw = norm.normalize_domains(domains, "none")
    assert raw["d0"][0].dtype == np.float32 and np.allclose(raw["d0"][0], domains["d0"][0])
    with pytest.raises(ValueError, match="normalization"):
        norm.normalize_domains(domains, "global")
    images = np.random.default_rng(1).random((6, 3, 4, 4))
    assert norm.per_domain_standardize(images)[0].shape == images.shape


# ----------------------------------------------------------------------------- office_caltech


def _oc_data(domain: str, n: int = 50, dim: int = 16):
    rng = np.random.default_rng(len(domain))
    labels = np.arange(n) % 10 + 1  # 1..10 as released
    feas = rng.normal(size=(n, dim)) + labels[:, None]
    return feas, labels


def _write_decaf(root, domains=OC_DOMAINS):
    for d in domains:
        feas, labels = _oc_data(d)
        scipy.io.savemat(str(root / f"{d}_decaf.mat"), {"feas": feas, "labels": labels.reshape(-1, 1)})


def test_office_caltech_decaf(tmp_path):
    _write_decaf(tmp_path)
    bench = OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path)))
    assert bench.domains() == ["amazon", "caltech", "dslr", "webcam"]
    dom = bench.load("dslr")
    assert dom.num_classes == 10 and dom.input_shape == (16,)
    assert dom.train_x.shape == (40, 16) and dom.test_x.shape == (10, 16)
    assert set(np.unique(np.concatenate([dom.train_y, dom.test_y]))) == set(range(10))  # shifted to 0..9
    feas, labels = _oc_data("dslr")
    row = np.flatnonzero(np.all(np.isclose(feas, dom.test_x[0]), axis=1))
    assert len(row) == 1 and labels[row[0]] - 1 == dom.test_y[0]  # features and labels stay paired


def test_office_caltech_surf_npz_and_csv_forms(tmp_path):
    for d in OC_DOMAINS:  # the SURF release: Caltech10_SURF_L10.mat for caltech, fts/labels
        feas, labels = _oc_data(d, dim=8)
        name = "Caltech10_SURF_L10.mat" if d == "caltech" else f"{d}_SURF_L10.mat"
        scipy.io.savemat(str(tmp_path / name), {"fts": feas, "labels": labels.reshape(-1, 1)})
    surf = OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path))).load("caltech")
    assert surf.input_shape == (8,)
    npz_dir = tmp_path / "npz"
    npz_dir.mkdir()
    for d in OC_DOMAINS:
        feas, labels = _oc_data(d, dim=12)
        np.savez(npz_dir / f"{d}.npz", x=feas, y=labels - 1)  # 0..9 labels stay as they are
    dom = OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(npz_dir), variant="resnet50")).load(
        "amazon"
    )
    assert dom.input_shape == (12,) and dom.train_y.max() == 9
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for d in OC_DOMAINS:
        feas, labels = _oc_data(d, dim=6)
        np.savetxt(csv_dir / f"{d}_{d}.csv", np.column_stack([feas, labels - 1]), delimiter=",")
    dom = OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(csv_dir))).load("webcam")
    assert dom.input_shape == (6,) and len(dom.train_y) + len(dom.test_y) == 50


@pytest.mark.parametrize("case", ["missing", "corrupt", "no_key", "bad_label", "mismatch", "dims", "nan"])
def test_office_caltech_bad_files_name_the_file(tmp_path, case):
    _write_decaf(tmp_path)
    bad = tmp_path / "webcam_decaf.mat"
    feas, labels = _oc_data("webcam")
    if case == "missing":
        bad.unlink()
    elif case == "corrupt":
        bad.write_bytes(b"this is not a MATLAB file")
    elif case == "no_key":
        scipy.io.savemat(str(bad), {"features": feas, "labels": labels})
    elif case == "bad_label":
        scipy.io.savemat(str(bad), {"feas": feas, "labels": np.where(labels == 3, 11, labels)})
    elif case == "mismatch":
        scipy.io.savemat(str(bad), {"feas": feas[:40], "labels": labels})
    elif case == "dims":
        scipy.io.savemat(str(bad), {"feas": feas[:, :5], "labels": labels})
    elif case == "nan":
        scipy.io.savemat(str(bad), {"feas": np.where(feas > 5, np.nan, feas), "labels": labels})
    with pytest.raises(UserError) as info:
        OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path), target="webcam")).load(
            "amazon"
        )
    message = str(info.value)
    assert "webcam_decaf.mat" in message and "\n" not in message
    if case == "missing":  # how to fix it: the file to add, or the domains that have files
        assert "webcam.mat" in message and "files found for amazon, caltech, dslr" in message
    if case == "no_key":
        assert "feas" in message and "features" in message  # what was expected and what was found


def test_office_caltech_settings_errors(tmp_path):
    with pytest.raises(UserError, match="data.root"):
        OfficeCaltechBenchmark(data_config(benchmark="office_caltech")).load("amazon")
    with pytest.raises(UserError, match="does not exist"):
        OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path / "nope"))).load("amazon")
    _write_decaf(tmp_path)
    with pytest.raises(UserError, match="surf"):
        OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path), variant="sift")).load(
            "amazon"
        )
    with pytest.raises(UserError, match="SURF_L10"):  # decaf files exist, but SURF was asked for
        OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path), variant="surf")).load(
            "amazon"
        )
    with pytest.raises(UserError, match="amazon"):
        OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path))).load("amazom")


def _write_fts(folder, domains, dim, n=20, plain=True):
    """Gautheron's release: <domain>.mat (caltech10.mat for Caltech) with fts N x dim and labels 1 x N."""
    folder.mkdir(parents=True, exist_ok=True)
    for d in domains:
        feas, labels = _oc_data(d, n=n, dim=dim)
        name = ("caltech10" if d == "caltech" else d) + (".mat" if plain else "_SURF_L10.mat")
        scipy.io.savemat(str(folder / name), {"fts": feas.astype(np.float32), "labels": labels.reshape(1, -1)})


def test_office_caltech_gautheron_forms_by_dimension_and_sub_folder(tmp_path):
    features = tmp_path / "features"
    _write_fts(features / "GoogleNet1024", ("amazon", "dslr", "webcam"), 1024)
    _write_fts(features / "CaffeNet4096", OC_DOMAINS, 4096)
    _write_fts(features / "surf", OC_DOMAINS, 800)

    def bench(**kwargs):
        return OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(features), **kwargs))

    google = bench(variant="googlenet1024")
    assert google.domains() == ["amazon", "dslr", "webcam"]  # no Caltech file: three domains
    dom = google.load("webcam")
    assert dom.input_shape == (1024,) and len(dom.train_y) + len(dom.test_y) == 20 and dom.train_y.max() == 9
    assert bench(variant="caffenet4096").load("caltech").input_shape == (4096,)
    assert bench(variant="surf").load("caltech").input_shape == (800,)
    auto = bench()  # the most domains, ties in the documented order: CaffeNet-4096 before SURF
    assert auto.domains() == list(OC_DOMAINS) and auto.load("dslr").input_shape == (4096,)
    with pytest.raises(UserError, match="no googlenet1024 file for caltech") as info:
        bench(variant="googlenet1024", target="caltech").domains()
    assert "caltech.mat or caltech10.mat" in str(info.value) and "amazon, dslr, webcam" in str(info.value)
    with pytest.raises(UserError, match="holds googlenet1024 features .--set data.variant=googlenet1024"):
        OfficeCaltechBenchmark(
            data_config(benchmark="office_caltech", root=str(features / "GoogleNet1024"), variant="caffenet4096")
        ).domains()


def test_office_caltech_domains_are_those_with_files(tmp_path):
    for d in ("dslr", "webcam"):  # DeCAF6 as <domain>.mat, feas / labels N x 1
        feas, labels = _oc_data(d)
        scipy.io.savemat(str(tmp_path / f"{d}.mat"), {"feas": feas, "labels": labels.reshape(-1, 1)})
    bench = OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path), variant="decaf"))
    assert bench.domains() == ["dslr", "webcam"] and bench.load("dslr").input_shape == (16,)
    with pytest.raises(UserError, match="no decaf6 file for amazon .*amazon_decaf.mat or amazon.mat"):
        OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path), target="amazon")).domains()
    _write_fts(tmp_path / "sift", OC_DOMAINS, 500)  # fts of none of the known sizes
    with pytest.raises(UserError, match="no decaf6 or resnet50 .* feature files .*holds none of the forms"):
        OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(tmp_path / "sift"))).domains()
    _write_fts(tmp_path / "surf", OC_DOMAINS, 8, plain=False)  # the GFK release's names, fts labels 1 x N too
    assert OfficeCaltechBenchmark(
        data_config(benchmark="office_caltech", root=str(tmp_path / "surf"))
    ).domains() == list(OC_DOMAINS)


def test_every_benchmark_has_a_one_line_description():
    """``fedsim list`` prints the first docstring line of every registered benchmark."""
    for name in BENCHMARKS.names():
        cls = BENCHMARKS.get(name)
        assert cls.registry_name == name
        text = cls.description()
        assert len(text) > 20 and "\n" not in text and text == cls.__doc__.strip().splitlines()[0], name
