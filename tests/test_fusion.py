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
    # x1 = (0.9 * 10 + 0.3 * 14) / 1.2 = 11, x2 = (0.9 * 50 + 0.3 * 54) / 1.2 = 51; score = mean(0.9, 0.3) * min(2, 2) / 2
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
    out = {"boxes": torch.tensor([[20.0, 30.0, 60.0, 90.0]]), "scores": torch.tensor([0.5]), "labels": torch.tensor([3])}
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
