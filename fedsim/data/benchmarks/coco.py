"""Your own detection sets in COCO format (SODA10M, nuScenes after conversion, ...): one folder per domain.

Layout under ``--set data.root=DIR``::

    DIR/server/annotations.json   DIR/server/images/...    <- the FedOD server's own labeled set
    DIR/cityA/annotations.json    DIR/cityA/images/...     <- one client domain
    DIR/night/annotations.json    DIR/night/images/...

``annotations.json`` is a COCO detection file (``images``, ``annotations`` with ``bbox = [x, y, width, height]`` in
pixels, ``categories``); ``file_name`` is relative to the domain's ``images/`` folder. An image record may carry
``"split": "train"`` or ``"test"``; images without it are split 80/20 from ``data.seed``. Classes are matched by
category *name* across domains (in the order first seen: by category id, domains in name order), so a class may be
absent from some domains. Images are resized to S x S (``data.variant``: ``default`` = 128, or a number such as
``256``), boxes scaled by the same factors; crowd annotations (``iscrowd = 1``) are dropped. The domain named
``server`` holds the FedOD server's data. Every problem (missing file, bad box, unknown category) is one line naming
the file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from fedsim.data.base import Benchmark
from fedsim.data.benchmarks.splits import rng_for
from fedsim.data.detection import Annotations, DetectionDomain, check_boxes
from fedsim.errors import UserError
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

ANNOTATIONS = "annotations.json"
IMAGES = "images"
DEFAULT_SIZE = 128
TEST_FRACTION = 0.2
_KEY_SPLIT = 7
_KEY_SUBSAMPLE = 8


def write_coco_domain(
    folder, images: Mapping[str, np.ndarray], annotations: Mapping[str, Annotations], class_names: Sequence[str]
) -> Path:
    """Write uint8 images (N, 3, H, W) per split and their boxes as one COCO file + PNGs; returns the JSON path."""
    from PIL import Image

    folder = Path(folder)
    (folder / IMAGES).mkdir(parents=True, exist_ok=True)
    coco = {
        "images": [],
        "annotations": [],
        "categories": [{"id": i + 1, "name": n} for i, n in enumerate(class_names)],
    }
    for split, array in images.items():
        per_image = annotations[split].per_image()
        for index, (img, (boxes, labels)) in enumerate(zip(array, per_image)):
            image_id = len(coco["images"]) + 1
            name = f"{split}_{index:05d}.png"
            Image.fromarray(np.ascontiguousarray(img.transpose(1, 2, 0)), mode="RGB").save(folder / IMAGES / name)
            size = {"width": int(img.shape[2]), "height": int(img.shape[1])}
            coco["images"].append({"id": image_id, "file_name": name, **size, "split": split})
            for box, label in zip(boxes, labels):
                x1, y1, x2, y2 = (float(v) for v in box)
                ids = {"id": len(coco["annotations"]) + 1, "image_id": image_id, "category_id": int(label) + 1}
                geometry = {"bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0}
                coco["annotations"].append({**ids, **geometry})
    path = folder / ANNOTATIONS
    path.write_text(json.dumps(coco))
    return path


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(
            f"{path} is not a readable COCO JSON file ({type(exc).__name__}: {str(exc).splitlines()[0]}): fix or "
            "re-export it"
        ) from None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), list) for k in ("images", "annotations", "categories")
    ):
        raise UserError(f"{path} must be a COCO detection file with lists 'images', 'annotations' and 'categories'")
    return data


def parse_size(variant: str) -> int:
    if variant == "default":
        return DEFAULT_SIZE
    try:
        size = int(variant)
    except ValueError:
        size = 0
    if size < 32 or size % 32:
        raise UserError(
            f"data.variant {variant!r} of benchmark 'coco' must be 'default' (128) or an image size, a multiple of "
            "32 such as 256"
        )
    return size


@BENCHMARKS.register("coco")
class CocoBenchmark(Benchmark):
    """Your own COCO-format detection domains: DIR/<domain>/annotations.json + images/ (server domain 'server')

    For SODA10M or nuScenes converted to COCO; images resized to S x S (data.variant, default 128).
    """

    @dataclass(frozen=True)
    class Options:
        """``data.variant``: the side S images are resized to, "default" (128) or a multiple of 32."""

        variant: str = "default"

        def __post_init__(self):
            parse_size(self.variant)

    task = "detection"
    server_domain = "server"
    default_target = None

    def __init__(self, data_config):
        super().__init__(data_config)
        self._json: dict[str, dict] = {}
        self._classes: Optional[tuple[str, ...]] = None

    def _root(self) -> Path:
        root = self.config.root
        if root is None or str(root).strip() == "":
            raise UserError(
                "the coco benchmark needs a folder with one subfolder per domain: pass --set data.root=DIR "
                "(DIR/<domain>/annotations.json + images/)"
            )
        path = Path(root).expanduser()
        if not path.is_dir():
            raise UserError(
                f"data.root {str(path)!r} is not a folder: create it with one subfolder per domain, each holding "
                "annotations.json and images/"
            )
        return path

    def domains(self) -> list[str]:
        root = self._root()
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and (p / ANNOTATIONS).is_file())
        if not names:
            raise UserError(
                f"no domain folders in {root}: put one folder per domain there, each with annotations.json (COCO) "
                "and images/"
            )
        return names

    def _coco(self, domain: str) -> dict:
        if domain not in self._json:
            path = self._root() / domain / ANNOTATIONS
            if not path.is_file():
                raise UserError(
                    f"{path} does not exist: domains are {', '.join(self.domains())}; each needs annotations.json "
                    "and images/"
                )
            self._json[domain] = _read_json(path)
        return self._json[domain]

    def classes(self) -> tuple[str, ...]:
        """Category names over all domains: by category id within a file, files in domain order, first seen first."""
        if self._classes is None:
            names: list[str] = []
            for domain in self.domains():
                categories = self._coco(domain)["categories"]
                for cat in categories:
                    if not isinstance(cat, dict) or "id" not in cat or "name" not in cat:
                        raise UserError(
                            f"{self._root() / domain / ANNOTATIONS}: every category needs an 'id' and a 'name', got "
                            f"{cat!r}"
                        )
                for cat in sorted(categories, key=lambda c: int(c["id"])):
                    if str(cat["name"]) not in names:
                        names.append(str(cat["name"]))
            if not names:
                raise UserError(
                    f"no categories in the annotations.json files under {self._root()}: list them under 'categories'"
                )
            self._classes = tuple(names)
        return self._classes

    def build_domain(self, domain: str) -> DetectionDomain:
        """One domain's images resized to S x S with their boxes, split by the records' ``split`` or 80/20."""
        if domain not in self.domains():
            raise UserError(
                f"unknown domain {domain!r} for benchmark 'coco' in {self._root()}: choose one of "
                f"{', '.join(self.domains())}"
            )
        size = parse_size(self.options.variant)
        folder = self._root() / domain
        coco = self._coco(domain)
        classes = self.classes()
        targets = _targets_by_image(folder / ANNOTATIONS, coco, classes)
        arrays = {}
        for split, records in _split_records(folder / ANNOTATIONS, coco["images"], self.config.seed).items():
            arrays[split] = _read_split(folder, split, records, targets, size, len(classes))
        train_x, train = arrays["train"]
        test_x, test = arrays["test"]
        return DetectionDomain.from_uint8(
            domain,
            train_x,
            train,
            test_x,
            test,
            classes,
            subsample_limit=self.config.max_train_per_domain,
            subsample_rng=rng_for(self.config.seed, _KEY_SUBSAMPLE),
        )


def _targets_by_image(path: Path, coco: dict, classes: tuple[str, ...]) -> dict[int, tuple[list, list]]:
    """{image id: (boxes x1 y1 x2 y2, class indices)} of the non-crowd annotations, every reference checked."""
    cat_to_class = {int(c["id"]): classes.index(str(c["name"])) for c in coco["categories"]}
    known = set()
    for record in coco["images"]:
        if not isinstance(record, dict) or "id" not in record or "file_name" not in record:
            raise UserError(f"{path}: every image needs an 'id' and a 'file_name', got {record!r}")
        known.add(int(record["id"]))
    targets: dict[int, tuple[list, list]] = {}
    for ann in coco["annotations"]:
        where = f"{path}: annotation {ann.get('id', '?') if isinstance(ann, dict) else ann!r}"
        if not isinstance(ann, dict) or not {"image_id", "category_id", "bbox"} <= set(ann):
            raise UserError(f"{where} needs 'image_id', 'category_id' and 'bbox'")
        if int(ann["category_id"]) not in cat_to_class:
            raise UserError(
                f"{where} has category_id {ann['category_id']}, which is not under 'categories': add the category or "
                "fix the id"
            )
        if int(ann["image_id"]) not in known:
            raise UserError(f"{where} refers to image_id {ann['image_id']}, which is not under 'images'")
        if ann.get("iscrowd", 0):
            continue
        bbox = ann["bbox"]
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
            raise UserError(f"{where} has bbox {bbox!r}: write it as [x, y, width, height]")
        x, y, w, h = (float(v) for v in bbox)
        boxes, labels = targets.setdefault(int(ann["image_id"]), ([], []))
        boxes.append([x, y, x + w, y + h])
        labels.append(cat_to_class[int(ann["category_id"])])
    return targets


def _split_records(path: Path, records: list, seed: int) -> dict[str, list]:
    """Image records by split: their own ``split`` field, the others 80/20 from ``data.seed``."""
    splits: dict[str, list] = {"train": [], "test": []}
    unsplit = []
    for record in records:
        split = record.get("split")
        if split is None:
            unsplit.append(record)
        elif split in splits:
            splits[split].append(record)
        else:
            raise UserError(
                f"{path}: image {record['id']} has split {split!r}: use 'train' or 'test' (or leave it out)"
            )
    if unsplit:
        order = rng_for(seed, _KEY_SPLIT).permutation(len(unsplit))
        n_test = int(round(TEST_FRACTION * len(unsplit)))
        splits["test"] += [unsplit[i] for i in sorted(order[:n_test])]
        splits["train"] += [unsplit[i] for i in sorted(order[n_test:])]
    return splits


def _read_split(
    folder: Path, split: str, records: list, targets: dict, size: int, num_classes: int
) -> tuple[np.ndarray, Annotations]:
    """The images of ``records`` as uint8 (N, 3, size, size) and their boxes scaled to that size."""
    from PIL import Image

    path = folder / ANNOTATIONS
    images, split_boxes, split_labels = [], [], []
    for record in records:
        file = folder / IMAGES / str(record["file_name"])
        if not file.is_file():
            raise UserError(f"{path}: image file {file} is missing: put it under {folder / IMAGES} or fix 'file_name'")
        try:
            with Image.open(file) as im:
                rgb = im.convert("RGB")
                width, height = rgb.size
                resized = rgb if (width, height) == (size, size) else rgb.resize((size, size), Image.BILINEAR)
                images.append(np.asarray(resized, dtype=np.uint8).transpose(2, 0, 1))
        except OSError as exc:
            raise UserError(f"{path}: image file {file} cannot be read ({exc}): replace it") from None
        boxes, labels = targets.get(int(record["id"]), ([], []))
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        lab = np.asarray(labels, dtype=np.int64)
        check_boxes(b, lab, height, width, num_classes, f"{path}: image {record['id']} ({record['file_name']})")
        b = b * np.array([size / width, size / height, size / width, size / height])
        split_boxes.append(b.astype(np.float32))
        split_labels.append(lab)
    if not images:
        raise UserError(
            f'{path}: no {split} images: mark some images with "split": "{split}" or remove the \'split\' fields'
        )
    return np.stack(images), Annotations.from_lists(split_boxes, split_labels)
