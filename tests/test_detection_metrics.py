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


def test_a_u_scores_each_clients_model_on_the_server_set_and_every_clients_set():
    """u_i = mAP(M_i on S u T_1 u T_2), the paper's L_U; A_u_deployed keeps mAP(M_i on S, M_j on T_j for every
    client j), A_u_own mAP(M_i on S u T_i)."""
    from fedsim.methods.detection.evaluation import DetectionRoles, Family, family_scores

    rng = np.random.default_rng(3)
    roles = DetectionRoles("server", 0, (1, 2), ())
    truth = {name: random_set(rng, 6)[0] for name in ("S", "T1", "T2")}

    def detect(images, hit):  # each box found with probability ``hit``, jittered, with a rounded score
        out = []
        for boxes, labels in images:
            found = rng.uniform(0, 1, len(boxes)) < hit
            det = boxes[found] + rng.normal(0, 2, (int(found.sum()), 4))
            det[:, 2:] = np.maximum(det[:, 2:], det[:, :2] + 1)
            out.append((det, np.round(rng.uniform(0.1, 1, len(det)), 1), labels[found]))
        return out

    # M_i finds most boxes on its own client's set, few elsewhere; the global model g half of them everywhere
    hits = {"g": (0.5, 0.5, 0.5), "m1": (0.4, 0.9, 0.2), "m2": (0.4, 0.2, 0.9)}
    models = {m: {name: detect(truth[name], h) for name, h in zip(("S", "T1", "T2"), hit)} for m, hit in hits.items()}
    records = {(m, name): match_records(truth[name], models[m][name], 3) for m in models for name in truth}
    lookup = {
        (0, "g"): records["g", "S"],
        (1, "g"): records["g", "T1"],
        (2, "g"): records["g", "T2"],
        (0, "m@1"): records["m1", "S"],
        (0, "m@2"): records["m2", "S"],
        (1, "m"): records["m1", "T1"],  # each client's own model on its own set
        (2, "m"): records["m2", "T2"],
        (1, "m@2"): records["m2", "T1"],  # client 1 scores M_2 on T_1
        (2, "m@1"): records["m1", "T2"],
    }
    get = lambda cid, label: lookup[(cid, label)]  # noqa: E731

    def pooled(model, names):  # pycocotools on the pooled images: the reference
        return coco_map([t for n in names for t in truth[n]], [d for n in names for d in models[model][n]], 3)["mAP"]

    glob = family_scores(Family("g", False, (), lambda c: ()), get, roles, 3, 0.3)
    assert glob["A_u"] == pytest.approx(pooled("g", ("S", "T1", "T2")), abs=1e-12)  # a global model: the pooled set
    assert glob["A_u_deployed"] == glob["A_u"]
    per = family_scores(Family("m", True, (), lambda c: ()), get, roles, 3, 0.3)
    for cid, other in ((1, 2), (2, 1)):
        scores = per["clients"][str(cid)]
        assert scores["u"] == pytest.approx(pooled(f"m{cid}", ("S", "T1", "T2")), abs=1e-12)
        deployed = accumulate([records[f"m{cid}", "S"], records["m1", "T1"], records["m2", "T2"]], 3)["mAP"]
        assert scores["ud"] == pytest.approx(deployed, abs=1e-12)
        assert scores["uo"] == pytest.approx(pooled(f"m{cid}", ("S", f"T{cid}")), abs=1e-12)
        # M_i finds few boxes on the other client's set, where the deployed form scores that client's own model
        assert scores["u"] < scores["ud"] - 0.04
    assert per["A_u"] == pytest.approx(np.mean([per["clients"][c]["u"] for c in ("1", "2")]))
    assert per["A_u_deployed"] == pytest.approx(np.mean([per["clients"][c]["ud"] for c in ("1", "2")]))
    assert per["A_u_own"] == pytest.approx(np.mean([per["clients"][c]["uo"] for c in ("1", "2")]))
