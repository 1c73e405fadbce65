"""torchvision's ResNets (He et al., CVPR 2016) as fedsim models: ``model.name=resnet18|resnet50|resnet101``.

The domain adaptation papers on Office-Caltech10 (FADA's rows among them), Office-31, Office-Home and DomainNet start
from an ImageNet-pretrained ResNet-50 or -101 at 224 x 224 and fine-tune it. Their options (:class:`Options`,
``model.<option>`` keys):

* ``model.weights``: a file holding a state dict of the architecture (``torch.save(model.state_dict(), PATH)``;
  torchvision's own ``resnet50-0676ba61.pth`` is one, its ImageNet classifier ``fc.*`` is left out), or
  ``torchvision``: torchvision's IMAGENET1K_V1 file in torchvision's own cache (``$TORCH_HOME/hub/checkpoints``).
  Nothing is ever downloaded: a file that is not there is one line naming it. Without it the backbone keeps
  random weights (a frozen one from a fixed seed, 0, so that its features do not depend on ``run.seed``).
* ``model.backbone``: ``frozen`` (the default, what two CPU cores can run: each client passes its images through
  the backbone once, in eval mode, and caches the features, :mod:`fedsim.models.features`; the model the methods
  train and exchange is the head alone, on those features) or ``finetune`` (the whole network trains and travels,
  batch norms in training mode: what the papers do; about 11 M weights for ResNet-18, 24 M for ResNet-50).
* ``model.head``: ``mlp`` (the default: one hidden layer of ``model.hidden`` units with a ReLU, the encoder the
  alignment methods align, then the linear classifier) or ``linear`` (the classifier on the backbone's features;
  the encoder has no weights then, so methods that align features need ``mlp``).

Inputs are images in [0, 1] (C x H x W, one or three channels): :class:`ImageNetInput`, the network's first layer,
repeats a single channel three times and standardizes with ImageNet's mean and standard deviation, for a frozen
backbone while the features are computed, for a fine-tuned one in every forward pass; so a fine-tuned ResNet wants
``data.normalization=none`` (checked before a run starts). Images are not resized here: the images benchmark
decodes them at ``data.image_size`` (224 for the papers' setting). torchvision is the optional ``detection`` extra;
it is imported when a ResNet is built, so listing the models works without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Mapping, Optional
from urllib.parse import urlparse

import torch
from torch import nn

from fedsim.data.scenario import resolve_normalization
from fedsim.errors import MissingDependency, UserError, first_line, typed_first_line
from fedsim.models import declares
from fedsim.models.classifier import Classifier
from fedsim.models.features import FrozenFeatures
from fedsim.registry import MODELS

log = logging.getLogger(__name__)

ARCHITECTURES: dict[str, int] = {"resnet18": 512, "resnet50": 2048, "resnet101": 2048}
"""Architecture -> the width of its features (the output of its global average pool)."""
TORCHVISION = "torchvision"
"""The ``model.weights`` value that names torchvision's own cache."""
TORCHVISION_WEIGHTS = "IMAGENET1K_V1"
"""The torchvision weights ``model.weights=torchvision`` loads: torchvision's original ImageNet weights, the ones the
domain adaptation papers started from."""
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RANDOM_SEED = 0
"""The seed of a frozen backbone's random weights (no ``model.weights``)."""
BACKBONES: tuple[str, ...] = ("frozen", "finetune")
"""The values of ``model.backbone``, the default first."""
HEADS: tuple[str, ...] = ("mlp", "linear")
"""The values of ``model.head``, the default first."""
INSTALL = "pip install -c constraints.txt -e '.[detection]'"
SHOWN = 3  # state-dict keys named in an error


def torchvision_models():
    """``torchvision.models``, or one line saying which extra installs it."""
    try:
        import torchvision.models as models
    except (ImportError, RuntimeError) as exc:  # not installed, or built for another torch
        raise MissingDependency(
            f"the resnet models need a working torchvision ({typed_first_line(exc)}): {INSTALL}"
        ) from None
    return models


@dataclasses.dataclass(frozen=True)
class Options:
    """A ResNet's own ``model.<option>`` keys (see the module docstring)."""

    weights: Optional[str] = None
    """The backbone's weights: a file holding a state dict of the architecture, or "torchvision" (its cache); None:
    random weights."""
    backbone: str = BACKBONES[0]
    """"frozen" (each client computes the backbone's features once and caches them, the head trains on them) or
    "finetune" (the whole network trains, as the papers do)."""
    head: str = HEADS[0]
    """"mlp" (one hidden layer of ``model.hidden`` units, then the linear classifier) or "linear" (the classifier
    on the backbone's features)."""

    def __post_init__(self):
        for key, choices in (("backbone", BACKBONES), ("head", HEADS)):
            if getattr(self, key) not in choices:
                raise UserError(
                    f"model.{key}={getattr(self, key)} is not one of {', '.join(choices)}: choose one of them"
                )
        if self.weights is not None and not str(self.weights).strip():
            raise UserError("model.weights is empty: name a state-dict file of the ResNet, or torchvision")


