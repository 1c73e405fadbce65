"""The images benchmark: an ImageFolder-style folder of domains, decoded once, cached, one clear line per bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedsim.config import DataConfig, data_config
from fedsim.data.benchmarks import images
from fedsim.data.benchmarks.images import ImageFolderBenchmark
from fedsim.errors import UserError
from fedsim.experiments.cli import main

DOMAINS = ("cam_a", "cam_b", "cam_c")
CLASSES = ("blue", "green", "red")  # each class a solid colour: its brightest channel names it
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (20, 40, 230)}
PER_CLASS = 4
OFFICE_CALTECH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "office_caltech10" / "images"
OFFICE_COUNTS = {"amazon": 958, "caltech10": 1123, "dslr": 157, "webcam": 295}


def _write(path: Path, colour, d: int, i: int, mode: str = "RGB") -> None:
    """A 10 x 12 (width x height) picture of ``colour`` with a little noise and a per-domain brightness."""
    rng = np.random.default_rng(d * 100 + i)
    pixels = np.clip(np.array(colour) * (1.0 - 0.15 * d) + rng.normal(0, 8, size=(12, 10, 3)), 0, 255)
    Image.fromarray(pixels.astype(np.uint8)).convert(mode).save(path)


def make_folder(tmp_path: Path, domains=DOMAINS, classes=CLASSES, per_class=PER_CLASS) -> Path:
    """DIR/<domain>/<class>/ with PNG and JPEG files alternating (one RGBA PNG), plus files to ignore."""
    root = tmp_path / "photos"
    for d, domain in enumerate(domains):
        for cls in classes:
            folder = root / domain / cls
            folder.mkdir(parents=True)
            for i in range(per_class):
                suffix, mode = (".png", "RGBA" if i == 2 else "RGB") if i % 2 == 0 else (".JPG", "RGB")
                _write(folder / f"img{i}{suffix}", COLOURS[cls], d, i, mode)
            (folder / "notes.txt").write_text("not an image")
            (folder / ".hidden.jpg").write_bytes(b"")
    return root


def bench(root, tmp_path, **kw) -> ImageFolderBenchmark:
    cache = kw.pop("cache_dir", tmp_path / "cache")
    return ImageFolderBenchmark(data_config(benchmark="images", root=str(root), cache_dir=str(cache), **kw))


def error(b: ImageFolderBenchmark, domain: str = "cam_a") -> str:
    with pytest.raises(UserError) as err:
        b.load(domain)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_domains_classes_shapes_labels_and_split(tmp_path):
    root = make_folder(tmp_path)
    b = bench(root, tmp_path, image_size=8)
    assert b.domains() == list(DOMAINS) and b.classes == CLASSES and b.num_classes == 3
    d = b.load("cam_b")
    assert d.name == "cam_b" and d.num_classes == 3 and d.input_shape == (3, 8, 8)
    assert d.train_x.dtype == np.float32 and d.train_y.dtype == np.int64
    assert (len(d.train_y), len(d.test_y)) == (9, 3)  # 12 images (the .txt and hidden files ignored), 80/20
    assert sorted(np.bincount(d.test_y, minlength=3)) == [1, 1, 1]
    for x, y in ((d.train_x, d.train_y), (d.test_x, d.test_y)):
        assert 0.0 <= x.min() and x.max() <= 1.0
        brightest = x.mean(axis=(2, 3)).argmax(axis=1)  # channel order R, G, B
        assert list(brightest) == [{"red": 0, "green": 1, "blue": 2}[CLASSES[label]] for label in y]
    again = bench(root, tmp_path, image_size=8).load("cam_b")
    assert np.array_equal(again.train_x, d.train_x) and np.array_equal(again.test_y, d.test_y)
    other = bench(root, tmp_path, image_size=8, seed=3).load("cam_b")
    assert not np.array_equal(other.test_x, d.test_x)
    assert len(bench(root, tmp_path, image_size=8, max_train_per_domain=6).load("cam_b").train_y) == 6
    assert bench(root, tmp_path).load("cam_a").input_shape == (3, 32, 32)  # the default size


def test_resize_keeps_the_picture(tmp_path):
    pixels = np.zeros((12, 10, 3), np.uint8)
    pixels[:, :5] = (255, 0, 0)  # left half red, right half blue
    pixels[:, 5:] = (0, 0, 255)
    path = tmp_path / "halves.png"
    Image.fromarray(pixels).save(path)
    Image.fromarray(pixels[..., 0]).save(tmp_path / "grey.png")  # a greyscale file comes out as three channels
    out = images.decode_image(path, 6)
    assert out.shape == (3, 6, 6) and out.dtype == np.uint8
    assert (out[0, :, :2] > 200).all() and (out[2, :, :2] < 50).all()
    assert (out[2, :, -2:] > 200).all() and (out[0, :, -2:] < 50).all()
    grey = images.decode_image(tmp_path / "grey.png", 6)
    assert grey.shape == (3, 6, 6) and np.array_equal(grey[0], grey[1]) and np.array_equal(grey[1], grey[2])


def test_second_load_reads_the_cache_and_an_edited_folder_is_decoded_again(tmp_path, monkeypatch):
    root = make_folder(tmp_path)
    first = bench(root, tmp_path, image_size=8).load("cam_a")
    assert len(list((tmp_path / "cache").glob("images-v1-cam_a-8px-*.npz"))) == 1

    def refuse(path, size):
        raise AssertionError(f"decoded {path} again")

    monkeypatch.setattr(images, "decode_image", refuse)
    cached = bench(root, tmp_path, image_size=8).load("cam_a")
    assert np.array_equal(cached.train_x, first.train_x) and np.array_equal(cached.test_y, first.test_y)
    _write(root / "cam_a" / "red" / "img9.png", COLOURS["red"], 0, 9)  # a new file: the cache no longer fits
    message = error(bench(root, tmp_path, image_size=8))
    assert "13 of 13 image files of domain 'cam_a'" in message and "decoded" in message


def test_corrupt_files_are_named(tmp_path):
    root = make_folder(tmp_path)
    (root / "cam_a" / "red" / "broken.jpg").write_bytes(b"not a jpeg at all")
    png = (root / "cam_a" / "blue" / "img0.png").read_bytes()
    (root / "cam_a" / "blue" / "cut.png").write_bytes(png[: len(png) // 2])
    message = error(bench(root, tmp_path, image_size=8))
    assert "2 of 14 image files of domain 'cam_a'" in message
    assert os.path.join("cam_a", "red", "broken.jpg") in message and os.path.join("cam_a", "blue", "cut.png") in message
    assert "remove or replace them" in message
    assert bench(root, tmp_path, image_size=8).load("cam_b").num_classes == 3  # the other domains still load
    for i in range(5):
        (root / "cam_c" / "green" / f"bad{i}.png").write_bytes(b"")
    many = error(bench(root, tmp_path, image_size=8), "cam_c")
    assert "5 of 17 image files" in many and "and 2 more" in many  # the first three named, then how many more


def test_a_missing_class_is_refused_unless_classes_are_named(tmp_path, caplog):
    root = make_folder(tmp_path)
    for path in (root / "cam_b" / "red").iterdir():
        path.unlink()  # an empty class folder counts as missing
    message = error(bench(root, tmp_path, image_size=8))
    assert "domain 'cam_b' has no folder of images for class(es) red" in message
    assert "--set data.classes=blue,green" in message
    chosen = bench(root, tmp_path, image_size=8, classes=("green", "blue"))
    assert chosen.classes == ("green", "blue") and chosen.load("cam_b").num_classes == 2
    assert set(np.unique(chosen.load("cam_a").train_y)) == {0, 1}
    partial = bench(root, tmp_path, image_size=8, classes=CLASSES)  # named: a domain may lack one (logged)
    assert len(partial.load("cam_b").train_y) + len(partial.load("cam_b").test_y) == 8
    assert "cam_b has no images of class(es) red" in caplog.text
    unused = bench(root, tmp_path, image_size=8, target="cam_c", sources=("cam_a",))  # cam_b is not in play
    assert unused.classes == CLASSES
    assert "unknown: cow" in error(bench(root, tmp_path, classes=("blue", "cow")))


def test_wrong_layouts_get_one_line(tmp_path):
    with pytest.raises(UserError, match=r"pass --set data.root=DIR"):
        ImageFolderBenchmark(DataConfig(benchmark="images")).domains()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no images found under data.root" in error(bench(empty, tmp_path))
    one = make_folder(tmp_path / "one", domains=("solo",))
    assert "only one domain folder (solo)" in error(bench(one, tmp_path))
    assert "holds images directly" in error(bench(one / "solo", tmp_path))  # DIR/<class>/*.jpg: one domain
    root = make_folder(tmp_path)
    assert "--target" in error(bench(root, tmp_path), "cam_z")
    with pytest.raises(UserError, match="at least 4"):  # refused with the config, before any image is read
        bench(root, tmp_path, image_size=2)


def test_fedsim_run_on_an_image_folder(tmp_path, capsys):
    root = make_folder(tmp_path, per_class=6)
    out = tmp_path / "run"
    flags = [f"data.root={root}", f"data.cache_dir={tmp_path / 'cache'}", "model.name=cnn", "data.image_size=8"]
    flags += ["method.batch_size=8", "method.local_epochs=3", "run.tensorboard=false"]
    argv = ["run", "-q", "--backend", "local", "--benchmark", "images", "--target", "cam_c", "--rounds", "2"]
    assert main(argv + ["--out", str(out)] + [a for f in flags for a in ("--set", f)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["benchmark"], summary["target"], summary["rounds"]) == ("images", "cam_c", 2)
    assert sorted(summary["source_accuracy"]) == ["cam_a", "cam_b"]
    assert min(summary["source_accuracy"].values()) >= 0.8  # solid colours: the sources are learned in two rounds
    assert 0.0 <= summary["target_accuracy"] <= 1.0
    assert [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


@pytest.mark.skipif(not OFFICE_CALTECH.is_dir(), reason=f"Office-Caltech10 images not found at {OFFICE_CALTECH}")
def test_office_caltech10_images(tmp_path):
    b = bench(OFFICE_CALTECH, tmp_path, image_size=8)
    assert b.domains() == sorted(OFFICE_COUNTS) and b.num_classes == 10
    for domain, n in OFFICE_COUNTS.items():
        d = b.load(domain)
        assert len(d.train_y) + len(d.test_y) == n and d.input_shape == (3, 8, 8)
        assert set(np.unique(np.concatenate([d.train_y, d.test_y]))) == set(range(10))


@pytest.mark.skipif(not OFFICE_CALTECH.is_dir(), reason=f"Office-Caltech10 images not found at {OFFICE_CALTECH}")
def test_fedsim_run_on_office_caltech10_images(tmp_path):
    out = tmp_path / "run"
    flags = [f"data.root={OFFICE_CALTECH}", f"data.cache_dir={tmp_path / 'cache'}", "model.name=cnn"]
    flags += ["data.image_size=16", "data.max_train_per_domain=60", "run.tensorboard=false"]
    argv = ["run", "-q", "--backend", "local", "--benchmark", "images", "--target", "webcam", "--sources", "dslr"]
    assert main(argv + ["--rounds", "1", "--out", str(out)] + [a for f in flags for a in ("--set", f)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["benchmark"], summary["target"], list(summary["source_accuracy"])) == ("images", "webcam", ["dslr"])
    assert 0.0 <= summary["target_accuracy"] <= 1.0
