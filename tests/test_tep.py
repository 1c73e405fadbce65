"""TEP benchmark: simulation mechanics on short runs, the windows benchmark and the snapshot variants (caching,
splits, scaling, options, sources), the 1-D CNN."""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytest.importorskip("tep_studio")

from fedsim.config import DataConfig, data_config  # noqa: E402
from fedsim.data.benchmarks import tep, tep_simulation  # noqa: E402
from fedsim.errors import UserError  # noqa: E402

SHORT = dict(settle_hours=3.0, warmup_hours=0.2)  # the real settings take 60 h; the mechanics are the same


def tep_config(**values) -> DataConfig:
    """The data section of a TEP run (target mode2), with the given keys."""
    return data_config(**{"benchmark": "tep", "target": "mode2", **values})


@pytest.fixture
def short_runs(monkeypatch):
    """Make the benchmark simulate short runs (3 h settling, 0.2 h warm-up)."""
    monkeypatch.setattr(tep_simulation, "SETTLE_HOURS", {m: 3.0 for m in tep.MODES})
    monkeypatch.setattr(tep_simulation, "WARMUP_HOURS", 0.2)


def _separation(x: np.ndarray, y: np.ndarray, label: int) -> float:
    """Largest |mean shift| of class ``label`` from class 0, in units of class 0's per-feature std."""
    normal = x[y == 0].astype(np.float64)
    scale = normal.std(0) + 1e-6 * np.abs(normal.mean(0)) + 1e-9
    return float(np.max(np.abs(x[y == label].mean(0) - normal.mean(0)) / scale))


def test_simulate_shapes_determinism_and_fault_effect():
    classes = ("normal", "idv_01", "idv_04")
    x, y = tep_simulation.simulate_mode("mode1", classes, 10, seed=0, **SHORT)
    assert x.shape == (30, 53) and x.dtype == np.float32 and np.all(np.isfinite(x))
    assert y.dtype == np.int64 and np.array_equal(y, np.repeat(np.arange(3), 10))
    assert np.all((x[:, 6] > 2600) & (x[:, 6] < 2900))  # XMEAS(7) reactor pressure, kPa
    mvs = x[:, 41:]  # XMV(1..12) in %, three held constant by the Ricker strategy
    assert np.all((mvs >= 0) & (mvs <= 100)) and np.sum(mvs.std(0) > 1e-3) == 9
    np.testing.assert_allclose(mvs[:, [4, 8, 11]], np.broadcast_to([22.21, 47.446, 50.0], (30, 3)), rtol=1e-6)
    again, _ = tep_simulation.simulate_mode("mode1", classes, 10, seed=0, **SHORT)
    assert np.array_equal(x, again)  # bit-identical for a seed
    other, _ = tep_simulation.simulate_mode("mode1", classes, 10, seed=1, **SHORT)
    assert not np.array_equal(x, other)
    # Faults move the process well beyond normal variation (step faults: > 5 normal stds within half an hour).
    assert _separation(x, y, 1) > 5 and _separation(x, y, 2) > 5
    # Classes branch with their own noise: two normal runs from one snapshot are not the same samples.
    assert not np.allclose(x[y == 0][:, :22], x[y == 1][:, :22])
    # A class's samples do not depend on which other classes are simulated.
    alone, _ = tep_simulation.simulate_mode("mode1", ("normal", "idv_04"), 10, seed=0, **SHORT)
    assert np.array_equal(alone[10:], x[20:])