class ImageNetInput(nn.Module):
    """Images in [0, 1] -> ImageNet's standardization; a one-channel image is repeated to three channels."""

    def __init__(self):
        super().__init__()
        # not in the state dict: constants, never exchanged or averaged
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x):
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        return (x - self.mean) / self.std


def trunk(arch: str, device: Optional[str] = None) -> nn.Module:
    """torchvision's ``arch`` with random weights (never downloaded), its ImageNet classifier replaced by the
    identity: N x 3 x H x W -> N x width features."""
    models = torchvision_models()
    with torch.device(device) if device else contextlib.nullcontext():
        net = getattr(models, arch)(weights=None)
    net.fc = nn.Identity()
    return net


# ---------------------------------------------------------------------------------------------------- weights files


def torchvision_file(arch: str) -> Path:
    """Where torchvision keeps ``arch``'s IMAGENET1K_V1 weights; one line when the file is not there."""
    url = getattr(torchvision_models().get_model_weights(arch), TORCHVISION_WEIGHTS).url
    path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)
    if not path.is_file():
        raise UserError(
            f"model.weights=torchvision: {arch}'s ImageNet weights ({TORCHVISION_WEIGHTS}) are not in torchvision's "
            f"cache: {path} does not exist and nothing is downloaded; put that file there (TORCH_HOME sets the "
            "folder) or name a weights file with model.weights=PATH"
        )
    return path


def weights_file(arch: str, setting: Optional[str]) -> Optional[Path]:
    """The file ``model.weights`` names for ``arch`` (None: random weights); one line for a missing file."""
    if setting is None:
        return None
    if setting == TORCHVISION:
        return torchvision_file(arch)
    path = Path(setting).expanduser()
    if not path.is_file():
        raise UserError(
            f"model.weights={setting}: no such file; name a state dict of {arch} (torch.save(model.state_dict(), "
            "PATH)) or model.weights=torchvision for the file in torchvision's cache"
        )
    return path


@functools.lru_cache(maxsize=8)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes (remembered per path, size and modification time)."""
    stat = path.stat()
    return _file_digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a state-dict file, ``fc.*`` (an ImageNet classifier) left out; one line for another file."""
    how = "save one with torch.save(model.state_dict(), PATH)"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, truncated, or pickled objects other than tensors
        raise UserError(
            f"model.weights={path} cannot be read as a torch state dict ({first_line(exc)[:200]}): {how}"
        ) from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"model.weights={path} holds a {type(state).__name__}, not a state dict of tensors: {how}")
    return {str(k): v for k, v in state.items() if not str(k).startswith("fc.")}


def mismatch(arch: str, state: Mapping[str, torch.Tensor]) -> str:
    """What keeps ``state`` from being ``arch``'s trunk ("" when it fits): missing, unexpected and misshapen keys.
    A missing batch-norm counter (``num_batches_tracked``, absent from old files) does not count."""
    expected = trunk(arch, device="meta").state_dict()
    missing = [k for k in expected if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in expected]
    shapes = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    parts = [
        f"{len(keys)} {what} ({', '.join(keys[:SHOWN])}{', ...' if len(keys) > SHOWN else ''})"
        for what, keys in (("missing", missing), ("unexpected", unexpected), ("of another shape", shapes))
        if keys
    ]
    return "; ".join(parts)


def checked_state(arch: str, path: Path) -> dict:
    """The state dict of ``path``, checked against ``arch`` without building it; one line when it is of another
    architecture."""
    state = read_state(path)
    problem = mismatch(arch, state)
    if problem:
        fits = [other for other in ARCHITECTURES if other != arch and not mismatch(other, state)]
        hint = f"it is a state dict of {fits[0]}: set model.name={fits[0]}" if fits else f"give a state dict of {arch}"
        raise UserError(f"model.weights={path} does not fit {arch}: {problem}; {hint}")
    return state


def load_trunk(arch: str, path: Optional[Path]) -> nn.Module:
    """``arch``'s trunk with the weights of ``path`` (None: as built); one line when the file is not of ``arch``."""
    net = trunk(arch)
    if path is None:
        return net
    state = checked_state(arch, path)
    current = net.state_dict()
    net.load_state_dict({**{k: v for k, v in current.items() if k.endswith("num_batches_tracked")}, **state})
    return net


