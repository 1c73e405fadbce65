"""Tennessee Eastman process (Downs & Vogel 1993), simulated with ``tep-studio``.

The six operating modes of the plant (Ricker 1996's decentralized control, modified
model of Bathelt, Ricker & Jelali 2015) are the domains ``mode1`` ... ``mode6``.

**The windows benchmark** (the default, ``data.variant=windows``) is the domain-adaptation
benchmark of Montesuma et al. (``eddardd/tep-domain-adaptation``: the windows in
``benchmark/preprocessing/build_benchmark.py``, the scaling in ``benchmark/data/read_tep_data.py``,
the encoder in ``benchmark/deep_learning/fully_convolutional.py``), simulated here instead of
read from the Reinartz et al. (2021) runs the authors use:

* 29 classes: normal operation and IDV(1) ... IDV(28), labels 0 ... 28.
* A sample is a window of 34 variables x 600 samples, one sample every 3 min (30 h): the
  authors' columns 1-23 and 43-53 of the Reinartz process data, whose column 0 is the
  time, i.e. XMEAS(1..23) and XMV(2..12). (Their README names XMEAS(1..22) and
  XMV(1..12) instead; the code, which built their data, is followed.) A faulty window is
  the first 30 h after the fault's onset (their samples 600-1199), a normal window 30 h of
  fault-free operation (their samples 0-599 of a run).
* Each window starts from its own state: per mode, one fault-free run settles (60 h, 70 h for mode 5) and then
  runs consecutive 30-h segments, segment k being normal window k; window k of every IDV branches from the end of
  segment k (its own 30 h of fault-free history, as the authors' runs have) with a noise stream of its own (seeded
  by ``data.seed``, mode, class, k and intensity) and its fault switched on there.
* Fault intensity, as the authors': per mode and IDV, the highest of 100, 75, 50 and 25 % at which at least one
  window runs through, the windows that shut the plant down left out (so a class may have fewer windows).
* ``data.windows_per_class`` windows per class and mode (default :data:`DEFAULT_WINDOWS_PER_CLASS`; the authors have
  100, less the runs that failed): the plant and controller run compiled (:mod:`fedsim.data.benchmarks.tep_compiled`,
  bit-identical to tep-studio), about 0.17 s of CPU a window, so the authors' size takes about 50 min of CPU
  (docs/benchmarks.md has the measurements); ``fedsim data prepare tep`` builds it ahead, on this machine's cores or
  a Ray cluster's. ``data.window`` shortens the windows.
* The windows are simulated in chunks in ``data.workers`` processes started by multiprocessing's
  "spawn" method, which imports the main script again: a script that runs fedsim through
  its API does so under ``if __name__ == "__main__":`` (or sets ``data.workers=1``).
* Scaling (``data.scaling=mode``, the authors' standardization): every variable of a mode
  is centred and scaled by its mean and standard deviation over all windows and time steps
  of that mode, so each mode, the unlabeled target included, is standardized by its own
  input statistics (the authors' choice; no labels are used). The statistics come from the
  mode's training split only, where the authors use all of the mode's windows (their 5
  folds are drawn afterwards): the test windows stay unseen before evaluation. A variable
  with no spread (XMV(5), XMV(9) and XMV(12) are held constant by this control strategy)
  is only centred, where the authors divide it by its mean: constant either way.
  ``data.scaling=none`` keeps the raw values (then ``data.normalization`` applies).
* Inputs are (34, length) float32 arrays, channels first, for which ``model.name=auto``
  picks the authors' fully convolutional encoder (:mod:`fedsim.models.cnn1d`).

**The snapshot variants** (``data.variant=snapshot``: normal + IDV 1, 2, 4, 7, 13;
``snapshot-hard``: adds IDV 8 and 17) are one 53-feature sample every 3 min:

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

A snapshot sample has 53 raw features: the 41 measurements XMEAS(1..41) followed by the 12
manipulated variables XMV(1..12) as commanded by the controller. They are float32 and *not*
scaled by the benchmark (its default ``data.normalization`` is "federated", see
:mod:`fedsim.data.normalization`).

Everything is seeded from ``data.seed``; a snapshot mode is built once per (variant, size, seed) into
``data.cache_dir``, the windows once per (mode, class, size, seed). The simulation itself lives in
:mod:`fedsim.data.benchmarks.tep_simulation`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, Sequence

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks import tep_simulation
from fedsim.data.benchmarks.options import check_domain, choice, count
from fedsim.data.benchmarks.splits import feature_domain, split_domain
from fedsim.data.benchmarks.tep_simulation import MODES
from fedsim.data.cache import load_arrays, save_arrays
from fedsim.data.normalization import MIN_STD
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

VERSION = "v1"  # bump whenever the generated snapshot data change, so old caches are not reused
WINDOWS_VERSION = "w2"  # the same for the windows
SNAPSHOT_FAULTS: tuple[str, ...] = ("idv_01", "idv_02", "idv_04", "idv_07", "idv_13")
WINDOW_CLASSES: tuple[str, ...] = ("normal",) + tuple(f"idv_{i:02d}" for i in range(1, 29))
VARIANTS: dict[str, tuple[str, ...]] = {
    "windows": WINDOW_CLASSES,
    "snapshot": ("normal",) + SNAPSHOT_FAULTS,
    "snapshot-hard": ("normal",) + SNAPSHOT_FAULTS + ("idv_08", "idv_17"),
}
VARIANT_ALIASES = {"default": "windows"}
SCALINGS = ("mode", "none")
DEFAULT_WINDOWS_PER_CLASS = 10  # per class and mode, train + test: see the module docstring
DEFAULT_SAMPLES_PER_CLASS = 200  # snapshot variants: train + test, per class and mode
KEY_SPLIT = 1000  # + mode number
KEY_SUBSAMPLE = 2000  # + mode number
WINDOW_OPTIONS = ("windows_per_class", "window", "workers")
WINDOW_ARRAYS = ("x", "window", "intensity", "shutdowns")  # a class's cache file
SNAPSHOT_OPTIONS = ("samples_per_class",)


def feature_names() -> list[str]:
    """The 53 snapshot feature names: XMEAS(1..41) then XMV(1..12), as named by tep-studio."""
    from tep_studio import TEP_SCHEMA

    meas = [f"xmeas_{i + 1:02d}_{v.name}" for i, v in enumerate(TEP_SCHEMA.measurements)]
    mvs = [f"xmv_{i + 1:02d}_{v.name}" for i, v in enumerate(TEP_SCHEMA.manipulated_variables)]
    return meas + mvs


def window_variable_names() -> list[str]:
    """The 34 channels of a window: XMEAS(1..23) then XMV(2..12), as named by tep-studio."""
    names = feature_names()
    return [names[i] for i in tep_simulation.WINDOW_MEASUREMENTS] + [names[41 + i] for i in tep_simulation.WINDOW_MVS]


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


def _variant(options) -> str:
    return choice(options, "variant", "tep variant", sorted(VARIANTS), "windows", VARIANT_ALIASES)


def _digest(settings: tuple) -> str:
    return hashlib.sha256(repr(settings).encode("utf-8")).hexdigest()[:10]


def mode_scaling(train_x: np.ndarray, *others: np.ndarray) -> tuple[np.ndarray, ...]:
    """Standardize windows (N, variables, length) per variable by the mean and standard deviation of ``train_x``
    over its windows and time steps; a variable without spread is only centred. Returns (train_x, *others)."""
    data = np.asarray(train_x, dtype=np.float64)
    mean = data.mean(axis=(0, 2))
    std = data.std(axis=(0, 2))
    std = np.where(std > np.maximum(MIN_STD, 1e-7 * np.abs(mean)), std, 1.0)
    scale = [(np.asarray(x, np.float64) - mean[:, None]) / std[:, None] for x in (train_x,) + others]
    return tuple(x.astype(np.float32) for x in scale)


@BENCHMARKS.register("tep")
class TEPBenchmark(Benchmark):
    """Tennessee Eastman process (tep-studio): six operating modes, 29 classes, windows of 34 variables x 600 steps

    Configuration read from the data section: ``seed``, ``cache_dir``,
    ``max_train_per_domain``, ``sources`` (the source modes; default: all modes but the
    target) and its own options (:class:`TEPBenchmark.Options`).
    """

    @dataclass(frozen=True)
    class Options:
        """``data.variant``: "windows" (or "default": the authors' 29-class windows), "snapshot" (53 features a
        sample; normal + idv 01, 02, 04, 07, 13) or "snapshot-hard" (adds idv 08 and 17).
        Windows: ``data.windows_per_class``: windows per class and mode, train + test (None: 10);
        ``data.window``: samples per window (None: 600, 30 h); ``data.scaling``: "mode" (each mode standardized per
        variable by its own statistics, the authors' scaling) or "none"; ``data.workers``: processes simulating a
        mode's classes (None: one per core; 1: none besides the run's own).
        Snapshots: ``data.samples_per_class``: train + test samples per class and mode (None: 200)."""

        ALIASES: ClassVar[dict[str, dict[str, str]]] = {"variant": VARIANT_ALIASES}
        """Other names of option values (recipes match the canonical one)."""

        variant: str = "default"
        windows_per_class: Optional[int] = None
        window: Optional[int] = None
        scaling: str = "mode"
        workers: Optional[int] = None
        samples_per_class: Optional[int] = None

        def __post_init__(self):
            variant = _variant(self)
            choice(self, "scaling", "tep scaling", SCALINGS, "mode")
            count(self, "windows_per_class", "tep")
            count(self, "window", "tep")
            count(self, "workers", "tep", minimum=1)
            count(self, "samples_per_class", "tep")
            windows = variant == "windows"
            foreign = SNAPSHOT_OPTIONS if windows else WINDOW_OPTIONS
            given = [f"data.{key}" for key in foreign if getattr(self, key) is not None]
            if not windows and self.scaling not in ("", "mode"):
                given.append("data.scaling")
            if given:
                kind = "the snapshot variants" if windows else "the windows variant (data.variant=windows)"
                verb = "applies" if len(given) == 1 else "apply"
                raise UserError(f"{', '.join(given)} only {verb} to {kind} of the tep benchmark, not to {variant}")

    @property
    def variant(self) -> str:
        return _variant(self.options)

    @property
    def windows(self) -> bool:
        """Whether this is the windows benchmark (else a snapshot variant)."""
        return self.variant == "windows"

    @property
    def default_normalization(self) -> str:
        """Windows: "none", as the benchmark scales each mode itself (``data.scaling``); snapshots: "federated" (one
        standardization shared by all clients, from their sums)."""
        return "none" if self.windows else "federated"

    default_target = "mode2"

    @property
    def classes(self) -> tuple[str, ...]:
        return VARIANTS[self.variant]

    @property
    def samples_per_class(self) -> int:
        """Snapshot variants: samples per class and mode."""
        value = count(self.options, "samples_per_class", "tep")
        return DEFAULT_SAMPLES_PER_CLASS if value is None else value

    @property
    def windows_per_class(self) -> int:
        value = count(self.options, "windows_per_class", "tep")
        return DEFAULT_WINDOWS_PER_CLASS if value is None else value

    @property
    def window_length(self) -> int:
        return count(self.options, "window", "tep") or tep_simulation.WINDOW_LENGTH

    @property
    def scaling(self) -> str:
        return choice(self.options, "scaling", "tep scaling", SCALINGS, "mode")

    def describe(self) -> str:
        if not self.windows:
            return (
                f"Tennessee Eastman process (tep-studio), {self.variant} variant: six operating modes, "
                f"{len(self.classes)} classes, 53 raw features, {self.samples_per_class} samples per class and mode"
            )
        return (
            f"Tennessee Eastman process (tep-studio): six operating modes, 29 classes, windows of 34 variables x "
            f"{self.window_length} steps, {self.windows_per_class} windows per class and mode, scaling {self.scaling}"
        )

    def domains(self) -> list[str]:
        """All six modes (``data.sources`` narrows the federation in fedsim.data.scenario)."""
        return list(MODES)

    def window_timing(self, domain: str) -> tep_simulation.WindowTiming:
        return tep_simulation.WindowTiming(tep_simulation.SETTLE_HOURS[domain], length=self.window_length)

    def cache_name(self, domain: str, cls: Optional[str] = None) -> str:
        """Cache file stem: version, variant, size, seed, mode and a hash of every generation setting; the windows are
        cached per class (``cls``), so that a grid, a cluster and ``fedsim data prepare`` share them."""
        sim = tep_simulation
        seed = int(self.config.seed)
        if self.windows:
            timing = self.window_timing(domain)
            settings = (timing, sim.WINDOW_MEASUREMENTS, sim.WINDOW_MVS, sim.INTENSITIES, _tep_version())
            stem = (
                f"tep-{WINDOWS_VERSION}-windows-n{self.windows_per_class}-l{self.window_length}-seed{seed}-{domain}-"
                f"{_digest(settings)}"
            )
            return stem if cls is None else f"{stem}-{cls}"
        settings = (
            self.classes,
            sim.SETTLE_HOURS[domain],
            sim.WARMUP_HOURS,
            sim.SAMPLE_HOURS,
            sim.CONTROL_INTERVAL,
            _tep_version(),
        )
        return f"tep-{VERSION}-{self.variant}-n{self.samples_per_class}-seed{seed}-{domain}-{_digest(settings)}"

    def cached_windows(
        self, domains: Sequence[str], keep: bool = True
    ) -> tuple[dict[tuple[str, str], dict[str, np.ndarray]], dict[str, list[str]]]:
        """``(found, needs)``: the classes of ``domains`` in the cache (``{(mode, class): arrays}``, empty unless
        ``keep``) and those missing (``{mode: [class, ...]}``)."""
        for domain in domains:
            check_domain("tep", domain, MODES)
        found: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        needs: dict[str, list[str]] = {}
        for domain in domains:
            for cls in self.classes:
                arrays = load_arrays(self.config.cache_dir, self.cache_name(domain, cls))
                if arrays is not None and set(arrays) == set(WINDOW_ARRAYS):
                    if keep:
                        found[domain, cls] = arrays
                else:
                    needs.setdefault(domain, []).append(cls)
        return found, needs

    def class_windows(
        self,
        domains: Sequence[str],
        *,
        map_chunks: Optional[Callable] = None,
        workers: Optional[int] = None,
        keep: bool = True,
        progress: bool = True,
    ) -> dict[tuple[str, str], dict[str, np.ndarray]]:
        """The windows of every class of ``domains``, ``{(mode, class): arrays}`` (:data:`WINDOW_ARRAYS`): from the
        cache, the missing classes simulated now (:func:`tep_simulation.simulate_classes`, its chunks handed to
        ``map_chunks``, default ``workers`` processes: None takes ``data.workers``) and cached class by class.
        ``keep=False`` (building the cache ahead of a run) returns only what could not be cached."""
        found, needs = self.cached_windows(domains, keep)
        if not needs:
            return found
        _require_tep()
        start = time.perf_counter()

        def sink(mode: str, cls: str, windows: tep_simulation.ClassWindows) -> None:
            arrays = {
                "x": windows.x,
                "window": windows.window,
                "intensity": np.array([windows.intensity]),  # one value, kept 1-d as the cache stores it
                "shutdowns": np.array([windows.shutdowns], dtype=np.int64),
            }
            if cls not in needs[mode]:  # the normal class of a mode whose normal windows were cached already
                return
            saved = save_arrays(self.config.cache_dir, self.cache_name(mode, cls), arrays)
            if keep or saved is None:
                found[mode, cls] = arrays

        tep_simulation.simulate_classes(
            needs,
            self.windows_per_class,
            int(self.config.seed),
            timings={m: self.window_timing(m) for m in needs},
            map_chunks=map_chunks,
            workers=self.options.workers if workers is None else workers,
            progress=progress,
            sink=sink,
        )
        logger.info(
            "tep: simulated %d classes of %s (%d windows of %d steps a class at most) in %.1f s",
            sum(len(c) for c in needs.values()),
            ", ".join(needs),
            self.windows_per_class,
            self.window_length,
            time.perf_counter() - start,
        )
        return found

    def raw_arrays(self, domain: str) -> dict[str, np.ndarray]:
        """All samples of one mode (before the split and scaling), from the cache or simulated now: ``x`` and
        ``y``; windows also ``window`` (each window's onset index), and ``intensity`` and ``shutdowns`` per class."""
        if self.windows:
            parts = self.class_windows([domain])
            parts = [parts[domain, cls] for cls in self.classes]
            arrays = {
                "x": np.concatenate([p["x"] for p in parts]),
                "y": np.concatenate([np.full(len(p["x"]), i, dtype=np.int64) for i, p in enumerate(parts)]),
                "window": np.concatenate([p["window"] for p in parts]),
                "intensity": np.concatenate([p["intensity"] for p in parts]),
                "shutdowns": np.concatenate([p["shutdowns"] for p in parts]),
            }
            reduced = [f"{c} {i:.0%}" for c, i in zip(self.classes[1:], arrays["intensity"][1:]) if i < 1.0]
            logger.info(
                "tep: %s: %d windows of %d steps, %d classes; %d shutdowns left out%s",
                domain,
                len(arrays["y"]),
                self.window_length,
                len(self.classes),
                int(arrays["shutdowns"].sum()),
                f"; reduced intensity: {', '.join(reduced)}" if reduced else "",
            )
            return arrays
        name = self.cache_name(domain)
        cached = load_arrays(self.config.cache_dir, name)
        if cached is not None and set(cached) == {"x", "y"}:
            return cached
        _require_tep()
        start = time.perf_counter()
        x, y = tep_simulation.simulate_mode(domain, self.classes, self.samples_per_class, int(self.config.seed))
        arrays = {"x": x, "y": y}
        logger.info(
            "tep: simulated %s (%d samples, %d classes) in %.1f s",
            domain,
            len(y),
            len(self.classes),
            time.perf_counter() - start,
        )
        save_arrays(self.config.cache_dir, name, arrays)
        return arrays

    def build_domain(self, domain: str) -> Domain:
        """One mode, split 80/20 stratified by class from ``data.seed``; windows scaled by ``data.scaling``."""
        check_domain("tep", domain, MODES)
        arrays = self.raw_arrays(domain)
        key = MODES.index(domain) + 1
        built = split_domain(
            domain, arrays["x"], arrays["y"], len(self.classes), self.config, KEY_SPLIT + key, KEY_SUBSAMPLE + key
        )
        if not self.windows or self.scaling == "none":
            return built
        train_x, test_x = mode_scaling(built.train_x, built.test_x)
        return feature_domain(domain, train_x, built.train_y, test_x, built.test_y, built.num_classes)
