"""Office-Caltech10 (Gong et al. 2012) from the feature files it is usually released as.

Four domains, ``amazon``, ``caltech``, ``dslr``, ``webcam``, ten shared classes. Put the
files of one feature form in one folder and pass it with ``--set data.root=DIR``
(file names are matched case-insensitively):

* ``decaf``: DeCAF6 (4096-d), ``<domain>_decaf.mat`` with ``feas`` (N x 4096) and
  ``labels`` (N x 1, 1..10), as in the common release (``caltech_decaf.mat`` for Caltech).
* ``surf``: SURF bag of words (800-d), ``<domain>_SURF_L10.mat`` with ``fts`` and
  ``labels`` (``Caltech10_SURF_L10.mat`` for Caltech); the z-scored release
  ``<domain>_zscore_SURF_L10.mat`` (``Xt``, ``Yt``) is read too.
* ``resnet50``: ResNet-50 features (2048-d) as ``<domain>.npz`` or
  ``<domain>_resnet50.npz`` (arrays ``x``, ``y``), or as the CSV release
  ``<domain>_<domain>.csv`` (one row per image: the features, then the label).

``data.variant`` picks the form (``decaf``, ``surf``, ``resnet50``); the default,
``auto``, takes the first of decaf, resnet50, surf whose files exist for every domain.
Labels 1..10 are shifted to 0..9. Each domain is split 80/20 stratified by label
from ``data.seed``; features are returned raw (see :mod:`fedsim.data.normalization`).
"""
from __future__ import annotations

import hashlib
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.digits import rng_for, stratified_split, stratified_subsample
from fedsim.data.validation import finite_float32
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS, unknown_name_message

logger = logging.getLogger(__name__)

DOMAINS: tuple[str, ...] = ("amazon", "caltech", "dslr", "webcam")
NUM_CLASSES = 10
_KEY_SPLIT = 1
_KEY_SUBSAMPLE = 2


@dataclass(frozen=True)
class FeatureForm:
    name: str
    description: str
    patterns: tuple[str, ...]  # file names, "{d}" = domain name (or a Caltech alias)
    keys: tuple[tuple[str, str], ...]  # (features, labels) pairs tried in order (.mat / .npz)


FORMS: dict[str, FeatureForm] = {
    "decaf": FeatureForm("decaf", "DeCAF6 .mat (feas, labels)", ("{d}_decaf.mat",), (("feas", "labels"),)),
    "resnet50": FeatureForm(
        "resnet50", "ResNet-50 .npz (x, y) or .csv (features..., label)",
        ("{d}.npz", "{d}_resnet50.npz", "{d}_{d}.csv"), (("x", "y"),),
    ),
    "surf": FeatureForm(
        "surf", "SURF .mat (fts, labels)", ("{d}_SURF_L10.mat", "{d}_zscore_SURF_L10.mat"),
        (("fts", "labels"), ("Xt", "Yt")),
    ),
}
AUTO_ORDER = ("decaf", "resnet50", "surf")
_ALIASES = {"caltech": ("caltech", "Caltech10")}  # the SURF release names it Caltech10_SURF_L10.mat