def test_branch_snapshot_restores_controller_and_plant():
    """Branching reproduces an uninterrupted run when the branch keeps the settled noise stream."""
    from tep_studio import RickerMultiLoopController, TennesseeEastmanProcess
    from tep_studio.simulation.modes import mode_setpoints

    def run(steps, sim, ctl, meas):
        out = []
        for _ in range(steps):
            action, _ = ctl.compute_action(meas, time=sim.time)
            meas = sim.advance(action, control_interval=0.01, disturbances=np.zeros(28)).measurements
            out.append(meas)
        return np.array(out), meas

    sim = TennesseeEastmanProcess()
    meas, _ = sim.reset(mode="mode2", seed=12345.0)
    ctl = RickerMultiLoopController(setpoints=mode_setpoints("mode2"))
    ctl.reset(meas)
    _, meas = run(100, sim, ctl, meas)
    snap, ctl_copy, meas_copy = sim.snapshot(), copy.deepcopy(ctl), meas.copy()
    straight, _ = run(50, sim, ctl, meas)
    sim.restore(snap)
    branched, _ = run(50, sim, copy.deepcopy(ctl_copy), meas_copy)
    assert np.array_equal(straight, branched)
    # A reseeded branch continues from the same operating point with other noise.
    sim.restore(tep_simulation.reseeded(snap, 12345, 777))
    reseeded, _ = run(50, sim, copy.deepcopy(ctl_copy), meas_copy)
    assert not np.allclose(reseeded, straight)
    assert np.all(np.abs(reseeded.mean(0) - straight.mean(0)) <= 0.05 * np.abs(straight.mean(0)) + 0.5)
    # The generator state sits where tep_simulation.py rewrites it (the seed copies next to it are intact).
    assert tep_simulation.reseeded(snap, 12345, 777).model_bytes != snap.model_bytes
    with pytest.raises(RuntimeError, match="layout"):
        tep_simulation.reseeded(snap, 999, 777)


def test_benchmark_split_cache_and_subsample(tmp_path, short_runs, monkeypatch):
    config = tep_config(cache_dir=str(tmp_path), variant="snapshot", samples_per_class=10)
    bench = tep.TEPBenchmark(config)
    assert bench.domains() == list(tep.MODES)
    dom = bench.load("mode1")
    assert dom.num_classes == 6 and dom.input_shape == (53,)
    assert dom.train_x.shape == (48, 53) and dom.test_x.shape == (12, 53)
    assert np.array_equal(np.bincount(dom.train_y), [8] * 6) and np.array_equal(np.bincount(dom.test_y), [2] * 6)
    assert list(tmp_path.glob("tep-v1-snapshot-n10-seed0-mode1-*.npz"))

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated although the cache holds the mode")

    monkeypatch.setattr(tep_simulation, "simulate_mode", no_simulation)
    cached = tep.TEPBenchmark(config).load("mode1")
    for field in ("train_x", "train_y", "test_x", "test_y"):
        assert np.array_equal(getattr(cached, field), getattr(dom, field))
    small = tep.TEPBenchmark(
        tep_config(cache_dir=str(tmp_path), variant="snapshot", samples_per_class=10, max_train_per_domain=12)
    ).load("mode1")
    assert small.train_x.shape == (12, 53) and np.array_equal(np.bincount(small.train_y), [2] * 6)
    # Every setting that changes the data changes the cache key.
    names = {
        tep.TEPBenchmark(c).cache_name("mode1")
        for c in (
            config,
            tep_config(cache_dir=str(tmp_path), variant="snapshot", samples_per_class=11),
            tep_config(cache_dir=str(tmp_path), variant="snapshot", samples_per_class=10, seed=1),
            tep_config(cache_dir=str(tmp_path), samples_per_class=10, variant="snapshot-hard"),
        )
    }
    assert len(names) == 4


def test_variants_and_settings_errors(tmp_path):
    assert tep.TEPBenchmark(tep_config(variant="snapshot-hard")).classes == (
        "normal",
        "idv_01",
        "idv_02",
        "idv_04",
        "idv_07",
        "idv_13",
        "idv_08",
        "idv_17",
    )
    assert tep.TEPBenchmark(tep_config(variant="snapshot")).classes == tep.VARIANTS["snapshot"]
    no_options = tep.TEPBenchmark(DataConfig(benchmark="tep"))  # no options: the defaults, the windows benchmark
    assert no_options.classes == tep.WINDOW_CLASSES and no_options.windows_per_class == 10
    with pytest.raises(UserError, match="variant"):
        tep_config(variant="harder")  # refused with the config, before any benchmark is built
    with pytest.raises(UserError, match="samples_per_class"):
        tep_config(variant="snapshot", samples_per_class=1)
    with pytest.raises(UserError, match="mode7"):
        tep.TEPBenchmark(tep_config(cache_dir=str(tmp_path))).load("mode7")


