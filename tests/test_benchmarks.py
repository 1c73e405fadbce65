"""The benchmark scripts run and print consistent figures (smoke runs on tiny settings; no timing target is
asserted)."""

import re
import subprocess
import sys

NUMBER = r"(\d+(?:\.\d+)?)"
WAYS = ("floor: plain serial torch loop", "fedsim local backend", "fedsim Ray backend (2 actors)")


def _run(*args, timeout=300):
    result = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _overhead_rows(out: str) -> dict[str, list[float]]:
    """way -> [rounds s, rounds/floor, whole s, whole/floor, peak RSS GiB, PSS GiB, processes, usps accuracy]."""
    rows = {}
    for way in WAYS:
        match = re.search("^" + re.escape(way) + r"\s+" + r"\s+".join([NUMBER] * 8) + r"\s*$", out, re.M)
        assert match, (way, out)
        rows[way] = [float(v) for v in match.groups()]
    return rows


def test_overhead_three_ways_agree():
    out = _run("tools.benchmarks.overhead")
    rows = _overhead_rows(out)
    floor_rounds, _, floor_whole = rows[WAYS[0]][:3]
    for way, (rounds, rounds_ratio, whole, whole_ratio, rss, pss, processes, accuracy) in rows.items():
        assert 0 < rounds <= whole, way
        assert abs(rounds_ratio - rounds / floor_rounds) <= 0.01 and abs(whole_ratio - whole / floor_whole) <= 0.01, way
        assert 0 < pss <= rss and processes >= 1, way
        assert 0.1 < accuracy <= 1.0, way  # above chance on the other domain, after 5 rounds
    assert rows[WAYS[0]][1] == rows[WAYS[0]][3] == 1.0
    assert rows[WAYS[0]][6] == rows[WAYS[1]][6] == 1 and rows[WAYS[2]][6] >= 4  # driver, server and two client actors
    assert len({row[7] for row in rows.values()}) == 1  # the same model, bit for bit, three ways
    floor_usps = float(re.search(r"floor accuracies: \{'usps': " + NUMBER, out).group(1))
    assert abs(floor_usps - rows[WAYS[0]][7]) <= 5e-5
    ray = re.search(
        r"cluster start-up " + NUMBER + r" s, run_experiment " + NUMBER + r" s \(of which rounds " + NUMBER + r" s\)",
        out,
    )
    assert ray, out
    start, run, rounds = (float(v) for v in ray.groups())
    assert start > 0 and abs(rounds - rows[WAYS[2]][0]) <= 0.01 and rounds <= run
    actors = [float(v) for v in re.findall(r"ray::ClientActor " + NUMBER, out)]
    assert len(actors) == 2 and all(v > 0 for v in actors)


def test_scale_prints_rounds_memory_and_flatness(tmp_path):
    out = _run("tools.benchmarks.scale", "--sizes", "40", "--rounds", "3", "--flat-rounds", "70")
    size = re.search(
        r"features, 40 clients .*clients\s+(\d+)\s+mean round\s+"
        + NUMBER
        + r" s\s+median\s+"
        + NUMBER
        + r" s\s+final eval round\s+"
        + NUMBER
        + r" s\s+wall\s+"
        + NUMBER
        + r" s\s+peak RSS\s+"
        + NUMBER
        + r" GiB \((\d+) processes\)",
        out,
    )
    assert size, out
    clients, mean, median, final, wall, peak, processes = (float(v) for v in size.groups())
    assert clients == 40 and 0 < mean < wall and 0 < median < wall and 0 < final < wall and peak > 0 and processes >= 2
    flat = re.search(r"flat memory, 1000 clients, rounds 10-40 vs 41-70 \(peaks\): (.*)", out)
    assert flat, out
    parts = re.findall(
        r"(driver RSS|all processes RSS|object store) " + NUMBER + r" -> " + NUMBER + r" MiB \(([+-]\d+\.\d) %\)",
        flat.group(1),
    )
    assert [p[0] for p in parts] == ["driver RSS", "all processes RSS", "object store"], flat.group(1)
    for name, early, late, growth in parts:
        early, late = float(early), float(late)
        assert late >= 0 and (name == "object store" or early > 0), name
        if early >= 1:  # the printed growth is the change of the printed (rounded) figures, within rounding
            assert abs(float(growth) - 100 * (late - early) / early) <= 1 + 100 / early, (name, early, late, growth)


def test_scale_rejects_a_too_short_flatness_run():
    result = subprocess.run(
        [sys.executable, "-m", "tools.benchmarks.scale", "--flat-rounds", "20"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "--flat-rounds must be at least 70" in result.stderr


def test_feddadil_ot_reports_the_ot_share(toy_root, tmp_path):
    out = _run(
        "tools.benchmarks.feddadil_ot",
        "--benchmark",
        "npz",
        "--target",
        "dom1",
        "--rounds",
        "2",
        "--set",
        f"data.root={toy_root}",
        "--set",
        f"data.cache_dir={tmp_path}",
        "--set",
        "method.samples_per_atom=20",
        "--set",
        "method.batch_size=16",
    )
    rows = re.findall(r"^\s*(\d+)\s+(\S+)\s+" + NUMBER + r"\s+" + NUMBER + r"\s+(\d+)\s+" + NUMBER + "%", out, re.M)
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 2, out
    for _, _, seconds, pot, calls, share in rows:
        assert float(seconds) > 0 and 0 <= float(pot) <= float(seconds) + 0.01 and int(calls) >= 0
        assert abs(float(share) - 100 * float(pot) / float(seconds)) <= 0.1 + 100 * 0.01 / float(seconds)
    total = re.search(r"dictionary rounds without evaluation: " + NUMBER + " % of the time inside OT calls", out)
    assert total and 0 < float(total.group(1)) <= 100, out
    assert any(r[1] == "dictionary" and int(r[4]) > 0 for r in rows)  # the dictionary rounds do solve OT problems


def test_layout_prints_both_layouts_of_every_image_model_and_their_agreement():
    out = _run("tools.benchmarks.layout", "--steps", "2", "--detector-steps", "1", "--repeats", "1")
    models = ["lenet5, 1x28x28", "cnn, 1x28x28", "cnn, 3x32x32"]
    if "detector left out" not in out:
        models.append("detector, 3x128x128")
    for model in models:
        row = r"\s+".join([NUMBER] * 2 + [NUMBER + "x"] + [NUMBER] * 2 + [NUMBER + "x"]) + r"\s+(\S+)"
        match = re.search("^" + re.escape(model) + r"\s+" + row + r"\s*$", out, re.M)
        assert match, (model, out)
        train, train_cl, ratio, ev, ev_cl, ev_ratio, difference = (float(v) for v in match.groups())
        assert min(train, train_cl, ev, ev_cl) > 0
        assert abs(ratio - train_cl / train) < 0.02 and abs(ev_ratio - ev_cl / ev) < 0.02
        assert difference < 1e-4  # the same computation, rounded in another order
