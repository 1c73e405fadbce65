"""Models of images (classifiers and detectors) train in the channels-last layout and compute what torch's default
layout computes; their weights leave and enter a model in the default (C-ordered) layout."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedsim.config import model_config
from fedsim.methods.common.training import load_numpy, model_to_numpy
from fedsim.models import build_model


def model(name: str, shape: tuple[int, ...], seed: int = 0):
    torch.manual_seed(seed)
    return build_model(SimpleNamespace(name=name, hidden=16), shape, 10)


@pytest.mark.parametrize("name", ["lenet5", "cnn"])
def test_image_models_hold_convolutions_channels_last(name):
    net = model(name, (1, 28, 28))
    convs = [m.weight for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 2
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    assert not convs[1].is_contiguous()  # the first one, with one input channel, is both layouts at once


def test_feature_models_keep_the_default_layout():
    net = model("mlp", (8,))
    assert all(p.is_contiguous() for p in net.parameters())


@pytest.mark.parametrize("name, shape", [("lenet5", (1, 28, 28)), ("cnn", (3, 16, 16))])
def test_channels_last_trains_as_the_default_layout_does(name, shape):
    fast = model(name, shape)
    plain = model(name, shape).to(memory_format=torch.contiguous_format)  # the same weights, torch's layout
    second = [m.weight for m in plain.modules() if isinstance(m, torch.nn.Conv2d)][1]
    assert second.is_contiguous() and not second.is_contiguous(memory_format=torch.channels_last)
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 16, *shape, generator=generator), torch.randint(0, 10, (4, 16), generator=generator)
    for net in (fast, plain):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        for step in range(4):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x[step]), y[step]).backward()
            optimizer.step()
    for (key, a), b in zip(fast.state_dict().items(), plain.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=key)
    fast.eval(), plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(fast(x[0]), plain(x[0]), rtol=1e-4, atol=1e-5)


def test_weights_travel_in_c_order_and_load_back_channels_last():
    net = model("cnn", (3, 16, 16))
    arrays = model_to_numpy(net)
    weight = arrays["encoder.0.weight"]
    assert weight.flags["C_CONTIGUOUS"] and weight.shape == (16, 3, 5, 5)
    np.testing.assert_array_equal(weight, net.encoder[0].weight.detach().contiguous().numpy())
    other = model("cnn", (3, 16, 16), seed=5)
    load_numpy(other, arrays)
    assert other.encoder[0].weight.is_contiguous(memory_format=torch.channels_last)
    for key, value in other.state_dict().items():
        np.testing.assert_array_equal(value.contiguous().numpy(), arrays[key], err_msg=key)


def test_detectors_hold_convolutions_channels_last_and_save_c_ordered_weights(tmp_path):
    pytest.importorskip("torchvision", reason="the detector is the optional detection extra")
    from fedsim.models.detector import DetectorSpec, build_detector, save_weights

    spec = DetectorSpec(num_classes=3, image_size=64)
    detector = build_detector(spec, seed=0)
    convs = [m.weight for m in detector.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    convs = [w for w in convs if w.shape[1] > 1 and w.shape[-1] > 1]  # the others are both layouts at once
    assert convs and not any(w.is_contiguous() for w in convs)
    path = save_weights(detector, tmp_path / "w.npz")
    with np.load(path) as saved:
        assert all(saved[k].flags["C_CONTIGUOUS"] for k in saved.files)
        loaded = build_detector(DetectorSpec(num_classes=3, image_size=64, weights=str(path)))
        for key, value in loaded.state_dict().items():
            np.testing.assert_array_equal(value.contiguous().numpy(), saved[key], err_msg=key)


def test_a_finetuned_resnet_holds_convolutions_channels_last_and_a_frozen_one_is_its_head():
    pytest.importorskip("torchvision", reason="the ResNets are the optional detection extra")
    config = model_config(name="resnet18", hidden=16, backbone="finetune", head="mlp")
    torch.manual_seed(0)
    net = build_model(config, (3, 32, 32), 10)
    convs = [m.weight for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 20 and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    arrays = model_to_numpy(net)
    assert arrays["encoder.1.conv1.weight"].flags["C_CONTIGUOUS"] and arrays["head.weight"].shape == (10, 16)
    assert not any(key.startswith("encoder.0.") for key in arrays)  # ImageNet's mean and std are not weights
    net.eval()
    with torch.no_grad():
        assert net(torch.rand(2, 1, 32, 32)).shape == (2, 10)  # one channel: repeated to three
    head = build_model(model_config(name="resnet18", hidden=16), (512,), 10)  # frozen by default: the head
    assert [tuple(p.shape) for p in head.parameters()] == [(16, 512), (16,), (10, 16), (10,)]
