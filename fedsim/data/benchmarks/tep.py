"""Tennessee Eastman process (Downs & Vogel 1993), simulated with ``tep-studio``.

The six operating modes of the plant (Ricker 1996's decentralized control, modified
model of Bathelt, Ricker & Jelali 2015) are the domains ``mode1`` ... ``mode6``; the
classes are normal operation and process faults (IDVs). How one domain is made:

1. Start the plant in the mode (``TennesseeEastmanProcess.reset(mode=...)``) with the
   Ricker controller on the mode's setpoints, and run it fault-free for
   ``SETTLE_HOURS[mode]`` (60 h, 70 h for mode 5, which is still drifting at 50 h).
2. Snapshot the plant (the native model bytes: states, valve states, random-walk
   disturbance processes, generator state) *and* the controller (a deep copy of its
   PI memories and ramped setpoints): the controller re-initializes on every fresh
   run, so a settled plant state alone would be upset again by a bumpless restart.
3. Branch every class from that snapshot: restore, give the branch its own noise
   stream (the model's generator state is rewritten with a seed per class), switch
   the class's IDV on at the branch point, discard ``WARMUP_HOURS`` and then record
   one sample every ``SAMPLE_HOURS`` (3 min, as in the classic TEP data sets).

A sample has 53 raw features: the 41 measurements XMEAS(1..41) followed by the 12
manipulated variables XMV(1..12) as commanded by the controller (three of them,
compressor recycle valve, stripper steam valve and agitator speed, are held constant
by this control strategy). Features are float32 and *not* normalized (see
:mod:`fedsim.data.normalization`). Everything is seeded from ``data.seed`` and built
once per (mode, variant, samples per class, seed) into ``data.cache_dir``.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import struct
import time
from typing import Optional, Sequence

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.digits import rng_for, stratified_split, stratified_subsample
from fedsim.data.cache import load_arrays, save_arrays
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS, unknown_name_message

logger = logging.getLogger(__name__)

VERSION = "v1"  # bump whenever the generated data changes, so old caches are not reused
MODES: tuple[str, ...] = ("mode1", "mode2", "mode3", "mode4", "mode5", "mode6")
DEFAULT_FAULTS: tuple[str, ...] = ("idv_01", "idv_02", "idv_04", "idv_07", "idv_13")
VARIANTS: dict[str, tuple[str, ...]] = {
    "default": ("normal",) + DEFAULT_FAULTS,
    "hard": ("normal",) + DEFAULT_FAULTS + ("idv_08", "idv_17"),
}
# Fixed per-class stream keys, so a class's samples do not depend on the variant it is in.
_CLASS_KEYS: dict[str, int] = {"normal": 0, **{f"idv_{i:02d}": i for i in range(1, 29)}}

DEFAULT_SAMPLES_PER_CLASS = 200  # train + test, per class and mode
SETTLE_HOURS: dict[str, float] = {"mode1": 60.0, "mode2": 60.0, "mode3": 60.0, "mode4": 60.0, "mode5": 70.0, "mode6": 60.0}
WARMUP_HOURS = 1.0  # discarded after the fault onset (20 samples)
SAMPLE_HOURS = 0.05  # 3 min between samples
CONTROL_INTERVAL = 0.01  # hours between controller moves (the plant integrates at 0.0005 h inside)
TEST_FRACTION = 0.2

# struct stModelData (temexd_mod.c) starts with ProcessValues (xmeas 41, xmeasadd 32,
# xmeasdist 21, xmeasmonitor 62, xmeascomp 96, xmv 12 doubles) and DistVector (idv 29
# doubles), then RandState {g, measnoise, procdist}. Without MSFlag bit 0x20 every
# random draw (measurement noise and disturbance processes) comes from ``g``.
_RANDSTATE_OFFSET = 8 * (41 + 32 + 21 + 62 + 96 + 12 + 29)
_SEPARATE_STREAMS_FLAG = 0x20

_KEY_KERNEL = 1
_KEY_BRANCH = 2
_KEY_SPLIT = 1000
_KEY_SUBSAMPLE = 2000


def feature_names() -> list[str]:
    """The 53 feature names: XMEAS(1..41) then XMV(1..12), as named by tep-studio."""
    from tep_studio import TEP_SCHEMA

    meas = [f"xmeas_{i + 1:02d}_{v.name}" for i, v in enumerate(TEP_SCHEMA.measurements)]
    mvs = [f"xmv_{i + 1:02d}_{v.name}" for i, v in enumerate(TEP_SCHEMA.manipulated_variables)]
    return meas + mvs


def _odd_seed(seed: int, *keys: int) -> int:
    """A kernel seed in [1, 2**32): the model's generator is x <- 9228907 x mod 2**32, odd seeds keep its period."""
    state = np.random.SeedSequence([int(seed)] + [int(k) for k in keys]).generate_state(1, dtype=np.uint32)[0]
    return int(state) | 1


