"""Simulating the operating modes of the Tennessee Eastman process with ``tep-studio``.

The methods are described in :mod:`fedsim.data.benchmarks.tep`:

* :func:`simulate_classes` / :func:`simulate_windows`: the windows benchmark (34 variables x ``length`` samples).
  One fault-free run per mode, cut into consecutive windows (the normal class); window k of every fault branches
  from the end of segment k, so each window starts from its own state; fault intensities fall back from 100 % as the
  authors'. The plant and controller are advanced by compiled code (:mod:`fedsim.data.benchmarks.tep_compiled`,
  bit-identical to tep-studio), in chunks of windows spread over processes or a Ray cluster (``map_chunks``).
* :func:`simulate_mode`: the snapshot variants, one branch per class of a settled plant, 53 features a sample,
  advanced by tep-studio itself (:class:`ControlledPlant`, also the reference the compiled loop is tested against).

The times below are the defaults; tests pass shorter ones to check the mechanics cheaply.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import struct
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
from tqdm.auto import tqdm

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


def record_window(plant: ControlledPlant, idv: np.ndarray, what: str, length: int, per_sample: int) -> np.ndarray:
    """One window (34 variables x ``length``) advanced by tep-studio itself: XMEAS(1..23) and the implemented
    XMV(2..12) every ``per_sample`` control steps, the first sample ``per_sample`` steps after the start (the
    reference :mod:`fedsim.data.benchmarks.tep_compiled` is tested against)."""
    window = np.empty((NUM_WINDOW_VARIABLES, length), dtype=np.float64)
    meas, mvs = list(WINDOW_MEASUREMENTS), list(WINDOW_MVS)
    split = len(meas)
    for i in range(length):
        for _ in range(per_sample):
            result = plant.step(idv, what)
        window[:split, i] = result.measurements[meas]
        window[split:, i] = result.implemented_action[mvs]
    return window


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
    """The windows of one class in one mode: ``x`` float32 (count, 34, length); ``window`` the index k of each
    window's onset state (the end of the fault-free run's segment k); the intensity they were simulated at (0 for
    normal operation); the windows that shut the plant down at any intensity tried (left out)."""

    x: np.ndarray
    window: np.ndarray
    intensity: float
    shutdowns: int


@dataclasses.dataclass(frozen=True)
class Onset:
    """The plant at the end of segment k of a mode's fault-free run: native snapshot, controller memories and the
    last measurements (:meth:`CompiledPlant.snapshot`)."""

    plant: object
    memories: tuple
    meas: np.ndarray


def window_seed(seed: int, mode: str, cls: str, window: int, level: int) -> int:
    """The noise stream of a faulty window: data.seed, mode, class, window index (its onset) and intensity level,
    so that no window depends on the classes, window counts, chunks or workers around it."""
    return odd_seed(seed, MODES.index(mode) + 1, KEY_WINDOW, CLASS_KEYS[cls], window, level)


def _window_plant(mode: str, seed: int, timing: WindowTiming):
    from fedsim.data.benchmarks.tep_compiled import CompiledPlant

    kernel_seed = odd_seed(seed, MODES.index(mode) + 1, KEY_KERNEL)
    return kernel_seed, CompiledPlant(mode, kernel_seed, timing.control_interval, TEP_STUDIO_MS_FLAG | SCALED_IDV_FLAG)


_MEAS_IDX = np.array(WINDOW_MEASUREMENTS, dtype=np.int64)
_MV_IDX = np.array(WINDOW_MVS, dtype=np.int64)


def fault_free_run(mode: str, count: int, seed: int, timing: WindowTiming) -> tuple[np.ndarray, list[Onset]]:
    """The mode's fault-free run: settle ``timing.settle_hours``, then ``count`` consecutive windows (the normal
    class, float32 (count, 34, length)) and the plant at the end of each (the onsets of the faulty windows)."""
    settle_steps, per_sample = timing.step_counts()
    _, plant = _window_plant(mode, seed, timing)
    normal = np.zeros(28, dtype=np.float64)
    _, shutdown = plant.run(normal, settle_steps, 0, per_sample, _MEAS_IDX, _MV_IDX)
    x = np.empty((count, NUM_WINDOW_VARIABLES, timing.length), dtype=np.float32)
    onsets = []
    for k in range(count):
        if not shutdown:
            rows, shutdown = plant.run(normal, 0, timing.length, per_sample, _MEAS_IDX, _MV_IDX)
        if shutdown:
            raise PlantShutdown(
                f"TEP {mode}: the plant shut down at t={plant.time:.2f} h of its fault-free run "
                f"({plant.shutdown_message()}); choose another data.seed"
            )
        x[k] = rows.T
        onsets.append(Onset(*plant.snapshot()))
    if not np.all(np.isfinite(x)):
        raise RuntimeError(f"TEP {mode}: the simulation produced non-finite values")
    return x, onsets


def faulty_windows(
    mode: str, cls: str, level: int, windows: Sequence[int], onsets: Sequence[Onset], seed: int, timing: WindowTiming
) -> list[Optional[np.ndarray]]:
    """The windows ``windows`` of a fault at ``INTENSITIES[level]``, window k branched from ``onsets[i]`` (the end of
    segment k) with its own noise stream: float32 (34, length) each, None where the plant shut down."""
    _, per_sample = timing.step_counts()
    kernel_seed, plant = _window_plant(mode, seed, timing)
    idv = idv_vector(cls) * INTENSITIES[level]
    out: list[Optional[np.ndarray]] = []
    for k, onset in zip(windows, onsets):
        branch = reseeded(onset.plant, kernel_seed, window_seed(seed, mode, cls, k, level))
        plant.restore(branch, onset.memories, onset.meas)
        rows, shutdown = plant.run(idv, 0, timing.length, per_sample, _MEAS_IDX, _MV_IDX)
        if shutdown:
            out.append(None)
            continue
        window = rows.T.astype(np.float32)
        if not np.all(np.isfinite(window)):
            raise RuntimeError(f"TEP {mode}, {cls}: the simulation produced non-finite values")
        out.append(window)
    return out


def run_task(task: tuple):
    """One chunk of work: ``("normal", mode, count, seed, timing)`` (:func:`fault_free_run`) or
    ``("fault", mode, cls, level, windows, onsets, seed, timing)`` (:func:`faulty_windows`)."""
    if task[0] == "normal":
        return fault_free_run(*task[1:])
    return faulty_windows(*task[1:])


def worker_count(workers: Optional[int], tasks: int) -> int:
    """``workers`` (None: every core this process may use), at most one per task."""
    if workers is None:
        try:
            workers = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            workers = os.cpu_count() or 1
    return max(1, min(int(workers), tasks))


class ProcessMap:
    """``map_chunks`` on this machine: the tasks in ``workers`` processes (None: one per core; 1: in this process),
    started by multiprocessing's "spawn" method (the workers import numpy, numba and tep-studio afresh instead of
    inheriting torch's threads through fork). Results come back in task order."""

    def __init__(self, workers: Optional[int] = None) -> None:
        self.workers = workers
        self._pool: Optional[ProcessPoolExecutor] = None

    def __call__(self, function: Callable, tasks: Sequence) -> Iterator:
        count = worker_count(self.workers, len(tasks))
        if count == 1:
            return map(function, tasks)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=worker_count(self.workers, 1 << 30), mp_context=get_context("spawn")
            )
        return self._pool.map(function, tasks)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> "ProcessMap":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def chunks(windows: Sequence[int], size: int) -> list[list[int]]:
    return [list(windows[i : i + size]) for i in range(0, len(windows), size)]


