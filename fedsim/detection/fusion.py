"""Box fusion of several detectors' outputs on one image, over ``ensemble-boxes``.

    fused = fuse([dets_global, dets_personal], image_size=(128, 128), method="wbf", weights=(1, 1))

Methods (Solovyev et al., "Weighted boxes fusion", Image and Vision Computing 2021):

* ``wbf``: weighted boxes fusion: boxes of the same label whose IoU with a cluster's fused
  box exceeds ``iou_thr`` join the cluster; the fused box is the score-weighted mean of
  the cluster's boxes, its score the mean score times min(#models, #boxes) / sum(weights)
  (``conf_type="avg"``);
* ``nms``: non-maximum suppression over the pooled boxes (scores scaled by the model weights);
* ``soft_nms``: Gaussian soft-NMS (Bodla et al. 2017): the best box is kept, every other box
  of its label has its score multiplied by exp(-IoU^2 / sigma), repeat; boxes whose score
  falls below ``max(skip_box_thr, 1e-3)`` are dropped. Computed here: ensemble-boxes'
  ``soft_nms`` (1.0.9) uses the decayed scores only to filter and returns the original ones;
* ``nmw``: non-maximum weighted (Zhou et al. 2017).

Detections are ``(boxes, scores, labels)`` in pixels (x1 y1 x2 y2), or torchvision's
output dicts; they are normalized to [0, 1] for ensemble-boxes and scaled back.
ensemble-boxes prints and calls ``exit()`` on some bad inputs and silently clips others;
this wrapper checks first and raises ``ValueError`` instead.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import numpy as np

METHODS = ("wbf", "nms", "soft_nms", "nmw")
CONF_TYPES = ("avg", "max", "box_and_model_avg", "absent_model_aware_avg")

Detections = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes (N, 4) pixels, scores (N,), labels (N,)


def as_detections(output: Union[Mapping, Sequence]) -> Detections:
    """torchvision's ``{"boxes", "scores", "labels"}`` (tensors or arrays), or a triple -> numpy triple."""
    if isinstance(output, Mapping):
        missing = {"boxes", "scores", "labels"} - set(output)
        if missing:
            raise ValueError(f"detections need keys boxes, scores and labels; missing {sorted(missing)}")
        parts = (output["boxes"], output["scores"], output["labels"])
    else:
        if len(output) != 3:
            raise ValueError("detections must be (boxes, scores, labels)")
        parts = tuple(output)
    arrays = []
    for part in parts:
        if hasattr(part, "detach"):
            part = part.detach().cpu().numpy()
        arrays.append(np.asarray(part))
    boxes = arrays[0].astype(np.float64).reshape(-1, 4) if arrays[0].size else np.zeros((0, 4))
    scores = arrays[1].astype(np.float64).reshape(-1)
    labels = arrays[2].reshape(-1)
    if len(boxes) != len(scores) or len(boxes) != len(labels):
        raise ValueError(
            f"{len(boxes)} boxes, {len(scores)} scores and {len(labels)} labels: give one score and one label per box"
        )
    if len(labels) and not np.all(np.equal(np.mod(labels, 1), 0)):
        raise ValueError("labels must be integers")
    return boxes, scores, labels.astype(np.int64)


def _check(dets: Detections, height: float, width: float, model: int, tolerance: float = 1e-3) -> None:
    boxes, scores, _ = dets
    if not (np.isfinite(boxes).all() and np.isfinite(scores).all()):
        raise ValueError(f"model {model}: non-finite box coordinate or score")
    if len(scores) and (scores.min() < 0 or scores.max() > 1 + tolerance):
        raise ValueError(f"model {model}: scores must lie in [0, 1], got {scores.min():.4g}..{scores.max():.4g}")
    if len(boxes):
        if np.any(boxes[:, 2] < boxes[:, 0]) or np.any(boxes[:, 3] < boxes[:, 1]):
            raise ValueError(f"model {model}: a box has x2 < x1 or y2 < y1 (boxes are x1, y1, x2, y2)")
        if (
            boxes.min() < -tolerance
            or np.any(boxes[:, [0, 2]] > width + tolerance)
            or np.any(boxes[:, [1, 3]] > height + tolerance)
        ):
            raise ValueError(f"model {model}: a box lies outside the {width:g} x {height:g} image")


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    x1 = np.maximum(box[0], boxes[:, 0])
    y1 = np.maximum(box[1], boxes[:, 1])
    x2 = np.minimum(box[2], boxes[:, 2])
    y2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    union = (box[2] - box[0]) * (box[3] - box[1]) + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) - inter
    return inter / np.maximum(union, 1e-12)


