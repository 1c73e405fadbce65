"""torchvision ResNets: weights from a file or torchvision's cache (never downloaded), a frozen backbone's features
computed once per client and cached, a fine-tuned one trained whole, one line for every bad setting.

Nothing here has ImageNet weights: the networks are resnet18 at 16-32 px with random weights, and the weights files
are state dicts the tests write themselves."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

torchvision = pytest.importorskip("torchvision", reason="the ResNets need the optional detection extra")

from conftest import assert_same_results  # noqa: E402

from fedsim.api import run_experiment  # noqa: E402
from fedsim.config import load_config, model_config  # noqa: E402
from fedsim.data.scenario import build_federation, load_client_data  # noqa: E402
from fedsim.errors import MissingDependency, UserError  # noqa: E402
from fedsim.experiments.cli import main  # noqa: E402
from fedsim.models import build_model, features, resnet  # noqa: E402
from fedsim.registry import MODELS  # noqa: E402

MEAN = torch.tensor(resnet.IMAGENET_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(resnet.IMAGENET_STD).view(1, 3, 1, 1)


def write_domains(root: Path, size: int = 32, per_domain: int = 18) -> Path:
    """Three domains of 3 x size x size images in [0, 1]; class c is a bright channel c, domains differ in
    brightness."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    y = np.arange(per_domain) % 3
    for d in range(3):
        x = rng.uniform(0.0, 0.3, size=(per_domain, 3, size, size))
        for c in range(3):
            x[y == c, c] += 0.4 + 0.15 * d
        np.savez(root / f"d{d}.npz", x=x.astype(np.float32), y=y.astype(np.int64))
    return root


def write_weights(path: Path, seed: int, arch: str = "resnet18") -> torch.nn.Module:
    """A state dict of torchvision's ``arch`` (its ImageNet classifier included, as torchvision's files hold it),
    batch-norm statistics moved off their defaults so that they count; returns the network, in eval mode."""
    torch.manual_seed(seed)
    net = getattr(torchvision.models, arch)(weights=None)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), path)
    return net.eval()