def check_needs(needs: dict[str, Sequence[str]], windows_per_class: int) -> None:
    """ValueError for an unknown mode or class, or no windows."""
    for mode in needs:
        if mode not in MODES:
            raise ValueError(f"unknown TEP mode {mode!r}")
        unknown = [c for c in needs[mode] if c not in CLASS_KEYS]
        if unknown:
            raise ValueError(f"unknown TEP classes {unknown}: use 'normal' or idv_01 ... idv_28")
    if windows_per_class < 1:
        raise ValueError("windows per class must be positive")


@dataclasses.dataclass
class WindowBuild:
    """One :func:`simulate_classes` call's work: its settings, the chunk mapper, the progress bar and where each
    finished class goes (``finish(mode, class, windows)``)."""

    windows_per_class: int
    seed: int
    timings: dict[str, WindowTiming]
    chunk_windows: int
    mapper: Callable[[Callable, Sequence], Iterable]
    bar: tqdm
    finish: Callable[[str, str, ClassWindows], None]

    def fault_free(self, modes: Sequence[str]) -> dict[str, list[Onset]]:
        """Every mode's fault-free run (one task each): the normal class finished, the onsets returned."""
        n = self.windows_per_class
        tasks = [("normal", m, n, self.seed, self.timings[m]) for m in modes]
        onsets = {}
        for mode, (x, mode_onsets) in zip(modes, self.mapper(run_task, tasks)):
            onsets[mode] = mode_onsets
            self.bar.update(n)
            self.finish(mode, "normal", ClassWindows(x, np.arange(n, dtype=np.int64), 0.0, 0))
        return onsets

    def faults(self, pending: list[tuple[str, str]], onsets: dict) -> None:
        """The (mode, class) pairs ``pending``, each at the highest intensity at which a window runs through."""
        shutdowns = {key: 0 for key in pending}
        for level in range(len(INTENSITIES)):
            if not pending:
                break
            retry = self.fault_level(level, pending, onsets, shutdowns)
            if retry and level + 1 < len(INTENSITIES):
                self.bar.total += self.windows_per_class * len(retry)
                self.bar.refresh()
            pending = retry
        if pending:
            mode, cls = pending[0]
            length = self.timings[mode].length * self.timings[mode].sample_hours
            raise UserError(
                f"TEP {mode}: {cls} shuts the plant down in every window at every intensity "
                f"({', '.join(f'{i:.0%}' for i in INTENSITIES)}) within {length:g} h; choose another data.seed"
            )

    def fault_level(
        self, level: int, pending: Sequence[tuple[str, str]], onsets: dict, shutdowns: dict
    ) -> list[tuple[str, str]]:
        """The ``pending`` (mode, class) pairs at ``INTENSITIES[level]``, in chunks: each class finished as soon as
        its last chunk is in; returns the pairs whose every window shut the plant down (``shutdowns`` counts)."""
        n = self.windows_per_class
        tasks, owners = [], []
        for mode, cls in pending:
            for part in chunks(range(n), self.chunk_windows):
                part_onsets = [onsets[mode][k] for k in part]
                tasks.append(("fault", mode, cls, level, part, part_onsets, self.seed, self.timings[mode]))
                owners.append((mode, cls, part))
        left = {key: -(-n // self.chunk_windows) for key in pending}
        got: dict[tuple[str, str], list] = {key: [] for key in pending}
        retry = []
        for (mode, cls, part), windows in zip(owners, self.mapper(run_task, tasks)):
            got[mode, cls].extend((k, w) for k, w in zip(part, windows) if w is not None)
            self.bar.update(len(part))
            left[mode, cls] -= 1
            if left[mode, cls]:
                continue
            kept = got.pop((mode, cls))  # every chunk of the class is in: finish it (windows in onset order)
            shutdowns[mode, cls] += n - len(kept)
            if not kept:
                retry.append((mode, cls))
                continue
            x = np.stack([w for _, w in kept])
            index = np.array([k for k, _ in kept], dtype=np.int64)
            self.finish(mode, cls, ClassWindows(x, index, float(INTENSITIES[level]), shutdowns[mode, cls]))
        return retry


def simulate_classes(
    needs: dict[str, Sequence[str]],
    windows_per_class: int,
    seed: int,
    *,
    timings: Optional[dict[str, WindowTiming]] = None,
    map_chunks: Optional[Callable[[Callable, Sequence], Iterable]] = None,
    workers: Optional[int] = None,
    chunk_windows: Optional[int] = None,
    progress: bool = True,
    sink: Optional[Callable[[str, str, ClassWindows], None]] = None,
) -> dict[tuple[str, str], ClassWindows]:
    """The windows of the classes ``needs[mode]`` of each mode: ``{(mode, class): ClassWindows}``.

    Per mode, one fault-free run gives the normal windows (consecutive segments, so that they continue one another)
    and the onsets; window k of every IDV branches from the end of segment k, its fault switched on there. A fault
    runs at the highest of :data:`INTENSITIES` at which at least one of its windows runs through, and the windows
    that shut the plant down at that intensity are left out (the authors' rule for Reinartz et al.'s runs); a fault
    that trips the plant in every window at every intensity is an error. The normal class is always returned for a
    mode with needs (its run is needed for the onsets).

    The work is cut into chunks of at most ``chunk_windows`` windows of one (mode, class, intensity), the fault-free
    runs first (one per mode), and handed to ``map_chunks(run_task, tasks)``, which returns the results in task
    order: by default a :class:`ProcessMap` of ``workers`` processes; ``fedsim.actors.tep_tasks`` passes one that
    runs Ray tasks. The arrays depend on neither the chunks nor the workers. ``sink(mode, class, windows)``, when
    given, receives each class as soon as it is complete (then nothing is kept and the result is empty), so that a
    large build is written out class by class; a tqdm bar counts the windows (``progress``).
    """
    check_needs(needs, windows_per_class)
    modes = [m for m in MODES if needs.get(m)]
    timings = {m: (timings or {}).get(m) or WindowTiming(SETTLE_HOURS[m]) for m in modes}
    faults = {m: [c for c in dict.fromkeys(needs[m]) if c != "normal"] for m in modes}
    total = sum(windows_per_class * (1 + len(faults[m])) for m in modes)
    owned = map_chunks is None
    mapper = map_chunks or ProcessMap(workers)
    if chunk_windows is None:
        cores = worker_count(workers, 1 << 30)
        chunk_windows = max(1, -(-sum(len(f) for f in faults.values()) * windows_per_class // (4 * cores)))
    bar = tqdm(total=total, desc="tep windows", unit="window", disable=None if progress else True)
    results: dict[tuple[str, str], ClassWindows] = {}

    def finish(mode: str, cls: str, windows: ClassWindows) -> None:
        if sink is None:
            results[mode, cls] = windows
        else:
            sink(mode, cls, windows)

    build = WindowBuild(windows_per_class, seed, timings, chunk_windows, mapper, bar, finish)
    try:
        onsets = build.fault_free(modes)
        build.faults([(m, c) for m in modes for c in faults[m]], onsets)
    finally:
        bar.close()
        if owned:
            mapper.close()
    return results


def simulate_windows(
    mode: str,
    classes: Sequence[str],
    windows_per_class: int,
    seed: int,
    *,
    timing: Optional[WindowTiming] = None,
    workers: Optional[int] = None,
    map_chunks: Optional[Callable[[Callable, Sequence], Iterable]] = None,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The windows of one mode (:func:`simulate_classes`): ``(x, y, intensity, shutdowns)``.

    ``x`` is float32 (windows, 34, length), grouped by class in ``classes`` order and by onset within a class; ``y[i]``
    is the index of the window's class; ``intensity`` and ``shutdowns`` hold one value per class.
    """
    if mode not in MODES:
        raise ValueError(f"unknown TEP mode {mode!r}")
    result = simulate_classes(
        {mode: list(classes)},
        windows_per_class,
        seed,
        timings={mode: timing} if timing else None,
        map_chunks=map_chunks,
        workers=workers,
        progress=progress,
    )
    parts = [result[mode, cls] for cls in classes]
    x = np.concatenate([p.x for p in parts])
    y = np.concatenate([np.full(len(p.x), i, dtype=np.int64) for i, p in enumerate(parts)])
    intensity = np.array([p.intensity for p in parts], dtype=np.float64)
    shutdowns = np.array([p.shutdowns for p in parts], dtype=np.int64)
    return x, y, intensity, shutdowns
