"""Box fusion wrapper: hand-computed WBF, NMS behaviour, torchvision inputs, errors instead of exit()."""

import numpy as np
import pytest
import torch

from fedsim.detection.fusion import METHODS, as_detections, fuse

SIZE = (100, 200)  # height, width


def dets(boxes, scores, labels):
    return (np.asarray(boxes, float).reshape(-1, 4), np.asarray(scores, float), np.asarray(labels))


def test_wbf_averages_overlapping_boxes_weighted_by_score():
    a = dets([[10, 10, 50, 50]], [0.9], [1])
    b = dets([[14, 10, 54, 50]], [0.3], [1])
    boxes, scores, labels = fuse([a, b], SIZE, method="wbf", iou_thr=0.5)
    # x1 = (0.9 * 10 + 0.3 * 14) / 1.2 = 11, x2 = (0.9 * 50 + 0.3 * 54) / 1.2 = 51;
    # score = mean(0.9, 0.3) * min(2, 2) / 2
    np.testing.assert_allclose(boxes, [[11, 10, 51, 50]], atol=1e-6)
    np.testing.assert_allclose(scores, [0.6])
    assert labels.tolist() == [1] and labels.dtype == np.int64


def test_wbf_model_weights_and_separate_labels():
    a = dets([[10, 10, 50, 50], [100, 20, 150, 80]], [0.8, 0.5], [0, 2])
    b = dets([[10, 10, 50, 50]], [0.4], [1])  # same box, other label: not fused
    boxes, scores, labels = fuse([a, b], SIZE, method="wbf", weights=[3, 1])
    assert sorted(labels.tolist()) == [0, 1, 2]
    # a lone box keeps its coordinates; its score is w * s * min(2, 1) / sum(w)
    lone = labels == 2
    np.testing.assert_allclose(boxes[lone], [[100, 20, 150, 80]], atol=1e-6)
    np.testing.assert_allclose(scores[lone], [3 * 0.5 / 4])
    assert np.all(np.diff(scores) <= 0), "sorted by decreasing score"


def test_nms_keeps_the_best_of_overlapping_boxes_and_soft_nms_decays_instead():
    a = dets([[10, 10, 50, 50]], [0.9], [0])
    b = dets([[12, 10, 52, 50], [120, 10, 160, 50]], [0.6, 0.7], [0, 0])
    boxes, scores, _ = fuse([a, b], SIZE, method="nms", iou_thr=0.5)
    assert len(boxes) == 2
    np.testing.assert_allclose(boxes[0], [10, 10, 50, 50], atol=1e-6)
    soft_boxes, soft_scores, _ = fuse([a, b], SIZE, method="soft_nms", iou_thr=0.5, sigma=0.5)
    assert len(soft_boxes) == 3  # the suppressed box survives with a decayed score
    decayed = soft_scores[np.argmin(np.abs(soft_boxes[:, 0] - 12))]
    assert 0 < decayed < 0.6 / 2  # scores are scaled by weight / sum(weights) first
    nmw_boxes, _, _ = fuse([a, b], SIZE, method="nmw", iou_thr=0.5)
    assert len(nmw_boxes) == 2


def test_accepts_torchvision_outputs_and_returns_pixels():
    out = {
        "boxes": torch.tensor([[20.0, 30.0, 60.0, 90.0]]),
        "scores": torch.tensor([0.5]),
        "labels": torch.tensor([3]),
    }
    boxes, scores, labels = fuse([out, out], SIZE, method="wbf")
    np.testing.assert_allclose(boxes, [[20, 30, 60, 90]], atol=1e-5)
    np.testing.assert_allclose(scores, [0.5])
    assert labels.tolist() == [3]
    assert as_detections(out)[0].shape == (1, 4)


@pytest.mark.parametrize("method", METHODS)
def test_empty_inputs_give_empty_outputs(method):
    empty = dets(np.zeros((0, 4)), [], [])
    boxes, scores, labels = fuse([empty, empty], SIZE, method=method)
    assert boxes.shape == (0, 4) and scores.shape == (0,) and labels.shape == (0,)


