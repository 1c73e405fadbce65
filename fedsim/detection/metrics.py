"""COCO mAP with pycocotools, computable over several clients' test sets without pooling them.

Central (one test set in one place)::

    coco_map(ground_truth, detections, num_classes)   # {"mAP": AP@[.5:.95], "AP50": AP@.5}

Federated (the union of test sets held by different clients): each holder matches its
own detections to its own boxes with pycocotools (``COCOeval.evaluate``: per image and
class, greedy matching by score at IoU .50:.05:.95, maxDets 100) and keeps only what
``COCOeval.accumulate`` reads: per detection its class, score and matched/ignored flags
per IoU threshold, and per class the number of ground-truth boxes::

    records = match_records(ground_truth, detections, num_classes)   # on each client
    accumulate([records_a, records_b], num_classes)                  # anywhere: = coco_map on the union

No image and no box leaves a client this way. ``accumulate`` runs pycocotools'
``accumulate`` on the merged records, so the result equals ``coco_map`` on the
concatenated set (same image order) exactly; a test checks it.

``mAP`` is COCO's AP@[.5:.95] (area all, 100 detections per image), ``AP50`` AP@.5, both
averaged over the classes that have ground truth (pycocotools' -1 for absent classes is
excluded); a set without any ground truth gives -1, as in pycocotools.

The paper's comprehensive indicator (FedOD, Su et al. 2022) weighs a client's model on
the server's test set (A_s) against its own test set (A_p)::

    A_com(alpha) = alpha * A_s + (1 - alpha) * A_p,   alpha = 0.3 by default.
"""

from __future__ import annotations

import contextlib
import copy
import io
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

GroundTruth = Sequence[tuple[np.ndarray, np.ndarray]]  # per image: boxes (G, 4) x1 y1 x2 y2, labels (G,)
Detections = Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]  # per image: boxes (D, 4), scores (D,), labels (D,)

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
MAX_DETECTIONS = 100


def comprehensive(a_s: float, a_p: float, alpha: float = 0.3) -> float:
    """A_com(alpha) = alpha A_s + (1 - alpha) A_p (FedOD's comprehensive indicator)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    return float(alpha * a_s + (1 - alpha) * a_p)


def _check_inputs(ground_truth: GroundTruth, detections: Detections, num_classes: int) -> None:
    if len(ground_truth) != len(detections):
        raise ValueError(
            f"{len(ground_truth)} ground-truth images but {len(detections)} detection lists: give one per image"
        )
    for i, (boxes, labels) in enumerate(ground_truth):
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) if np.size(boxes) else np.zeros((0, 4))
        if len(boxes) != len(labels):
            raise ValueError(f"image {i}: {len(boxes)} boxes but {len(labels)} labels")
        if len(boxes) and (
            np.any(boxes[:, 2] <= boxes[:, 0]) or np.any(boxes[:, 3] <= boxes[:, 1]) or not np.isfinite(boxes).all()
        ):
            raise ValueError(f"image {i}: a ground-truth box is empty or not finite")
        if len(labels) and (np.min(labels) < 0 or np.max(labels) >= num_classes):
            raise ValueError(f"image {i}: a ground-truth label lies outside 0..{num_classes - 1}")
    for i, (boxes, scores, labels) in enumerate(detections):
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) if np.size(boxes) else np.zeros((0, 4))
        if not len(boxes) == len(scores) == len(labels):
            raise ValueError(f"image {i}: {len(boxes)} boxes, {len(scores)} scores, {len(labels)} labels")
        if len(labels) and (np.min(labels) < 0 or np.max(labels) >= num_classes):
            raise ValueError(f"image {i}: a detected label lies outside 0..{num_classes - 1}")
        if not (np.isfinite(boxes).all() and np.isfinite(np.asarray(scores, dtype=np.float64)).all()):
            raise ValueError(f"image {i}: a detection is not finite")


def _coco_objects(ground_truth: GroundTruth, detections: Detections, num_classes: int):
    from pycocotools.coco import COCO

    dataset = {
        "images": [],
        "annotations": [],
        "categories": [{"id": k + 1, "name": str(k)} for k in range(num_classes)],
    }
    results = []
    for i, ((gt_boxes, gt_labels), (boxes, scores, labels)) in enumerate(zip(ground_truth, detections)):
        dataset["images"].append({"id": i + 1})
        for box, label in zip(np.asarray(gt_boxes, np.float64).reshape(-1, 4), gt_labels):
            x1, y1, x2, y2 = (float(v) for v in box)
            dataset["annotations"].append(
                {
                    "id": len(dataset["annotations"]) + 1,
                    "image_id": i + 1,
                    "category_id": int(label) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                }
            )
        for box, score, label in zip(np.asarray(boxes, np.float64).reshape(-1, 4), scores, labels):
            x1, y1, x2, y2 = (float(v) for v in box)
            results.append(
                {
                    "id": len(results) + 1,
                    "image_id": i + 1,
                    "category_id": int(label) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "score": float(score),
                }
            )
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = dataset
        gt.createIndex()
        dt = COCO()
        dt.dataset = {"images": dataset["images"], "categories": dataset["categories"], "annotations": results}
        dt.createIndex()
    return gt, dt


def _evaluator(ground_truth: GroundTruth, detections: Detections, num_classes: int):
    from pycocotools.cocoeval import COCOeval

    gt, dt = _coco_objects(ground_truth, detections, num_classes)
    evaluator = COCOeval(gt, dt, "bbox")
    evaluator.params.areaRng = [[0, 1e5**2]]  # COCO's "all"
    evaluator.params.areaRngLbl = ["all"]
    evaluator.params.maxDets = [MAX_DETECTIONS]
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator.evaluate()
    return evaluator


def summarize_precision(precision: np.ndarray) -> dict[str, float]:
    """pycocotools' precision array (T, R, K, A=1, M=1) -> mAP (AP@[.5:.95]) and AP50, as ``COCOeval.summarize``."""
    p = precision[..., 0, 0]
    valid = p[p > -1]
    valid50 = p[0][p[0] > -1]
    return {
        "mAP": float(np.mean(valid)) if valid.size else -1.0,
        "AP50": float(np.mean(valid50)) if valid50.size else -1.0,
    }


