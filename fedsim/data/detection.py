"""Detection data in the framework's Domain/ClientData mould.

A detection domain keeps fixed-size images (``train_x``: N x 3 x S x S float32 in
[0, 1]), so every existing piece (partitions, normalization, the object store)
handles them like classification images. Boxes do not fit one array per image, so
they live next to the images in an :class:`Annotations` table (flat arrays:
``boxes`` M x 4 in pixels, x1 y1 x2 y2; ``labels`` M; ``image`` M, the image each
box belongs to), and ``train_y`` / ``test_y`` hold each image's *index* into that
table (``np.arange(N)``). The partition code then splits images, and
``load_client_data`` gives each client its boxes in ``ClientData`` (``train.targets``
/ ``test.targets``: one ``(boxes, labels)`` pair per image, in the split's order).
The target client's ``train.y`` and ``train.targets`` are ``None`` as for
classification, so its boxes are unreachable for training.

Detection benchmarks set three class attributes declared on
:class:`fedsim.data.base.Benchmark`: ``task = "detection"``, ``server_domain`` (the
domain of the FedOD server's own labeled data) and ``default_target``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from fedsim.data.base import Domain
from fedsim.errors import UserError


@dataclass(frozen=True)
class Annotations:
    """Boxes of a set of images: flat arrays, ``image[m]`` the index of box ``m``'s image."""

    boxes: np.ndarray  # (M, 4) float32, x1 y1 x2 y2 in pixels
    labels: np.ndarray  # (M,) int64 in [0, num_classes)
    image: np.ndarray  # (M,) int64 in [0, num_images)
    num_images: int

    @staticmethod
    def from_lists(boxes: list[np.ndarray], labels: list[np.ndarray]) -> "Annotations":
        """Per-image lists -> one table."""
        if len(boxes) != len(labels):
            raise ValueError("one box array and one label array per image")
        counts = [len(b) for b in boxes]
        flat_boxes = (
            np.concatenate([np.asarray(b, np.float32).reshape(-1, 4) for b in boxes])
            if boxes
            else np.zeros((0, 4), np.float32)
        )
        flat_labels = (
            np.concatenate([np.asarray(lab, np.int64).reshape(-1) for lab in labels])
            if labels
            else np.zeros(0, np.int64)
        )
        image = np.repeat(np.arange(len(boxes), dtype=np.int64), counts)
        return Annotations(flat_boxes.astype(np.float32), flat_labels.astype(np.int64), image, len(boxes))

    def per_image(self, indices: Optional[np.ndarray] = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """``[(boxes, labels)]`` for the given image indices (all images by default), in that order."""
        order = np.argsort(self.image, kind="stable")
        starts = np.searchsorted(self.image[order], np.arange(self.num_images + 1))
        wanted = np.arange(self.num_images) if indices is None else np.asarray(indices, dtype=np.int64)
        out = []
        for i in wanted:
            if not 0 <= i < self.num_images:
                raise IndexError(f"image index {i} outside 0..{self.num_images - 1}")
            sel = order[starts[i] : starts[i + 1]]
            out.append((self.boxes[sel], self.labels[sel]))
        return out

    def subset(self, indices: np.ndarray) -> "Annotations":
        """The annotations of images ``indices``, renumbered 0..len(indices)-1."""
        parts = self.per_image(indices)
        return Annotations.from_lists([b for b, _ in parts], [lab for _, lab in parts])

    def class_counts(self, num_classes: int) -> np.ndarray:
        return np.bincount(self.labels, minlength=num_classes)

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {
            f"{prefix}_boxes": self.boxes,
            f"{prefix}_labels": self.labels,
            f"{prefix}_image": self.image,
            f"{prefix}_count": np.array([self.num_images], dtype=np.int64),
        }

    @staticmethod
    def from_arrays(arrays: dict, prefix: str) -> "Annotations":
        return Annotations(
            np.asarray(arrays[f"{prefix}_boxes"], np.float32).reshape(-1, 4),
            np.asarray(arrays[f"{prefix}_labels"], np.int64),
            np.asarray(arrays[f"{prefix}_image"], np.int64),
            int(np.asarray(arrays[f"{prefix}_count"]).reshape(-1)[0]),  # the cache stores 0-d arrays as 1-d
        )


def check_boxes(boxes: np.ndarray, labels: np.ndarray, height: int, width: int, num_classes: int, where: str) -> None:
    """Raise UserError naming ``where`` for boxes that are not finite, empty, outside the image, or mislabeled."""
    boxes = np.asarray(boxes, dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise UserError(f"{where}: boxes must be an M x 4 array (x1, y1, x2, y2), got shape {boxes.shape}")
    if len(labels) != len(boxes):
        raise UserError(f"{where}: {len(boxes)} boxes but {len(labels)} labels: give one label per box")
    if not np.isfinite(boxes).all():
        raise UserError(f"{where}: a box has a non-finite coordinate: fix or drop it")
    bad = np.flatnonzero((boxes[:, 2] <= boxes[:, 0]) | (boxes[:, 3] <= boxes[:, 1]))
    if len(bad):
        raise UserError(f"{where}: box {boxes[bad[0]].tolist()} has no area (x2 <= x1 or y2 <= y1): fix or drop it")
    tol = 1e-3
    outside = np.flatnonzero(
        (boxes[:, 0] < -tol) | (boxes[:, 1] < -tol) | (boxes[:, 2] > width + tol) | (boxes[:, 3] > height + tol)
    )
    if len(outside):
        raise UserError(
            f"{where}: box {boxes[outside[0]].tolist()} lies outside the {width}x{height} image: clip it to the image"
        )
    labels = np.asarray(labels)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise UserError(
            f"{where}: label {int(labels.max() if labels.max() >= num_classes else labels.min())} outside "
            f"0..{num_classes - 1}"
        )


@dataclass(frozen=True)
class DetectionDomain(Domain):
    """A Domain whose ``train_y`` / ``test_y`` are image indices into the annotation tables."""

    train_annotations: Annotations
    test_annotations: Annotations
    class_names: tuple[str, ...]

    def __post_init__(self):
        for split in ("train", "test"):
            x, y, ann = getattr(self, f"{split}_x"), getattr(self, f"{split}_y"), getattr(self, f"{split}_annotations")
            if len(x) != len(y) or ann.num_images != len(x):
                raise ValueError(
                    f"{self.name}/{split}: {len(x)} images, {len(y)} indices, {ann.num_images} annotated images"
                )
            if not np.array_equal(y, np.arange(len(x))):
                raise ValueError(f"{self.name}/{split}: y must be the image indices 0..N-1")
        if len(self.class_names) != self.num_classes:
            raise ValueError("one class name per class")

    @classmethod
    def from_uint8(
        cls,
        name: str,
        train_x: np.ndarray,
        train: Annotations,
        test_x: np.ndarray,
        test: Annotations,
        class_names: tuple[str, ...],
        subsample_limit=None,
        subsample_rng=None,
    ) -> "DetectionDomain":
        """A domain from cached uint8 images, the training part optionally subsampled to ``subsample_limit``."""
        if subsample_limit is not None and subsample_limit < len(train_x):
            keep = np.sort(subsample_rng.permutation(len(train_x))[:subsample_limit])
            train_x, train = train_x[keep], train.subset(keep)
        return cls(
            name=name,
            train_x=train_x.astype(np.float32) / np.float32(255.0),
            train_y=np.arange(len(train_x), dtype=np.int64),
            test_x=test_x.astype(np.float32) / np.float32(255.0),
            test_y=np.arange(len(test_x), dtype=np.int64),
            num_classes=len(class_names),
            train_annotations=train,
            test_annotations=test,
            class_names=tuple(class_names),
        )
