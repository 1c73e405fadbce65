"""User-provided domains: one ``<domain>.npz`` per domain in the folder ``data.root``.

Each file holds ``x`` (N x D features, or N x C x H x W images) and ``y`` (N integer
labels 0..K-1), and optionally ``x_test``/``y_test``; without them the domain is split
80/20 stratified by label from ``data.seed``. Make one with::

    numpy.savez("domains/siteA.npz", x=features, y=labels)

then run with ``--benchmark npz --set data.root=domains``. Every file is checked on
first use and any problem is reported as one line naming the file.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.feature_files import is_real, root_folder
from fedsim.data.benchmarks.splits import feature_domain, limit_train, named_streams, split_named_domain
from fedsim.data.validation import finite_float32
from fedsim.errors import UserError, first_line
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

_HOW = "save each domain with numpy.savez(path, x=features, y=labels)"


@BENCHMARKS.register("npz")
class NpzBenchmark(Benchmark):
    """Your own domains: one <domain>.npz (arrays x, y) per domain in --set data.root=DIR

    ``x`` is N x D (features) or N x C x H x W (images), ``y`` holds N integer labels;
    optional ``x_test``/``y_test``, otherwise an 80/20 stratified split from ``data.seed``.
    """

    def __init__(self, data_config):
        super().__init__(data_config)
        self._raw: Optional[dict[str, dict[str, np.ndarray]]] = None  # per domain: x, y[, x_test, y_test]
        self._num_classes: Optional[int] = None

    # ------------------------------------------------------------------ files

    def _root(self) -> Path:
        return root_folder(self.config, "npz", "one <domain>.npz per domain (arrays x and y)")

    def _files(self) -> dict[str, Path]:
        root = self._root()
        files = {p.stem: p for p in sorted(root.glob("*.npz")) if p.is_file()}
        if not files:
            raise UserError(
                f"no .npz files in data.root {str(root)!r}: put one <domain>.npz per domain there, each with "
                f"arrays x (N x D or N x C x H x W) and y (N integer labels); {_HOW}"
            )
        return files

    def domains(self) -> list[str]:
        return sorted(self._files())

    # ------------------------------------------------------------------ validation

    def validate(self) -> None:
        """Read and check every domain file once (the arrays stay in memory)."""
        if self._raw is not None:
            return
        files = self._files()
        if len(files) < 2:
            only = next(iter(files.values()))
            raise UserError(
                f"only one domain file ({only}) in data.root {str(only.parent)!r}: domain adaptation needs at "
                "least two <domain>.npz files (a target and one or more sources)"
            )
        raw: dict[str, dict[str, np.ndarray]] = {}
        reference: Optional[tuple[Path, tuple[int, ...]]] = None
        max_label = -1
        for name, path in files.items():
            arrays = _read_file(path)
            for key in ("x", "x_test"):
                if key not in arrays:
                    continue
                shape = tuple(arrays[key].shape[1:])
                if reference is None:
                    reference = (path, shape)
                elif shape != reference[1]:
                    raise UserError(
                        f"{path}: {key} has samples of shape {shape} but {reference[0]} has {reference[1]}: "
                        "all domains must share the same input shape"
                    )
            for key in ("y", "y_test"):
                if key in arrays and len(arrays[key]):
                    max_label = max(max_label, int(arrays[key].max()))
            raw[name] = arrays
        self._raw = raw
        self._num_classes = max_label + 1
        if self._num_classes < 2:
            raise UserError(
                f"all labels in data.root {str(self._root())!r} are 0: a classification task needs at least two "
                "classes (labels 0..K-1)"
            )
        seen = np.unique(np.concatenate([a[k] for a in raw.values() for k in ("y", "y_test") if k in a]))
        if len(seen) < self._num_classes:
            logger.warning(
                "npz benchmark: labels run 0..%d but only %d distinct labels occur; the missing classes are never seen",
                self._num_classes - 1,
                len(seen),
            )
        logger.info(
            "npz benchmark: %d domains, %d classes, input shape %s",
            len(raw),
            self._num_classes,
            reference[1] if reference else None,
        )

    @property
    def num_classes(self) -> int:
        self.validate()
        assert self._num_classes is not None
        return self._num_classes

    # ------------------------------------------------------------------ domains

    def build_domain(self, domain: str) -> Domain:
        """One domain: its own test split when the file has one, else 80/20 stratified from ``data.seed``."""
        self.validate()
        assert self._raw is not None and self._num_classes is not None
        if domain not in self._raw:
            raise UserError(
                f"unknown domain {domain!r} for benchmark 'npz': choose one of {', '.join(sorted(self._raw))} "
                f"(the .npz files in {str(self._root())!r})"
            )
        arrays = self._raw[domain]
        if "x_test" not in arrays:
            return split_named_domain(domain, arrays["x"], arrays["y"], self._num_classes, self.config)
        _, subsample_key = named_streams(domain)
        train_x, train_y = limit_train(
            arrays["x"], arrays["y"], self.config.max_train_per_domain, self.config.seed, subsample_key
        )
        return feature_domain(domain, train_x, train_y, arrays["x_test"], arrays["y_test"], self._num_classes)


def _read_file(path: Path) -> dict[str, np.ndarray]:
    """Read and check one domain file: x float32 (2-D or 4-D), y int64 >= 0, same length."""
    if not zipfile.is_zipfile(path):
        raise UserError(f"cannot read {path}: not a valid .npz file (not a zip archive, or truncated); {_HOW}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):
                raise UserError(f"{path} holds a single array, not named arrays: {_HOW}")
            found = list(npz.files)
            wanted = [k for k in ("x", "y", "x_test", "y_test") if k in found]
            arrays = {k: npz[k] for k in wanted}
    except UserError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise UserError(f"{path} holds object (pickled) arrays: store plain numeric arrays; {_HOW}") from None
        raise UserError(f"cannot read {path}: not a valid .npz file ({exc}); {_HOW}") from None
    except Exception as exc:  # bad zip, truncated file, permission denied, ...
        raise UserError(f"cannot read {path}: not a valid .npz file ({first_line(exc)}); {_HOW}") from None
    for key in ("x", "y"):
        if key not in arrays:
            listed = ", ".join(found) if found else "none"
            raise UserError(f"{path} has no array {key!r} (arrays found: {listed}): {_HOW}")
    if ("x_test" in arrays) != ("y_test" in arrays):
        missing = "y_test" if "x_test" in arrays else "x_test"
        raise UserError(
            f"{path} has {'x_test' if missing == 'y_test' else 'y_test'} but no {missing}: store both or neither"
        )
    out: dict[str, np.ndarray] = {}
    for xk, yk in (("x", "y"), ("x_test", "y_test")):
        if xk not in arrays:
            continue
        x = _check_x(path, xk, arrays[xk])
        y = _check_y(path, yk, arrays[yk])
        if len(x) != len(y):
            raise UserError(
                f"{path}: {xk} has {len(x)} samples but {yk} has {len(y)} labels: they must have the same length"
            )
        out[xk], out[yk] = x, y
    if "x_test" in out:
        if len(out["x"]) < 1 or len(out["x_test"]) < 1:
            raise UserError(
                f"{path}: x has {len(out['x'])} and x_test {len(out['x_test'])} samples: each needs at least 1"
            )
        if out["x"].shape[1:] != out["x_test"].shape[1:]:
            raise UserError(
                f"{path}: x has samples of shape {out['x'].shape[1:]} but x_test {out['x_test'].shape[1:]}: they "
                "must match"
            )
    elif len(out["x"]) < 2:
        raise UserError(
            f"{path}: only {len(out['x'])} sample(s): a domain needs at least 2 (split into train and test)"
        )
    return out


def _check_x(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    if x.ndim not in (2, 4):
        raise UserError(
            f"{path}: {key} has shape {x.shape}: it must be 2-D (N x D features) or 4-D (N x C x H x W images)"
        )
    if not is_real(x):
        raise UserError(f"{path}: {key} has dtype {x.dtype}: it must hold real numbers (float or int)")
    return finite_float32(path, key, x)


def _check_y(path: Path, key: str, y: np.ndarray) -> np.ndarray:
    if y.ndim != 1:
        raise UserError(f"{path}: {key} has shape {y.shape}: it must be 1-D (one integer label per sample)")
    if y.dtype == np.bool_:
        y = y.astype(np.int64)
    if np.issubdtype(y.dtype, np.floating):
        if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
            bad = y[~np.isfinite(y) | (y != np.round(y))][0]
            raise UserError(f"{path}: {key} holds non-integer label {bad!r}: labels must be integers 0..K-1")
        if len(y) and float(np.max(np.abs(y))) > 2**31:
            raise UserError(f"{path}: {key} holds label {float(np.max(y))!r}: labels must be integers 0..K-1")
    elif not np.issubdtype(y.dtype, np.integer):
        raise UserError(f"{path}: {key} has dtype {y.dtype}: labels must be integers 0..K-1")
    if len(y) and np.any(y < 0):
        raise UserError(f"{path}: {key} holds negative label {int(y[y < 0][0])}: labels must be integers 0..K-1")
    y64 = y.astype(np.int64)
    return y64
