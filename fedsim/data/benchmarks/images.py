"""Your own image domains from a folder of image files: ``--benchmark images --set data.root=DIR``.

Layout (ImageFolder style, as torchvision's ``ImageFolder`` reads one domain)::

    DIR/<domain>/<class>/<image>.jpg   (or .jpeg .png .bmp .ppm .pgm .tif .tiff .webp)

e.g. Office-Caltech10 as released: ``DIR/amazon/backpack/frame_0001.jpg`` ... Domains are the
subfolders of ``DIR``, classes the class folders' names, sorted; hidden files and other
extensions are ignored. Options (the ``data`` section):

* ``data.image_size`` (default 32): every image is decoded once with Pillow, converted to RGB
  and resized (bilinear, antialiased, aspect ratio not kept: the whole picture is squashed to a
  square) to this side. 32 is LeNet-5's input size (LeCun et al. 1998), the smallest side the
  ``cnn`` and ``lenet5`` models take comfortably, and what two CPU cores train in seconds per
  round; Office-Caltech10's 2,533 images decode in about 2 s at this size.
* ``data.classes`` (default: every class folder): the classes to use, in this label order.
  Without it every domain in play (the target and ``data.sources``, or all domains) must hold
  the same class folders, and a run stops with one line naming what a domain lacks; with it, a
  domain may lack some of the named classes (partial domain adaptation; logged).
* ``data.seed``, ``data.max_train_per_domain``: each domain is split 80/20 stratified by label
  with streams keyed by the domain's name (:mod:`fedsim.data.benchmarks.splits`), then its
  training part cut to ``data.max_train_per_domain``.

Decoded domains are cached as uint8 (N, 3, S, S) under ``data.cache_dir``
(:mod:`fedsim.data.cache`, a checksum inside), named by a digest of the folder's path, the
files' relative paths, sizes and modification times, the classes and the size: an edited
folder is decoded again, an unchanged one never. Inputs are float32 in [0, 1].
Unreadable files are reported in one line naming the first few and how many.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.feature_files import root_folder
from fedsim.data.benchmarks.options import check_domain, count
from fedsim.data.benchmarks.splits import split_named_domain
from fedsim.data.cache import load_arrays, save_arrays
from fedsim.errors import UserError, first_line
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

VERSION = "v1"  # bump whenever decoding or resizing changes, so old caches are not reused
DEFAULT_IMAGE_SIZE = 32  # LeNet-5's input side; see the module docstring
MIN_IMAGE_SIZE = 4  # the cnn model pools twice by 2
#: torchvision's ``IMG_EXTENSIONS`` (what ImageFolder reads)
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SHOWN = 3  # bad files named in an error
LAYOUT = "DIR/<domain>/<class>/<image>.jpg|jpeg|png (one folder per domain, one folder per class inside it)"

Tree = dict[str, dict[str, list[Path]]]  # domain -> class -> image files


def entries(folder: Path) -> list[Path]:
    """What ``folder`` holds, hidden names left out; an unreadable folder is one line naming it."""
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise UserError(f"images: cannot list the folder {str(folder)!r} ({first_line(exc)})") from None


def image_files(folder: Path) -> list[Path]:
    """The image files directly in ``folder`` (by extension, case-insensitive), sorted."""
    return [p for p in entries(folder) if p.suffix.lower() in EXTENSIONS and p.is_file()]


def subfolders(folder: Path) -> list[Path]:
    return [p for p in entries(folder) if p.is_dir()]


def scan(root: Path) -> Tree:
    """Every domain folder of ``root`` with its non-empty class folders; one line for a wrong layout."""
    tree: Tree = {}
    for domain in subfolders(root):
        classes = {c.name: files for c in subfolders(domain) if (files := image_files(c))}
        if classes:
            tree[domain.name] = classes
        elif image_files(domain):
            raise UserError(
                f"images: {str(domain)!r} holds images directly, so {str(root)!r} looks like one domain of class "
                f"folders: point data.root at a folder of domain folders, laid out as {LAYOUT}"
            )
        else:
            logger.warning("images: %s holds no class folder with images; it is not a domain", domain)
    if not tree:
        raise UserError(f"images: no images found under data.root {str(root)!r}: expected {LAYOUT}")
    if len(tree) < 2:
        raise UserError(
            f"images: only one domain folder ({next(iter(tree))}) with images in {str(root)!r}: domain adaptation "
            f"needs at least two (a target and one or more sources), laid out as {LAYOUT}"
        )
    return tree


def choose_classes(tree: Tree, in_play: list[str], named: tuple[str, ...]) -> tuple[str, ...]:
    """The class names in label order: ``named``, or the class folders every domain in play has."""
    found = sorted({c for d in in_play for c in tree[d]})
    if named:
        unknown = [c for c in named if c not in found]
        if unknown or len(set(named)) != len(named) or len(named) < 2:
            raise UserError(
                f"images: data.classes={','.join(named)} must name at least two distinct class folders of the "
                f"domains {', '.join(in_play)}; unknown: {', '.join(unknown) or 'none'}; found: {', '.join(found)}"
            )
        for d in in_play:
            if lacking := [c for c in named if c not in tree[d]]:
                logger.warning("images: domain %s has no images of class(es) %s", d, ", ".join(lacking))
        return tuple(named)
    common = [c for c in found if all(c in tree[d] for d in in_play)]
    for d in in_play:
        if lacking := [c for c in found if c not in tree[d]]:
            raise UserError(
                f"images: domain {d!r} has no folder of images for class(es) {', '.join(lacking)} that other domains "
                f"have: add them as {d}/<class>/, or choose the classes with --set data.classes="
                f"{','.join(common) or '<names>'} (those every domain has)"
            )
    if len(found) < 2:
        raise UserError(f"images: only one class folder ({found[0]}): a classification task needs at least two")
    return tuple(found)


def decode_image(path: Path, size: int) -> np.ndarray:
    """One image file as uint8 (3, size, size): decoded with Pillow, RGB, resized bilinearly (antialiased)."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # palette transparency, EXIF and decompression-bomb notices
        with Image.open(path) as im:
            im.draft("RGB", (size, size))  # JPEG: the decoder scales by 1/2..1/8 first, never below size
            rgb = im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def decode_all(root: Path, domain: str, files: list[Path], size: int) -> np.ndarray:
    """Every file decoded; the unreadable ones reported in one line (the first few, and how many)."""
    x = np.zeros((len(files), 3, size, size), dtype=np.uint8)
    bad: list[str] = []
    for i, path in enumerate(files):
        try:
            x[i] = decode_image(path, size)
        except Exception as exc:  # not an image, truncated, unsupported mode, permission denied, ...
            bad.append(f"{path.relative_to(root)} ({first_line(exc)})")
    if bad:
        more = f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        raise UserError(
            f"images: {len(bad)} of {len(files)} image files of domain {domain!r} under {str(root)!r} cannot be "
            f"read: {'; '.join(bad[:SHOWN])}{more}: remove or replace them"
        )
    return x


