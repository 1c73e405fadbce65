"""Simulating one operating mode of the Tennessee Eastman process with ``tep-studio``.

Both kinds of data settle the plant in a mode, snapshot plant and controller, and branch
from that snapshot with a noise stream of their own (the methods are described in
:mod:`fedsim.data.benchmarks.tep`):

* :func:`simulate_windows`: the windows benchmark, one branch per window (34 variables x
  ``length`` samples), fault intensities falling back from 100 % when the plant shuts down;
  the (mode, class) tasks run in worker processes;
* :func:`simulate_mode`: the snapshot variants, one branch per class, 53 features a sample.

The times below are the defaults; tests pass shorter ones to check the mechanics cheaply.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import struct
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
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
KEY_WINDOW = 3

# The windows benchmark (eddardd/tep-domain-adaptation, benchmark/preprocessing/build_benchmark.py): the columns
# 1..23 and 43..53 of the Reinartz et al. (2021) process data, whose column 0 is the simulation time, i.e.
# XMEAS(1..23) and XMV(2..12); 600 samples of 3 min (30 h) a window.
WINDOW_MEASUREMENTS: tuple[int, ...] = tuple(range(23))  # XMEAS(1..23), 0-based
WINDOW_MVS: tuple[int, ...] = tuple(range(1, 12))  # XMV(2..12), 0-based
NUM_WINDOW_VARIABLES = len(WINDOW_MEASUREMENTS) + len(WINDOW_MVS)  # 34
WINDOW_LENGTH = 600
# Fault intensities tried in order, as the authors take the highest of Reinartz et al.'s 100, 75, 50 and 25 % runs
# that completed; the kernel scales an IDV by its value only with MSFlag bit 0x80 (else it thresholds at 0.5).
INTENSITIES: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25)
SCALED_IDV_FLAG = 0x80
TEP_STUDIO_MS_FLAG = 0x0F  # tep-studio's default MSFlag


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


class PlantShutdown(UserError):
    """The plant tripped (a safety limit was crossed) during a simulated run."""


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

    def __init__(self, mode: str, kernel_seed: int, control_interval: float, ms_flag: int = TEP_STUDIO_MS_FLAG):
        from tep_studio import RickerMultiLoopController, TennesseeEastmanProcess
        from tep_studio.simulation.modes import mode_setpoints

        self.mode = mode
        self.control_interval = control_interval
        self.sim = TennesseeEastmanProcess(ms_flag=ms_flag)
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
            raise PlantShutdown(
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


@dataclasses.dataclass(frozen=True)
class WindowTiming:
    """The clock of the windows benchmark: settling, sampling and control intervals (hours), samples a window."""

    settle_hours: float
    sample_hours: float = SAMPLE_HOURS
    control_interval: float = CONTROL_INTERVAL
    length: int = WINDOW_LENGTH

    def step_counts(self) -> tuple[int, int]:
        """(control steps of settling, control steps between two samples)."""
        settle = steps(self.settle_hours, self.control_interval, "settle time")
        per_sample = steps(self.sample_hours, self.control_interval, "sample period")
        if per_sample < 1 or self.length < 1:
            raise ValueError("sample period and window length must be positive")
        return settle, per_sample


@dataclasses.dataclass(frozen=True)
class ClassWindows:
    """The windows of one class in one mode: ``x`` float32 (count, 34, length), the intensity they were simulated
    at (0 for normal operation) and the shutdowns met on the way (windows discarded, at any intensity)."""

    x: np.ndarray
    intensity: float
    shutdowns: int


def settle_mode(mode: str, seed: int, timing: WindowTiming):
    """The mode's plant run fault-free for ``timing.settle_hours``: (kernel seed, plant, controller, measurements)."""
    settle_steps, _ = timing.step_counts()
    kernel_seed = odd_seed(seed, MODES.index(mode) + 1, KEY_KERNEL)
    plant = ControlledPlant(mode, kernel_seed, timing.control_interval, TEP_STUDIO_MS_FLAG | SCALED_IDV_FLAG)
    normal = np.zeros(28, dtype=np.float64)
    for _ in range(settle_steps):
        plant.step(normal, "settling")
    return (kernel_seed,) + plant.snapshot()


def window_seed(seed: int, mode: str, cls: str, level: int, attempt: int) -> int:
    """The noise stream of one window: data.seed, mode, class, intensity level and attempt (so no window depends on
    the classes, workers or window counts around it)."""
    return odd_seed(seed, MODES.index(mode) + 1, KEY_WINDOW, CLASS_KEYS[cls], level, attempt)


