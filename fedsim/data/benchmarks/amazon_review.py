"""Amazon Review sentiment (Blitzer et al., ACL 2007) as released by Chen et al. (mSDA, ICML 2012).

Four domains, ``books``, ``dvd``, ``electronics``, ``kitchen``, two classes
(0 negative, 1 positive). Put the files of one layout in one folder and pass
it with ``--set data.root=DIR`` (names are matched case-insensitively; the first
layout found complete is read, in this order):

* ``amazon.mat``, the single file of the mSDA release: ``xx`` the 5,000-word
  bag-of-words counts, features x documents (5,000 x N, sparse or dense; a
  documents x features matrix is accepted too), ``yy`` the N labels (-1/1, 0/1 or
  1/2) and ``offset`` the index of each domain's first document, in the order
  books, dvd, electronics, kitchen (4 entries, or 5 with the end; 0- or 1-based).
* ``books_400.mat``, ``dvd_400.mat``, ``elec_400.mat``, ``kitchen_400.mat``: the
  400-feature release (the 400 most frequent words, as term frequencies; as shipped by
  skada-bench), ``fts`` (N x 400) and ``labels`` (N x 1, 0/1); 2,000, 1,999, 1,998 and
  1,999 reviews. ``electronics_400.mat`` is read too.
* ``books.npz``, ``dvd.npz``, ``electronics.npz``, ``kitchen.npz``: arrays ``x``
  (N x D counts) and ``y`` (N labels, as above), one file per domain.

``data.variant``: ``default`` (the features as released), ``binary`` (word present
or not) or ``log1p`` (log(1 + value)). Each domain is split 80/20 stratified by
label from ``data.seed`` (then ``data.max_train_per_domain``), as Office-Caltech10
is. The mSDA release is about 28,000 documents: a domain takes ~30 MB sparse on
disk and up to ~150 MB as dense float32 in each process that hosts one of its clients.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.feature_files import check_features, label_vector, read_mat, read_npz, root_folder
from fedsim.data.benchmarks.options import check_domain, choice
from fedsim.data.benchmarks.splits import split_named_domain
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

DOMAINS: tuple[str, ...] = ("books", "dvd", "electronics", "kitchen")
NUM_CLASSES = 2
MAT_FILE = "amazon.mat"
VARIANTS = ("default", "binary", "log1p")
#: per-domain layouts: (name, file names per domain, (features, labels) keys, what they hold)
PER_DOMAIN = (
    (
        "400",
        {
            "books": ("books_400.mat",),
            "dvd": ("dvd_400.mat",),
            "electronics": ("elec_400.mat", "electronics_400.mat"),
            "kitchen": ("kitchen_400.mat",),
        },
        ("fts", "labels"),
        "fts (N x 400), labels (N, 0/1)",
    ),
    ("npz", {d: (f"{d}.npz",) for d in DOMAINS}, ("x", "y"), "arrays x (N x D word counts), y (N labels -1/1 or 0/1)"),
)
_WHAT = (
    "amazon.mat (xx, yy, offset: the mSDA release), or books_400.mat, dvd_400.mat, elec_400.mat, kitchen_400.mat "
    "(fts, labels: the 400-d release), or books.npz, dvd.npz, electronics.npz, kitchen.npz (arrays x, y)"
)


def binary_labels(path: Path, key: str, y) -> np.ndarray:
    """-1/1, 0/1 or 1/2 -> 0 (negative) / 1 (positive)."""
    y = label_vector(path, key, y, "labels", "numbers (-1/1, 0/1 or 1/2)")
    values = set(np.unique(np.asarray(y, dtype=np.float64)).tolist()) if np.size(y) else set()
    for pair, negative in (({-1.0, 1.0}, -1.0), ({0.0, 1.0}, 0.0), ({1.0, 2.0}, 1.0)):
        if values <= pair:
            return (np.asarray(y, dtype=np.float64) != negative).astype(np.int64)
    shown = ", ".join(str(v) for v in sorted(values)[:5])
    raise UserError(f"{path}: {key!r} holds labels {shown}: sentiment labels must be -1/1, 0/1 or 1/2")


def _as_documents(path: Path, xx, n: int):
    """The bag of words as documents x features (sparse CSR or dense), from either orientation."""
    import scipy.sparse

    if scipy.sparse.issparse(xx):
        matrix = xx.tocsr() if xx.shape[0] == n else xx.T.tocsr()
        if matrix.shape[0] != n:
            raise UserError(
                f"{path}: 'xx' has shape {xx.shape} but 'yy' has {n} labels: one dimension of xx must match"
            )
        if not np.issubdtype(matrix.dtype, np.number) or np.iscomplexobj(matrix.data):
            raise UserError(f"{path}: 'xx' has dtype {matrix.dtype}: it must hold word counts")
        if not np.all(np.isfinite(matrix.data)):
            raise UserError(f"{path}: 'xx' has NaN or infinite values: replace or drop them")
        return matrix
    dense = np.asarray(xx)
    if dense.ndim == 2 and dense.shape[0] != n and dense.shape[1] == n:
        dense = dense.T
    if dense.ndim != 2 or dense.shape[0] != n:
        raise UserError(
            f"{path}: 'xx' has shape {np.shape(xx)} but 'yy' has {n} labels: one dimension of xx must match"
        )
    return check_features(path, "xx", dense)


def _offsets(path: Path, offset, n: int) -> list[tuple[int, int]]:
    """(start, end) per domain from the release's ``offset`` (starts, optionally with the end; 0- or 1-based)."""
    raw = np.asarray(offset, dtype=np.float64).reshape(-1)
    if len(raw) not in (len(DOMAINS), len(DOMAINS) + 1) or np.any(raw != np.round(raw)):
        raise UserError(
            f"{path}: 'offset' holds {raw.tolist()}: expected the first document of each of {', '.join(DOMAINS)} "
            "(4 integers, optionally followed by the number of documents)"
        )
    starts = raw.astype(np.int64)
    if starts[0] == 1:
        starts = starts - 1  # MATLAB indices
    bounds = list(starts[: len(DOMAINS)]) + [int(starts[len(DOMAINS)]) if len(starts) > len(DOMAINS) else n]
    if bounds[0] != 0 or bounds[-1] != n or any(b >= e for b, e in zip(bounds[:-1], bounds[1:])):
        raise UserError(
            f"{path}: 'offset' {raw.tolist()} does not cut its {n} documents into 4 non-empty domains in the order "
            f"{', '.join(DOMAINS)}: fix the offsets"
        )
    return [(int(b), int(e)) for b, e in zip(bounds[:-1], bounds[1:])]