def _soft_nms(boxes: list, scores: list, labels: list, weights: list[float], sigma: float, threshold: float):
    """Gaussian soft-NMS over the pooled boxes; scores first scaled by weight / sum(weights), as ensemble-boxes'
    nms does."""
    total = sum(weights)
    all_boxes = np.concatenate(boxes)
    all_scores = np.concatenate([s * w / total for s, w in zip(scores, weights)])
    all_labels = np.concatenate(labels)
    out_boxes, out_scores, out_labels = [], [], []
    for label in np.unique(all_labels):
        sel = all_labels == label
        b, s = all_boxes[sel], all_scores[sel].copy()
        alive = np.ones(len(b), dtype=bool)
        while alive.any():
            best = int(np.flatnonzero(alive)[np.argmax(s[alive])])
            alive[best] = False
            out_boxes.append(b[best])
            out_scores.append(s[best])
            out_labels.append(label)
            rest = np.flatnonzero(alive)
            if len(rest):
                s[rest] *= np.exp(-(_iou(b[best], b[rest]) ** 2) / sigma)
                alive[rest[s[rest] < threshold]] = False
    if not out_boxes:
        return np.zeros((0, 4)), np.zeros(0), np.zeros(0)
    return np.stack(out_boxes), np.asarray(out_scores), np.asarray(out_labels)


def _checked_settings(detections, image_size, method, weights, iou_thr, sigma, conf_type):
    """(height, width, one float weight per model) of a ``fuse`` call; ValueError for a bad setting."""
    if method not in METHODS:
        raise ValueError(f"unknown fusion method {method!r}: choose one of {', '.join(METHODS)}")
    if conf_type not in CONF_TYPES:
        raise ValueError(f"unknown conf_type {conf_type!r}: choose one of {', '.join(CONF_TYPES)}")
    if not 0 < iou_thr <= 1:
        raise ValueError(f"iou_thr must lie in (0, 1], got {iou_thr}")
    if sigma <= 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    if len(detections) == 0:
        raise ValueError("fuse needs the detections of at least one model")
    height, width = (float(v) for v in image_size)
    if height <= 0 or width <= 0:
        raise ValueError(f"image_size must be positive (height, width), got {image_size}")
    if weights is None:
        weights = [1.0] * len(detections)
    weights = [float(w) for w in weights]
    if len(weights) != len(detections):
        raise ValueError(f"{len(weights)} weights for {len(detections)} models: give one weight per model")
    if min(weights) < 0 or sum(weights) <= 0:
        raise ValueError(f"model weights must be non-negative with a positive sum, got {weights}")
    return height, width, weights


def fuse(
    detections: Sequence[Union[Mapping, Sequence]],
    image_size: tuple[int, int],
    method: str = "wbf",
    weights: Optional[Sequence[float]] = None,
    iou_thr: float = 0.55,
    skip_box_thr: float = 0.0,
    sigma: float = 0.5,
    conf_type: str = "avg",
) -> Detections:
    """Fuse one image's detections from several models; ``image_size = (height, width)`` in pixels.

    Returns ``(boxes, scores, labels)`` in pixels, sorted by decreasing score.
    """
    from ensemble_boxes import nms, non_maximum_weighted, weighted_boxes_fusion

    height, width, weights = _checked_settings(detections, image_size, method, weights, iou_thr, sigma, conf_type)
    parsed = [as_detections(d) for d in detections]
    for i, dets in enumerate(parsed):
        _check(dets, height, width, i)
    scale = np.array([width, height, width, height])
    keep = [
        (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1]) for b, _, _ in parsed
    ]  # ensemble-boxes drops zero-area boxes anyway
    boxes = [np.clip(b[k] / scale, 0.0, 1.0) for (b, _, _), k in zip(parsed, keep)]
    scores = [np.clip(s[k], 0.0, 1.0) for (_, s, _), k in zip(parsed, keep)]
    labels = [lab[k] for (_, _, lab), k in zip(parsed, keep)]
    if sum(len(b) for b in boxes) == 0:
        return np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64)
    if method == "wbf":
        out = weighted_boxes_fusion(
            boxes, scores, labels, weights=weights, iou_thr=iou_thr, skip_box_thr=skip_box_thr, conf_type=conf_type
        )
    elif method == "nmw":
        out = non_maximum_weighted(boxes, scores, labels, weights=weights, iou_thr=iou_thr, skip_box_thr=skip_box_thr)
    elif method == "nms":
        scores = [s.copy() for s in scores]  # nms_method rescales the score arrays in place
        out = nms(boxes, scores, labels, iou_thr=iou_thr, weights=weights)
    else:
        out = _soft_nms(boxes, scores, labels, weights, sigma, max(skip_box_thr, 1e-3))
    fused_boxes, fused_scores, fused_labels = (np.asarray(a) for a in out)
    if len(fused_boxes) == 0:
        return np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64)
    order = np.argsort(-fused_scores, kind="stable")
    return (
        fused_boxes[order].reshape(-1, 4) * scale,
        fused_scores[order].astype(np.float64),
        np.rint(fused_labels[order]).astype(np.int64),
    )