def test_sources_pick_the_source_modes(tmp_path, short_runs):
    from fedsim.data.scenario import build_federation

    config = data_config(
        benchmark="tep",
        variant="snapshot",
        cache_dir=str(tmp_path),
        samples_per_class=4,
        target="mode2",
        sources=("mode1", "mode3"),
    )
    assert tep.TEPBenchmark(config).domains() == list(tep.MODES)
    federation = build_federation(config)
    assert [(c.domain, c.role) for c in federation.clients] == [
        ("mode1", "source"),
        ("mode2", "target"),
        ("mode3", "source"),
    ]
    assert federation.num_classes == 6 and federation.input_shape == (53,)
    with pytest.raises(UserError, match="mode9"):
        build_federation(
            data_config(
                benchmark="tep",
                variant="snapshot",
                cache_dir=str(tmp_path),
                samples_per_class=4,
                target="mode2",
                sources=("mode1", "mode9"),
            )
        )


def test_description_is_the_docstring_first_line():
    assert tep.TEPBenchmark.description() == (
        "Tennessee Eastman process (tep-studio): six operating modes, 29 classes, windows of 34 variables x 600 steps"
    )
    assert "snapshot-hard variant" in tep.TEPBenchmark(tep_config(variant="snapshot-hard")).describe()


def test_feature_names():
    names = tep.feature_names()
    assert len(names) == 53 and names[0].startswith("xmeas_01") and names[41].startswith("xmv_01")


# ---------------------------------------------------------------------------------------------- the windows benchmark

TINY = tep_simulation.WindowTiming(settle_hours=1.0, length=8)  # 8 samples of 3 min; the real windows are 600 (30 h)


@pytest.fixture
def short_settling(monkeypatch):
    """Make the windows benchmark settle for 1 h instead of 60-70 h."""
    monkeypatch.setattr(tep_simulation, "SETTLE_HOURS", {m: 1.0 for m in tep.MODES})


def window_config(tmp_path, **values) -> DataConfig:
    """A windows run with tiny sizes: 2 windows of 8 steps per class and mode, simulated in this process."""
    return tep_config(**{"cache_dir": str(tmp_path), "windows_per_class": 2, "window": 8, "workers": 1, **values})


def test_windows_shapes_determinism_and_independence():
    classes = ("normal", "idv_01", "idv_06")
    x, y, intensity, shutdowns = tep_simulation.simulate_windows("mode1", classes, 3, seed=0, timing=TINY, workers=1)
    assert x.shape == (9, 34, 8) and x.dtype == np.float32 and np.all(np.isfinite(x))
    assert y.dtype == np.int64 and np.array_equal(y, np.repeat(np.arange(3), 3))
    assert np.array_equal(intensity, [0.0, 1.0, 1.0]) and np.array_equal(shutdowns, [0, 0, 0])  # idv_06 trips at 7 h
    assert np.all((x[:, 6] > 2600) & (x[:, 6] < 2900))  # channel 7: XMEAS(7), reactor pressure in kPa
    mvs = x[:, 23:]  # XMV(2..12) in %: XMV(5), XMV(9), XMV(12) held constant by the Ricker strategy
    np.testing.assert_allclose(mvs[:, [3, 7, 10]], np.broadcast_to([22.21, 47.446, 50.0], (9, 8, 3)).swapaxes(1, 2))
    assert np.sum(mvs.std(axis=(0, 2)) > 1e-3) == 8
    # Every window is its own noise stream, also within a class.
    assert not np.allclose(x[0, :22], x[1, :22]) and not np.allclose(x[3, :22], x[4, :22])
    again = tep_simulation.simulate_windows("mode1", classes, 3, seed=0, timing=TINY, workers=1)[0]
    assert np.array_equal(x, again)  # bit-identical for a seed
    assert not np.array_equal(x, tep_simulation.simulate_windows("mode1", classes, 3, 1, timing=TINY, workers=1)[0])
    # A window depends on neither the other classes, nor the windows after it, nor the chunks and worker processes.
    alone = tep_simulation.simulate_windows("mode1", ("idv_06",), 2, seed=0, timing=TINY, workers=2)[0]
    assert np.array_equal(alone, x[6:8])
    chunked = tep_simulation.simulate_classes({"mode1": ["idv_01"]}, 3, 0, timings={"mode1": TINY}, chunk_windows=1)
    assert np.array_equal(chunked["mode1", "idv_01"].x, x[3:6]) and np.array_equal(chunked["mode1", "normal"].x, x[:3])
    # The window variables are XMEAS(1..23) and XMV(2..12).
    names = tep.window_variable_names()
    assert len(names) == 34 and names[0].startswith("xmeas_01") and names[22].startswith("xmeas_23")
    assert names[23].startswith("xmv_02") and names[33].startswith("xmv_12")


