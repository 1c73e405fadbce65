"""Frozen-backbone features, computed by each client from its own images and cached on its own disk.

With ``model.backbone=frozen`` (the ResNets' default, :mod:`fedsim.models.resnet`) nothing in the backbone trains,
so each client passes its training and test images through it once and the methods train and exchange the head
alone, on those features: the same head a CPU trains in seconds whatever the backbone. Two hooks:

* :func:`backbone_federation`, in the driver before anything runs or is written (:func:`fedsim.api.checked_federation`):
  checks that the inputs are images, that ``model.weights`` names a file of the architecture, and, for a fine-tuned
  backbone, that ``data.normalization`` is "none" (the network standardizes with ImageNet's statistics itself);
  with a frozen backbone it returns the federation whose inputs are the features (``input_shape == (width,)``), so
  every model and method is built for them.
* :func:`client_features`, in the process that hosts the client, right after its data is built
  (:class:`fedsim.runtime.client_host.ClientHost`): the client's images replaced by their features, read from the
  cache or computed and cached. Labels, the split and the role stay as they are; the features are computed where
  the images are and stay there as the images did (a method sends what it sent before, computed on features).

The cache: ``<data.cache_dir>/features-v1-<arch>-<benchmark>-<domain>-client<id>-<H>px-<digest>.npz``, arrays
``train``, ``test`` and a source's held-out ``validation`` (N x width, float32), written atomically with a checksum
inside (:mod:`fedsim.data.cache`).
The digest is a sha256 over the client's images (training then test: they fix the benchmark, the domain, the
client's split and the image size), the weights (the sha256 of the file's bytes, or the seed of random weights and
the torch version), the architecture, the device kind (cpu or cuda compute slightly different sums) and
:data:`VERSION`: another weights file, image size or split is computed again, the same ones never. The features
are deterministic: eval mode, no gradients, the images in their order in batches of :data:`BATCH`, with the client's
torch threads (the host sets them), so the local and the Ray backend compute the same bits.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import re
import time

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ClientData
from fedsim.data.cache import checksum, load_arrays, save_arrays
from fedsim.data.scenario import Federation, resolve_normalization
from fedsim.errors import UserError
from fedsim.models.resnet import (
    ARCHITECTURES,
    RANDOM_SEED,
    checked_state,
    file_digest,
    frozen_backbone,
    image_shape_error,
    weights_file,
)

log = logging.getLogger(__name__)

VERSION = "v1"  # bump whenever the features of the same images and weights change, so old caches are not reused
BATCH = 32  # images per forward pass


def uses_frozen_backbone(model_config) -> bool:
    """Whether the model is a ResNet whose backbone is frozen (its clients train on cached features)."""
    return model_config.name in ARCHITECTURES and model_config.backbone == "frozen"


def weights_key(arch: str, setting) -> str:
    """What the weights of ``model.weights`` are, for the cache key: the file's sha256, or random weights' seed."""
    path = weights_file(arch, setting)
    return f"random:{RANDOM_SEED}:{torch.__version__}" if path is None else f"sha256:{file_digest(path)}"


def backbone_federation(config, federation: Federation) -> Federation:
    """The federation a ResNet run uses, after one-line checks of its settings (see the module docstring)."""
    model = config.model
    arch = model.name
    problem = image_shape_error(arch, tuple(federation.input_shape))
    if problem:
        raise UserError(problem)
    frozen = uses_frozen_backbone(model)
    if not frozen and resolve_normalization(config.data) != "none":
        raise UserError(
            f"model.backbone=finetune standardizes images in [0, 1] with ImageNet's mean and std inside {arch}, so "
            f"data.normalization={resolve_normalization(config.data)} would standardize them twice: set "
            "data.normalization=none"
        )
    path = weights_file(arch, model.weights)
    if path is not None:
        checked_state(arch, path)  # one line now, before anything starts, for a file of another architecture
    if frozen:
        return dataclasses.replace(federation, input_shape=(ARCHITECTURES[arch],))
    return federation


@functools.lru_cache(maxsize=1)
def _backbone(arch: str, setting, weights: str, device: str) -> nn.Module:
    """One frozen backbone per process, kept for the next client it hosts (``weights``, the file's digest, tells a
    file rewritten in place from the one loaded)."""
    return frozen_backbone(arch, setting, device).to(memory_format=torch.channels_last)


def extract(backbone: nn.Module, images: np.ndarray, device: str) -> np.ndarray:
    """The features of ``images`` (N x C x H x W in [0, 1]), computed in batches of :data:`BATCH`, in order."""
    width = None
    parts = []
    with torch.inference_mode():
        for start in range(0, len(images), BATCH):
            batch = torch.from_numpy(np.ascontiguousarray(images[start : start + BATCH], dtype=np.float32))
            out = backbone(batch.to(device)).float().cpu().numpy()
            width = out.shape[1]
            parts.append(out)
    if not parts:
        return np.zeros((0, width or 0), dtype=np.float32)
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def cache_name(config, data: ClientData, device: str) -> str:
    """The cache file's name for one client's features (see the module docstring)."""
    model = config.model
    kind = torch.device(device).type
    images = checksum({"train": data.train.x, "test": data.test.x, **_validation_images(data)})
    key = "\0".join([VERSION, model.name, weights_key(model.name, model.weights), kind, images])
    digest = hashlib.sha256(key.encode()).hexdigest()
    safe = [re.sub(r"[^A-Za-z0-9_]+", "_", str(part))[:40] for part in (config.data.benchmark, data.domain)]
    size = data.train.x.shape[-1] if data.train.x.ndim == 4 else 0
    return f"features-{VERSION}-{model.name}-{safe[0]}-{safe[1]}-client{data.client_id}-{size}px-{digest[:20]}"


def _validation_images(data: ClientData) -> dict:
    """A source's validation images (``data.validation_fraction``) by name, or nothing."""
    return {} if data.validation is None else {"validation": data.validation.x}


def client_features(config, data: ClientData, device: str = "cpu") -> ClientData:
    """``data`` with its images replaced by the frozen backbone's features (unchanged for any other model)."""
    if not uses_frozen_backbone(config.model):
        return data
    arch = config.model.name
    width = ARCHITECTURES[arch]
    images = {"train": data.train.x, "test": data.test.x, **_validation_images(data)}
    for x in images.values():
        problem = image_shape_error(arch, tuple(x.shape[1:]))
        if problem:
            raise UserError(problem)
    name = cache_name(config, data, device)
    arrays = load_arrays(config.data.cache_dir, name)
    shapes = {part: (len(x), width) for part, x in images.items()}
    if arrays is None or {k: v.shape for k, v in arrays.items()} != shapes:
        start = time.perf_counter()
        backbone = _backbone(arch, config.model.weights, weights_key(arch, config.model.weights), device)
        arrays = {part: extract(backbone, x, device) for part, x in images.items()}
        saved = save_arrays(config.data.cache_dir, name, arrays)
        log.info(
            "features: client %d (%s): %d + %d images through %s in %.1fs%s",
            data.client_id,
            data.domain,
            len(data.train),
            len(data.test),
            arch,
            time.perf_counter() - start,
            f", cached as {saved}" if saved else "",
        )
    train = dataclasses.replace(data.train, x=arrays["train"].reshape(shapes["train"]))
    test = dataclasses.replace(data.test, x=arrays["test"].reshape(shapes["test"]))
    validation = data.validation
    if validation is not None:
        validation = dataclasses.replace(validation, x=arrays["validation"].reshape(shapes["validation"]))
    return dataclasses.replace(data, train=train, test=test, validation=validation)
