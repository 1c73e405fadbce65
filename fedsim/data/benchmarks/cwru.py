"""CWRU bearing faults (Case Western Reserve University Bearing Data Center) as the DaDiL authors use them.

The DaDiL / FedDaDiL / GMM-DaDiL authors' CWRU task, from their public experiment scripts and tables (ids in the
public-code index docs/benchmarks.md cites): three domains ``A``, ``B``, ``C``, ten classes, one domain the
unlabeled target and the other two the sources; the methods run on the 256 features of an MLP trained on the two
sources of each target (``mlp_fts_256_target_<A|B|C>.pkl``, one feature file per target), and the line that would
standardize them is commented out (FedDaDiL CWRU script 40920335471, WBT 41528495697, GMM-DaDiL 40668303387). The
GMM-DaDiL README (ECML-PKDD 2024; 42115401738) gives that MLP 70.90 / 79.76 / 72.26 on targets A / B / C (mean
74.31). Their public code does not hold the step that cuts the recordings and trains the MLP, so the rest is
fedsim's, each choice stated:

* Domains: the loads ``1hp`` (1772 rpm, A), ``2hp`` (1750 rpm, B), ``3hp`` (1730 rpm, C), the cross-load
  convention whose datasets A, B, C are the loads 1, 2, 3 hp (Zhang et al., Sensors 2017, WDCNN); the authors'
  scripts do not name the loads. ``0hp`` (1797 rpm) joins when ``--target``, ``data.sources`` or ``data.loads``
  names it.
* Classes: the normal baseline and the nine drive-end faults ``ball_``, ``inner_``, ``outer_`` (outer race at
  6:00) of 0.007, 0.014, 0.021 in: the authors' ten. The classes every load of the task has are used, said in one
  line: copies without the normal recordings of 1-3 hp (the data centre's 98, 99, 100) give the nine faults, and
  the line names the files that would give the ten (:data:`FILE_NUMBERS`).
* Split: the authors' (their script reads ``dataset[source]`` whole and ``dataset[target]['fold k']['Train' |
  'Test']``, k = 0..4): each source trains on all its windows (and its accuracy is read on them); the target's
  windows fall in 5 folds stratified by class from ``data.seed``, fold ``data.target_fold`` (0) its test split, the
  other four its unlabeled training split. ``data.split=holdout``: every domain 80/20.
* Inputs: each recording cut into non-overlapping windows of ``data.window`` = 1024 samples (or
  ``data.samples_per_class`` windows spread evenly), the one-sided FFT magnitude of each window minus its mean
  (512 values, ``data.variant=fft``) or the raw window (``raw``). The MLP that makes the authors' 256 features is
  the model trained on the sources: FedAvg's own model for the source-only row, the encoder stage of FedDaDiL and
  DaDiL (``method.encoder_rounds``, ``model.hidden=256``) for the dictionary.
* No standardization of the inputs by default (``default_normalization = "none"``); the authors' commented-out
  line would act on the 256 MLP features, which their scripts therefore leave as the MLP gives them (the
  dictionary's ``method.feature_standardization=none``). Standardizing each domain by its own statistics
  (``--set data.normalization=per-domain``) uses the target's input statistics and is an adaptation method of its
  own ("FedAvg + per-domain standardization").

Layout, one 12 kHz drive-end recording of the data centre per class and load, named after the class, as shipped
with the recording's file number or without it::

    DIR/0hp/normal_97.mat        (variable X097_DE_time)
    DIR/1hp/inner_007_106.mat    (variable X106_DE_time)
    DIR/1hp/ball_007.mat         (one *_DE_time variable)
    DIR/2hp/...

With a number, the variable ``X<number>_DE_time`` is used, which settles files that hold several recordings;
without one, the file must hold exactly one ``*_DE_time`` variable (the drive-end accelerometer). Other variables
(``X<number>RPM``, fan end, base) are ignored. ``data.classes`` (``--set data.classes=ball_007,inner_007``) names
the classes, labelled in the order given; every load of the task must have them. ``data.max_train_per_domain``
applies after the split; the signal is used at the rate it was stored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.feature_files import read_mat, root_folder
from fedsim.data.benchmarks.options import check_domain, choice, count
from fedsim.data.benchmarks.splits import feature_domain, limit_train, named_streams, rng_for, split_named_domain
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS, unknown_name_message

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
#: the authors' domains A, B, C
PAPER_LOADS: tuple[str, ...] = ("1hp", "2hp", "3hp")
#: the data centre's file numbers of each class at 0, 1, 2, 3 hp (12 kHz drive end; outer race at 6:00)
FILE_NUMBERS: dict[str, tuple[int, int, int, int]] = {
    "normal": (97, 98, 99, 100),
    "ball_007": (118, 119, 120, 121),
    "ball_014": (185, 186, 187, 188),
    "ball_021": (222, 223, 224, 225),
    "inner_007": (105, 106, 107, 108),
    "inner_014": (169, 170, 171, 172),
    "inner_021": (209, 210, 211, 212),
    "outer_007": (130, 131, 132, 133),
    "outer_014": (197, 198, 199, 200),
    "outer_021": (234, 235, 236, 237),
}
WINDOW = 1024
FEATURES = ("fft", "raw")
#: ``data.split``: "folds" (the authors': the sources whole, the target in FOLDS folds) or "holdout" (80/20)
SPLITS = ("folds", "holdout")
FOLDS = 5
_LAYOUT = (
    "DIR/<load>/<class>.mat or <class>_<file number>.mat with load in 0hp, 1hp, 2hp, 3hp and class in "
    + ", ".join(CLASSES)
)


def release_name(cls: str, load: str) -> str:
    """The file a load's class is shipped as: ``1hp/normal_98.mat``."""
    return f"{load}/{cls}_{FILE_NUMBERS[cls][DOMAINS.index(load)]}.mat"


