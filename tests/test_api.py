"""The Python API: ``fedsim.run`` returns the summary and the per-round history, as ``fedsim run`` writes them."""

import subprocess
import sys

import pytest

import fedsim
from fedsim.errors import UserError


def test_readme_example_runs_and_returns_summary_and_history(toy_root, tmp_path):
    result = fedsim.run(
        method="fedavg",
        benchmark="npz",
        target="dom1",
        rounds=2,
        backend="local",
        set={"data.root": toy_root, "data.cache_dir": str(tmp_path / "cache"), "method.batch_size": 16},
    )
    assert result.summary["method"] == "fedavg" and result.summary["rounds"] == 2
    assert [m["round"] for m in result.history] == [1, 2]
    assert result.summary["target_accuracy"] == result.history[-1]["target_accuracy"]
    assert 0.34 < result.summary["target_accuracy"] <= 1.0  # 3 balanced classes: better than chance after 2 rounds
    assert set(result.summary["source_accuracy"]) == {"dom0", "dom2"}


def test_run_with_a_config_object_and_an_out_dir_matches_the_keywords(toy_overrides, tmp_path):
    from fedsim.config import load_config

    config = load_config(None, toy_overrides + ["run.backend=local", "run.rounds=1"])
    first = fedsim.run(config, out=tmp_path / "run")
    second = fedsim.run(config, rounds=1)
    assert first.summary["target_accuracy"] == second.summary["target_accuracy"]
    assert (tmp_path / "run" / "summary.json").is_file()


def test_unknown_keyword_is_named():
    with pytest.raises(UserError, match=r"unknown argument\(s\) \['roundz'\]"):
        fedsim.run(roundz=3)


def test_import_fedsim_imports_neither_ray_nor_torch():
    code = "import sys, fedsim; fedsim.run; print('ray' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False"
    code = "import sys, fedsim; print('ray' in sys.modules, 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == [
        "False",
        "False",
    ]