def _idv_vector(cls: str) -> np.ndarray:
    idv = np.zeros(28, dtype=np.float64)
    if cls != "normal":
        idv[int(cls.split("_")[1]) - 1] = 1.0
    return idv


def _reseeded(snapshot, kernel_seed: int, branch_seed: int):
    """The plant snapshot with the model's random generator state replaced by ``branch_seed``."""
    g, measnoise, procdist = struct.unpack_from("@3d", snapshot.model_bytes, _RANDSTATE_OFFSET)
    if measnoise != float(kernel_seed) or procdist != float(kernel_seed):
        raise RuntimeError(
            "the installed tep-studio's model layout differs from the one this benchmark was written for "
            f"(random state at byte {_RANDSTATE_OFFSET} reads {measnoise!r}, {procdist!r}, expected the seed "
            f"{kernel_seed}); reinstall tep-studio 0.2.0"
        )
    data = bytearray(snapshot.model_bytes)
    struct.pack_into("@d", data, _RANDSTATE_OFFSET, float(branch_seed))
    return dataclasses.replace(snapshot, model_bytes=bytes(data))


def _steps(hours: float, control_interval: float, what: str) -> int:
    steps = hours / control_interval
    if steps < 0 or abs(steps - round(steps)) > 1e-6:
        raise ValueError(f"{what} ({hours} h) must be a non-negative multiple of the control interval ({control_interval} h)")
    return int(round(steps))


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
    to ``SETTLE_HOURS[mode]`` and the others to the module constants; tests pass
    shorter times to check the mechanics cheaply.
    """
    from tep_studio import RickerMultiLoopController, TennesseeEastmanProcess
    from tep_studio.simulation.modes import mode_setpoints

    if mode not in MODES:
        raise ValueError(f"unknown TEP mode {mode!r}")
    unknown = [c for c in classes if c not in _CLASS_KEYS]
    if unknown:
        raise ValueError(f"unknown TEP classes {unknown}: use 'normal' or idv_01 ... idv_28")
    settle = SETTLE_HOURS[mode] if settle_hours is None else float(settle_hours)
    warmup_hours = WARMUP_HOURS if warmup_hours is None else float(warmup_hours)
    sample_hours = SAMPLE_HOURS if sample_hours is None else float(sample_hours)
    control_interval = CONTROL_INTERVAL if control_interval is None else float(control_interval)
    settle_steps = _steps(settle, control_interval, "settle time")
    warmup_steps = _steps(warmup_hours, control_interval, "warm-up")
    per_sample = _steps(sample_hours, control_interval, "sample period")
    if per_sample < 1 or samples_per_class < 1:
        raise ValueError("sample period and samples per class must be positive")

    mode_key = MODES.index(mode) + 1
    kernel_seed = _odd_seed(seed, mode_key, _KEY_KERNEL)
    sim = TennesseeEastmanProcess()
    if sim.ms_flag & _SEPARATE_STREAMS_FLAG:
        raise RuntimeError("tep-studio now draws from separate random streams (MSFlag 0x20): update _reseeded")
    meas, _ = sim.reset(mode=mode, seed=float(kernel_seed))
    controller = RickerMultiLoopController(setpoints=mode_setpoints(mode))
    controller.reset(meas, time=sim.time)
    normal = np.zeros(28, dtype=np.float64)

    def step(idv: np.ndarray, what: str):
        nonlocal meas
        action, _ = controller.compute_action(meas, time=sim.time)
        result = sim.advance(action, control_interval=control_interval, disturbances=idv)
        if result.shutdown_status["terminated"]:
            message = result.shutdown_status["message"] or f"code {result.shutdown_status['code']}"
            raise UserError(
                f"TEP {mode}: the plant shut down at t={sim.time:.2f} h during {what} ({message.strip()}); "
                "choose another data.seed, fewer samples per class or the default variant"
            )
        meas = result.measurements
        return result

    for _ in range(settle_steps):
        step(normal, "settling")
    plant = sim.snapshot()
    # The schema and loop registry are immutable and shared; only the loop memories are copied.
    shared = {id(controller.schema): controller.schema, id(controller.registry): controller.registry}
    settled_controller = copy.deepcopy(controller, dict(shared))
    settled_meas = meas.copy()

    xs, ys = [], []
    for label, cls in enumerate(classes):
        sim.restore(_reseeded(plant, kernel_seed, _odd_seed(seed, mode_key, _KEY_BRANCH, _CLASS_KEYS[cls])))
        controller = copy.deepcopy(settled_controller, dict(shared))
        meas = settled_meas.copy()
        idv = _idv_vector(cls)
        what = f"class {cls}"
        for _ in range(warmup_steps):
            step(idv, what)
        rows = np.empty((samples_per_class, 53), dtype=np.float64)
        for i in range(samples_per_class):
            for _ in range(per_sample):
                result = step(idv, what)
            rows[i, :41] = result.measurements
            rows[i, 41:] = result.implemented_action
        xs.append(rows)
        ys.append(np.full(samples_per_class, label, dtype=np.int64))
    x = np.concatenate(xs).astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise RuntimeError(f"TEP {mode}: the simulation produced non-finite values")
    return x, np.concatenate(ys)


def _tep_version() -> str:
    try:
        from importlib.metadata import version

        return version("tep-studio")
    except Exception:  # not installed: the simulation will say so
        return "missing"


def _require_tep() -> None:
    try:
        import tep_studio  # noqa: F401
    except ImportError as exc:
        raise UserError(
            f"the tep benchmark needs the tep-studio simulator ({exc}): install it with 'pip install tep-studio==0.2.0'"
        ) from None


@BENCHMARKS.register("tep")
class TEPBenchmark(Benchmark):
    default_normalization = "federated"  # one standardization shared by all clients, from their sums
    default_target = "mode2"
    """Tennessee Eastman process (tep-studio): six operating modes, normal + faults, 53 raw features

    Configuration read from the data section: ``seed``, ``cache_dir``,
    ``max_train_per_domain``, and (when present) ``variant`` ("default": normal + idv
    01, 02, 04, 07, 13; "hard": adds idv 08 and 17), ``samples_per_class`` (train + test
    per class and mode, default 200) and ``sources`` (the source modes; default: all
    modes but the target).
    """

    def __init__(self, data_config):
        super().__init__(data_config)
        self._loaded: dict[str, Domain] = {}

    # ------------------------------------------------------------------ settings

    @property
    def variant(self) -> str:
        variant = str(getattr(self.config, "variant", None) or "default")
        if variant not in VARIANTS:
            raise UserError(unknown_name_message("tep variant", variant, sorted(VARIANTS), "--set data.variant=..."))
        return variant

    @property
    def classes(self) -> tuple[str, ...]:
        return VARIANTS[self.variant]

    @property
    def samples_per_class(self) -> int:
        value = getattr(self.config, "samples_per_class", None)
        if value is None:
            return DEFAULT_SAMPLES_PER_CLASS
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
            raise UserError(
                f"data.samples_per_class must be an integer of at least 2 for the tep benchmark, got {value!r}"
            )
        return int(value)

    def domains(self) -> list[str]:
        """All six modes (``data.sources`` narrows the federation in fedsim.data.scenario)."""
        return list(MODES)

    # ------------------------------------------------------------------ data

    def cache_name(self, domain: str) -> str:
        """Cache file stem: version, variant, samples, seed, mode and a hash of every generation setting."""
        settings = repr((self.classes, SETTLE_HOURS[domain], WARMUP_HOURS, SAMPLE_HOURS, CONTROL_INTERVAL, _tep_version()))
        digest = hashlib.sha256(settings.encode("utf-8")).hexdigest()[:10]
        return f"tep-{VERSION}-{self.variant}-n{self.samples_per_class}-seed{int(self.config.seed)}-{domain}-{digest}"

    def raw_arrays(self, domain: str) -> tuple[np.ndarray, np.ndarray]:
        """All samples of one mode (before the split), from the cache or simulated now."""
        name = self.cache_name(domain)
        cached = load_arrays(self.config.cache_dir, name)
        if cached is not None and set(cached) == {"x", "y"}:
            return cached["x"], cached["y"]
        _require_tep()
        start = time.perf_counter()
        x, y = simulate_mode(domain, self.classes, self.samples_per_class, int(self.config.seed))
        logger.info("tep: simulated %s (%d samples, %d classes) in %.1f s", domain, len(y), len(self.classes),
                    time.perf_counter() - start)
        save_arrays(self.config.cache_dir, name, {"x": x, "y": y})
        return x, y

    def load(self, domain: str) -> Domain:
        if domain not in MODES:
            raise UserError(unknown_name_message("domain of benchmark 'tep'", domain, list(MODES), "--target"))
        if domain not in self._loaded:
            self._loaded[domain] = self._make_domain(domain)
        return self._loaded[domain]

    def _make_domain(self, domain: str) -> Domain:
        x, y = self.raw_arrays(domain)
        seed = int(self.config.seed)
        key = MODES.index(domain) + 1
        train_idx, test_idx = stratified_split(y, rng_for(seed, _KEY_SPLIT + key), TEST_FRACTION)
        train_x, train_y = x[train_idx], y[train_idx]
        limit = self.config.max_train_per_domain
        if limit is not None and limit < len(train_y):
            keep = stratified_subsample(train_y, int(limit), rng_for(seed, _KEY_SUBSAMPLE + key))
            train_x, train_y = train_x[keep], train_y[keep]
        return Domain(
            name=domain,
            train_x=np.ascontiguousarray(train_x, dtype=np.float32),
            train_y=np.ascontiguousarray(train_y, dtype=np.int64),
            test_x=np.ascontiguousarray(x[test_idx], dtype=np.float32),
            test_y=np.ascontiguousarray(y[test_idx], dtype=np.int64),
            num_classes=len(self.classes),
        )
