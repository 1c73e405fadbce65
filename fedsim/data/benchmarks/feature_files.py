"""Reading the files a user provides (office_caltech, cwru, amazon_review, npz): one UserError line per problem."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from fedsim.data.validation import finite_float32
from fedsim.errors import UserError, first_line


def root_folder(config, benchmark: str, what: str) -> Path:
    """The folder ``data.root``, which must exist and hold ``what``."""
    root = getattr(config, "root", None)
    if root is None or str(root).strip() == "":
        raise UserError(
            f"the {benchmark} benchmark reads files you provide: pass --set data.root=DIR, a folder holding {what}"
        )
    path = Path(str(root)).expanduser()
    if not path.is_dir():
        state = "does not exist" if not path.exists() else "is not a folder"
        raise UserError(f"data.root {str(path)!r} {state}: pass --set data.root=DIR, a folder holding {what}")
    return path


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


def read_npz(
    path: Path, expected: str, keys: Optional[Iterable[str]] = None
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The arrays of an .npz file (only ``keys`` when given) and the names of all it holds."""
    if not zipfile.is_zipfile(path):
        raise UserError(f"cannot read {path}: not a valid .npz file; expected {expected}")
    wanted = None if keys is None else set(keys)
    try:
        with np.load(path, allow_pickle=False) as npz:
            found = list(npz.files)
            arrays = {k: npz[k] for k in found if wanted is None or k in wanted}
    except Exception as exc:
        raise UserError(f"cannot read {path} ({first_line(exc)}): expected {expected}") from None
    return arrays, found


def is_real(x: np.ndarray) -> bool:
    """Real numbers (ints, floats or booleans): no objects, strings or complex values."""
    return x.dtype != object and (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_) and not np.iscomplexobj(x)


def check_features(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    """A 2-D real matrix with finite values, as float32."""
    x = np.asarray(x)
    if not is_real(x):
        raise UserError(f"{path}: {key!r} has dtype {x.dtype}: it must hold real numbers (samples x features)")
    if x.ndim != 2 or min(x.shape) == 0:
        raise UserError(f"{path}: {key!r} has shape {x.shape}: it must be a samples x features matrix")
    return finite_float32(path, key, x)


def label_vector(path: Path, key: str, y, what: str, kind: str) -> np.ndarray:
    """Labels given as N, 1 x N or N x 1 (dense or sparse) -> a real-valued vector; one line naming the file
    otherwise."""
    y = np.asarray(y.toarray() if hasattr(y, "toarray") else y)
    if y.ndim == 2 and 1 in y.shape:
        y = y.reshape(-1)
    if y.ndim != 1:
        raise UserError(f"{path}: {key!r} has shape {y.shape}: it must be a vector of {what}")
    if not is_real(y):
        raise UserError(f"{path}: {key!r} has dtype {y.dtype}: labels must be {kind}")
    return y


def check_labels(path: Path, key: str, y: np.ndarray) -> np.ndarray:
    """A vector (N, 1 x N or N x 1) of non-negative integers, as int64."""
    y = label_vector(path, key, y, "integer labels", "integers")
    yf = y.astype(np.float64)
    if not np.all(np.isfinite(yf)) or np.any(yf != np.round(yf)) or np.any(yf < 0):
        bad = yf[~np.isfinite(yf) | (yf != np.round(yf)) | (yf < 0)][0]
        raise UserError(f"{path}: {key!r} holds label {bad!r}: labels must be non-negative integers")
    return yf.astype(np.int64)


def pick_pair(
    path: Path, arrays: dict, keys: Iterable[tuple[str, str]], expected: str
) -> tuple[np.ndarray, np.ndarray]:
    """The first (features, labels) pair of ``keys`` that ``arrays`` holds, as (N x D float32, N int64); a
    features x samples matrix is turned around."""
    for xk, yk in keys:
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


def read_csv_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
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
            f"cannot read {path} as CSV ({first_line(exc)}): expected one row per sample, the features then the "
            "label, comma-separated"
        ) from None
    if data.shape[1] < 2 or data.shape[0] < 1:
        raise UserError(f"{path} has shape {data.shape}: expected one row per sample, the features then the label")
    return check_features(path, "features", data[:, :-1]), check_labels(path, "last column (labels)", data[:, -1])
