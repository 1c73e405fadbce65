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
once per (mode, variant, samples per class, seed) into ``data.cache_dir``. The simulation
itself lives in :mod:`fedsim.data.benchmarks.tep_simulation`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks import tep_simulation
from fedsim.data.benchmarks.options import check_domain, choice, count
from fedsim.data.benchmarks.splits import split_domain
from fedsim.data.benchmarks.tep_simulation import MODES
from fedsim.data.cache import load_arrays, save_arrays
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

VERSION = "v1"  # bump whenever the generated data changes, so old caches are not reused
DEFAULT_FAULTS: tuple[str, ...] = ("idv_01", "idv_02", "idv_04", "idv_07", "idv_13")
VARIANTS: dict[str, tuple[str, ...]] = {
    "default": ("normal",) + DEFAULT_FAULTS,
    "hard": ("normal",) + DEFAULT_FAULTS + ("idv_08", "idv_17"),
}
DEFAULT_SAMPLES_PER_CLASS = 200  # train + test, per class and mode
KEY_SPLIT = 1000  # + mode number
KEY_SUBSAMPLE = 2000  # + mode number


def feature_names() -> list[str]:
    """The 53 feature names: XMEAS(1..41) then XMV(1..12), as named by tep-studio."""
    from tep_studio import TEP_SCHEMA

    meas = [f"xmeas_{i + 1:02d}_{v.name}" for i, v in enumerate(TEP_SCHEMA.measurements)]
    mvs = [f"xmv_{i + 1:02d}_{v.name}" for i, v in enumerate(TEP_SCHEMA.manipulated_variables)]
    return meas + mvs


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
    """Tennessee Eastman process (tep-studio): six operating modes, normal + faults, 53 raw features

    Configuration read from the data section: ``seed``, ``cache_dir``,
    ``max_train_per_domain``, ``sources`` (the source modes; default: all modes but the
    target) and its own options (:class:`TEPBenchmark.Options`).
    """

    @dataclass(frozen=True)
    class Options:
        """``data.variant``: "default" (normal + idv 01, 02, 04, 07, 13) or "hard" (adds idv 08 and 17);
        ``data.samples_per_class``: train + test samples per class and mode (None: 200)."""

        variant: str = "default"
        samples_per_class: Optional[int] = None

        def __post_init__(self):
            choice(self, "variant", "tep variant", sorted(VARIANTS), "default")
            count(self, "samples_per_class", "tep")

    default_normalization = "federated"  # one standardization shared by all clients, from their sums
    default_target = "mode2"

    @property
    def variant(self) -> str:
        return choice(self.options, "variant", "tep variant", sorted(VARIANTS), "default")

    @property
    def classes(self) -> tuple[str, ...]:
        return VARIANTS[self.variant]

    @property
    def samples_per_class(self) -> int:
        value = count(self.options, "samples_per_class", "tep")
        return DEFAULT_SAMPLES_PER_CLASS if value is None else value

    def domains(self) -> list[str]:
        """All six modes (``data.sources`` narrows the federation in fedsim.data.scenario)."""
        return list(MODES)

    def cache_name(self, domain: str) -> str:
        """Cache file stem: version, variant, samples, seed, mode and a hash of every generation setting."""
        sim = tep_simulation
        settings = repr(
            (
                self.classes,
                sim.SETTLE_HOURS[domain],
                sim.WARMUP_HOURS,
                sim.SAMPLE_HOURS,
                sim.CONTROL_INTERVAL,
                _tep_version(),
            )
        )
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
        x, y = tep_simulation.simulate_mode(domain, self.classes, self.samples_per_class, int(self.config.seed))
        logger.info(
            "tep: simulated %s (%d samples, %d classes) in %.1f s",
            domain,
            len(y),
            len(self.classes),
            time.perf_counter() - start,
        )
        save_arrays(self.config.cache_dir, name, {"x": x, "y": y})
        return x, y

    def build_domain(self, domain: str) -> Domain:
        """One mode, split 80/20 stratified by class from ``data.seed``."""
        check_domain("tep", domain, MODES)
        x, y = self.raw_arrays(domain)
        key = MODES.index(domain) + 1
        return split_domain(domain, x, y, len(self.classes), self.config, KEY_SPLIT + key, KEY_SUBSAMPLE + key)
