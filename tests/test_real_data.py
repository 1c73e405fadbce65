"""The real benchmark files beside the repository (``../shared/data``): the releases' counts, and one short
``fedsim run`` per benchmark on a subsample (CWRU on both backends). Skipped when the folder is absent: the
files are for measuring, not part of the product."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedsim.config import data_config
from fedsim.data.benchmarks.amazon_review import AmazonReviewBenchmark
from fedsim.data.benchmarks.cwru import CLASSES, CWRUBenchmark
from fedsim.data.benchmarks.office_caltech import OfficeCaltechBenchmark
from fedsim.errors import UserError
from fedsim.experiments.cli import main

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
if not DATA.is_dir():
    pytest.skip(
        f"{DATA} (…/shared/data) not found: the real benchmark files are not part of the product",
        allow_module_level=True,
    )

OFFICE_CALTECH = {"amazon": 958, "caltech": 1123, "dslr": 157, "webcam": 295}
AMAZON = {"books": 2000, "dvd": 1999, "electronics": 1998, "kitchen": 1999}


def _counts(benchmark) -> dict[str, tuple[int, int]]:
    """{domain: (samples, classes present)} over train and test."""
    out = {}
    for domain in benchmark.domains():
        dom = benchmark.load(domain)
        y = np.concatenate([dom.train_y, dom.test_y])
        out[domain] = (len(y), len(np.unique(y)))
        assert dom.num_classes == out[domain][1]
    return out


@pytest.mark.parametrize(
    "form, dim, domains",
    [
        ("surf", 800, ("amazon", "caltech", "dslr", "webcam")),
        ("googlenet1024", 1024, ("amazon", "dslr", "webcam")),
        ("decaf6", 4096, ("dslr", "webcam")),
    ],
)
def test_office_caltech_counts_equal_the_release(form, dim, domains):
    bench = OfficeCaltechBenchmark(data_config(benchmark="office_caltech", root=str(DATA / "office_caltech10" / form)))
    assert _counts(bench) == {d: (OFFICE_CALTECH[d], 10) for d in domains}
    assert bench.load(domains[0]).input_shape == (dim,)
    # The same form read from the folder above it, by name: the form's sub-folder is looked in.
    above = OfficeCaltechBenchmark(
        data_config(benchmark="office_caltech", root=str(DATA / "office_caltech10"), variant=form)
    )
    assert above.domains() == list(domains)


def test_amazon_review_counts_equal_the_release():
    bench = AmazonReviewBenchmark(data_config(benchmark="amazon_review", root=str(DATA / "amazon_review")))
    assert _counts(bench) == {d: (n, 2) for d, n in AMAZON.items()}
    assert bench.load("books").input_shape == (400,)


def test_cwru_loads_share_the_nine_faults():
    bench = CWRUBenchmark(data_config(benchmark="cwru", root=str(DATA / "cwru"), split="holdout"))  # each window once
    assert bench.domains() == ["1hp", "2hp", "3hp"]  # the authors' A, B, C
    assert bench.classes == CLASSES[1:]  # normal is recorded at 0hp only in this copy
    counts = _counts(bench)
    assert all(classes == 9 for _, classes in counts.values())
    assert all(1000 <= n <= 1100 for n, _ in counts.values())  # ~120k samples per recording, 1024 per window
    every_load = CWRUBenchmark(data_config(benchmark="cwru", root=str(DATA / "cwru"), target="0hp"))
    assert every_load.domains() == ["0hp", "1hp", "2hp", "3hp"] and every_load.classes == CLASSES[1:]
    with_normal = CWRUBenchmark(
        data_config(benchmark="cwru", root=str(DATA / "cwru"), classes=("normal", "ball_007"), target="0hp")
    )
    with pytest.raises(UserError, match="load 1hp has no normal.mat or normal_<number>.mat"):
        with_normal.domains()


def _run(tmp_path, name: str, args: list[str]) -> dict:
    out = tmp_path / name
    base = ["run", "-q", "--out", str(out), "--set", "run.tensorboard=false", "--set", f"data.cache_dir={tmp_path}"]
    assert main(base + args) == 0
    return json.loads((out / "summary.json").read_text())


def _flags(root: Path, *pairs: str) -> list[str]:
    flags = ["--set", f"data.root={root}"]
    for pair in pairs:
        flags += ["--set", pair]
    return flags


@pytest.mark.parametrize(
    "benchmark, folder, target, sources",
    [
        ("office_caltech", "office_caltech10/surf", "caltech", {"amazon", "dslr", "webcam"}),
        ("office_caltech", "office_caltech10/googlenet1024", "amazon", {"dslr", "webcam"}),
        ("amazon_review", "amazon_review", "kitchen", {"books", "dvd", "electronics"}),
        ("images", "office_caltech10/images", "webcam", {"amazon", "caltech10", "dslr"}),
    ],
)
def test_short_run_on_real_data_is_the_same_on_both_backends(tmp_path, ray_cluster, benchmark, folder, target, sources):
    args = ["--benchmark", benchmark, "--target", target, "--rounds", "2"]
    pairs = ["data.max_train_per_domain=120"] + (["model.name=cnn"] if benchmark == "images" else [])
    flags = _flags(DATA / folder, *pairs)
    runs = {b: _run(tmp_path, b, args + flags + ["--backend", b]) for b in ("local", "ray")}
    summary = runs["local"]
    assert (summary["benchmark"], summary["target"]) == (benchmark, target)
    assert set(summary["source_accuracy"]) == sources
    assert all(0.0 <= a <= 1.0 for a in [summary["target_accuracy"], *summary["source_accuracy"].values()])
    for key in ("target_accuracy", "source_accuracy", "bytes_sent", "bytes_received"):
        assert runs["ray"][key] == summary[key], key


def test_cwru_runs_the_same_on_both_backends(tmp_path, ray_cluster):
    args = ["--benchmark", "cwru", "--target", "3hp", "--sources", "1hp,2hp", "--rounds", "2", "--seed", "1"]
    flags = _flags(DATA / "cwru", "data.samples_per_class=30", "data.max_train_per_domain=150")
    runs = {b: _run(tmp_path, b, args + flags + ["--backend", b]) for b in ("local", "ray")}
    local, ray = runs["local"], runs["ray"]
    assert local["target"] == "3hp" and set(local["source_accuracy"]) == {"1hp", "2hp"}
    assert 0.0 <= local["target_accuracy"] <= 1.0
    for key in ("target_accuracy", "source_accuracy", "bytes_sent", "bytes_received"):
        assert local[key] == ray[key], key


def test_cwru_default_keeps_the_load_shift_that_per_domain_standardization_removes(tmp_path):
    """The authors' task at its defaults (target 1hp = A, sources 2hp and 3hp, no standardization): FedAvg
    source-only stays well below its sources on the target; standardizing each domain by its own statistics
    (an adaptation method of its own) closes most of the gap."""
    args = ["--backend", "local", "--benchmark", "cwru", "--method", "fedavg", "--seed", "0"]
    default = _run(tmp_path, "default", args + _flags(DATA / "cwru"))
    assert default["target"] == "1hp" and set(default["source_accuracy"]) == {"2hp", "3hp"}
    assert min(default["source_accuracy"].values()) > 0.9
    assert default["target_accuracy"] < min(default["source_accuracy"].values()) - 0.08
    per_domain = _run(tmp_path, "per_domain", args + _flags(DATA / "cwru", "data.normalization=per-domain"))
    assert per_domain["target_accuracy"] > default["target_accuracy"] + 0.08


def test_alignment_baselines_keep_their_sources_on_real_cwru(tmp_path):
    """With per-domain standardization and the papers' lambda 1, FedMMD and FedDANN keep every source within 5
    points of FedAvg source-only's on the real recordings (on the unstandardized FFT magnitudes they collapse)."""
    args = ["--backend", "local", "--benchmark", "cwru", "--target", "3hp", "--sources", "1hp,2hp", "--rounds", "20"]
    flags = _flags(DATA / "cwru", "data.normalization=per-domain")
    runs = {m: _run(tmp_path, m, args + flags + ["--method", m]) for m in ("fedavg", "fedmmd", "feddann")}
    assert min(runs["fedavg"]["source_accuracy"].values()) > 0.9
    for method in ("fedmmd", "feddann"):
        for domain, accuracy in runs[method]["source_accuracy"].items():
            assert accuracy >= runs["fedavg"]["source_accuracy"][domain] - 0.05, (method, domain)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--benchmark", "amazon_review", "--target", "kitchen"] + _flags(DATA / "cwru"), "no amazon.mat and no"),
        (
            ["--benchmark", "office_caltech", "--target", "caltech"] + _flags(DATA / "office_caltech10/googlenet1024"),
            "put caltech.mat or caltech10.mat there",
        ),
    ],
)
def test_wrong_or_partial_folder_is_one_line_exit_2(tmp_path, capsys, args, expected):
    out = tmp_path / "never"
    assert main(["run", "-q", "--backend", "local", "--out", str(out)] + args) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1 and not out.exists()
