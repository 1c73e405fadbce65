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
    # A window depends on neither the other classes, nor the windows after it, nor the worker processes.
    alone = tep_simulation.simulate_windows("mode1", ("idv_06",), 2, seed=0, timing=TINY, workers=2)[0]
    assert np.array_equal(alone, x[6:8])
    # The window variables are XMEAS(1..23) and XMV(2..12).
    names = tep.window_variable_names()
    assert len(names) == 34 and names[0].startswith("xmeas_01") and names[22].startswith("xmeas_23")
    assert names[23].startswith("xmv_02") and names[33].startswith("xmv_12")


def test_fault_intensity_scales_the_disturbance():
    """With MSFlag 0x80 the kernel scales an IDV by its value (without, 0.25 would switch it off, 0.75 fully on)."""
    settled = tep_simulation.settle_mode("mode1", 0, TINY)
    kernel_seed, snapshot, controller, meas = settled
    flag = tep_simulation.TEP_STUDIO_MS_FLAG | tep_simulation.SCALED_IDV_FLAG
    plant = tep_simulation.ControlledPlant("mode1", kernel_seed, TINY.control_interval, flag)

    def window(intensity: float) -> np.ndarray:
        plant.restore(tep_simulation.reseeded(snapshot, kernel_seed, 12345), controller, meas)
        idv = tep_simulation.idv_vector("idv_04") * intensity  # reactor cooling water inlet temperature step
        return tep_simulation.record_window(plant, idv, "test", 20, 5)  # 1 h

    base = window(0.0)
    shift = {i: float(np.abs(window(i)[8, -5:] - base[8, -5:]).mean()) for i in (0.25, 0.5, 1.0)}  # XMEAS(9)
    assert 0.0 < shift[0.25] < shift[0.5] < shift[1.0]


def test_intensity_falls_back_after_shutdowns(monkeypatch):
    """Windows that shut the plant down are retried with other noise, then at the next lower intensity."""
    record = tep_simulation.record_window
    tried = []

    def tripping(plant, idv, what, length, per_sample):
        tried.append(float(idv.max()))
        if idv.max() > 0.6:  # 100 % and 75 % shut down
            raise tep_simulation.PlantShutdown("tripped")
        return record(plant, idv, what, length, per_sample)

    monkeypatch.setattr(tep_simulation, "record_window", tripping)
    settled = tep_simulation.settle_mode("mode2", 0, TINY)
    result = tep_simulation.class_windows("mode2", "idv_13", 3, 0, settled, TINY)
    assert result.intensity == 0.5 and result.shutdowns == 6 and result.x.shape == (3, 34, 8)
    assert tried == [1.0] * 3 + [0.75] * 3 + [0.5] * 3

    def always(*args):
        raise tep_simulation.PlantShutdown("tripped")

    monkeypatch.setattr(tep_simulation, "record_window", always)
    with pytest.raises(UserError, match="idv_13 shuts the plant down at every intensity"):
        tep_simulation.class_windows("mode2", "idv_13", 2, 0, settled, TINY)
    with pytest.raises(tep_simulation.PlantShutdown):  # normal operation has nothing to fall back on
        tep_simulation.class_windows("mode2", "normal", 2, 0, settled, TINY)


def test_windows_benchmark_split_scaling_and_cache(tmp_path, short_settling, monkeypatch):
    config = window_config(tmp_path)
    bench = tep.TEPBenchmark(config)
    assert bench.windows and bench.default_normalization == "none" and bench.classes == tep.WINDOW_CLASSES
    dom = bench.load("mode3")
    assert dom.num_classes == 29 and dom.input_shape == (34, 8)
    assert dom.train_x.shape == (29, 34, 8) and dom.test_x.shape == (29, 34, 8)  # 2 windows a class: 1 + 1
    assert np.array_equal(np.bincount(dom.train_y), [1] * 29) and np.array_equal(np.bincount(dom.test_y), [1] * 29)
    files = list(tmp_path.glob("tep-w1-windows-n2-l8-seed0-mode3-*.npz"))
    assert len(files) == 1
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
    assert len(list(tmp_path.glob("*.npz"))) == 1

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated although the cache holds the mode")

    monkeypatch.setattr(tep_simulation, "simulate_windows", no_simulation)
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