def read_domain_file(path: Path, keys: tuple[str, str], expected: str) -> tuple[np.ndarray, np.ndarray]:
    """(documents x features float32, labels 0/1) of one per-domain file (.mat or .npz)."""
    xk, yk = keys
    if path.suffix.lower() == ".npz":
        arrays, found = read_npz(path, expected, keys=keys)
        found = sorted(found)
    else:
        arrays = read_mat(path, expected)
        found = sorted(arrays)
    if xk not in arrays or yk not in arrays:
        kind = "arrays" if path.suffix.lower() == ".npz" else "variables"
        raise UserError(f"{path} lacks the expected {kind} (found: {', '.join(found) or 'none'}): expected {expected}")
    x = check_features(path, xk, arrays[xk])
    y = binary_labels(path, yk, arrays[yk])
    if len(x) != len(y):
        raise UserError(f"{path}: {xk} has {len(x)} rows but {yk} has {len(y)} labels: they must match")
    return x, y


def read_msda(path: Path) -> dict[str, tuple[object, np.ndarray, Path]]:
    """The mSDA release's single amazon.mat, cut into its four domains by ``offset``."""
    expected = "variables xx (5000 x N word counts), yy (N labels) and offset (first document of each domain)"
    variables = read_mat(path, expected)
    missing = [k for k in ("xx", "yy", "offset") if k not in variables]
    if missing:
        raise UserError(
            f"{path} lacks {', '.join(missing)} (found: {', '.join(sorted(variables)) or 'none'}): expected {expected}"
        )
    y = binary_labels(path, "yy", variables["yy"])
    matrix = _as_documents(path, variables["xx"], len(y))
    return {
        domain: (matrix[start:end], y[start:end], path)
        for domain, (start, end) in zip(DOMAINS, _offsets(path, variables["offset"], len(y)))
    }