def test_each_window_starts_from_its_own_state():
    """The normal windows are consecutive segments of one fault-free run; window k of a fault starts where normal
    window k ends."""
    from fedsim.data.benchmarks.tep_compiled import CompiledPlant

    normal, onsets = tep_simulation.fault_free_run("mode2", 3, 0, TINY)
    settle, per_sample = TINY.step_counts()
    kernel_seed = tep_simulation.odd_seed(0, 2, tep_simulation.KEY_KERNEL)
    plant = CompiledPlant("mode2", kernel_seed, TINY.control_interval, tep_simulation.TEP_STUDIO_MS_FLAG | 0x80)
    meas, mvs = np.array(tep_simulation.WINDOW_MEASUREMENTS), np.array(tep_simulation.WINDOW_MVS)
    plant.run(np.zeros(28), settle, 0, per_sample, meas, mvs)
    segments, ends = [], []
    for _ in range(3):
        segments.append(plant.run(np.zeros(28), 0, TINY.length, per_sample, meas, mvs)[0].T.astype(np.float32))
        ends.append(plant.snapshot()[0].model_bytes)
    assert np.array_equal(normal, np.array(segments))  # one run, cut in three
    assert [o.plant.model_bytes for o in onsets] == ends  # window k's onset: the end of segment k
    assert [o.plant.time for o in onsets] == pytest.approx([1.4, 1.8, 2.2])  # 1 h settling + k windows of 0.4 h
    assert len({o.plant.state.tobytes() for o in onsets}) == 3  # three states, not one snapshot
    assert np.array_equal(tep_simulation.fault_free_run("mode2", 2, 0, TINY)[0], normal[:2])
    # Faulty windows of different onsets differ, the same onset and stream give the same window.
    faulty = tep_simulation.faulty_windows("mode2", "idv_04", 0, [0, 2], [onsets[0], onsets[2]], 0, TINY)
    again = tep_simulation.faulty_windows("mode2", "idv_04", 0, [2], [onsets[2]], 0, TINY)
    assert np.array_equal(faulty[1], again[0]) and not np.allclose(faulty[0], faulty[1])


def test_fault_intensity_scales_the_disturbance():
    """With MSFlag 0x80 the kernel scales an IDV by its value (without, 0.25 would switch it off, 0.75 fully on)."""
    _, onsets = tep_simulation.fault_free_run("mode1", 1, 0, TINY)
    kernel_seed, plant = tep_simulation._window_plant("mode1", 0, TINY)
    meas, mvs = np.array(tep_simulation.WINDOW_MEASUREMENTS), np.array(tep_simulation.WINDOW_MVS)

    def window(intensity: float) -> np.ndarray:
        plant.restore(tep_simulation.reseeded(onsets[0].plant, kernel_seed, 12345), onsets[0].memories, onsets[0].meas)
        idv = tep_simulation.idv_vector("idv_04") * intensity  # reactor cooling water inlet temperature step
        return plant.run(idv, 0, 20, 5, meas, mvs)[0].T  # 1 h

    base = window(0.0)
    shift = {i: float(np.abs(window(i)[8, -5:] - base[8, -5:]).mean()) for i in (0.25, 0.5, 1.0)}  # XMEAS(9)
    assert 0.0 < shift[0.25] < shift[0.5] < shift[1.0]


