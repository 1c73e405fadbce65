"""Office-Caltech10 (Gong et al., CVPR 2012) from the feature files it is usually released as.

Four domains, ``amazon`` (958 images), ``caltech`` (1,123), ``dslr`` (157), ``webcam``
(295), ten shared classes. Put the files of one feature form in one folder, or in a
sub-folder named after the form, and pass the folder with ``--set data.root=DIR``
(file names are matched case-insensitively; Caltech's file may be named ``caltech`` or
``Caltech10``). The forms, ``data.variant``:

* ``surf``: SURF bag of words (800-d), ``<domain>_SURF_L10.mat`` with ``fts`` (N x 800)
  and ``labels`` (N x 1, 1..10), as in Gong et al.'s GFK release
  (``Caltech10_SURF_L10.mat`` for Caltech); the z-scored ``<domain>_zscore_SURF_L10.mat``
  (``Xt``, ``Yt``) and Gautheron's ``surf/<domain>.mat`` (``fts`` N x 800) are read too.
* ``decaf6``: DeCAF6 (4096-d), ``<domain>_decaf.mat`` or ``<domain>.mat`` with ``feas``
  (N x 4096) and ``labels`` (N x 1); ``decaf`` is another name for it.
* ``googlenet1024``: GoogleNet features (1024-d) of Gautheron's OfficeCaltechDomainAdaptation
  release, ``<domain>.mat`` (``GoogleNet1024/<domain>.mat`` there) with ``fts`` (N x 1024)
  and ``labels`` (1 x N).
* ``caffenet4096``: CaffeNet features (4096-d) of the same release, ``<domain>.mat`` with
  ``fts`` (N x 4096) and ``labels`` (1 x N).
* ``resnet50``: ResNet-50 features (2048-d) as ``<domain>.npz`` or ``<domain>_resnet50.npz``
  (arrays ``x``, ``y``), or as the CSV release ``<domain>_<domain>.csv`` (the features, then
  the label).

A plain ``<domain>.mat`` is told apart by what it holds: ``feas`` is DeCAF6, ``fts`` of
800, 1024 or 4096 columns is SURF, GoogleNet-1024 or CaffeNet-4096. Sub-folders looked
in: ``surf``, ``decaf6`` (or ``decaf``), ``GoogleNet1024``, ``CaffeNet4096``, ``resnet50``.
The default, ``auto``, takes the form with files for the most domains (among those
holding every domain named by ``data.target`` and ``data.sources``), ties in the order
decaf6, resnet50, googlenet1024, caffenet4096, surf; name the form when a folder holds
several. The domains are those whose file exists for the form (GoogleNet-1024 copies
often lack Caltech): naming a domain without its file is one line naming the file to put
there. Labels 1..10 are shifted to 0..9. Each domain is split 80/20 stratified by label
from ``data.seed`` (then ``data.max_train_per_domain``); features are returned raw (see
:mod:`fedsim.data.normalization`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.feature_files import pick_pair, read_csv_rows, read_mat, read_npz, root_folder
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
    description: str  # what the files hold, for messages
    patterns: tuple[str, ...]  # file names, "{d}" = domain name (or a Caltech alias)
    keys: tuple[tuple[str, str], ...]  # (features, labels) pairs tried in order (.mat / .npz)
    folders: tuple[str, ...]  # sub-folders of data.root looked in (lower case)


FORMS: dict[str, FeatureForm] = {
    "decaf6": FeatureForm(
        "decaf6",
        "DeCAF6 (feas N x 4096, labels N x 1)",
        ("{d}_decaf.mat", "{d}.mat"),
        (("feas", "labels"),),
        ("decaf6", "decaf"),
    ),
    "resnet50": FeatureForm(
        "resnet50",
        "ResNet-50 .npz (x, y) or .csv (features..., label)",
        ("{d}.npz", "{d}_resnet50.npz", "{d}_{d}.csv"),
        (("x", "y"),),
        ("resnet50",),
    ),
    "googlenet1024": FeatureForm(
        "googlenet1024",
        "GoogleNet-1024 (fts N x 1024, labels 1 x N)",
        ("{d}.mat",),
        (("fts", "labels"),),
        ("googlenet1024",),
    ),
    "caffenet4096": FeatureForm(
        "caffenet4096",
        "CaffeNet-4096 (fts N x 4096, labels 1 x N)",
        ("{d}.mat",),
        (("fts", "labels"),),
        ("caffenet4096",),
    ),
    "surf": FeatureForm(
        "surf",
        "SURF (fts N x 800, labels N x 1)",
        ("{d}_SURF_L10.mat", "{d}_zscore_SURF_L10.mat", "{d}.mat"),
        (("fts", "labels"), ("Xt", "Yt")),
        ("surf",),
    ),
}
AUTO_ORDER = tuple(FORMS)
_ALIASES = {"caltech": ("caltech", "caltech10")}  # the SURF and GoogleNet releases name it Caltech10
_FTS_DIMS = {800: "surf", 1024: "googlenet1024", 4096: "caffenet4096"}


def expected_names(form: FeatureForm, domain: str) -> list[str]:
    """File names that hold ``domain`` in ``form``, in the order they are looked for."""
    names = [pattern.format(d=alias) for pattern in form.patterns for alias in _ALIASES.get(domain, (domain,))]
    return [n.replace("caltech10_", "Caltech10_") for n in names]


def plain_mat_form(variables: dict) -> Optional[str]:
    """The form of a plain ``<domain>.mat`` from what it holds (None when it is none of them)."""
    if "feas" in variables:
        return "decaf6"
    fts = variables.get("fts")
    if fts is not None and np.ndim(fts) == 2:
        return _FTS_DIMS.get(int(np.shape(fts)[1])) or _FTS_DIMS.get(int(np.shape(fts)[0]))
    return None


def _form_option(options) -> str:
    """``data.variant`` as a feature form name, or "auto"."""
    aliases = {"default": "auto", "decaf": "decaf6"}
    return choice(options, "variant", "office_caltech feature form", ["auto"] + list(FORMS), "auto", aliases=aliases)


@BENCHMARKS.register("office_caltech")
class OfficeCaltechBenchmark(Benchmark):
    """Office-Caltech10 features from your files (--set data.root=DIR): amazon, caltech, dslr, webcam

    SURF ``<domain>_SURF_L10.mat``, DeCAF6 ``<domain>_decaf.mat``, GoogleNet-1024 / CaffeNet-4096
    ``<domain>.mat`` (``fts``) or ResNet-50 ``<domain>.npz``; ``data.variant`` = auto | surf | decaf6 |
    googlenet1024 | caffenet4096 | resnet50.
    """

    @dataclass(frozen=True)
    class Options:
        """``data.variant``: the feature form, "auto" (or "default": the first form whose files are there), "surf",
        "decaf6" (or "decaf"), "googlenet1024", "caffenet4096" or "resnet50"."""

        variant: str = "default"

        def __post_init__(self):
            _form_option(self)

    #: each client standardizes by its own training statistics, nothing shared: what the FedDaDiL authors'
    #: code does (and Gong et al.'s z-scored Office-Caltech10 release); --set data.normalization=federated
    #: shares one mean and std, =none keeps the raw features
    default_normalization = "per-domain"

    def __init__(self, data_config):
        super().__init__(data_config)
        self._arrays: Optional[dict[str, tuple[np.ndarray, np.ndarray]]] = None
        self._files: Optional[tuple[FeatureForm, dict[str, Path]]] = None
        self._mats: dict[Path, dict] = {}

    def domains(self) -> list[str]:
        """The domains whose file exists for the feature form in use."""
        return [d for d in DOMAINS if d in self.files()[1]]

    # ------------------------------------------------------------------ files

    def _form_names(self) -> tuple[str, ...]:
        variant = _form_option(self.options)
        return AUTO_ORDER if variant == "auto" else (variant,)

    def _named(self) -> list[str]:
        """The domains the config names (target and sources), in order."""
        names = {getattr(self.config, "target", None), *(getattr(self.config, "sources", ()) or ())}
        return [d for d in DOMAINS if d in names]

    def _mat(self, path: Path, expected: str) -> dict:
        if path not in self._mats:
            self._mats[path] = read_mat(path, expected)
        return self._mats[path]

    def _find(self, root: Path, form: FeatureForm) -> tuple[dict[str, Path], dict[str, str]]:
        """{domain: file} of ``form`` in ``root`` and its sub-folders named after the form, and {domain: what a
        plain ``<domain>.mat`` of another form holds}."""
        folders = [root] + [p for p in sorted(root.iterdir()) if p.is_dir() and p.name.lower() in form.folders]
        present: dict[str, Path] = {}
        for folder in reversed(folders):  # files in data.root itself win
            present.update({p.name.lower(): p for p in folder.iterdir() if p.is_file()})
        found: dict[str, Path] = {}
        notes: dict[str, str] = {}
        for domain in DOMAINS:
            for name in expected_names(form, domain):
                path = present.get(name.lower())
                if path is None:
                    continue
                plain = name.lower() in (f"{a}.mat" for a in _ALIASES.get(domain, (domain,)))
                held = plain_mat_form(self._mat(path, form.description)) if plain else form.name
                if held != form.name:  # a plain <domain>.mat of another form
                    what = f"{held} features (--set data.variant={held})" if held else "none of the forms"
                    notes[domain] = f"{path} holds {what}"
                    continue
                found[domain] = path
                break
        return found, notes

    def files(self) -> tuple[FeatureForm, dict[str, Path]]:
        """The feature form in use and its file per domain; one UserError line for a named domain without one."""
        if self._files is not None:
            return self._files
        root = root_folder(
            self.config, "office_caltech", "the Office-Caltech10 feature files (e.g. amazon_SURF_L10.mat)"
        )
        named = self._named()
        found = [(FORMS[n], self._find(root, FORMS[n])) for n in self._form_names()]
        ranked = sorted(found, key=lambda f: (-sum(d in f[1][0] for d in named), -len(f[1][0])))
        form, (files, notes) = ranked[0]  # sorted() is stable: ties keep the order of AUTO_ORDER
        if not files:
            layouts = "; ".join(f"{f.name}: {_layout(f)}" for f, _ in found)
            held = f" ({next(iter(notes.values()))})" if notes else ""
            raise UserError(
                f"office_caltech: no {' or '.join(f.name for f, _ in found)} feature files in {str(root)!r}{held}: "
                f"put one file per domain ({', '.join(DOMAINS)}) there, as {layouts}"
            )
        missing = [d for d in named if d not in files]
        if missing:
            d = missing[0]
            held = f" ({notes[d]})" if d in notes else ""
            raise UserError(
                f"office_caltech: no {form.name} file for {d} in {str(root)!r}{held}: put "
                f"{' or '.join(expected_names(form, d))} there ({form.description}), or leave {d} out (files found "
                f"for {', '.join(x for x in DOMAINS if x in files)}; choose --target and --set data.sources among them)"
            )
        self._files = (form, files)
        return self._files

    def _read_all(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        if self._arrays is not None:
            return self._arrays
        form, files = self.files()
        expected = " or ".join(f"variables {xk} (N x D) and {yk} (N labels 1..10)" for xk, yk in form.keys)
        arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for domain, path in files.items():
            if path.suffix.lower() == ".mat":
                arrays[domain] = pick_pair(path, self._mat(path, expected), form.keys, expected)
            elif path.suffix.lower() == ".npz":
                npz_expected = "arrays x (N x D features) and y (N labels)"
                arrays[domain] = pick_pair(path, read_npz(path, npz_expected)[0], form.keys, npz_expected)
            else:
                arrays[domain] = read_csv_rows(path)
        self._mats.clear()
        _check_dims(files, arrays)
        arrays = _zero_based(files, arrays)
        dims = next(iter(arrays.values()))[0].shape[1]
        logger.info(
            "office_caltech: %s features, %d dims, %s",
            form.name,
            dims,
            ", ".join(f"{d} {len(y)}" for d, (_, y) in arrays.items()),
        )
        self._arrays = arrays
        return arrays

    def build_domain(self, domain: str) -> Domain:
        """One domain's features, split 80/20 stratified by label from ``data.seed``."""
        check_domain("office_caltech", domain, self.domains())
        x, y = self._read_all()[domain]
        return split_named_domain(domain, x, y, NUM_CLASSES, self.config)