def read_per_domain(root: Path, present: dict[str, Path]) -> dict[str, tuple[object, np.ndarray, Path]]:
    """The first per-domain layout with a file for every domain (one line naming the missing files otherwise)."""
    found = []
    for name, names, keys, what in PER_DOMAIN:
        files = {d: next((present[n] for n in names[d] if n in present), None) for d in DOMAINS}
        found.append((sum(p is not None for p in files.values()), name, files, keys, what))
        if all(files.values()):
            break
    count, name, files, keys, what = max(found, key=lambda f: f[0])  # max() keeps the first of equals
    if count < len(DOMAINS):
        layout = dict((n, names) for n, names, _, _ in PER_DOMAIN)[name]
        missing = ", ".join(layout[d][0] for d in DOMAINS if files[d] is None)
        raise UserError(f"amazon_review: no {MAT_FILE} and no {missing} in {str(root)!r}: put {_WHAT} there")
    documents = {d: (*read_domain_file(p, keys, what), p) for d, p in files.items()}
    dims = {d: x.shape[1] for d, (x, _, _) in documents.items()}
    if len(set(dims.values())) > 1:
        listing = ", ".join(f"{documents[d][2].name}: {n}" for d, n in dims.items())
        raise UserError(
            f"amazon_review: the domain files have different vocabularies ({listing}): use one bag-of-words release"
        )
    return documents


@BENCHMARKS.register("amazon_review")
class AmazonReviewBenchmark(Benchmark):
    """Amazon Review sentiment from your files (--set data.root=DIR): books, dvd, electronics, kitchen

    ``amazon.mat`` of the mSDA release (xx, yy, offset), the 400-d ``<domain>_400.mat`` (fts, labels) or
    ``<domain>.npz`` (x, y);
    ``data.variant`` = default (counts) | binary | log1p.
    """

    @dataclass(frozen=True)
    class Options:
        """``data.variant``: the features, "default" (counts as released), "binary" (word present) or "log1p"."""

        variant: str = "default"

        def __post_init__(self):
            choice(self, "variant", "amazon_review variant", VARIANTS, "default")

    #: each client standardizes by its own training statistics, nothing shared: what the FedDaDiL authors'
    #: code does (and Gong et al.'s z-scored Office-Caltech10 release); --set data.normalization=federated
    #: shares one mean and std, =none keeps the raw features
    default_normalization = "per-domain"

    def __init__(self, data_config):
        super().__init__(data_config)
        self._documents: Optional[dict[str, tuple[object, np.ndarray, Path]]] = None

    def domains(self) -> list[str]:
        return list(DOMAINS)

    def variant(self) -> str:
        return choice(self.options, "variant", "amazon_review variant", VARIANTS, "default")

    def _read(self) -> dict[str, tuple[object, np.ndarray, Path]]:
        """Per domain: (documents x features, sparse or dense; labels 0/1; the file)."""
        if self._documents is not None:
            return self._documents
        root = root_folder(self.config, "amazon_review", _WHAT)
        present = {p.name.lower(): p for p in root.iterdir() if p.is_file()}
        documents = read_msda(present[MAT_FILE]) if MAT_FILE in present else read_per_domain(root, present)
        for domain, (x, y, path) in documents.items():
            if len(y) < 2:
                raise UserError(
                    f"{path}: domain {domain} has {len(y)} document(s): a domain needs at least 2 (train and test)"
                )
        logger.info("amazon_review: %s", ", ".join(f"{d} {len(y)}" for d, (_, y, _) in documents.items()))
        self._documents = documents
        return documents

    def build_domain(self, domain: str) -> Domain:
        """One domain's documents as dense float32 (``data.variant``), split 80/20 stratified by label."""
        check_domain("amazon_review", domain, DOMAINS)
        variant = self.variant()
        x, y, _ = self._read()[domain]
        dense = np.asarray(x.toarray() if hasattr(x, "toarray") else x, dtype=np.float32)
        if variant == "binary":
            dense = (dense > 0).astype(np.float32)
        elif variant == "log1p":
            dense = np.log1p(np.maximum(dense, 0.0)).astype(np.float32)
        return split_named_domain(domain, dense, y, NUM_CLASSES, self.config)
