"""A small FCOS detector (Tian et al., ICCV 2019) from torchvision, sized for 2 CPU cores.

``body`` = a five-stage conv/batch-norm backbone (strides 2..32, widths w, 2w, 4w,
8w, 8w) + a feature pyramid (Lin et al., CVPR 2017) on strides 8, 16 and 32;
``head`` = torchvision's FCOS head (classification, box regression and
centerness towers, group norm). No pretrained weights exist for this backbone
and none are downloaded: it trains from scratch, or starts from a local weights
file (``weights=path``: a ``.npz`` of named arrays as written by
:func:`save_weights`, or a torch ``state_dict`` file).

The explicit split the federated methods need, without forward hooks:

* :meth:`Detector.maps` returns the pyramid features and the head's raw maps, per
  level, as ``N x C x H x W`` tensors (what FedOD distills);
* :meth:`Detector.loss` the FCOS losses (focal, GIoU, centerness) from those maps;
* :meth:`Detector.detect` post-processed boxes in pixels of the S x S input, on the CPU;
* ``body.*`` / ``head.*`` state-dict prefixes (FedRep) and :func:`fedsim.models.normalization.bn_keys` (FedBN).

Inputs are float images in [0, 1] of one fixed size (``N x 3 x S x S``), normalized
inside (mean 0.5, std 0.25); no resizing. Images and targets held on another device (the CPU) are copied to the
detector's device where they enter :meth:`Detector.maps` and :meth:`Detector.loss`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from fedsim.errors import MissingDependency, UserError

try:
    from torchvision.models.detection._utils import BoxLinearCoder
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.fcos import FCOS, FCOSClassificationHead, FCOSHead, FCOSRegressionHead
    from torchvision.models.detection.image_list import ImageList
    from torchvision.ops.feature_pyramid_network import FeaturePyramidNetwork
except (ImportError, RuntimeError) as exc:  # torchvision is the optional "detection" extra (or does not match torch)
    raise MissingDependency(
        f"the detection methods need a working torchvision ({type(exc).__name__}: {str(exc).splitlines()[0]}): "
        "pip install -c constraints.txt -e '.[detection]'"
    ) from None

STRIDES = (8, 16, 32)
MEAN, STD = 0.5, 0.25


@dataclass(frozen=True)
class DetectorSpec:
    num_classes: int
    image_size: int
    width: int = 16  # channels of the first stage; stages use w, 2w, 4w, 8w, 8w
    fpn_channels: int = 32
    head_convs: int = 2  # conv layers per head tower (torchvision's default is 4)
    score_thresh: float = 0.05  # detections kept for evaluation (COCO mAP wants low-score boxes too)
    nms_thresh: float = 0.6
    detections_per_img: int = 100
    weights: Optional[str] = None  # local weights file; None: random initialization

    def __post_init__(self):
        if self.image_size % 32:
            raise UserError(
                f"detector input size must be a multiple of 32, got {self.image_size}: resize the images (data.variant)"
            )
        if self.fpn_channels % 8:
            raise UserError(f"method.fpn_channels must be a multiple of 8 (group norm), got {self.fpn_channels}")
        if self.width < 4 or self.head_convs < 1:
            raise UserError(
                f"method.width must be at least 4 and method.head_convs at least 1, got {self.width} and "
                f"{self.head_convs}"
            )


def _conv(cin: int, cout: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class Body(nn.Module):
    """Backbone + feature pyramid; returns ``OrderedDict`` of P3, P4, P5 (strides 8, 16, 32)."""

    def __init__(self, width: int, out_channels: int):
        super().__init__()
        w = width
        self.stem = nn.Sequential(*_conv(3, w, 2))
        self.stage2 = nn.Sequential(*_conv(w, 2 * w, 2), *_conv(2 * w, 2 * w, 1))
        self.stage3 = nn.Sequential(*_conv(2 * w, 4 * w, 2), *_conv(4 * w, 4 * w, 1))
        self.stage4 = nn.Sequential(*_conv(4 * w, 8 * w, 2), *_conv(8 * w, 8 * w, 1))
        self.stage5 = nn.Sequential(*_conv(8 * w, 8 * w, 2), *_conv(8 * w, 8 * w, 1))
        self.fpn = FeaturePyramidNetwork([4 * w, 8 * w, 8 * w], out_channels)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        c3 = self.stage3(self.stage2(self.stem(x)))
        c4 = self.stage4(c3)
        c5 = self.stage5(c4)
        return self.fpn(OrderedDict([("p3", c3), ("p4", c4), ("p5", c5)]))


class Head(FCOSHead):
    """torchvision's FCOS head with group norm over ``groups`` groups (its default, 32, needs 32k channels)."""

    def __init__(self, channels: int, num_classes: int, convs: int, groups: int = 8):
        nn.Module.__init__(self)  # FCOSHead.__init__ would build the towers with GroupNorm(32)
        norm = partial(nn.GroupNorm, groups)
        self.box_coder = BoxLinearCoder(normalize_by_size=True)
        self.classification_head = FCOSClassificationHead(channels, 1, num_classes, convs, norm_layer=norm)
        self.regression_head = FCOSRegressionHead(channels, 1, convs, norm_layer=norm)


