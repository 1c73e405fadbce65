"""TEP benchmark: simulation mechanics on short runs, caching, splits, variants, sources."""

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
    config = tep_config(cache_dir=str(tmp_path), samples_per_class=10)
    bench = tep.TEPBenchmark(config)
    assert bench.domains() == list(tep.MODES)
    dom = bench.load("mode1")
    assert dom.num_classes == 6 and dom.input_shape == (53,)
    assert dom.train_x.shape == (48, 53) and dom.test_x.shape == (12, 53)
    assert np.array_equal(np.bincount(dom.train_y), [8] * 6) and np.array_equal(np.bincount(dom.test_y), [2] * 6)
    assert list(tmp_path.glob("tep-v1-default-n10-seed0-mode1-*.npz"))

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated although the cache holds the mode")

    monkeypatch.setattr(tep_simulation, "simulate_mode", no_simulation)
    cached = tep.TEPBenchmark(config).load("mode1")
    for field in ("train_x", "train_y", "test_x", "test_y"):
        assert np.array_equal(getattr(cached, field), getattr(dom, field))
    small = tep.TEPBenchmark(tep_config(cache_dir=str(tmp_path), samples_per_class=10, max_train_per_domain=12)).load(
        "mode1"
    )
    assert small.train_x.shape == (12, 53) and np.array_equal(np.bincount(small.train_y), [2] * 6)
    # Every setting that changes the data changes the cache key.
    names = {
        tep.TEPBenchmark(c).cache_name("mode1")
        for c in (
            config,
            tep_config(cache_dir=str(tmp_path), samples_per_class=11),
            tep_config(cache_dir=str(tmp_path), samples_per_class=10, seed=1),
            tep_config(cache_dir=str(tmp_path), samples_per_class=10, variant="hard"),
        )
    }
    assert len(names) == 4


def test_variants_and_settings_errors(tmp_path):
    assert tep.TEPBenchmark(tep_config(variant="hard")).classes == (
        "normal",
        "idv_01",
        "idv_02",
        "idv_04",
        "idv_07",
        "idv_13",
        "idv_08",
        "idv_17",
    )
    assert tep.TEPBenchmark(DataConfig(benchmark="tep")).classes == tep.VARIANTS["default"]  # no options: defaults
    with pytest.raises(UserError, match="variant"):
        tep_config(variant="harder")  # refused with the config, before any benchmark is built
    with pytest.raises(UserError, match="samples_per_class"):
        tep_config(samples_per_class=1)
    with pytest.raises(UserError, match="mode7"):
        tep.TEPBenchmark(tep_config(cache_dir=str(tmp_path))).load("mode7")


def test_sources_pick_the_source_modes(tmp_path, short_runs):
    from fedsim.data.scenario import build_federation

    config = data_config(
        benchmark="tep", cache_dir=str(tmp_path), samples_per_class=4, target="mode2", sources=("mode1", "mode3")
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
                cache_dir=str(tmp_path),
                samples_per_class=4,
                target="mode2",
                sources=("mode1", "mode9"),
            )
        )


def test_description_is_the_docstring_first_line():
    assert tep.TEPBenchmark.description() == (
        "Tennessee Eastman process (tep-studio): six operating modes, normal + faults, 53 raw features"
    )


def test_feature_names():
    names = tep.feature_names()
    assert len(names) == 53 and names[0].startswith("xmeas_01") and names[41].startswith("xmv_01")