def test_intensity_falls_back_as_the_authors(monkeypatch):
    """A fault runs at the highest intensity at which a window completes; the windows that shut down there are left
    out; a fault that trips every window at every intensity is an error."""
    real = tep_simulation.faulty_windows
    tried = []

    def tripping(mode, cls, level, windows, onsets, seed, timing):
        tried.append((level, list(windows)))
        out = real(mode, cls, level, windows, onsets, seed, timing)
        return [None if level < 2 or k == 1 else w for k, w in zip(windows, out)]  # 100 %, 75 %: all trip

    monkeypatch.setattr(tep_simulation, "faulty_windows", tripping)
    result = tep_simulation.simulate_classes({"mode2": ["idv_13"]}, 3, 0, timings={"mode2": TINY}, workers=1)
    windows = result["mode2", "idv_13"]
    assert windows.intensity == 0.5 and windows.shutdowns == 7 and windows.x.shape == (2, 34, 8)
    assert np.array_equal(windows.window, [0, 2])
    assert sorted((level, k) for level, part in tried for k in part) == [(lv, k) for lv in range(3) for k in range(3)]
    assert result["mode2", "normal"].x.shape == (3, 34, 8)

    monkeypatch.setattr(tep_simulation, "faulty_windows", lambda *args: [None] * len(args[3]))
    with pytest.raises(UserError, match="idv_13 shuts the plant down in every window at every intensity"):
        tep_simulation.simulate_classes({"mode2": ["idv_13"]}, 2, 0, timings={"mode2": TINY}, workers=1)


def test_windows_benchmark_split_scaling_and_cache(tmp_path, short_settling, monkeypatch):
    config = window_config(tmp_path)
    bench = tep.TEPBenchmark(config)
    assert bench.windows and bench.default_normalization == "none" and bench.classes == tep.WINDOW_CLASSES
    dom = bench.load("mode3")
    assert dom.num_classes == 29 and dom.input_shape == (34, 8)
    assert dom.train_x.shape == (29, 34, 8) and dom.test_x.shape == (29, 34, 8)  # 2 windows a class: 1 + 1
    assert np.array_equal(np.bincount(dom.train_y), [1] * 29) and np.array_equal(np.bincount(dom.test_y), [1] * 29)
    files = list(tmp_path.glob("tep-w2-windows-n2-l8-seed0-mode3-*.npz"))
    assert len(files) == 29 and len(list(tmp_path.glob("tep-w2-*-mode3-*-idv_28.npz"))) == 1  # a file a class
    # Each variable standardized by the training windows' mean and std over windows and time steps.
    means, stds = dom.train_x.mean(axis=(0, 2)), dom.train_x.std(axis=(0, 2))
    varying = stds > 0.5
    assert varying.sum() == 31  # XMV(5), XMV(9), XMV(12) are constant: centred to 0
    np.testing.assert_allclose(means, 0.0, atol=1e-5)
    np.testing.assert_allclose(stds[varying], 1.0, rtol=1e-4)
    assert np.all(dom.train_x[:, ~varying] == 0.0)
    raw = tep.TEPBenchmark(window_config(tmp_path, scaling="none")).load("mode3")  # same cache, no scaling
    assert np.array_equal(raw.train_y, dom.train_y) and np.array_equal(raw.test_y, dom.test_y)
    train = raw.train_x[:, varying].astype(np.float64)
    expected = (raw.test_x[:, varying] - train.mean(axis=(0, 2))[:, None]) / train.std(axis=(0, 2))[:, None]
    np.testing.assert_allclose(dom.test_x[:, varying], expected, rtol=1e-4, atol=1e-4)
    assert len(list(tmp_path.glob("*.npz"))) == 29

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated although the cache holds the mode")

    monkeypatch.setattr(tep_simulation, "simulate_classes", no_simulation)
    cached = tep.TEPBenchmark(window_config(tmp_path, workers=2)).load("mode3")  # workers: not part of the key
    for field in ("train_x", "train_y", "test_x", "test_y"):
        assert np.array_equal(getattr(cached, field), getattr(dom, field))
    names = {
        tep.TEPBenchmark(c).cache_name("mode3")
        for c in (config, window_config(tmp_path, seed=1), tep_config(cache_dir=str(tmp_path), window=8, workers=1))
    }
    assert len(names) == 3