def _layout(form: FeatureForm) -> str:
    return " or ".join(p.replace("{d}", "<domain>") for p in form.patterns) + f" ({form.description})"


def _check_dims(files: dict[str, Path], arrays: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    dims = {d: x.shape[1] for d, (x, _) in arrays.items()}
    if len(set(dims.values())) > 1:
        listing = ", ".join(f"{files[d].name}: {n}" for d, n in dims.items())
        raise UserError(
            f"office_caltech: the feature files have different dimensions ({listing}): use one feature form for "
            "all domains"
        )


def _zero_based(
    files: dict[str, Path], arrays: dict[str, tuple[np.ndarray, np.ndarray]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Labels 1..10 (the .mat releases) or 0..9 in every file -> 0..9; one line for a label out of range."""
    labels = np.concatenate([y for _, y in arrays.values()])
    one_based = labels.min() >= 1 and labels.max() >= NUM_CLASSES
    low, high = (1, NUM_CLASSES) if one_based else (0, NUM_CLASSES - 1)
    out = {}
    for domain, (x, y) in arrays.items():
        if y.min() < low or y.max() > high:
            bad = int(y[(y < low) | (y > high)][0])
            raise UserError(
                f"{files[domain]} holds label {bad}: Office-Caltech10 labels must be 1..10 (or 0..9 in every file)"
            )
        if len(y) < 2:
            raise UserError(f"{files[domain]} holds {len(y)} sample(s): a domain needs at least 2 (train and test)")
        out[domain] = (x, y - 1) if one_based else (x, y)
    return out