@pytest.mark.parametrize(
    "detections, kwargs, message",
    [
        ([dets([[10, 10, 50, 50]], [0.5, 0.4], [1])], {}, "one score and one label per box"),
        ([dets([[50, 10, 10, 50]], [0.5], [1])], {}, "x2 < x1"),
        ([dets([[10, 10, 250, 50]], [0.5], [1])], {}, "outside"),
        ([dets([[10, 10, 50, 50]], [1.5], [1])], {}, "scores must lie in"),
        ([dets([[10, 10, np.nan, 50]], [0.5], [1])], {}, "non-finite"),
        ([dets([[10, 10, 50, 50]], [0.5], [1])], {"method": "vote"}, "unknown fusion method"),
        ([dets([[10, 10, 50, 50]], [0.5], [1])], {"weights": [1, 2]}, "one weight per model"),
        ([dets([[10, 10, 50, 50]], [0.5], [1])], {"conf_type": "median"}, "unknown conf_type"),
        ([dets([[10, 10, 50, 50]], [0.5], [1])], {"iou_thr": 0}, "iou_thr"),
        ([], {}, "at least one model"),
    ],
)
def test_bad_input_raises_instead_of_exiting(detections, kwargs, message):
    with pytest.raises(ValueError, match=message):
        fuse(detections, SIZE, **kwargs)


# ---- the docs' reading of WBF vs NMS (docs/fedod.md): WBF's mean score divides a box that only one of the two
# models finds by 2, so it loses rank only against boxes both models find. Three settings that could refute it.
FALSE_BOX = [150.0, 60, 190, 95]  # no object there


def scenes(rng, images):
    """Ground truth and the hits of a detector that finds every object (jittered boxes, scores 0.5-1)."""
    truth, hits = [], []
    for _ in range(images):
        xy = rng.uniform(2, 60, (2, 2))
        boxes = np.c_[xy, xy + rng.uniform(15, 35, (2, 2))]
        labels = rng.integers(0, 2, 2)
        truth.append((boxes, labels))
        hits.append((np.clip(boxes + rng.normal(0, 1.5, (2, 4)), 0, 100), rng.uniform(0.5, 1.0, 2), labels))
    return truth, hits


def model(hits, false_score=None):
    """Detections: ``hits`` (or none), plus the false box at ``false_score`` (or not)."""
    boxes, scores, labels = hits if hits is not None else (np.zeros((0, 4)), np.zeros(0), np.zeros(0, int))
    if false_score is not None:
        boxes, scores, labels = np.r_[boxes, [FALSE_BOX]], np.r_[scores, false_score], np.r_[labels, 0]
    return dets(boxes, scores, labels)


def ensemble_map(truth, per_model, method, conf_type="avg"):
    from fedsim.detection.metrics import coco_map

    fused = [fuse(list(parts), SIZE, method=method, iou_thr=0.55, conf_type=conf_type) for parts in zip(*per_model)]
    return coco_map(truth, fused, 2)["mAP"]


def test_reading_identical_models_wbf_equals_nms_and_the_single_model():
    from fedsim.detection.metrics import coco_map

    truth, hits = scenes(np.random.default_rng(0), 20)
    found = [model(h, 0.3) for h in hits]
    single = coco_map(truth, found, 2)["mAP"]
    assert ensemble_map(truth, [found, found], "wbf") == pytest.approx(single, abs=1e-9)
    assert ensemble_map(truth, [found, found], "nms") == pytest.approx(single, abs=1e-9)


def test_reading_each_model_alone_on_its_half_wbf_equals_nms():
    """Every box is found by one model only: WBF divides all scores by 2, the ranking (and mAP) is NMS's."""
    truth, hits = scenes(np.random.default_rng(1), 20)
    a = [model(h, 0.3) if i < 10 else model(None) for i, h in enumerate(hits)]
    b = [model(None) if i < 10 else model(h, 0.3) for i, h in enumerate(hits)]
    wbf, nms = ensemble_map(truth, [a, b], "wbf"), ensemble_map(truth, [a, b], "nms")
    assert wbf == pytest.approx(nms, abs=1e-9) and wbf > 0.5


def test_reading_lone_hits_below_shared_false_positives_make_wbf_lose():
    """Each model finds the objects of its own half only; both report the same false box on every image (0.6).
    WBF ranks the shared false boxes (0.6) above the lone hits (0.25-0.5), NMS keeps the hits above (0.5-1 vs 0.6 at
    worst); WBF with conf_type max (no division) scores what NMS scores."""
    truth, hits = scenes(np.random.default_rng(2), 20)
    a = [model(h if i < 10 else None, 0.6) for i, h in enumerate(hits)]
    b = [model(h if i >= 10 else None, 0.6) for i, h in enumerate(hits)]
    wbf, nms = ensemble_map(truth, [a, b], "wbf"), ensemble_map(truth, [a, b], "nms")
    assert wbf < nms - 0.05
    assert ensemble_map(truth, [a, b], "wbf", conf_type="max") == pytest.approx(nms, abs=0.02)