def domain_key(name: str) -> int:
    """A stable integer per domain name (Python's hash() differs between processes)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "little")


# ----------------------------------------------------------------------------- file reading (shared with cwru)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_mat(path: Path, expected: str) -> dict[str, np.ndarray]:
    """Variables of a MATLAB file (v4-v7); any problem is one UserError naming the file and ``expected``."""
    import scipy.io

    try:
        raw = scipy.io.loadmat(str(path))
    except NotImplementedError:  # scipy's answer for v7.3 (HDF5) files
        raise UserError(
            f"{path} is a MATLAB v7.3 (HDF5) file, which scipy cannot read: re-save it in MATLAB with "
            f"save(name, ..., '-v7'); expected {expected}"
        ) from None
    except Exception as exc:  # truncated, not a .mat, permission denied, ...
        raise UserError(f"cannot read {path} as a MATLAB .mat file ({first_line(exc)}): expected {expected}") from None
    return {k: v for k, v in raw.items() if not k.startswith("__")}


def check_features(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    """A 2-D real matrix with finite values, as float32."""
    x = np.asarray(x)
    if x.dtype == object or not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_) or np.iscomplexobj(x):
        raise UserError(f"{path}: {key!r} has dtype {x.dtype}: it must hold real numbers (samples x features)")
    if x.ndim != 2 or min(x.shape) == 0:
        raise UserError(f"{path}: {key!r} has shape {x.shape}: it must be a samples x features matrix")
    return finite_float32(path, key, x)


def check_labels(path: Path, key: str, y: np.ndarray) -> np.ndarray:
    """A vector (N, 1 x N or N x 1) of non-negative integers, as int64."""
    y = np.asarray(y)
    if y.ndim == 2 and 1 in y.shape:
        y = y.reshape(-1)
    if y.ndim != 1:
        raise UserError(f"{path}: {key!r} has shape {y.shape}: it must be a vector of integer labels")
    if y.dtype == object or not (np.issubdtype(y.dtype, np.number) or y.dtype == np.bool_) or np.iscomplexobj(y):
        raise UserError(f"{path}: {key!r} has dtype {y.dtype}: labels must be integers")
    yf = y.astype(np.float64)
    if not np.all(np.isfinite(yf)) or np.any(yf != np.round(yf)) or np.any(yf < 0):
        bad = yf[~np.isfinite(yf) | (yf != np.round(yf)) | (yf < 0)][0]
        raise UserError(f"{path}: {key!r} holds label {bad!r}: labels must be non-negative integers")
    return yf.astype(np.int64)


def split_domain(name: str, x: np.ndarray, y: np.ndarray, num_classes: int, config) -> Domain:
    """80/20 split stratified by label from ``data.seed``, then ``max_train_per_domain``."""
    seed = int(config.seed)
    key = domain_key(name)
    train_idx, test_idx = stratified_split(y, rng_for(seed, key * 4 + _KEY_SPLIT))
    train_x, train_y = x[train_idx], y[train_idx]
    limit = config.max_train_per_domain
    if limit is not None and limit < len(train_y):
        keep = stratified_subsample(train_y, int(limit), rng_for(seed, key * 4 + _KEY_SUBSAMPLE))
        train_x, train_y = train_x[keep], train_y[keep]
    return Domain(
        name=name,
        train_x=np.ascontiguousarray(train_x, dtype=np.float32),
        train_y=np.ascontiguousarray(train_y, dtype=np.int64),
        test_x=np.ascontiguousarray(x[test_idx], dtype=np.float32),
        test_y=np.ascontiguousarray(y[test_idx], dtype=np.int64),
        num_classes=num_classes,
    )


def root_folder(config, benchmark: str, what: str) -> Path:
    root = getattr(config, "root", None)
    if root is None or str(root).strip() == "":
        raise UserError(f"the {benchmark} benchmark reads files you provide: pass --set data.root=DIR, a folder holding {what}")
    path = Path(str(root)).expanduser()
    if not path.is_dir():
        state = "does not exist" if not path.exists() else "is not a folder"
        raise UserError(f"data.root {str(path)!r} {state}: pass --set data.root=DIR, a folder holding {what}")
    return path


# ----------------------------------------------------------------------------- this benchmark


def _expected_names(form: FeatureForm, domain: str) -> list[str]:
    """File names that hold ``domain`` in ``form``, in the order they are looked for."""
    return [pattern.format(d=alias) for alias in _ALIASES.get(domain, (domain,)) for pattern in form.patterns]


def _read_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Rows of features followed by the label; an optional header line is skipped."""
    try:
        with open(path, "r", encoding="utf-8") as fh:
            first = fh.readline()
        try:
            [float(v) for v in first.strip().split(",") if v.strip()]
            skip = 0
        except ValueError:
            skip = 1
        data = np.loadtxt(path, delimiter=",", skiprows=skip, ndmin=2, dtype=np.float64)
    except Exception as exc:
        raise UserError(
            f"cannot read {path} as CSV ({first_line(exc)}): expected one row per image, the features then the label, "
            "comma-separated"
        ) from None
    if data.shape[1] < 2 or data.shape[0] < 1:
        raise UserError(f"{path} has shape {data.shape}: expected one row per image, the features then the label")
    return check_features(path, "features", data[:, :-1]), check_labels(path, "last column (labels)", data[:, -1])