def stratified_folds(y: np.ndarray, folds: int, rng: np.random.Generator) -> np.ndarray:
    """The fold (0 .. folds-1) of every row: each class shuffled from ``rng`` and dealt out in turn, so that every
    fold holds 1/folds of each class (within one row)."""
    fold = np.empty(len(y), dtype=np.int64)
    start = 0
    for cls in np.unique(y):
        members = np.flatnonzero(y == cls)
        fold[members[rng.permutation(len(members))]] = (start + np.arange(len(members))) % folds
        start += len(members)
    return fold


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


def _de_signal(path: Path, number: Optional[str], window: int = WINDOW) -> np.ndarray:
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
    if len(signal) < window:
        raise UserError(f"{path}: {key} has {len(signal)} samples: at least one window of {window} is needed")
    if not np.all(np.isfinite(signal)):
        raise UserError(f"{path}: {key} has {int(np.count_nonzero(~np.isfinite(signal)))} NaN or infinite values")
    return signal.astype(np.float64)


def scan_load(folder: Path) -> dict[str, tuple[Path, Optional[str]]]:
    """{class: (file, recording number or None)} of one load folder; one line for a stray or duplicate file."""
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
    return entries


def _named(options, field: str, known, kind: str, example: str, one: str) -> tuple[str, ...]:
    """``data.<field>``: names among ``known``, each once, not a single one (``one`` says why)."""
    names = tuple(str(n).strip().lower() for n in (getattr(options, field, None) or ()))
    for name in names:
        if name not in known:
            raise UserError(unknown_name_message(f"cwru {kind}", name, list(known), f"--set data.{field}={example}"))
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"data.{field} names {', '.join(repeated)} more than once: name each {kind} once")
    if len(names) == 1:
        raise UserError(f"data.{field} names one {kind} ({names[0]}): {one}")
    return names


def class_option(options) -> tuple[str, ...]:
    """``data.classes``: known class names, no repeats (empty: choose the common ones)."""
    return _named(options, "classes", CLASSES, "class", "a,b", "a task needs at least two")


def load_option(options) -> tuple[str, ...]:
    """``data.loads``: known loads, no repeats, at least two (empty: the authors' three plus the ones the task
    names)."""
    return _named(options, "loads", DOMAINS, "load", "1hp,2hp,3hp", "a task needs a source and a target")


def choose_classes(files: dict[str, dict], loads: list[str], named: tuple[str, ...]) -> tuple[str, ...]:
    """The named classes, each checked in every chosen load, or the classes every chosen load has (logged)."""
    common = [c for c in CLASSES if all(c in files[d] for d in loads)]
    have = f"every chosen load has ({', '.join(common) or 'none'})"
    for cls in named:
        lacking = [d for d in loads if cls not in files[d]]
        if lacking:
            raise UserError(
                f"cwru: data.classes names {cls} but load {lacking[0]} has no {cls}.mat or {cls}_<number>.mat: "
                f"pick data.classes among the classes {have}, or leave {'load' if len(lacking) == 1 else 'loads'} "
                f"{', '.join(lacking)} out "
                "(--target and --set data.sources=...)"
            )
    if named:
        return named
    if len(common) < 2:
        raise UserError(
            f"cwru: the classes {have} are fewer than two (loads {', '.join(loads)}): "
            f"add the missing files ({_LAYOUT}) or leave the incomplete loads out with --set data.sources=..."
        )
    logger.info(class_line(common, files, loads))
    return tuple(common)


