"""CWRU bearing faults (Case Western Reserve University Bearing Data Center), from your files.

Domains are motor loads (the shaft speed changes with the load): ``0hp`` (about
1797 rpm), ``1hp`` (1772), ``2hp`` (1750), ``3hp`` (1730); the usual choice is three of
them (``1hp``, ``2hp``, ``3hp``). Classes are the normal baseline and the drive-end
faults ``ball_``, ``inner_`` and ``outer_`` (outer race at 6:00) of diameter 0.007,
0.014 and 0.021 in (``ball_007`` ... ``outer_021``); any subset works if every domain
has it. Layout, one CWRU ``.mat`` recording per class, renamed::

    DIR/1hp/normal.mat        (e.g. 98.mat)
    DIR/1hp/inner_007.mat     (e.g. 106.mat)
    DIR/2hp/...

A file may keep its number as ``<class>_<number>.mat`` (``normal_99.mat``): then the
variable ``X<number>_DE_time`` is used, which settles files that hold several
recordings. Otherwise the file must hold exactly one ``*_DE_time`` variable (the
drive-end accelerometer). Each signal is cut into windows of ``WINDOW`` = 1024
samples, non-overlapping (all that fit), or ``data.samples_per_class`` windows spread
evenly over the recording (overlapping when more are asked than fit). Features
(``data.variant``): ``fft`` (default), the one-sided FFT magnitude of the window minus
its mean (512 values), or ``raw`` (the 1024 samples). Split 80/20 stratified from
``data.seed``; no resampling (the signal is used at the rate it was stored).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.feature_files import read_mat, root_folder
from fedsim.data.benchmarks.options import check_domain, choice, count
from fedsim.data.benchmarks.splits import split_named_domain
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

DOMAINS: tuple[str, ...] = ("0hp", "1hp", "2hp", "3hp")
CLASSES: tuple[str, ...] = (
    "normal",
    "ball_007",
    "ball_014",
    "ball_021",
    "inner_007",
    "inner_014",
    "inner_021",
    "outer_007",
    "outer_014",
    "outer_021",
)
WINDOW = 1024
FEATURES = ("fft", "raw")
_LAYOUT = "DIR/<load>/<class>.mat with load in 0hp, 1hp, 2hp, 3hp and class in " + ", ".join(CLASSES)


def parse_name(stem: str) -> Optional[tuple[str, Optional[str]]]:
    """'inner_007' -> ('inner_007', None); 'normal_99' -> ('normal', '99'); anything else -> None."""
    stem = stem.lower()
    for cls in sorted(CLASSES, key=len, reverse=True):
        if stem == cls:
            return cls, None
        rest = stem[len(cls) + 1 :]
        if stem.startswith(cls + "_") and rest.isdigit():
            return cls, rest
    return None


def window_starts(length: int, window: int, count: Optional[int]) -> np.ndarray:
    """Start indices: every non-overlapping window, or ``count`` windows spread evenly."""
    if count is None:
        return np.arange(length // window, dtype=np.int64) * window
    return np.round(np.linspace(0, length - window, count)).astype(np.int64)


def window_features(signal: np.ndarray, starts: np.ndarray, window: int, kind: str) -> np.ndarray:
    """(len(starts), D) float32: raw windows, or one-sided FFT magnitudes (window // 2 bins, DC removed)."""
    idx = starts[:, None] + np.arange(window)[None, :]
    windows = signal[idx].astype(np.float64)
    if kind == "raw":
        return windows.astype(np.float32)
    windows = windows - windows.mean(axis=1, keepdims=True)
    spectrum = np.abs(np.fft.rfft(windows, axis=1))[:, : window // 2] * (2.0 / window)
    return spectrum.astype(np.float32)


def _de_signal(path: Path, number: Optional[str]) -> np.ndarray:
    expected = "a drive-end signal variable X<number>_DE_time (as in the CWRU files)"
    variables = read_mat(path, expected)
    keys = sorted(k for k in variables if k.endswith("_DE_time"))
    if number is not None:
        wanted = [k for k in keys if k.lstrip("X").split("_")[0].lstrip("0") == number.lstrip("0")]
        if not wanted:
            raise UserError(
                f"{path} has no variable X{int(number):03d}_DE_time (drive-end signals found: "
                f"{', '.join(keys) or 'none'}): "
                "rename the file to the number of the recording it holds"
            )
        key = wanted[0]
    elif len(keys) == 1:
        key = keys[0]
    elif not keys:
        found = ", ".join(sorted(variables)) or "none"
        raise UserError(f"{path} has no drive-end signal *_DE_time (variables found: {found}): expected {expected}")
    else:
        raise UserError(
            f"{path} holds several drive-end signals ({', '.join(keys)}): name the file <class>_<number>.mat "
            "(e.g. normal_99.mat) to pick X<number>_DE_time"
        )
    signal = np.asarray(variables[key])
    if signal.dtype == object or not np.issubdtype(signal.dtype, np.number) or np.iscomplexobj(signal):
        raise UserError(f"{path}: {key} has dtype {signal.dtype}: expected a real-valued signal")
    if signal.ndim == 2 and 1 in signal.shape:
        signal = signal.reshape(-1)
    if signal.ndim != 1:
        raise UserError(f"{path}: {key} has shape {signal.shape}: expected one signal (N x 1)")
    if len(signal) < WINDOW:
        raise UserError(f"{path}: {key} has {len(signal)} samples: at least one window of {WINDOW} is needed")
    if not np.all(np.isfinite(signal)):
        raise UserError(f"{path}: {key} has {int(np.count_nonzero(~np.isfinite(signal)))} NaN or infinite values")
    return signal.astype(np.float64)


@BENCHMARKS.register("cwru")
class CWRUBenchmark(Benchmark):
    """CWRU bearing faults from your .mat files (--set data.root=DIR): one load (0hp..3hp) per domain

    Layout ``DIR/<load>/<class>.mat`` (classes normal, ball_007 ... outer_021); windows
    of 1024 samples, FFT-magnitude (``data.variant=fft``) or raw (``raw``) features.
    """

    def __init__(self, data_config):
        super().__init__(data_config)
        self._files: Optional[dict[str, dict[str, tuple[Path, Optional[str]]]]] = None

    # ------------------------------------------------------------------ settings

    @property
    def features(self) -> str:
        return choice(self.config, "variant", "cwru feature kind", FEATURES, "fft", aliases={"default": "fft"})

    @property
    def windows_per_class(self) -> Optional[int]:
        return count(self.config, "samples_per_class", "cwru")

    # ------------------------------------------------------------------ files

    def files(self) -> dict[str, dict[str, tuple[Path, Optional[str]]]]:
        """{domain: {class: (path, recording number or None)}}, checked for a complete, consistent layout."""
        if self._files is not None:
            return self._files
        root = root_folder(self.config, "cwru", f"one sub-folder per load ({_LAYOUT})")
        folders = {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and p.name in DOMAINS}
        if len(folders) < 2:
            have = ", ".join(sorted(folders)) or "none"
            raise UserError(
                f"cwru: {str(root)!r} has {len(folders)} load folder(s) ({have}): put at least two of 0hp, 1hp, 2hp, "
                f"3hp there, laid out as {_LAYOUT}"
            )
        files: dict[str, dict[str, tuple[Path, Optional[str]]]] = {}
        for domain, folder in folders.items():
            entries: dict[str, tuple[Path, Optional[str]]] = {}
            for path in sorted(folder.iterdir()):
                if not path.is_file() or path.suffix.lower() != ".mat":
                    continue
                parsed = parse_name(path.stem)
                if parsed is None:
                    raise UserError(
                        f"cwru: {path} is not named after a class: name it <class>.mat or <class>_<number>.mat "
                        f"with class in {', '.join(CLASSES)}"
                    )
                cls, number = parsed
                if cls in entries:
                    raise UserError(f"cwru: {entries[cls][0]} and {path} are both class {cls!r} in {folder}: keep one")
                entries[cls] = (path, number)
            files[domain] = entries
        classes = [c for c in CLASSES if any(c in entries for entries in files.values())]
        if len(classes) < 2:
            raise UserError(
                f"cwru: found {len(classes)} class file(s) under {str(root)!r}: a task needs at least two ({_LAYOUT})"
            )
        for domain, entries in files.items():
            missing = [c for c in classes if c not in entries]
            if missing:
                raise UserError(
                    f"cwru: {folders[domain]} lacks {', '.join(m + '.mat' for m in missing)}: every load folder needs "
                    f"the same classes ({', '.join(classes)})"
                )
        self._files = files
        self._classes = tuple(classes)
        return files

    @property
    def classes(self) -> tuple[str, ...]:
        self.files()
        return self._classes

    def domains(self) -> list[str]:
        return [d for d in DOMAINS if d in self.files()]

    # ------------------------------------------------------------------ domains

    def build_domain(self, domain: str) -> Domain:
        """One load's windows of every class, split 80/20 stratified by class from ``data.seed``."""
        files = self.files()
        check_domain("cwru", domain, self.domains())
        xs, ys = [], []
        kind, windows = self.features, self.windows_per_class
        for label, cls in enumerate(self.classes):
            path, number = files[domain][cls]
            signal = _de_signal(path, number)
            starts = window_starts(len(signal), WINDOW, windows)
            xs.append(window_features(signal, starts, WINDOW, kind))
            ys.append(np.full(len(starts), label, dtype=np.int64))
        x, y = np.concatenate(xs), np.concatenate(ys)
        logger.info(
            "cwru %s: %d windows of %d samples (%s features), %s",
            domain,
            len(y),
            WINDOW,
            kind,
            ", ".join(f"{c} {n}" for c, n in zip(self.classes, np.bincount(y, minlength=len(self.classes)))),
        )
        return split_named_domain(domain, x, y, len(self.classes), self.config)