def listing_digest(root: Path, domain: str, files: list[Path], classes: tuple[str, ...], size: int) -> str:
    """sha256 of what a domain's decoded arrays depend on: folder, files (path, size, mtime), classes, size."""
    digest = hashlib.sha256(f"{VERSION}\0{root.resolve()}\0{domain}\0{size}\0{chr(1).join(classes)}\0".encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


@BENCHMARKS.register("images")
class ImageFolderBenchmark(Benchmark):
    """Your own image domains: DIR/<domain>/<class>/*.jpg|png in --set data.root=DIR (e.g. Office-Caltech10)

    Classes from the folder names (all domains alike, or ``data.classes``); images decoded once,
    RGB, resized to ``data.image_size`` (default 32) and cached; 80/20 split from ``data.seed``.
    """

    @dataclass(frozen=True)
    class Options:
        """``data.image_size``: the side images are resized to (None: 32); ``data.classes``: the classes, in label
        order (empty: every class folder, the same in every domain in play)."""

        image_size: Optional[int] = None
        classes: tuple[str, ...] = ()

        def __post_init__(self):
            count(self, "image_size", "images", minimum=MIN_IMAGE_SIZE)

    def __init__(self, data_config):
        super().__init__(data_config)
        self._tree: Optional[Tree] = None
        self._classes: Optional[tuple[str, ...]] = None

    def _root(self) -> Path:
        return root_folder(self.config, "images", f"image files laid out as {LAYOUT}")

    def tree(self) -> Tree:
        if self._tree is None:
            self._tree = scan(self._root())
        return self._tree

    def domains(self) -> list[str]:
        return list(self.tree())

    def in_play(self) -> list[str]:
        """The domains a run uses: the target and ``data.sources``, or every domain when no sources are named."""
        sources = tuple(self.config.sources or ())
        names = self.domains()
        return [d for d in names if d == self.config.target or d in sources] if sources else names

    @property
    def classes(self) -> tuple[str, ...]:
        if self._classes is None:
            named = tuple(str(c) for c in self.options.classes)
            self._classes = choose_classes(self.tree(), self.in_play(), named)
            logger.info("images: %d classes: %s", len(self._classes), ", ".join(self._classes))
        return self._classes

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_size(self) -> int:
        size = count(self.options, "image_size", "images", minimum=MIN_IMAGE_SIZE)
        return DEFAULT_IMAGE_SIZE if size is None else size

    def files(self, domain: str) -> tuple[list[Path], np.ndarray]:
        """A domain's image files of the chosen classes and their labels (class index), in class then file order."""
        check_domain("images", domain, self.domains())
        by_class = self.tree()[domain]
        files, labels = [], []
        for label, cls in enumerate(self.classes):
            files += by_class.get(cls, [])
            labels += [label] * len(by_class.get(cls, []))
        if len(files) < 2:
            raise UserError(
                f"images: domain {domain!r} has {len(files)} image(s) of the classes {', '.join(self.classes)}: a "
                "domain needs at least two (split into train and test)"
            )
        return files, np.asarray(labels, dtype=np.int64)

    def cache_name(self, domain: str, files: list[Path]) -> str:
        digest = listing_digest(self._root(), domain, files, self.classes, self.image_size)
        safe = re.sub(r"[^A-Za-z0-9_-]+", "_", domain)[:40]
        return f"images-{VERSION}-{safe}-{self.image_size}px-{digest[:20]}"

    def build_arrays(self, domain: str) -> dict[str, np.ndarray]:
        """A domain's uint8 images ``x`` (N, 3, S, S) and labels ``y``, from the cache or decoded and cached."""
        files, labels = self.files(domain)
        name = self.cache_name(domain, files)
        arrays = load_arrays(self.config.cache_dir, name)
        if arrays is not None and set(arrays) == {"x", "y"} and np.array_equal(arrays["y"], labels):
            return arrays
        start = time.perf_counter()
        arrays = {"x": decode_all(self._root(), domain, files, self.image_size), "y": labels}
        logger.info(
            "images: decoded domain %s (%d images at %dpx) in %.1fs",
            domain,
            len(files),
            self.image_size,
            time.perf_counter() - start,
        )
        save_arrays(self.config.cache_dir, name, arrays)
        return arrays

    def build_domain(self, domain: str) -> Domain:
        """One domain as float32 in [0, 1], split 80/20 by label from ``data.seed``."""
        arrays = self.build_arrays(domain)
        x = arrays["x"].astype(np.float32) / np.float32(255.0)
        return split_named_domain(domain, x, arrays["y"], self.num_classes, self.config)
