"""Drawing of the ``scenes`` benchmark: domains, sizes, the real pictures they use, and the renderer.

:func:`render_domain` turns a domain name, a :class:`Variant` and a seed into uint8 images
and exact boxes; the benchmark class, its cache and the COCO export live in
:mod:`fedsim.data.benchmarks.scenes`, whose docstring describes the scenes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

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
from fedsim.data.detection import Annotations
from fedsim.errors import UserError

VERSION = "v1"  # bump whenever the generator's output changes
CLASSES = ("digit", "coin", "face", "horse")
SERVER_DOMAIN = "server"


@dataclass(frozen=True)
class DomainSpec:
    key: int
    backgrounds: tuple[str, ...]  # "city", "farm"
    lighting: str  # "day", "night", "dusk"
    fog: tuple[float, float]  # range of the scattering coefficient beta (0, 0: no haze)
    class_probs: tuple[float, ...]


SPECS = {
    "server": DomainSpec(1, ("city",), "day", (0.0, 0.0), (0.40, 0.30, 0.30, 0.0)),
    "night": DomainSpec(2, ("city",), "night", (0.0, 0.0), (0.35, 0.35, 0.30, 0.0)),
    "fog": DomainSpec(3, ("city",), "day", (1.4, 2.4), (0.30, 0.40, 0.30, 0.0)),
    "farm": DomainSpec(4, ("farm",), "day", (0.0, 0.0), (0.15, 0.15, 0.20, 0.50)),
    "dusk": DomainSpec(5, ("city", "farm"), "dusk", (0.5, 1.0), (0.25, 0.25, 0.25, 0.25)),
}


@dataclass(frozen=True)
class Variant:
    size: int
    server: tuple[int, int]  # (train, test) images of the server domain
    other: tuple[int, int]  # (train, test) images of every other domain
    objects: tuple[int, int]  # objects per image (min, max), inclusive


VARIANTS = {"default": Variant(128, (400, 100), (48, 48), (2, 5)), "tiny": Variant(64, (24, 8), (8, 8), (1, 3))}

# relative object size (longest side / image side) per class
_SIZE_RANGE = {"digit": (0.13, 0.30), "coin": (0.12, 0.26), "face": (0.14, 0.28), "horse": (0.20, 0.36)}
_CITY_PHOTOS = (
    "coffee.png",
    "chelsea.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "ihc.png",
)  # no photo with unannotated faces
_FARM_TEXTURES = {
    "grass.png": (0.45, 0.75, 0.30),
    "gravel.png": (0.80, 0.72, 0.60),
    "brick.png": (0.85, 0.55, 0.40),
    "moon.png": (0.75, 0.80, 0.70),
}


# ----------------------------------------------------------------------------- sources


@lru_cache(maxsize=1)
def _backgrounds() -> dict[str, list[np.ndarray]]:
    """Float RGB photos in [0, 1]: ``city`` (colour photos) and ``farm`` (colourised textures)."""
    paths = [skimage_file(name) for name in _CITY_PHOTOS] + [sklearn_photo(name) for name in SKLEARN_PHOTOS]
    city = [open_rgb(path).astype(np.float32) / 255.0 for path in paths if path is not None]
    farm = []
    for name, tint in _FARM_TEXTURES.items():
        path = skimage_file(name)
        if path is not None:
            grey = open_rgb(path).astype(np.float32).mean(axis=2, keepdims=True) / 255.0
            farm.append(np.clip(grey * np.asarray(tint, np.float32) * 1.25, 0, 1))
    if len(city) < 2 or len(farm) < 2:
        raise UserError(
            "the scenes benchmark needs the sample photos shipped with scikit-image and scikit-learn, but they were "
            "not found: reinstall them with 'pip install --force-reinstall scikit-image scikit-learn'"
        )
    return {"city": city, "farm": farm}


@dataclass(frozen=True)
class Sprite:
    grey: np.ndarray  # (h, w) float32 in [0, 1]: the object's own shading
    alpha: np.ndarray  # (h, w) float32 in [0, 1]: its mask


def _crop_to_mask(grey: np.ndarray, alpha: np.ndarray, threshold: float = 0.1) -> Sprite:
    rows = np.flatnonzero((alpha > threshold).any(axis=1))
    cols = np.flatnonzero((alpha > threshold).any(axis=0))
    sl = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
    return Sprite(np.ascontiguousarray(grey[sl], np.float32), np.ascontiguousarray(alpha[sl], np.float32))


@lru_cache(maxsize=1)
def _sprites() -> dict[str, list[Sprite]]:
    import skimage.data
    from scipy import ndimage as ndi
    from skimage import filters, measure, segmentation

    images, _ = mnist_source()
    digits = [_crop_to_mask(np.ones(img.shape, np.float32), img.astype(np.float32) / 255.0) for img in images[:2000]]

    coins_img = skimage.data.coins()
    markers = np.zeros_like(coins_img)
    markers[coins_img < 30] = 1
    markers[coins_img > 150] = 2
    regions = ndi.binary_fill_holes(segmentation.watershed(filters.sobel(coins_img), markers) - 1)
    labelled = measure.label(regions)
    coins = []
    for region in measure.regionprops(labelled):
        if region.area < 300:
            continue
        r0, c0, r1, c1 = region.bbox
        mask = (labelled[r0:r1, c0:c1] == region.label).astype(np.float32)
        coins.append(Sprite(coins_img[r0:r1, c0:c1].astype(np.float32) / 255.0, mask))

    faces = [
        Sprite(face.astype(np.float32), np.ones(face.shape, np.float32)) for face in skimage.data.lfw_subset()[:100]
    ]

    horse_mask = (~skimage.data.horse()).astype(np.float32)
    horse = [_crop_to_mask(np.ones(horse_mask.shape, np.float32), horse_mask, 0.5)]
    return {"digit": digits, "coin": coins, "face": faces, "horse": horse}


# ----------------------------------------------------------------------------- rendering


def _resize(array: np.ndarray, height: int, width: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(
        Image.fromarray(array.astype(np.float32), mode="F").resize((width, height), Image.BILINEAR), dtype=np.float32
    )


def _background(rng: np.random.Generator, kinds: tuple[str, ...], size: int) -> np.ndarray:
    photos = _backgrounds()[kinds[int(rng.integers(len(kinds)))]]
    photo = photos[int(rng.integers(len(photos)))]
    side = min(photo.shape[0], photo.shape[1])
    crop = int(rng.uniform(0.35, 1.0) * side)
    crop = max(crop, min(size, side))
    top = int(rng.integers(photo.shape[0] - crop + 1))
    left = int(rng.integers(photo.shape[1] - crop + 1))
    patch = photo[top : top + crop, left : left + crop]
    out = np.stack([_resize(patch[:, :, c], size, size) for c in range(3)], axis=2)
    if rng.random() < 0.5:
        out = out[:, ::-1]
    return np.clip(out, 0, 1)


def _colour(cls: str, rng: np.random.Generator, under: np.ndarray) -> np.ndarray:
    """(h, w, 3) colour layer of an object given the background ``under`` it."""
    if cls == "digit":
        lum = luminance(under.reshape(-1, 3).mean(axis=0))
        for _ in range(50):
            colour = rng.uniform(0, 1, 3).astype(np.float32)
            if abs(luminance(colour) - lum) >= 0.35:
                break
        else:
            colour = np.full(3, 0.0 if lum > 0.5 else 1.0, np.float32)
        return np.broadcast_to(colour, under.shape)
    if cls == "coin":
        tint = np.array((1.0, 0.72, 0.45) if rng.random() < 0.5 else (0.92, 0.92, 0.98), np.float32)
        return np.broadcast_to(tint * np.float32(rng.uniform(0.8, 1.3)), under.shape)
    if cls == "face":
        return np.broadcast_to(
            np.array((1.0, 0.86, 0.74), np.float32) * np.float32(rng.uniform(0.85, 1.15)), under.shape
        )
    base = [(0.45, 0.28, 0.15), (0.12, 0.10, 0.09), (0.92, 0.90, 0.86), (0.65, 0.45, 0.25)][int(rng.integers(4))]
    return np.broadcast_to(np.array(base, np.float32), under.shape)


def _box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    if len(boxes) == 0:
        return np.zeros(0)
    x1 = np.maximum(box[0], boxes[:, 0])
    y1 = np.maximum(box[1], boxes[:, 1])
    x2 = np.minimum(box[2], boxes[:, 2])
    y2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / (area + areas - inter)


def _paste(image: np.ndarray, cls: str, rng: np.random.Generator, taken: list[np.ndarray]) -> Optional[np.ndarray]:
    """Paste one object of class ``cls`` where it overlaps no earlier box; return its box (or None)."""
    size = image.shape[0]
    sprites = _sprites()[cls]
    sprite = sprites[int(rng.integers(len(sprites)))]
    low, high = _SIZE_RANGE[cls]
    longest = rng.uniform(low, high) * size
    stretch = rng.uniform(0.85, 1.15) if cls == "horse" else 1.0
    h0, w0 = sprite.alpha.shape
    scale = longest / max(h0, w0 * stretch)
    h, w = max(4, int(round(h0 * scale))), max(4, int(round(w0 * scale * stretch)))
    alpha = np.clip(_resize(sprite.alpha, h, w), 0, 1)
    grey = np.clip(_resize(sprite.grey, h, w), 0, 1)
    if rng.random() < 0.5:
        alpha, grey = alpha[:, ::-1], grey[:, ::-1]
    inside = alpha > 0.5
    if not inside.any():
        return None
    rows, cols = np.flatnonzero(inside.any(axis=1)), np.flatnonzero(inside.any(axis=0))
    for _ in range(30):
        top = int(rng.integers(0, size - h + 1))
        left = int(rng.integers(0, size - w + 1))
        box = np.array([left + cols[0], top + rows[0], left + cols[-1] + 1, top + rows[-1] + 1], np.float32)
        if len(taken) and _box_iou(box, np.stack(taken)).max() > 0:
            continue
        under = image[top : top + h, left : left + w]
        colour = _colour(cls, rng, under)
        shade = grey[:, :, None] if cls in ("coin", "face") else (0.75 + 0.25 * grey[:, :, None])
        if cls == "horse":
            shade = 0.8 + 0.4 * _resize(rng.uniform(0, 1, (4, 4)).astype(np.float32), h, w)[:, :, None]
        a = alpha[:, :, None]
        image[top : top + h, left : left + w] = under * (1 - a) + np.clip(colour * shade, 0, 1) * a
        return box
    return None


def _lighting(image: np.ndarray, spec: DomainSpec, rng: np.random.Generator) -> np.ndarray:
    if spec.lighting == "day":
        image = image * np.float32(rng.uniform(0.9, 1.1))
    elif spec.lighting == "night":
        image = np.float32(rng.uniform(0.25, 0.4)) * image ** np.float32(rng.uniform(1.5, 2.0))
        image = image * np.array((0.75, 0.85, 1.1), np.float32) + rng.normal(0, 0.02, image.shape).astype(np.float32)
    else:  # dusk
        image = np.float32(rng.uniform(0.55, 0.75)) * image ** np.float32(1.2) * np.array((1.1, 0.9, 0.75), np.float32)
    low, high = spec.fog
    if high > 0:
        size = image.shape[0]
        depth = np.linspace(1.0, 0.2, size, dtype=np.float32)[:, None] + np.linspace(-0.1, 0.1, size, dtype=np.float32)[
            None, :
        ] * np.float32(rng.uniform(-1, 1))
        t = np.exp(-np.float32(rng.uniform(low, high)) * depth)[:, :, None]
        airlight = np.float32(rng.uniform(0.75, 0.9))
        image = image * t + airlight * (1 - t)
    return np.clip(image, 0, 1)


def render_domain(domain: str, variant: Variant, seed: int) -> dict[str, np.ndarray]:
    """Build one domain: uint8 images (N, 3, S, S) and annotation tables, train then test."""
    spec = SPECS[domain]
    rng = rng_for(seed, spec.key)
    n_train, n_test = variant.server if domain == SERVER_DOMAIN else variant.other
    probs = np.asarray(spec.class_probs, np.float64)
    probs = probs / probs.sum()
    images, boxes, labels = [], [], []
    for _ in range(n_train + n_test):
        image = _background(rng, spec.backgrounds, variant.size)
        taken: list[np.ndarray] = []
        classes: list[int] = []
        for cls in rng.choice(
            len(CLASSES), size=int(rng.integers(variant.objects[0], variant.objects[1] + 1)), p=probs
        ):
            box = _paste(image, CLASSES[int(cls)], rng, taken)
            if box is not None:
                taken.append(box)
                classes.append(int(cls))
        image = _lighting(image, spec, rng)
        images.append(np.clip(np.rint(image * 255), 0, 255).astype(np.uint8).transpose(2, 0, 1))
        boxes.append(np.stack(taken) if taken else np.zeros((0, 4), np.float32))
        labels.append(np.asarray(classes, np.int64))
    x = np.stack(images)
    train = Annotations.from_lists(boxes[:n_train], labels[:n_train])
    test = Annotations.from_lists(boxes[n_train:], labels[n_train:])
    return {"train_x": x[:n_train], "test_x": x[n_train:], **train.to_arrays("train"), **test.to_arrays("test")}
