"""Detection scenes (tiny variant) and the COCO-format loader: determinism, exact boxes, round trip, errors."""

import dataclasses
import json

import numpy as np
import pytest

from fedsim.config import data_config, load_config
from fedsim.data.benchmarks.coco import CocoBenchmark, write_coco_domain
from fedsim.data.benchmarks.scenes import CLASSES, ScenesBenchmark, export_coco
from fedsim.data.detection import Annotations
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "scenes-tiny-cache"  # shared with test_fedod: built once per session
    return data_config(benchmark="scenes", target="dusk", variant="tiny", cache_dir=str(cache))


@pytest.fixture(scope="module")
def scenes(tiny):
    benchmark = ScenesBenchmark(tiny)
    return {d: benchmark.load(d) for d in benchmark.domains()}


def test_domains_roles_and_class_mix(scenes):
    assert list(scenes) == ["server", "night", "fog", "farm", "dusk"]
    assert ScenesBenchmark.server_domain == "server" and ScenesBenchmark.default_target == "dusk"
    server, farm = scenes["server"], scenes["farm"]
    assert server.train_x.shape == (24, 3, 64, 64) and server.test_x.shape == (8, 3, 64, 64)
    assert farm.train_x.shape == (8, 3, 64, 64)
    horse = CLASSES.index("horse")
    assert server.train_annotations.class_counts(4)[horse] == 0 and server.test_annotations.class_counts(4)[horse] == 0
    assert farm.train_annotations.class_counts(4)[horse] + farm.test_annotations.class_counts(4)[horse] > 0
    # night is darker than the server's day light, fog has less contrast
    assert scenes["night"].train_x.mean() < 0.6 * server.train_x.mean()
    assert scenes["fog"].train_x.std(axis=(1, 2, 3)).mean() < server.train_x.std(axis=(1, 2, 3)).mean()


def test_boxes_are_exact_and_inside(scenes):
    for domain in scenes.values():
        for split in ("train", "test"):
            ann = getattr(domain, f"{split}_annotations")
            x = getattr(domain, f"{split}_x")
            assert np.array_equal(getattr(domain, f"{split}_y"), np.arange(len(x)))
            assert ann.num_images == len(x) and len(ann.boxes) >= len(x)
            assert np.all(ann.boxes[:, :2] >= 0) and np.all(ann.boxes[:, 2:] <= 64)
            assert np.all(ann.boxes[:, 2:] > ann.boxes[:, :2])
            assert np.array_equal(ann.boxes, np.round(ann.boxes))  # pixel-exact bounding boxes of the pasted masks


def test_deterministic_and_cached(tiny, tmp_path, scenes):
    other = ScenesBenchmark(dataclasses.replace(tiny, cache_dir=str(tmp_path))).load("fog")
    assert np.array_equal(other.train_x, scenes["fog"].train_x)
    assert np.array_equal(other.test_annotations.boxes, scenes["fog"].test_annotations.boxes)
    assert list(tmp_path.glob("scenes-v1-tiny-fog-seed0.npz"))
    reseeded = ScenesBenchmark(dataclasses.replace(tiny, cache_dir=str(tmp_path), seed=1)).load("fog")
    assert not np.array_equal(reseeded.train_x, other.train_x)


def test_max_train_subsets_images_with_their_boxes(tiny, scenes):
    small = ScenesBenchmark(dataclasses.replace(tiny, max_train_per_domain=5)).load("server")
    assert len(small.train_x) == 5 and small.train_annotations.num_images == 5
    full = scenes["server"]
    for i, (boxes, labels) in enumerate(small.train_annotations.per_image()):
        j = next(j for j in range(len(full.train_x)) if np.array_equal(full.train_x[j], small.train_x[i]))
        fb, fl = full.train_annotations.per_image([j])[0]
        assert np.array_equal(boxes, fb) and np.array_equal(labels, fl)


def test_clients_get_their_boxes_in_client_data_and_the_target_no_training_boxes(tiny, scenes):
    config = load_config(
        None,
        [
            "method.name=fedod",
            "data.benchmark=scenes",
            "data.target=dusk",
            "data.variant=tiny",
            f"data.cache_dir={tiny.cache_dir}",
        ],
    )
    federation = build_federation(config.data)
    assert [c.domain for c in federation.clients] == ["server", "night", "fog", "farm", "dusk"]
    night = load_client_data(config.data, federation, 1)
    assert len(night.train.targets) == len(night.train) == 8 and len(night.test.targets) == len(night.test)
    domain = scenes["night"]
    for split, ann in (("train", domain.train_annotations), ("test", domain.test_annotations)):
        part = getattr(night, split)
        for (boxes, labels), index in zip(part.targets, part.y):  # each image's own boxes, in the split's order
            expected_boxes, expected_labels = ann.per_image([index])[0]
            assert (
                boxes.shape[1] == 4
                and np.array_equal(boxes, expected_boxes)
                and np.array_equal(labels, expected_labels)
            )
    target = load_client_data(config.data, federation, federation.target_ids[0])
    assert target.train.y is None and target.train.targets is None
    assert len(target.test.targets) == len(target.test) > 0
    assert sum(len(b) for b, _ in target.test.targets) == len(scenes["dusk"].test_annotations.boxes)


