"""COCO mAP through pycocotools, centrally and from per-client match records (federated union)."""

import contextlib
import io

import numpy as np
import pytest

from fedsim.detection.metrics import MatchRecords, accumulate, coco_map, comprehensive, match_records


def random_set(rng, images, classes=3):
    truth, dets = [], []
    for _ in range(images):
        g = int(rng.integers(0, 4))
        xy = rng.uniform(0, 80, (g, 2))
        boxes = np.c_[xy, xy + rng.uniform(6, 40, (g, 2))]
        truth.append((boxes, rng.integers(0, classes, g)))
        d = int(rng.integers(0, 6))
        if g:
            det = boxes[rng.integers(0, g, d)] + rng.normal(0, 3, (d, 4))
        else:
            start = rng.uniform(0, 60, (d, 2))
            det = np.c_[start, start + 20]
        det[:, 2:] = np.maximum(det[:, 2:], det[:, :2] + 1)
        dets.append((det, np.round(rng.uniform(0, 1, d), 1), rng.integers(0, classes, d)))  # rounded: score ties
    return truth, dets


def pycocotools_stats(truth, dets, classes):
    """Reference: pycocotools with its default parameters and summarize()."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = {
        "images": [{"id": i + 1} for i in range(len(truth))],
        "categories": [{"id": k + 1} for k in range(classes)],
        "annotations": [],
    }
    for i, (boxes, labels) in enumerate(truth):
        for b, lab in zip(boxes, labels):
            gt["annotations"].append(
                {
                    "id": len(gt["annotations"]) + 1,
                    "image_id": i + 1,
                    "category_id": int(lab) + 1,
                    "iscrowd": 0,
                    "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                    "area": (b[2] - b[0]) * (b[3] - b[1]),
                }
            )
    results = [
        {
            "image_id": i + 1,
            "category_id": int(lab) + 1,
            "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
            "score": float(s),
        }
        for i, (boxes, scores, labels) in enumerate(dets)
        for b, s, lab in zip(boxes, scores, labels)
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = gt
        coco.createIndex()
        evaluator = COCOeval(coco, coco.loadRes(results), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator.stats


def test_coco_map_equals_pycocotools_summary():
    truth, dets = random_set(np.random.default_rng(0), 30)
    stats = pycocotools_stats(truth, dets, 3)
    result = coco_map(truth, dets, 3)
    assert result["mAP"] == pytest.approx(stats[0], abs=1e-12)
    assert result["AP50"] == pytest.approx(stats[1], abs=1e-12)
    assert 0 < result["mAP"] < result["AP50"] < 1


def test_federated_union_equals_central_evaluation_exactly():
    rng = np.random.default_rng(1)
    parts = [random_set(rng, n) for n in (9, 14, 5)]
    records = [match_records(t, d, 3) for t, d in parts]
    union_truth = [x for t, _ in parts for x in t]
    union_dets = [x for _, d in parts for x in d]
    assert accumulate(records, 3) == coco_map(union_truth, union_dets, 3)
    assert accumulate(records[1:2], 3) == coco_map(*parts[1], 3)
    # records survive the trip through named tensors (what a Reply carries), and carry no boxes
    tensors = records[0].to_tensors("wg")
    assert set(tensors) == {f"wg/{k}" for k in MatchRecords.KEYS}
    assert all(t.ndim <= 2 and (t.ndim < 2 or t.shape[0] == 10) for t in tensors.values())
    assert accumulate([MatchRecords.from_tensors(tensors, "wg")], 3) == coco_map(*parts[0], 3)


def test_perfect_empty_and_absent_classes():
    truth = [(np.array([[0, 0, 10, 10], [20, 20, 40, 40]], float), np.array([0, 1]))]
    perfect = [(truth[0][0], np.array([0.9, 0.8]), truth[0][1])]
    assert coco_map(truth, perfect, 4) == pytest.approx(
        {"mAP": 1.0, "AP50": 1.0}
    )  # classes 2, 3 have no ground truth: excluded
    nothing = [(np.zeros((0, 4)), np.zeros(0), np.zeros(0, int))]
    assert coco_map(truth, nothing, 4) == {"mAP": 0.0, "AP50": 0.0}
    no_truth = [(np.zeros((0, 4)), np.zeros(0, int))]
    assert coco_map(no_truth, perfect, 4) == {"mAP": -1.0, "AP50": -1.0}
    shifted = [(truth[0][0] + np.array([3, 0, 3, 0]), np.array([0.9, 0.8]), truth[0][1])]  # IoU 0.54 and 0.74
    result = coco_map(truth, shifted, 4)
    # class 0 matches at IoU .50 only (1 of 10 thresholds), class 1 at .50-.70 (5 of 10): mAP = (0.1 + 0.5) / 2
    assert result == pytest.approx({"mAP": 0.3, "AP50": 1.0})


def test_comprehensive_indicator():
    assert comprehensive(0.5, 0.2) == pytest.approx(0.3 * 0.5 + 0.7 * 0.2)
    assert comprehensive(0.5, 0.2, alpha=1.0) == 0.5
    with pytest.raises(ValueError):
        comprehensive(0.5, 0.2, alpha=1.5)


@pytest.mark.parametrize(
    "truth, dets, message",
    [
        ([(np.zeros((1, 4)), np.array([0]))], [(np.zeros((0, 4)), [], [])], "empty or not finite"),
        ([(np.array([[0, 0, 5, 5]]), np.array([7]))], [(np.zeros((0, 4)), [], [])], "outside"),
        ([(np.array([[0, 0, 5, 5]]), np.array([0]))], [], "one per image"),
        ([(np.array([[0, 0, 5, 5]]), np.array([0]))], [(np.array([[0, 0, 5, 5]]), [0.5, 0.4], [0])], "scores"),
    ],
)
def test_bad_input_raises(truth, dets, message):
    with pytest.raises(ValueError, match=message):
        coco_map(truth, dets, 3)


def test_a_u_merges_the_server_records_with_every_clients_test_records():
    """u_i = mAP(M_i on S, M_j on T_j for every client j); A_u_own keeps mAP(M_i on S u T_i)."""
    from fedsim.methods.common.detection_eval import DetectionRoles, Family, family_scores

    rng = np.random.default_rng(3)
    roles = DetectionRoles("server", 0, (1, 2), ())
    sets = {label: random_set(rng, 6) for label in ("S@1", "S@2", "S", "T1", "T2")}
    records = {key: match_records(*value, 3) for key, value in sets.items()}
    lookup = {
        (0, "g"): records["S"],
        (1, "g"): records["T1"],
        (2, "g"): records["T2"],
        (0, "m@1"): records["S@1"],
        (0, "m@2"): records["S@2"],
        (1, "m"): records["T1"],
        (2, "m"): records["T2"],
    }
    get = lambda cid, label: lookup[(cid, label)]  # noqa: E731
    glob = family_scores(Family("g", False, (), lambda c: ()), get, roles, 3, 0.3)
    union = (
        [x for key in ("S", "T1", "T2") for x in sets[key][0]],
        [x for key in ("S", "T1", "T2") for x in sets[key][1]],
    )
    assert glob["A_u"] == pytest.approx(coco_map(*union, 3)["mAP"], abs=1e-12)  # a global model: the pooled set exactly
    per = family_scores(Family("m", True, (), lambda c: ()), get, roles, 3, 0.3)
    for cid in (1, 2):
        expected = accumulate([records[f"S@{cid}"], records["T1"], records["T2"]], 3)["mAP"]
        assert per["clients"][str(cid)]["u"] == pytest.approx(expected, abs=1e-12)
        assert per["clients"][str(cid)]["uo"] == pytest.approx(
            accumulate([records[f"S@{cid}"], records[f"T{cid}"]], 3)["mAP"], abs=1e-12
        )
    assert per["A_u"] == pytest.approx(np.mean([per["clients"][c]["u"] for c in ("1", "2")]))
    assert per["A_u_own"] == pytest.approx(np.mean([per["clients"][c]["uo"] for c in ("1", "2")]))