class Detector(FCOS):
    """torchvision FCOS over :class:`Body`; state-dict prefixes ``backbone.`` (the body) and ``head.``."""

    def __init__(self, spec: DetectorSpec):
        body = Body(spec.width, spec.fpn_channels)
        head = Head(spec.fpn_channels, spec.num_classes, spec.head_convs)
        anchors = AnchorGenerator(
            tuple((s,) for s in STRIDES), ((1.0,),) * len(STRIDES)
        )  # one point per location, size = stride
        super().__init__(
            body,
            spec.num_classes,
            min_size=spec.image_size,
            max_size=spec.image_size,
            image_mean=[MEAN] * 3,
            image_std=[STD] * 3,
            anchor_generator=anchors,
            head=head,
            score_thresh=spec.score_thresh,
            nms_thresh=spec.nms_thresh,
            detections_per_img=spec.detections_per_img,
            topk_candidates=200,
        )
        self.spec = spec

    # ---- the explicit pieces ----------------------------------------------
    @property
    def device(self) -> torch.device:
        """The device of the detector's parameters."""
        return next(self.parameters()).device

    def _image_list(self, images: torch.Tensor) -> ImageList:
        if images.ndim != 4 or images.shape[1] != 3 or images.shape[2] != images.shape[3]:
            raise ValueError(f"detector inputs must be N x 3 x S x S, got {tuple(images.shape)}")
        images = images.to(self.device)
        return ImageList((images - MEAN) / STD, [tuple(images.shape[-2:])] * images.shape[0])

    def maps(self, images: torch.Tensor) -> dict:
        """Pyramid features and head maps per level, each ``N x C x H x W``; plus what loss/detect need."""
        image_list = self._image_list(images)
        features = list(self.backbone(image_list.tensors).values())
        flat = self.head(features)
        sizes = [f.shape[-2:] for f in features]
        counts = [h * w for h, w in sizes]
        out = {"features": features, "flat": flat, "counts": counts, "image_list": image_list}
        for key in ("cls_logits", "bbox_regression", "bbox_ctrness"):
            out[key] = [
                part.reshape(part.shape[0], h, w, -1).permute(0, 3, 1, 2)
                for part, (h, w) in zip(flat[key].split(counts, dim=1), sizes)
            ]
        return out

    def loss(self, maps: dict, targets: list[dict]) -> dict[str, torch.Tensor]:
        """FCOS losses (classification focal, GIoU regression, centerness BCE) of ``maps`` against ``targets`` (moved
        to the maps' device)."""
        anchors = self.anchor_generator(maps["image_list"], maps["features"])
        device = anchors[0].device
        targets = [{key: value.to(device) for key, value in target.items()} for target in targets]
        return self.compute_loss(targets, maps["flat"], anchors, maps["counts"])

    @torch.no_grad()
    def detect(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Boxes (x1 y1 x2 y2 pixels), scores and labels per image, on the CPU (for the numpy
        matching of the evaluation); eval mode, no gradients."""
        was_training = self.training
        self.eval()
        try:
            maps = self.maps(images)
            anchors = self.anchor_generator(maps["image_list"], maps["features"])
            split = {k: list(v.split(maps["counts"], dim=1)) for k, v in maps["flat"].items()}
            split_anchors = [list(a.split(maps["counts"])) for a in anchors]
            found = self.postprocess_detections(split, split_anchors, maps["image_list"].image_sizes)
            return [{key: value.cpu() for key, value in det.items()} for det in found]
        finally:
            self.train(was_training)


def head_keys(model: nn.Module) -> set[str]:
    """State-dict keys of the detection head (FedRep's personal part)."""
    return {k for k in model.state_dict() if k.startswith("head.")}


def save_weights(model: nn.Module, path) -> Path:
    """Write the state dict as a ``.npz`` of named arrays (what ``weights=`` loads)."""
    path = Path(path)
    np.savez(path, **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
    return path


def load_weights(model: nn.Module, path) -> None:
    path = Path(str(path)).expanduser()
    if not path.is_file():
        raise UserError(
            f"detector weights file {str(path)!r} does not exist: give a .npz written by save_weights or a "
            "torch state_dict file"
        )
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                state = {k: torch.from_numpy(npz[k].copy()) for k in npz.files}
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state) if isinstance(state, dict) else state
        model.load_state_dict(state, strict=True)
    except (RuntimeError, ValueError, OSError, KeyError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"detector weights file {str(path)!r} does not fit this detector ({first[:200]}): use weights saved "
            "with the same width, fpn_channels, head_convs and classes"
        ) from None


def build_detector(spec: DetectorSpec, seed: Optional[int] = None) -> Detector:
    """A detector with seeded random initialization (``seed``), or the weights of ``spec.weights``; its
    convolution weights channels-last, as :func:`fedsim.models.build_model` holds a classifier's."""
    if seed is not None:
        torch.manual_seed(seed)
    model = Detector(spec)
    if spec.weights:
        load_weights(model, spec.weights)
    return model.to(memory_format=torch.channels_last)