def coco_map(ground_truth: GroundTruth, detections: Detections, num_classes: int) -> dict[str, float]:
    """COCO mAP and AP50 of ``detections`` against ``ground_truth`` (pixels, one entry per image)."""
    _check_inputs(ground_truth, detections, num_classes)
    evaluator = _evaluator(ground_truth, detections, num_classes)
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator.accumulate()
    return summarize_precision(evaluator.eval["precision"])


@dataclass(frozen=True)
class MatchRecords:
    """What pycocotools' accumulate needs from one test set, per detection, in its evaluation order."""

    category: np.ndarray  # (D,) int64, 0-based class
    scores: np.ndarray  # (D,) float64
    matched: np.ndarray  # (T, D) bool: matched to a ground-truth box at IoU threshold t
    ignored: np.ndarray  # (T, D) bool
    gt_count: np.ndarray  # (K,) int64: non-ignored ground-truth boxes per class

    KEYS = ("category", "scores", "matched", "ignored", "gt_count")

    def to_tensors(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}/{k}": getattr(self, k) for k in self.KEYS}

    @staticmethod
    def from_tensors(tensors: Mapping[str, np.ndarray], prefix: str) -> "MatchRecords":
        return MatchRecords(*(np.asarray(tensors[f"{prefix}/{k}"]) for k in MatchRecords.KEYS))


def match_records(ground_truth: GroundTruth, detections: Detections, num_classes: int) -> MatchRecords:
    """Match one test set's detections to its boxes (pycocotools ``evaluate``) and keep the records."""
    _check_inputs(ground_truth, detections, num_classes)
    evaluator = _evaluator(ground_truth, detections, num_classes)
    categories, scores, matched, ignored = [], [], [], []
    gt_count = np.zeros(num_classes, dtype=np.int64)
    num_images = len(evaluator.params.imgIds)
    for k in range(num_classes):  # evalImgs is ordered category, area range (one), image
        for entry in evaluator.evalImgs[k * num_images : (k + 1) * num_images]:
            if entry is None:
                continue
            n = len(entry["dtScores"])
            categories.append(np.full(n, k, dtype=np.int64))
            scores.append(np.asarray(entry["dtScores"], dtype=np.float64))
            matched.append(np.asarray(entry["dtMatches"]).reshape(len(IOU_THRESHOLDS), n) > 0)
            ignored.append(np.asarray(entry["dtIgnore"]).reshape(len(IOU_THRESHOLDS), n).astype(bool))
            gt_count[k] += int(np.count_nonzero(np.asarray(entry["gtIgnore"]) == 0))
    t = len(IOU_THRESHOLDS)
    return MatchRecords(
        np.concatenate(categories) if categories else np.zeros(0, np.int64),
        np.concatenate(scores) if scores else np.zeros(0),
        np.concatenate(matched, axis=1) if matched else np.zeros((t, 0), bool),
        np.concatenate(ignored, axis=1) if ignored else np.zeros((t, 0), bool),
        gt_count,
    )


def accumulate(records: Sequence[MatchRecords], num_classes: int) -> dict[str, float]:
    """mAP and AP50 of the union of the test sets behind ``records`` (in that order), with pycocotools."""
    from pycocotools.cocoeval import COCOeval, Params

    if not records:
        raise ValueError("accumulate needs the records of at least one test set")
    params = Params(iouType="bbox")
    params.imgIds = list(range(len(records)))  # one pseudo-image per test set: accumulate concatenates in this order
    params.catIds = list(range(1, num_classes + 1))
    params.areaRng = [[0, 1e5**2]]
    params.areaRngLbl = ["all"]
    params.maxDets = [max(1, max(len(r.scores) for r in records))]  # per-image truncation happened in match_records
    evaluator = COCOeval(iouType="bbox")
    evaluator.params = params
    evaluator._paramsEval = copy.deepcopy(params)
    entries = []
    for k in range(num_classes):
        for r in records:
            if r.gt_count.shape != (num_classes,):
                raise ValueError(f"records hold counts for {len(r.gt_count)} classes, expected {num_classes}")
            sel = r.category == k
            if not sel.any() and r.gt_count[k] == 0:
                entries.append(None)
                continue
            entries.append(
                {
                    "dtScores": r.scores[sel].tolist(),
                    "dtMatches": r.matched[:, sel].astype(np.float64),
                    "dtIgnore": r.ignored[:, sel],
                    "gtIgnore": np.zeros(int(r.gt_count[k]), dtype=np.int64),
                }
            )
    evaluator.evalImgs = entries
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator.accumulate()
    return summarize_precision(evaluator.eval["precision"])
