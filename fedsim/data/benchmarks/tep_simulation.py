"""Simulating one operating mode of the Tennessee Eastman process with ``tep-studio``.

:func:`simulate_mode` settles the plant in a mode, snapshots plant and controller, and
branches every class from that snapshot with its own noise stream (the method is
described in :mod:`fedsim.data.benchmarks.tep`). The times below are the defaults;
tests pass shorter ones to check the mechanics cheaply.
"""

from __future__ import annotations

import copy
import dataclasses
import struct
from typing import Optional, Sequence

import numpy as np

from fedsim.errors import UserError

MODES: tuple[str, ...] = ("mode1", "mode2", "mode3", "mode4", "mode5", "mode6")
# Fixed per-class stream keys, so a class's samples do not depend on the variant it is in.
CLASS_KEYS: dict[str, int] = {"normal": 0, **{f"idv_{i:02d}": i for i in range(1, 29)}}
NUM_FEATURES = 53  # XMEAS(1..41) then XMV(1..12)

SETTLE_HOURS: dict[str, float] = {
    "mode1": 60.0,
    "mode2": 60.0,
    "mode3": 60.0,
    "mode4": 60.0,
    "mode5": 70.0,
    "mode6": 60.0,
}
WARMUP_HOURS = 1.0  # discarded after the fault onset (20 samples)
SAMPLE_HOURS = 0.05  # 3 min between samples
CONTROL_INTERVAL = 0.01  # hours between controller moves (the plant integrates at 0.0005 h inside)

# struct stModelData (temexd_mod.c) starts with ProcessValues (xmeas 41, xmeasadd 32,
# xmeasdist 21, xmeasmonitor 62, xmeascomp 96, xmv 12 doubles) and DistVector (idv 29
# doubles), then RandState {g, measnoise, procdist}. Without MSFlag bit 0x20 every
# random draw (measurement noise and disturbance processes) comes from ``g``.
RANDSTATE_OFFSET = 8 * (41 + 32 + 21 + 62 + 96 + 12 + 29)
SEPARATE_STREAMS_FLAG = 0x20

KEY_KERNEL = 1
KEY_BRANCH = 2


def odd_seed(seed: int, *keys: int) -> int:
    """A kernel seed in [1, 2**32): the model's generator is x <- 9228907 x mod 2**32, odd seeds keep its period."""
    state = np.random.SeedSequence([int(seed)] + [int(k) for k in keys]).generate_state(1, dtype=np.uint32)[0]
    return int(state) | 1


def idv_vector(cls: str) -> np.ndarray:
    """The 28 disturbance switches of a class: all off for ``normal``, one on for ``idv_NN``."""
    idv = np.zeros(28, dtype=np.float64)
    if cls != "normal":
        idv[int(cls.split("_")[1]) - 1] = 1.0
    return idv


def reseeded(snapshot, kernel_seed: int, branch_seed: int):
    """The plant snapshot with the model's random generator state replaced by ``branch_seed``."""
    g, measnoise, procdist = struct.unpack_from("@3d", snapshot.model_bytes, RANDSTATE_OFFSET)
    if measnoise != float(kernel_seed) or procdist != float(kernel_seed):
        raise RuntimeError(
            "the installed tep-studio's model layout differs from the one this benchmark was written for "
            f"(random state at byte {RANDSTATE_OFFSET} reads {measnoise!r}, {procdist!r}, expected the seed "
            f"{kernel_seed}); reinstall tep-studio 0.2.0"
        )
    data = bytearray(snapshot.model_bytes)
    struct.pack_into("@d", data, RANDSTATE_OFFSET, float(branch_seed))
    return dataclasses.replace(snapshot, model_bytes=bytes(data))


def steps(hours: float, control_interval: float, what: str) -> int:
    """``hours`` as a whole number of control intervals."""
    count = hours / control_interval
    if count < 0 or abs(count - round(count)) > 1e-6:
        raise ValueError(
            f"{what} ({hours} h) must be a non-negative multiple of the control interval ({control_interval} h)"
        )
    return int(round(count))