def reference_features(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What the test expects of a backbone: ImageNet's standardization, the network without its classifier."""
    net.fc = torch.nn.Identity()
    with torch.no_grad():
        return net((x - MEAN) / STD)


def settings(root: Path, cache: Path, *extra: str) -> list[str]:
    return [
        "data.benchmark=npz",
        f"data.root={root}",
        "data.target=d2",
        f"data.cache_dir={cache}",
        "run.rounds=2",
        "run.backend=local",
        "run.progress=false",
        "run.tensorboard=false",
        "run.seed=3",
        "method.batch_size=8",
        "model.name=resnet18",
        "model.hidden=16",
        *extra,
    ]


@pytest.fixture
def extractions(monkeypatch):
    """Counts the images each call of ``features.extract`` passes through a backbone."""
    calls: list[int] = []
    real = features.extract

    def spy(backbone, images, device):
        calls.append(len(images))
        return real(backbone, images, device)

    monkeypatch.setattr(features, "extract", spy)
    features._backbone.cache_clear()
    return calls


ARCHS = ("resnet18", "resnet50", "resnet101")


def features_of(arch: str) -> resnet.ResNetFeatures:
    """What a ResNet declares it does to its inputs (a frozen backbone's cached features)."""
    return resnet.ResNetFeatures(arch)


def test_the_resnets_are_registered_with_their_widths():
    assert tuple(resnet.ARCHITECTURES) == ARCHS
    assert resnet.ARCHITECTURES == {"resnet18": 512, "resnet50": 2048, "resnet101": 2048}
    for arch, width in resnet.ARCHITECTURES.items():
        assert f"({width} features)" in MODELS.get(arch).__doc__
        assert resnet.trunk(arch, device="meta")(torch.zeros(2, 3, 64, 64, device="meta")).shape == (2, width)


def test_the_resnets_declare_their_own_options():
    options = model_config(name="resnet50").options
    assert options == resnet.Options() and (options.weights, options.backbone, options.head) == (None, "frozen", "mlp")
    assert model_config(name="resnet18", backbone="finetune").options.backbone == "finetune"
    assert MODELS.get("resnet18").inputs == features_of("resnet18")
    assert load_config(None, ["model.name=resnet18", "model.head=linear"]).model.options.head == "linear"
    assert load_config(None, ["model.name=cnn"]).to_dict()["model"] == {"name": "cnn", "hidden": 128}
    assert load_config(None, ["model.name=resnet18"]).to_dict()["model"] == {
        "name": "resnet18", "hidden": 128, "weights": None, "backbone": "frozen", "head": "mlp"
    }  # fmt: skip
    with pytest.raises(
        UserError, match=r"^unknown config key 'model.weights' for model 'cnn' \(it has no keys of its own\)"
    ):
        load_config(None, ["model.name=cnn", "model.weights=w.pt"])
    with pytest.raises(
        UserError, match=r"^unknown config key 'model.heads' for model 'resnet18' \(its own keys: weights, backbone, "
        r"head\): did you mean 'head'"
    ):  # fmt: skip
        load_config(None, ["model.name=resnet18", "model.heads=mlp"])
    with pytest.raises(UserError, match=r"^model.backbone=trained is not one of frozen, finetune"):
        model_config(name="resnet18", backbone="trained")
    with pytest.raises(UserError, match=r"^model.head=deep is not one of mlp, linear"):
        load_config(None, ["model.name=resnet18", "model.head=deep"])


def test_a_weights_file_gives_the_features_of_that_network(tmp_path):
    path = tmp_path / "w.pt"
    net = write_weights(path, seed=1)
    x = torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    backbone = resnet.frozen_backbone("resnet18", str(path))
    assert not backbone.training and not any(p.requires_grad for p in backbone.parameters())
    with torch.no_grad():
        got = backbone(x)
        grey = backbone(x[:, :1])  # one channel: repeated to three
        random = resnet.frozen_backbone("resnet18", None)(x)
    assert got.shape == (5, 512)
    assert torch.equal(got, reference_features(net, x))  # the very sums of the test's own network
    assert torch.equal(grey, reference_features(net, x[:, :1].repeat(1, 3, 1, 1)))
    assert not torch.allclose(random, got)  # the weights changed the features


def test_fedavg_trains_a_head_on_cached_features_and_computes_them_once(tmp_path, extractions):
    root, cache = write_domains(tmp_path / "domains"), tmp_path / "cache"
    first_file, second_file = tmp_path / "a.pt", tmp_path / "b.pt"
    net = write_weights(first_file, seed=1)
    write_weights(second_file, seed=2)
    run = load_config(None, settings(root, cache, f"model.weights={first_file}", "method.local_epochs=5"))
    first = run_experiment(run)
    assert extractions == [14, 4, 14, 4, 14, 4]  # three clients, each its training then its test images, once
    assert first.federation.input_shape == (512,)  # the methods train the head on the features
    assert {k: v.shape for k, v in first.global_tensors.items()} == {
        "encoder.0.weight": (16, 512),
        "encoder.0.bias": (16,),
        "head.weight": (3, 16),
        "head.bias": (3,),
    }
    assert first.summary["rounds"] == 2 and min(first.summary["source_accuracy"].values()) == 1.0
    files = sorted(p.name for p in cache.glob("features-*.npz"))
    assert len(files) == 3 and all(n.startswith("features-v1-resnet18-npz-d") and "-32px-" in n for n in files)

    # the cached features are the test's network's, on the client's own images (one batch: channels-last as there)
    client = load_client_data(run.data, build_federation(run.data), 0)
    reference = reference_features(net.to(memory_format=torch.channels_last), torch.from_numpy(client.train.x))
    with np.load(next(cache.glob("features-*-d0-client0-*.npz"))) as cached:
        np.testing.assert_array_equal(cached["train"], reference.numpy())

    extractions.clear()
    again = run_experiment(run)
    assert extractions == []  # read back from the cache
    assert_same_results(first, again, ("target_accuracy", "source_accuracy", "bytes_sent"))

    other = run_experiment(
        load_config(None, settings(root, cache, f"model.weights={second_file}", "method.local_epochs=5"))
    )
    assert extractions == [14, 4, 14, 4, 14, 4]  # another weights file: other features, computed again
    assert len(list(cache.glob("features-*.npz"))) == 6
    assert not np.array_equal(other.global_tensors["encoder.0.weight"], first.global_tensors["encoder.0.weight"])


def test_local_and_ray_compute_the_same_features_and_numbers(tmp_path, ray_cluster):
    root = write_domains(tmp_path / "domains", size=16, per_domain=12)
    weights = tmp_path / "w.pt"
    write_weights(weights, seed=1)
    results = {}
    for backend in ("local", "ray"):  # a cache each: both compute their features
        cache = tmp_path / f"cache-{backend}"
        config = load_config(None, settings(root, cache, f"model.weights={weights}", f"run.backend={backend}"))
        results[backend] = run_experiment(config)
    assert_same_results(results["local"], results["ray"], ("target_accuracy", "source_accuracy", "bytes_sent"))
    for local in sorted((tmp_path / "cache-local").glob("features-*.npz")):
        with np.load(local) as a, np.load(tmp_path / "cache-ray" / local.name) as b:
            np.testing.assert_array_equal(a["train"], b["train"])


def test_a_finetuned_resnet_starts_from_the_file_and_trains_whole(tmp_path, extractions):
    weights = tmp_path / "w.pt"
    net = write_weights(weights, seed=1)
    model = build_model(model_config(name="resnet18", weights=str(weights), backbone="finetune"), (3, 16, 16), 3)
    expected = {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    loaded = model.encoder[1].state_dict()
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)
    assert isinstance(model.encoder[0], resnet.ImageNetInput) and model.head.in_features == 128

    root = write_domains(tmp_path / "domains", size=16, per_domain=9)
    overrides = ["model.backbone=finetune", f"model.weights={weights}", "run.rounds=1"]
    result = run_experiment(load_config(None, settings(root, tmp_path / "cache", *overrides)))
    assert extractions == [] and result.federation.input_shape == (3, 16, 16)
    trained = result.global_tensors["encoder.1.conv1.weight"]
    assert trained.shape == (64, 3, 7, 7) and not np.array_equal(trained, expected["conv1.weight"].numpy())

    with pytest.raises(UserError, match=r"data.normalization=federated would standardize them twice"):
        run_experiment(
            load_config(None, settings(root, tmp_path / "cache", *overrides, "data.normalization=federated"))
        )


def run_cli(tmp_path: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    root = write_domains(tmp_path / "domains", size=16, per_domain=6)
    flags = settings(root, tmp_path / "cache", *extra)
    code = main(["run", "-q", "--out", str(tmp_path / "out")] + [a for f in flags for a in ("--set", f)])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", r"model.weights=.*missing.pt: no such file; name a state dict of resnet18"),
        ("garbage", r"model.weights=.*garbage.pt cannot be read as a torch state dict \(.*\): save one with"),
        ("not tensors", r"model.weights=.*numbers.pt holds a dict, not a state dict of tensors"),
        (
            "resnet50 file",
            r"model.weights=.*r50.pt does not fit resnet18: .*\d+ unexpected \(layer1.0.conv3.weight, .*\); it is a "
            r"state dict of resnet50: set model.name=resnet50",
        ),
    ],
)
def test_bad_weights_are_one_line_and_nothing_is_written(tmp_path, capsys, case, message):
    files = {"missing": tmp_path / "missing.pt", "garbage": tmp_path / "garbage.pt"}
    files.update({"not tensors": tmp_path / "numbers.pt", "resnet50 file": tmp_path / "r50.pt"})
    files["garbage"].write_bytes(b"not a torch file")
    torch.save({"conv1.weight": 1.0}, files["not tensors"])
    if case == "resnet50 file":
        write_weights(files[case], seed=0, arch="resnet50")
    code, err = run_cli(tmp_path, capsys, f"model.weights={files[case]}")
    assert code == 2 and len(err) == 1 and err[0].startswith("fedsim: error: "), err
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "out").exists()