def class_line(common: list[str], files: dict[str, dict], loads: list[str]) -> str:
    """The one line a task's default classes are logged with: the count, and the files that would give the
    authors' ten classes when some are missing."""
    where = f"loads {', '.join(loads)}"
    missing = [c for c in CLASSES if c not in common]
    if not missing:
        return f"cwru: {len(common)} classes, the authors' ten, in {where}"
    names = "; ".join(
        f"{c} missing ({', '.join(release_name(c, d) for d in loads if c not in files[d])})" for c in missing
    )
    return (
        f"cwru: {len(common)} classes common to {where}, not the authors' {len(CLASSES)}: {names}; add those files "
        f"(as the data centre names them) for the {len(CLASSES)} classes"
    )


@BENCHMARKS.register("cwru")
class CWRUBenchmark(Benchmark):
    """CWRU bearing faults as the DaDiL authors use them, from your .mat files (--set data.root=DIR)

    Domains ``1hp``, ``2hp``, ``3hp`` (the authors' A, B, C; ``0hp`` when named), ten classes (normal and
    ball_007 ... outer_021, those every load of the task has), FFT magnitudes of 1024-sample windows
    (``data.variant=raw``: the windows), not standardized; the sources whole, the target in 5 folds.
    """

    @dataclass(frozen=True)
    class Options:
        """``data.variant``: the window features, "fft" (or "default") or "raw"; ``data.window``: samples per window
        (1024); ``data.samples_per_class``: windows per class and load, spread evenly (None: every non-overlapping
        window); ``data.classes``: the classes, in label order (empty: those every load of the task has);
        ``data.loads``: the domains (empty: 1hp, 2hp, 3hp and any load --target or data.sources names);
        ``data.split``: "folds" (the sources whole, the target in 5 stratified folds) or "holdout" (every domain
        80/20); ``data.target_fold``: the target's fold held out for testing (0 .. 4), the other four its unlabeled
        training part."""

        variant: str = "default"
        window: int = WINDOW
        samples_per_class: Optional[int] = None
        classes: tuple[str, ...] = ()
        loads: tuple[str, ...] = ()
        split: str = "folds"
        target_fold: int = 0

        def __post_init__(self):
            choice(self, "variant", "cwru feature kind", FEATURES, "fft", aliases={"default": "fft"})
            count(self, "window", "cwru", minimum=8)
            count(self, "samples_per_class", "cwru")
            class_option(self)
            load_option(self)
            choice(self, "split", "cwru split", SPLITS, "folds")
            fold = self.target_fold
            if isinstance(fold, bool) or not isinstance(fold, (int, np.integer)) or not 0 <= fold < FOLDS:
                raise UserError(
                    f"data.target_fold must be an integer from 0 to {FOLDS - 1} (the target's test fold), got {fold!r}"
                )

    #: none, as the authors' scripts leave their standardization line commented out; per-domain standardization
    #: (each domain by its own statistics, the target's included) is an adaptation method of its own:
    #: --set data.normalization=per-domain; =federated shares one mean and std from every client's sums
    default_normalization = "none"
    #: the authors' domain A (their table lists A first)
    default_target = "1hp"

    def __init__(self, data_config):
        super().__init__(data_config)
        self._files: Optional[dict[str, dict[str, tuple[Path, Optional[str]]]]] = None

    # ------------------------------------------------------------------ settings

    @property
    def features(self) -> str:
        return choice(self.options, "variant", "cwru feature kind", FEATURES, "fft", aliases={"default": "fft"})

    @property
    def window(self) -> int:
        return count(self.options, "window", "cwru", minimum=8) or WINDOW

    @property
    def windows_per_class(self) -> Optional[int]:
        return count(self.options, "samples_per_class", "cwru")

    def _named_loads(self) -> list[str]:
        """The loads ``--target`` and ``data.sources`` name (a target left "auto" names none)."""
        named = [getattr(self.config, "target", None)] + list(getattr(self.config, "sources", ()) or ())
        return [d for d in named if d in DOMAINS]

    def task_loads(self, available: list[str]) -> list[str]:
        """``data.loads``, or the authors' three loads and every load the target and sources name, among
        ``available``; one line when a named load has no folder or fewer than two remain."""
        named = load_option(self.options)
        asked = set(named) if named else set(self._named_loads())
        wanted = asked if named else set(PAPER_LOADS) | asked
        missing = [d for d in DOMAINS if d in asked and d not in available]
        if missing:
            raise UserError(
                f"cwru: load {missing[0]} is named ({'data.loads' if named else '--target or data.sources'}) but "
                f"{missing[0]}/ is not under {self.config.root!r} (load folders there: {', '.join(available)})"
            )
        loads = [d for d in DOMAINS if d in wanted and d in available]
        if len(loads) < 2:
            raise UserError(
                f"cwru: the task has {len(loads)} load ({', '.join(loads) or 'none'}) among the folders "
                f"{', '.join(available)}: the authors' loads are {', '.join(PAPER_LOADS)}; name the loads to use "
                "with --set data.loads=... (e.g. 0hp,1hp)"
            )
        return loads

    def chosen_loads(self, loads: list[str]) -> list[str]:
        """The target and ``data.sources`` among ``loads``, or every load when no sources are named."""
        sources = tuple(getattr(self.config, "sources", ()) or ())
        if not sources:
            return loads
        target = getattr(self.config, "target", None)
        chosen = [d for d in loads if d in sources or d == target]
        return chosen or loads

    # ------------------------------------------------------------------ files

    def files(self) -> dict[str, dict[str, tuple[Path, Optional[str]]]]:
        """{domain: {class: (path, recording number or None)}} of the task's loads; the classes are chosen on
        first call."""
        if self._files is not None:
            return self._files
        named = class_option(self.options)
        root = root_folder(self.config, "cwru", f"one sub-folder per load ({_LAYOUT})")
        folders = {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and p.name in DOMAINS}
        if len(folders) < 2:
            have = ", ".join(sorted(folders)) or "none"
            raise UserError(
                f"cwru: {str(root)!r} has {len(folders)} load folder(s) ({have}): put at least two of 0hp, 1hp, 2hp, "
                f"3hp there, laid out as {_LAYOUT}"
            )
        loads = self.task_loads([d for d in DOMAINS if d in folders])
        files = {domain: scan_load(folders[domain]) for domain in loads}
        if not any(files.values()):
            raise UserError(f"cwru: the load folders under {str(root)!r} hold no .mat file: expected {_LAYOUT}")
        self._classes = choose_classes(files, self.chosen_loads(loads), named)
        self._files = files
        return files

    @property
    def classes(self) -> tuple[str, ...]:
        self.files()
        return self._classes

    def domains(self) -> list[str]:
        return list(self.files())

    # ------------------------------------------------------------------ domains

    def build_domain(self, domain: str) -> Domain:
        """One load's windows of every class, split as ``data.split`` says (:meth:`split`)."""
        files = self.files()
        if domain in DOMAINS and domain not in files:
            raise UserError(
                f"cwru: load {domain} is not in the task (loads {', '.join(files)}): name it with --target, "
                "--set data.sources=... or --set data.loads=..."
            )
        check_domain("cwru", domain, self.domains())
        lacking = [c for c in self.classes if c not in files[domain]]
        if lacking:
            raise UserError(
                f"cwru: load {domain} has no {lacking[0]}.mat or {lacking[0]}_<number>.mat: pick data.classes from "
                f"the classes it has ({', '.join(c for c in self.classes if c in files[domain])}) or leave {domain} out"
            )
        xs, ys = [], []
        kind, window, windows = self.features, self.window, self.windows_per_class
        for label, cls in enumerate(self.classes):
            path, number = files[domain][cls]
            signal = _de_signal(path, number, window)
            starts = window_starts(len(signal), window, windows)
            xs.append(window_features(signal, starts, window, kind))
            ys.append(np.full(len(starts), label, dtype=np.int64))
        x, y = np.concatenate(xs), np.concatenate(ys)
        logger.info(
            "cwru %s: %d windows of %d samples (%s features), %s",
            domain,
            len(y),
            window,
            kind,
            ", ".join(f"{c} {n}" for c, n in zip(self.classes, np.bincount(y, minlength=len(self.classes)))),
        )
        return self.split(domain, x, y)

    @property
    def target(self) -> str:
        target = getattr(self.config, "target", "auto")
        return self.default_target if target in (None, "auto") else target

    def split(self, domain: str, x: np.ndarray, y: np.ndarray) -> Domain:
        """``data.split=folds``, the authors' (FedDaDiL CWRU script: ``dataset[source]`` whole, ``dataset[target]
        ['fold k']['Train' | 'Test']`` for k in 0..4): a source trains on all its windows and is evaluated on the
        same windows; the target's windows are cut into 5 folds stratified by class from ``data.seed``, fold
        ``data.target_fold`` its test split, the other four its (unlabeled) training split. ``holdout``: every
        domain 80/20 stratified from ``data.seed``. Then ``data.max_train_per_domain``."""
        if self.options.split == "holdout":
            return split_named_domain(domain, x, y, len(self.classes), self.config)
        split_key, subsample_key = named_streams(domain)
        seed = int(self.config.seed)
        if domain != self.target:
            train_x, train_y = limit_train(x, y, self.config.max_train_per_domain, seed, subsample_key)
            return feature_domain(domain, train_x, train_y, x, y, len(self.classes))
        fold = stratified_folds(y, FOLDS, rng_for(seed, split_key))
        test = fold == self.options.target_fold
        train_x, train_y = limit_train(x[~test], y[~test], self.config.max_train_per_domain, seed, subsample_key)
        return feature_domain(domain, train_x, train_y, x[test], y[test], len(self.classes))
