"""The benchmark scripts run and print their figures (smoke runs on tiny settings; no timing is asserted)."""
import re
import subprocess
import sys


def _run(*args, timeout=300):
    result = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_overhead_three_ways_agree():
    out = _run("experiments.benchmarks.overhead")
    for way in ("floor: plain serial torch loop", "fedsim local backend", "fedsim Ray backend"):
        assert re.search(re.escape(way) + r".*\d+\.\d+", out), out
    assert "accuracies agree: True" in out
    assert "RSS by process at the last round" in out and "ray::ClientActor" in out


def test_scale_prints_rounds_memory_and_flatness(tmp_path):
    out = _run("experiments.benchmarks.scale", "--sizes", "40", "--rounds", "3", "--flat-rounds", "70")
    assert re.search(r"features, 40 clients .*mean round .*peak RSS", out), out
    assert re.search(r"flat memory, 1000 clients, rounds 10-40 vs 41-70 .*object store", out), out


def test_scale_rejects_a_too_short_flatness_run():
    result = subprocess.run([sys.executable, "-m", "experiments.benchmarks.scale", "--flat-rounds", "20"], capture_output=True, text=True)
    assert result.returncode == 2 and "--flat-rounds must be at least 70" in result.stderr


def test_feddadil_ot_reports_the_pot_share(toy_root, tmp_path):
    out = _run("experiments.benchmarks.feddadil_ot", "--benchmark", "npz", "--target", "dom1", "--rounds", "2",
               "--set", f"data.root={toy_root}", "--set", f"data.cache_dir={tmp_path}", "--set", "method.samples_per_atom=20", "--set", "method.batch_size=16")
    assert re.search(r"of the time inside POT calls", out), out