class ControlledPlant:
    """The plant and its controller, advanced together one control interval at a time."""

    def __init__(self, mode: str, kernel_seed: int, control_interval: float):
        from tep_studio import RickerMultiLoopController, TennesseeEastmanProcess
        from tep_studio.simulation.modes import mode_setpoints

        self.mode = mode
        self.control_interval = control_interval
        self.sim = TennesseeEastmanProcess()
        if self.sim.ms_flag & SEPARATE_STREAMS_FLAG:
            raise RuntimeError("tep-studio now draws from separate random streams (MSFlag 0x20): update reseeded")
        self.meas, _ = self.sim.reset(mode=mode, seed=float(kernel_seed))
        self.controller = RickerMultiLoopController(setpoints=mode_setpoints(mode))
        self.controller.reset(self.meas, time=self.sim.time)
        # The schema and loop registry are immutable and shared; only the loop memories are copied.
        self._shared = {
            id(self.controller.schema): self.controller.schema,
            id(self.controller.registry): self.controller.registry,
        }

    def step(self, idv: np.ndarray, what: str):
        action, _ = self.controller.compute_action(self.meas, time=self.sim.time)
        result = self.sim.advance(action, control_interval=self.control_interval, disturbances=idv)
        if result.shutdown_status["terminated"]:
            message = result.shutdown_status["message"] or f"code {result.shutdown_status['code']}"
            raise UserError(
                f"TEP {self.mode}: the plant shut down at t={self.sim.time:.2f} h during {what} ({message.strip()}); "
                "choose another data.seed, fewer samples per class or the default variant"
            )
        self.meas = result.measurements
        return result

    def snapshot(self):
        """Plant state, a copy of the controller's memories and the last measurements."""
        plant = self.sim.snapshot()
        return plant, copy.deepcopy(self.controller, dict(self._shared)), self.meas.copy()

    def restore(self, plant, controller, meas: np.ndarray) -> None:
        self.sim.restore(plant)
        self.controller = copy.deepcopy(controller, dict(self._shared))
        self.meas = meas.copy()

    def record(self, idv: np.ndarray, what: str, warmup_steps: int, count: int, per_sample: int) -> np.ndarray:
        """Discard ``warmup_steps``, then ``count`` samples (XMEAS then XMV) every ``per_sample`` steps."""
        for _ in range(warmup_steps):
            self.step(idv, what)
        rows = np.empty((count, NUM_FEATURES), dtype=np.float64)
        for i in range(count):
            for _ in range(per_sample):
                result = self.step(idv, what)
            rows[i, :41] = result.measurements
            rows[i, 41:] = result.implemented_action
        return rows


def simulate_mode(
    mode: str,
    classes: Sequence[str],
    samples_per_class: int,
    seed: int,
    *,
    settle_hours: Optional[float] = None,
    warmup_hours: Optional[float] = None,
    sample_hours: Optional[float] = None,
    control_interval: Optional[float] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Simulate one mode: ``(x, y)`` with ``x`` float32 (len(classes) * samples_per_class, 53).

    Samples are grouped by class (in ``classes`` order), in time order within a class;
    ``y[i]`` is the index of the sample's class in ``classes``. ``settle_hours`` defaults
    to ``SETTLE_HOURS[mode]`` and the others to the module constants.
    """
    if mode not in MODES:
        raise ValueError(f"unknown TEP mode {mode!r}")
    unknown = [c for c in classes if c not in CLASS_KEYS]
    if unknown:
        raise ValueError(f"unknown TEP classes {unknown}: use 'normal' or idv_01 ... idv_28")
    interval = CONTROL_INTERVAL if control_interval is None else float(control_interval)
    settle_steps = steps(SETTLE_HOURS[mode] if settle_hours is None else float(settle_hours), interval, "settle time")
    warmup_steps = steps(WARMUP_HOURS if warmup_hours is None else float(warmup_hours), interval, "warm-up")
    per_sample = steps(SAMPLE_HOURS if sample_hours is None else float(sample_hours), interval, "sample period")
    if per_sample < 1 or samples_per_class < 1:
        raise ValueError("sample period and samples per class must be positive")

    mode_key = MODES.index(mode) + 1
    kernel_seed = odd_seed(seed, mode_key, KEY_KERNEL)
    plant = ControlledPlant(mode, kernel_seed, interval)
    normal = np.zeros(28, dtype=np.float64)
    for _ in range(settle_steps):
        plant.step(normal, "settling")
    settled, settled_controller, settled_meas = plant.snapshot()
    xs, ys = [], []
    for label, cls in enumerate(classes):
        branch = reseeded(settled, kernel_seed, odd_seed(seed, mode_key, KEY_BRANCH, CLASS_KEYS[cls]))
        plant.restore(branch, settled_controller, settled_meas)
        xs.append(plant.record(idv_vector(cls), f"class {cls}", warmup_steps, samples_per_class, per_sample))
        ys.append(np.full(samples_per_class, label, dtype=np.int64))
    x = np.concatenate(xs).astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise RuntimeError(f"TEP {mode}: the simulation produced non-finite values")
    return x, np.concatenate(ys)