def test_torchvision_cache_is_read_never_downloaded(tmp_path, capsys, monkeypatch, extractions):
    home = tmp_path / "torch-home"
    monkeypatch.setenv("TORCH_HOME", str(home))
    monkeypatch.delenv("TORCH_HUB", raising=False)

    def no_download(*args, **kwargs):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    code, err = run_cli(tmp_path, capsys, "model.weights=torchvision")
    expected = home / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    assert code == 2 and err == [
        f"fedsim: error: model.weights=torchvision: resnet18's ImageNet weights (IMAGENET1K_V1) are not in "
        f"torchvision's cache: {expected} does not exist and nothing is downloaded; put that file there (TORCH_HOME "
        "sets the folder) or name a weights file with model.weights=PATH"
    ]
    assert not (tmp_path / "out").exists()

    write_weights(expected, seed=4)  # the file torchvision would have put there
    code, err = run_cli(tmp_path, capsys, "model.weights=torchvision")
    assert code == 0, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rounds"] == 2 and len(extractions) == 6
    assert features_of("resnet18").weights_key(resnet.Options(weights="torchvision")) == features_of(
        "resnet18"
    ).weights_key(resnet.Options(weights=str(expected)))


def test_without_torchvision_a_resnet_says_what_to_install(monkeypatch):
    listing = "import sys; sys.modules['torchvision'] = None; from fedsim.registry import MODELS; print(MODELS.names())"
    listed = subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True, check=True).stdout
    assert all(f"'{arch}'" in listed for arch in ARCHS)
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    with pytest.raises(MissingDependency, match=r"^the resnet models need a working torchvision \(.*\): pip install "):
        build_model(model_config(name="resnet50", backbone="finetune"), (3, 32, 32), 10)
    with pytest.raises(MissingDependency, match=r"\.\[detection\]'$"):
        resnet.frozen_backbone("resnet18", None)


def test_a_frozen_head_is_not_built_for_images():
    with pytest.raises(UserError, match=r"trains a head on the backbone's 512 features, which each client computes"):
        build_model(model_config(name="resnet18"), (3, 32, 32), 3)
    with pytest.raises(UserError, match=r"model.name=resnet18 takes images \(1 or 3 x H x W\), not inputs of shape"):
        build_model(model_config(name="resnet18", backbone="finetune"), (20,), 3)
    head = build_model(model_config(name="resnet18", head="linear"), (512,), 3)
    assert isinstance(head.encoder, torch.nn.Identity) and head.head.in_features == 512


def test_fada_with_a_linear_head_is_one_line(tmp_path, capsys):
    """FADA splits the model into generator and classifier: a linear head would leave the generator no weights."""
    code, err = run_cli(tmp_path, capsys, "method.name=fada", "model.head=linear")
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        "fedsim: error: fada splits the model into a feature generator and a classifier, and a linear head leaves "
        "the generator no weights: pass --set model.head=mlp"
    )
    assert not (tmp_path / "out").exists()
