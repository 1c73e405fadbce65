"""The compiled TEP loop against tep-studio: the same trajectories bit for bit, the same shutdowns, and snapshots
that continue a run exactly."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tep_studio")
pytest.importorskip("numba")

from fedsim.data.benchmarks import tep_compiled, tep_simulation  # noqa: E402

FLAG = tep_simulation.TEP_STUDIO_MS_FLAG | tep_simulation.SCALED_IDV_FLAG
ALL_MEAS, ALL_MVS = np.arange(41), np.arange(12)


def reference(mode: str, seed: int, idv: np.ndarray, steps: int):
    """tep-studio's own loop: every interval's 41 measurements and 12 implemented MVs, and the shutdown line."""
    plant = tep_simulation.ControlledPlant(mode, seed, 0.01, FLAG)
    rows = []
    for _ in range(steps):
        try:
            result = plant.step(idv, "the test")
        except tep_simulation.PlantShutdown as exc:
            return np.array(rows), plant.sim.time, str(exc)
        rows.append(np.concatenate([result.measurements, result.implemented_action]))
    return np.array(rows), plant.sim.time, None


def disturbance(number: int, intensity: float = 1.0) -> np.ndarray:
    idv = np.zeros(28)
    if number:
        idv[number - 1] = intensity
    return idv


@pytest.mark.parametrize(
    "mode, idv, intensity", [("mode1", 0, 0.0), ("mode2", 4, 1.0), ("mode3", 1, 0.75), ("mode5", 13, 1.0)]
)
def test_trajectories_equal_tep_studio(mode, idv, intensity):
    """Every measurement and MV of 150 control intervals (1.5 h) from the mode's reset, bit for bit."""
    expected, end, shutdown = reference(mode, 4321, disturbance(idv, intensity), 150)
    plant = tep_compiled.CompiledPlant(mode, 4321, 0.01, FLAG)
    rows, tripped = plant.run(disturbance(idv, intensity), 0, 150, 1, ALL_MEAS, ALL_MVS)
    assert shutdown is None and not tripped
    assert np.array_equal(rows, expected)
    assert plant.time == end and np.array_equal(plant.sim.state, plant.state)


def test_shutdown_at_the_same_interval_as_tep_studio():
    """IDV(6), the A feed loss, trips mode 1 after about 7.5 h: the same interval, the same samples and message."""
    expected, end, message = reference("mode1", 12345, disturbance(6), 1000)
    assert message is not None and "Low Stripper Liquid Level" in message
    plant = tep_compiled.CompiledPlant("mode1", 12345, 0.01, FLAG)
    rows, tripped = plant.run(disturbance(6), 0, 1000, 1, ALL_MEAS, ALL_MVS)
    assert tripped and plant.time == end
    assert np.array_equal(rows[: len(expected)], expected)
    assert plant.shutdown_message() in message


def test_snapshot_continues_the_run_and_skip_records_later():
    plant = tep_compiled.CompiledPlant("mode2", 99, 0.01, FLAG)
    normal = np.zeros(28)
    plant.run(normal, 30, 0, 5, ALL_MEAS, ALL_MVS)  # 30 intervals unrecorded
    snapshot = plant.snapshot()
    straight, _ = plant.run(normal, 0, 4, 5, ALL_MEAS, ALL_MVS)
    plant.restore(*snapshot)
    again, _ = plant.run(normal, 0, 4, 5, ALL_MEAS, ALL_MVS)
    assert np.array_equal(straight, again)
    # The same 50 intervals in one call, the first 30 skipped: the same samples.
    fresh = tep_compiled.CompiledPlant("mode2", 99, 0.01, FLAG)
    skipped, _ = fresh.run(normal, 30, 4, 5, ALL_MEAS, ALL_MVS)
    assert np.array_equal(skipped, straight)


def test_only_tep_studios_default_controller():
    from tep_studio import RickerMultiLoopController

    with pytest.raises(ValueError, match="defaults only"):
        tep_compiled.ControllerTable(RickerMultiLoopController(enable_overrides=True))