def test_coco_round_trip_is_exact(tiny, scenes, tmp_path):
    root = export_coco(tiny, tmp_path / "coco", domains=["server", "farm"])
    coco = CocoBenchmark(data_config(benchmark="coco", root=str(root), variant="64"))
    assert coco.domains() == ["farm", "server"] and coco.classes() == CLASSES
    for name in ("server", "farm"):
        loaded, original = coco.load(name), scenes[name]
        for split in ("train", "test"):
            assert np.array_equal(getattr(loaded, f"{split}_x"), getattr(original, f"{split}_x"))
            a, b = getattr(loaded, f"{split}_annotations"), getattr(original, f"{split}_annotations")
            assert (
                np.array_equal(a.boxes, b.boxes)
                and np.array_equal(a.labels, b.labels)
                and np.array_equal(a.image, b.image)
            )


def write_domain(
    root, name="server", boxes=((10, 10, 20, 30),), labels=(0,), size=(64, 96), count=5, classes=("car", "person")
):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (count, 3, size[0], size[1]), dtype=np.uint8)
    per_image = [np.array(boxes, np.float32)] + [np.zeros((0, 4), np.float32)] * (count - 1)
    ann = Annotations.from_lists(per_image, [np.array(labels)] + [np.zeros(0, np.int64)] * (count - 1))
    path = write_coco_domain(root / name, {"all": images}, {"all": ann}, classes)
    data = json.loads(path.read_text())
    for record in data["images"]:
        del record["split"]  # no split field: the loader splits 80/20 from the seed
    path.write_text(json.dumps(data))
    return path


def test_coco_loader_resizes_and_splits(tmp_path):
    write_domain(tmp_path)
    write_domain(tmp_path, "rain", classes=("person", "bus"))
    benchmark = CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path), variant="32"))
    assert benchmark.classes() == ("person", "bus", "car")  # domains in name order (rain, server), ids within a file
    server = benchmark.load("server")
    assert (
        server.train_x.shape[1:] == (3, 32, 32)
        and len(server.train_x) + len(server.test_x) == 5
        and len(server.test_x) == 1
    )
    everything = np.concatenate([server.train_annotations.boxes, server.test_annotations.boxes])
    np.testing.assert_allclose(everything, [[10 / 3, 5, 20 / 3, 15]], rtol=1e-6)  # 96 x 64 -> 32 x 32
    assert np.concatenate([server.train_annotations.labels, server.test_annotations.labels]).tolist() == [2]


def test_coco_loader_errors(tmp_path):
    with pytest.raises(UserError, match="needs a folder"):
        CocoBenchmark(data_config(benchmark="coco")).domains()
    with pytest.raises(UserError, match="not a folder"):
        CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path / "missing"))).domains()
    with pytest.raises(UserError, match="no domain folders"):
        CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path))).domains()
    path = write_domain(tmp_path, boxes=((10, 10, 5, 30),))  # x2 < x1
    with pytest.raises(UserError, match="no area"):
        CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path), variant="32")).load("server")
    path = write_domain(tmp_path, boxes=((10, 10, 120, 30),))
    with pytest.raises(UserError, match="outside"):
        CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path), variant="32")).load("server")
    path = write_domain(tmp_path)
    data = json.loads(path.read_text())
    data["annotations"][0]["category_id"] = 9
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="category_id 9"):
        CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path), variant="32")).load("server")
    path = write_domain(tmp_path)
    (tmp_path / "server" / "images" / "all_00002.png").unlink()
    with pytest.raises(UserError, match="is missing"):
        CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path), variant="32")).load("server")
    path.write_text("{not json")
    with pytest.raises(UserError, match="not a readable COCO JSON"):
        CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path), variant="32")).load("server")
    write_domain(tmp_path)
    with pytest.raises(UserError, match="multiple of 32"):
        CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path), variant="50")).load("server")
    with pytest.raises(UserError, match="unknown domain"):
        CocoBenchmark(data_config(benchmark="coco", root=str(tmp_path), variant="32")).load("snow")