def test_default_run_builds_the_windows_with_the_cnn(tmp_path, short_settling):
    from fedsim.config import ModelConfig
    from fedsim.data.scenario import build_federation, resolve_normalization
    from fedsim.models import build_model

    config = window_config(tmp_path, sources=("mode1",))
    federation = build_federation(config)
    assert federation.num_classes == 29 and federation.input_shape == (34, 8)
    assert [(c.domain, c.role) for c in federation.clients] == [("mode1", "source"), ("mode2", "target")]
    assert resolve_normalization(config) == "none"
    assert resolve_normalization(tep_config(variant="snapshot")) == "federated"
    model = build_model(ModelConfig(), (34, 600), 29)  # model.name=auto
    assert [type(m).__name__ for m in model.encoder] == ["Conv1d", "InstanceNorm1d", "ReLU"] * 3 + ["TimeMean"]
    assert [m.kernel_size for m in model.encoder if hasattr(m, "kernel_size")] == [(9,), (5,), (3,)]
    assert sum(p.numel() for p in model.encoder.parameters()) == 301_824  # the authors' 301 K
    import torch

    with torch.no_grad():
        assert model(torch.zeros(3, 34, 600)).shape == (3, 29) and model.features(torch.zeros(3, 34, 8)).shape == (
            3,
            128,
        )
    with pytest.raises(UserError, match="cnn1d takes time series"):
        build_model(ModelConfig(name="cnn1d"), (53,), 6)


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(windows_per_class=1), "data.windows_per_class must be an integer of at least 2"),
        (dict(window=0), "data.window must be an integer of at least 2"),
        (dict(workers=0), "data.workers must be an integer of at least 1"),
        (dict(windows_per_class=2.5), "data.windows_per_class must be an integer"),
        (dict(scaling="global"), "tep scaling"),
        (dict(samples_per_class=10), "data.samples_per_class only applies to the snapshot variants"),
        (dict(variant="snapshot", windows_per_class=10), "data.windows_per_class only applies to the windows variant"),
        (dict(variant="snapshot", scaling="none"), "data.scaling only applies to the windows variant"),
    ],
)
def test_bad_window_options_are_one_line(values, message):
    with pytest.raises(UserError, match=message) as info:
        tep_config(**values)
    assert "\n" not in str(info.value)


def test_data_prepare_builds_the_cache_a_run_reads(tmp_path, short_settling, monkeypatch, capsys):
    import argparse

    from fedsim.experiments import prepare

    parser = argparse.ArgumentParser()
    prepare.add_parser(parser.add_subparsers(dest="command"))
    sets = [f"data.cache_dir={tmp_path}", "data.windows_per_class=2", "data.window=8"]
    argv = ["data", "prepare", "tep", "--domains", "mode4", "--workers", "1", "-q"]
    args = parser.parse_args(argv + [x for s in sets for x in ("--set", s)])
    assert prepare.run(args) == 0 and "1 domains ready" in capsys.readouterr().out
    assert len(list(tmp_path.glob("tep-w2-windows-n2-l8-seed0-mode4-*.npz"))) == 29

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated although prepare built the cache")

    monkeypatch.setattr(tep_simulation, "simulate_classes", no_simulation)
    assert tep.TEPBenchmark(window_config(tmp_path)).load("mode4").train_x.shape == (29, 34, 8)
    with pytest.raises(UserError, match="data settings only"):
        prepare.run(parser.parse_args(["data", "prepare", "tep", "--set", "method.lr=1"]))
    with pytest.raises(UserError, match="--workers"):
        prepare.run(parser.parse_args(["data", "prepare", "tep", "--workers", "0"]))