def _read_npz(path: Path, form: FeatureForm) -> tuple[np.ndarray, np.ndarray]:
    expected = "arrays x (N x D features) and y (N labels)"
    if not zipfile.is_zipfile(path):
        raise UserError(f"cannot read {path}: not a valid .npz file; expected {expected}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as exc:
        raise UserError(f"cannot read {path} ({first_line(exc)}): expected {expected}") from None
    return _pick(path, arrays, form, expected)


def _pick(path: Path, arrays: dict, form: FeatureForm, expected: str) -> tuple[np.ndarray, np.ndarray]:
    for xk, yk in form.keys:
        if xk in arrays and yk in arrays:
            x = check_features(path, xk, arrays[xk])
            y = check_labels(path, yk, arrays[yk])
            if x.shape[0] != len(y) and x.shape[1] == len(y):  # stored features x samples
                x = np.ascontiguousarray(x.T)
            if x.shape[0] != len(y):
                raise UserError(f"{path}: {xk!r} has {x.shape[0]} rows but {yk!r} has {len(y)} labels: they must match")
            return x, y
    found = ", ".join(sorted(arrays)) or "none"
    raise UserError(f"{path} lacks the expected variables (found: {found}): expected {expected}")


@BENCHMARKS.register("office_caltech")
class OfficeCaltechBenchmark(Benchmark):
    """Office-Caltech10 features from your files (--set data.root=DIR): amazon, caltech, dslr, webcam

    DeCAF6 ``<domain>_decaf.mat``, SURF ``<domain>_SURF_L10.mat`` or ResNet-50
    ``<domain>.npz`` / ``<domain>_<domain>.csv``; ``data.variant`` = auto | decaf | surf | resnet50.
    """

    def __init__(self, data_config):
        super().__init__(data_config)
        self._arrays: Optional[dict[str, tuple[np.ndarray, np.ndarray]]] = None
        self._loaded: dict[str, Domain] = {}

    def domains(self) -> list[str]:
        return list(DOMAINS)

    # ------------------------------------------------------------------ files

    def _form_names(self) -> tuple[str, ...]:
        variant = str(getattr(self.config, "variant", None) or "auto")
        if variant in ("auto", "default"):
            return AUTO_ORDER
        if variant not in FORMS:
            raise UserError(unknown_name_message("office_caltech feature form", variant, ["auto"] + sorted(FORMS),
                                                 "--set data.variant=..."))
        return (variant,)

    def files(self) -> tuple[FeatureForm, dict[str, Path]]:
        """The feature form in use and its file per domain; one UserError line if incomplete."""
        root = root_folder(self.config, "office_caltech", "the Office-Caltech10 feature files (e.g. amazon_decaf.mat)")
        present = {p.name.lower(): p for p in root.iterdir() if p.is_file()}
        best: Optional[tuple[FeatureForm, dict[str, Path]]] = None
        for name in self._form_names():
            form = FORMS[name]
            found = {}
            for domain in DOMAINS:
                for candidate in _expected_names(form, domain):
                    if candidate.lower() in present:
                        found[domain] = present[candidate.lower()]
                        break
            if len(found) == len(DOMAINS):
                return form, found
            if best is None or len(found) > len(best[1]):
                best = (form, found)
        assert best is not None
        form, found = best
        missing = "; ".join(f"{' or '.join(_expected_names(form, d))}" for d in DOMAINS if d not in found)
        others = [n for n in self._form_names() if n != form.name]
        alternatives = "".join(
            f"; or, for {FORMS[n].description}, {' / '.join(p.replace('{d}', '<domain>') for p in FORMS[n].patterns)}" for n in others
        )
        raise UserError(
            f"office_caltech: missing feature files in {str(root)!r}: for {form.description} put {missing} there"
            f"{alternatives} (one file per domain: {', '.join(DOMAINS)}; names are case-insensitive)"
        )

    def _read_all(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        if self._arrays is not None:
            return self._arrays
        form, files = self.files()
        arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for domain, path in files.items():
            if path.suffix.lower() == ".mat":
                expected = " or ".join(f"variables {xk} (N x D) and {yk} (N labels 1..10)" for xk, yk in form.keys)
                arrays[domain] = _pick(path, read_mat(path, expected), form, expected)
            elif path.suffix.lower() == ".npz":
                arrays[domain] = _read_npz(path, form)
            else:
                arrays[domain] = _read_csv(path)
        dims = {d: x.shape[1] for d, (x, _) in arrays.items()}
        if len(set(dims.values())) > 1:
            listing = ", ".join(f"{files[d].name}: {n}" for d, n in dims.items())
            raise UserError(f"office_caltech: the feature files have different dimensions ({listing}): use one feature form for all domains")
        labels = np.concatenate([y for _, y in arrays.values()])
        one_based = labels.max() >= NUM_CLASSES  # the .mat releases number classes 1..10
        low, high = (1, NUM_CLASSES) if one_based else (0, NUM_CLASSES - 1)
        for domain, (x, y) in arrays.items():
            if y.min() < low or y.max() > high:
                bad = int(y[(y < low) | (y > high)][0])
                raise UserError(
                    f"{files[domain]} holds label {bad}: Office-Caltech10 labels must be 1..10 (or 0..9 in every file)"
                )
            if one_based:
                arrays[domain] = (x, y - 1)
            if len(y) < 2:
                raise UserError(f"{files[domain]} holds {len(y)} sample(s): a domain needs at least 2 (train and test)")
        logger.info("office_caltech: %s features, %d dims, %s", form.name, next(iter(dims.values())),
                    ", ".join(f"{d} {len(y)}" for d, (_, y) in arrays.items()))
        self._arrays = arrays
        return arrays

    def load(self, domain: str) -> Domain:
        if domain not in DOMAINS:
            raise UserError(unknown_name_message("domain of benchmark 'office_caltech'", domain, list(DOMAINS), "--target"))
        if domain not in self._loaded:
            x, y = self._read_all()[domain]
            self._loaded[domain] = split_domain(domain, x, y, NUM_CLASSES, self.config)
        return self._loaded[domain]