def frozen_backbone(arch: str, setting: Optional[str], device: str = "cpu") -> nn.Module:
    """ImageNet input + ``arch``'s trunk with the weights of ``model.weights`` (random from :data:`RANDOM_SEED`
    without), in eval mode, no gradients: images in [0, 1] -> features."""
    path = weights_file(arch, setting)
    if path is None:
        log.warning(
            "model.weights is not set: the frozen %s keeps random weights (seed %d); give model.weights for ImageNet's",
            arch,
            RANDOM_SEED,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(RANDOM_SEED)
            net = load_trunk(arch, None)
    else:
        net = load_trunk(arch, path)
    backbone = nn.Sequential(ImageNetInput(), net).to(device).eval()
    for parameter in backbone.parameters():
        parameter.requires_grad_(False)
    return backbone


# ---------------------------------------------------------------------------------------------------- the models


def image_shape_error(arch: str, input_shape: tuple[int, ...]) -> Optional[str]:
    """Why ``arch`` cannot take inputs of ``input_shape`` (None: it can)."""
    if len(input_shape) == 3 and input_shape[0] in (1, 3):
        return None
    return (
        f"model.name={arch} takes images (1 or 3 x H x W), not inputs of shape {tuple(input_shape)}: choose an image "
        "benchmark, or model.name=mlp for feature vectors"
    )


def build(arch: str, input_shape: tuple[int, ...], num_classes: int, hidden: int, options: Options) -> Classifier:
    """The Classifier of ``arch``: with a frozen backbone the head alone, on the features (``input_shape`` is
    ``(width,)``); fine-tuned, ImageNet input + trunk (+ the hidden layer) as the encoder, then the classifier."""
    width = ARCHITECTURES[arch]
    bottleneck = [nn.Linear(width, hidden), nn.ReLU()] if options.head == "mlp" else []
    if options.backbone == "frozen":
        if tuple(input_shape) != (width,):
            raise UserError(
                f"model.name={arch} with model.backbone=frozen trains a head on the backbone's {width} features, "
                f"which each client computes (fedsim run, fedsim.run); inputs of shape {tuple(input_shape)} are not "
                "those: run through fedsim.api, or set model.backbone=finetune"
            )
        encoder: nn.Module = nn.Sequential(*bottleneck) if bottleneck else nn.Identity()
    else:
        problem = image_shape_error(arch, tuple(input_shape))
        if problem:
            raise UserError(problem)
        encoder = nn.Sequential(ImageNetInput(), load_trunk(arch, weights_file(arch, options.weights)), *bottleneck)
    return Classifier(encoder, nn.Linear(hidden if options.head == "mlp" else width, num_classes))


@dataclasses.dataclass(frozen=True)
class ResNetFeatures(FrozenFeatures):
    """A ResNet's inputs: with ``model.backbone=frozen`` each client caches the backbone's features
    (:mod:`fedsim.models.features`); checked before a run starts either way."""

    arch: str

    def frozen(self, options: Options) -> bool:
        return options.backbone == "frozen"

    def width(self, options: Options) -> int:
        return ARCHITECTURES[self.arch]

    def input_problem(self, input_shape: tuple[int, ...]) -> Optional[str]:
        return image_shape_error(self.arch, input_shape)

    def check(self, config, federation) -> None:
        """A fine-tuned backbone standardizes itself (``data.normalization`` must be "none"); ``model.weights``
        names a file of the architecture."""
        options = config.model.options
        normalization = resolve_normalization(config.data)
        if not self.frozen(options) and normalization != "none":
            raise UserError(
                f"model.backbone=finetune standardizes images in [0, 1] with ImageNet's mean and std inside "
                f"{self.arch}, so data.normalization={normalization} would standardize them twice: set "
                "data.normalization=none"
            )
        path = weights_file(self.arch, options.weights)
        if path is not None:
            checked_state(self.arch, path)  # one line now, before anything starts, for a file of another architecture

    def weights_key(self, options: Options) -> str:
        path = weights_file(self.arch, options.weights)
        return f"random:{RANDOM_SEED}:{torch.__version__}" if path is None else f"sha256:{file_digest(path)}"

    def backbone(self, options: Options, device: str) -> nn.Module:
        return frozen_backbone(self.arch, options.weights, device)


@MODELS.register("resnet18")
@declares(Options, ResNetFeatures("resnet18"))
def resnet18(input_shape, num_classes, hidden=128, options: Options = Options()) -> Classifier:
    """ResNet-18 from torchvision (512 features), frozen (a head on cached features) or fine-tuned; model.weights"""
    return build("resnet18", input_shape, num_classes, hidden, options)


@MODELS.register("resnet50")
@declares(Options, ResNetFeatures("resnet50"))
def resnet50(input_shape, num_classes, hidden=128, options: Options = Options()) -> Classifier:
    """ResNet-50 from torchvision (2048 features), frozen (a head on cached features) or fine-tuned; model.weights"""
    return build("resnet50", input_shape, num_classes, hidden, options)


@MODELS.register("resnet101")
@declares(Options, ResNetFeatures("resnet101"))
def resnet101(input_shape, num_classes, hidden=128, options: Options = Options()) -> Classifier:
    """ResNet-101 from torchvision (2048 features), frozen (a head on cached features) or fine-tuned; model.weights"""
    return build("resnet101", input_shape, num_classes, hidden, options)