def class_windows(mode: str, cls: str, count: int, seed: int, settled, timing: WindowTiming) -> ClassWindows:
    """``count`` windows of one class, each a branch of the settled plant with its own noise stream.

    A fault is switched on at the branch point at the highest intensity of :data:`INTENSITIES` the plant runs
    through: a window that ends in a shutdown is discarded and another noise stream tried; once ``count`` windows
    have shut down at an intensity, its windows are dropped and the next lower intensity is simulated. Normal
    operation has no intensity to fall back on, so its shutdown is an error, as is a fault that trips the plant at
    every intensity.
    """
    if cls not in CLASS_KEYS:
        raise ValueError(f"unknown TEP class {cls!r}: use 'normal' or idv_01 ... idv_28")
    kernel_seed, settled_plant, settled_controller, settled_meas = settled
    _, per_sample = timing.step_counts()
    plant = ControlledPlant(mode, kernel_seed, timing.control_interval, TEP_STUDIO_MS_FLAG | SCALED_IDV_FLAG)
    levels = (0.0,) if cls == "normal" else INTENSITIES
    shutdowns = 0
    for level, intensity in enumerate(levels):
        idv = idv_vector(cls) * intensity
        out = np.empty((count, NUM_WINDOW_VARIABLES, timing.length), dtype=np.float32)
        done = failed = attempt = 0
        while done < count and failed < count:
            branch = reseeded(settled_plant, kernel_seed, window_seed(seed, mode, cls, level, attempt))
            plant.restore(branch, settled_controller, settled_meas)
            attempt += 1
            try:
                out[done] = record_window(plant, idv, f"class {cls}", timing.length, per_sample)
            except PlantShutdown:
                if cls == "normal":
                    raise
                failed += 1
                continue
            done += 1
        shutdowns += failed
        if done == count:
            if not np.all(np.isfinite(out)):
                raise RuntimeError(f"TEP {mode}, {cls}: the simulation produced non-finite values")
            return ClassWindows(out, float(intensity), shutdowns)
    raise UserError(
        f"TEP {mode}: {cls} shuts the plant down at every intensity ({', '.join(f'{i:.0%}' for i in levels)}) "
        f"within {timing.length * timing.sample_hours:g} h; choose another data.seed"
    )


def record_window(plant: ControlledPlant, idv: np.ndarray, what: str, length: int, per_sample: int) -> np.ndarray:
    """One window (34 variables x ``length``): XMEAS(1..23) and the implemented XMV(2..12) every ``per_sample``
    control steps, the first sample ``per_sample`` steps after the branch point."""
    window = np.empty((NUM_WINDOW_VARIABLES, length), dtype=np.float64)
    meas, mvs = list(WINDOW_MEASUREMENTS), list(WINDOW_MVS)
    split = len(meas)
    for i in range(length):
        for _ in range(per_sample):
            result = plant.step(idv, what)
        window[:split, i] = result.measurements[meas]
        window[split:, i] = result.implemented_action[mvs]
    return window


def _class_task(args) -> ClassWindows:
    return class_windows(*args)


def worker_count(workers: Optional[int], tasks: int) -> int:
    """``workers`` (None: every core this process may use), at most one per task."""
    if workers is None:
        try:
            workers = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            workers = os.cpu_count() or 1
    return max(1, min(int(workers), tasks))


def simulate_windows(
    mode: str,
    classes: Sequence[str],
    windows_per_class: int,
    seed: int,
    *,
    timing: Optional[WindowTiming] = None,
    workers: Optional[int] = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Simulate the windows of one mode: ``(x, y, intensity, shutdowns)``.

    ``x`` is float32 (len(classes) * windows_per_class, 34, length), grouped by class in ``classes`` order; ``y[i]``
    is the index of the window's class; ``intensity`` and ``shutdowns`` hold one value per class
    (:class:`ClassWindows`). The plant settles once in this process, then the (mode, class) tasks run in
    ``workers`` processes (None: one per core, 1: in this process); the arrays do not depend on the workers.
    """
    if mode not in MODES:
        raise ValueError(f"unknown TEP mode {mode!r}")
    if windows_per_class < 1:
        raise ValueError("windows per class must be positive")
    timing = timing or WindowTiming(SETTLE_HOURS[mode])
    settled = settle_mode(mode, seed, timing)
    tasks = [(mode, cls, windows_per_class, seed, settled, timing) for cls in classes]
    count = worker_count(workers, len(tasks))
    if count == 1:
        results = [_class_task(task) for task in tasks]
    else:
        # spawn: the workers import numpy and tep-studio afresh instead of inheriting torch's threads through fork
        with ProcessPoolExecutor(max_workers=count, mp_context=get_context("spawn")) as pool:
            results = list(pool.map(_class_task, tasks))
    x = np.concatenate([r.x for r in results])
    y = np.repeat(np.arange(len(classes), dtype=np.int64), windows_per_class)
    intensity = np.array([r.intensity for r in results], dtype=np.float64)
    shutdowns = np.array([r.shutdowns for r in results], dtype=np.int64)
    return x, y, intensity, shutdowns
