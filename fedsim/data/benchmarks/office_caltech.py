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

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.feature_files import (
    check_features,
    check_labels,
    first_line,
    read_mat,
    read_npz,
    root_folder,
)
from fedsim.data.benchmarks.options import check_domain, choice
from fedsim.data.benchmarks.splits import split_named_domain
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

DOMAINS: tuple[str, ...] = ("amazon", "caltech", "dslr", "webcam")
NUM_CLASSES = 10


@dataclass(frozen=True)
class FeatureForm:
    name: str
    description: str
    patterns: tuple[str, ...]  # file names, "{d}" = domain name (or a Caltech alias)
    keys: tuple[tuple[str, str], ...]  # (features, labels) pairs tried in order (.mat / .npz)


FORMS: dict[str, FeatureForm] = {
    "decaf": FeatureForm("decaf", "DeCAF6 .mat (feas, labels)", ("{d}_decaf.mat",), (("feas", "labels"),)),
    "resnet50": FeatureForm(
        "resnet50",
        "ResNet-50 .npz (x, y) or .csv (features..., label)",
        ("{d}.npz", "{d}_resnet50.npz", "{d}_{d}.csv"),
        (("x", "y"),),
    ),
    "surf": FeatureForm(
        "surf",
        "SURF .mat (fts, labels)",
        ("{d}_SURF_L10.mat", "{d}_zscore_SURF_L10.mat"),
        (("fts", "labels"), ("Xt", "Yt")),
    ),
}
AUTO_ORDER = ("decaf", "resnet50", "surf")
_ALIASES = {"caltech": ("caltech", "Caltech10")}  # the SURF release names it Caltech10_SURF_L10.mat


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
    arrays, _ = read_npz(path, expected)
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

    def domains(self) -> list[str]:
        return list(DOMAINS)

    # ------------------------------------------------------------------ files

    def _form_names(self) -> tuple[str, ...]:
        variant = choice(
            self.config,
            "variant",
            "office_caltech feature form",
            ["auto"] + sorted(FORMS),
            "auto",
            aliases={"default": "auto"},
        )
        return AUTO_ORDER if variant == "auto" else (variant,)

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
            f"; or, for {FORMS[n].description}, {' / '.join(p.replace('{d}', '<domain>') for p in FORMS[n].patterns)}"
            for n in others
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
            raise UserError(
                f"office_caltech: the feature files have different dimensions ({listing}): use one feature form for "
                "all domains"
            )
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
        logger.info(
            "office_caltech: %s features, %d dims, %s",
            form.name,
            next(iter(dims.values())),
            ", ".join(f"{d} {len(y)}" for d, (_, y) in arrays.items()),
        )
        self._arrays = arrays
        return arrays

    def build_domain(self, domain: str) -> Domain:
        """One domain's features, split 80/20 stratified by label from ``data.seed``."""
        check_domain("office_caltech", domain, DOMAINS)
        x, y = self._read_all()[domain]
        return split_named_domain(domain, x, y, NUM_CLASSES, self.config)
