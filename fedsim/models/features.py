"""Frozen features, computed by each client from its own inputs and cached on its own disk.

A model whose first part does not train (a ResNet's backbone with ``model.backbone=frozen``,
:mod:`fedsim.models.resnet`) declares a :class:`FrozenFeatures` as its inputs (:func:`fedsim.models.declares`): each
client passes its training and test images through that part once and the methods train and exchange the rest
alone, on those features: the same head a CPU trains in seconds whatever the backbone. Its two hooks:

* :meth:`FrozenFeatures.federation`, in the driver before anything runs or is written
  (:func:`fedsim.api.checked_federation`): the model's one-line checks of the inputs and its options, then, when the
  part is frozen, the federation whose inputs are the features (``input_shape == (width,)``), so every model and
  method is built for them.
* :meth:`FrozenFeatures.client_data`, in the process that hosts the client, right after its data is built
  (:class:`fedsim.runtime.client_host.ClientHost`, through :func:`client_features`): the client's images replaced by
  their features, read from the cache or computed and cached. Labels, the split and the role stay as they are; the
  features are computed where the images are and stay there as the images did (a method sends what it sent before,
  computed on features).

The cache: ``<data.cache_dir>/features-v1-<model>-<benchmark>-<domain>-client<id>-<H>px-<digest>.npz``, arrays
``train``, ``test`` and a source's held-out ``validation`` (N x width, float32), written atomically with a checksum
inside (:mod:`fedsim.data.cache`).
The digest is a sha256 over the client's images (training then test: they fix the benchmark, the domain, the
client's split and the image size), the weights (:meth:`FrozenFeatures.weights_key`), the model's name, the device
kind (cpu or cuda compute slightly different sums) and :data:`VERSION`: another weights file, image size or split
is computed again, the same ones never. The features are deterministic: eval mode, no gradients, the images in their
order in batches of :data:`BATCH`, with the client's torch threads (the host sets them), so the local and the Ray
backend compute the same bits.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import re
import time
from typing import Optional

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ClientData
from fedsim.data.cache import checksum, load_arrays, save_arrays
from fedsim.data.scenario import Federation
from fedsim.errors import UserError
from fedsim.models import ModelInputs, model_inputs

log = logging.getLogger(__name__)

VERSION = "v1"  # bump whenever the features of the same images and weights change, so old caches are not reused
BATCH = 32  # images per forward pass


class FrozenFeatures(ModelInputs):
    """The inputs of a model whose first part, when its options freeze it, each client computes once and caches:
    a subclass says which options freeze it, how wide its features are and how to build it."""

    def frozen(self, options) -> bool:
        """Whether the model's ``options`` freeze the part (its clients then train on cached features)."""
        raise NotImplementedError

    def width(self, options) -> int:
        """The width of the frozen part's features."""
        raise NotImplementedError

    def input_problem(self, input_shape: tuple[int, ...]) -> Optional[str]:
        """Why the model cannot take inputs of ``input_shape`` (None: it can)."""
        return None

    def check(self, config, federation: Federation) -> None:
        """The model's one-line checks of the run's settings, in the driver before anything runs."""

    def weights_key(self, options) -> str:
        """What the frozen part's weights are, for the cache key (a file's sha256, random weights' seed)."""
        raise NotImplementedError

    def backbone(self, options, device: str) -> nn.Module:
        """The frozen part, in eval mode, without gradients: inputs -> N x width features."""
        raise NotImplementedError

    def federation(self, config, federation: Federation) -> Federation:
        problem = self.input_problem(tuple(federation.input_shape))
        if problem:
            raise UserError(problem)
        self.check(config, federation)
        if self.frozen(config.model.options):
            return dataclasses.replace(federation, input_shape=(self.width(config.model.options),))
        return federation

    def client_data(self, config, data: ClientData, device: str = "cpu") -> ClientData:
        options = config.model.options
        if not self.frozen(options):
            return data
        width = self.width(options)
        images = {"train": data.train.x, "test": data.test.x, **_validation_images(data)}
        for x in images.values():
            problem = self.input_problem(tuple(x.shape[1:]))
            if problem:
                raise UserError(problem)
        name = cache_name(config, data, device, self.weights_key(options))
        arrays = load_arrays(config.data.cache_dir, name)
        shapes = {part: (len(x), width) for part, x in images.items()}
        if arrays is None or {k: v.shape for k, v in arrays.items()} != shapes:
            start = time.perf_counter()
            backbone = _backbone(self, options, self.weights_key(options), device)
            arrays = {part: extract(backbone, x, device) for part, x in images.items()}
            saved = save_arrays(config.data.cache_dir, name, arrays)
            log.info(
                "features: client %d (%s): %d + %d images through %s in %.1fs%s",
                data.client_id,
                data.domain,
                len(data.train),
                len(data.test),
                config.model.name,
                time.perf_counter() - start,
                f", cached as {saved}" if saved else "",
            )
        train = dataclasses.replace(data.train, x=arrays["train"].reshape(shapes["train"]))
        test = dataclasses.replace(data.test, x=arrays["test"].reshape(shapes["test"]))
        validation = data.validation
        if validation is not None:
            validation = dataclasses.replace(validation, x=arrays["validation"].reshape(shapes["validation"]))
        return dataclasses.replace(data, train=train, test=test, validation=validation)


def model_federation(config, federation: Federation) -> Federation:
    """The federation the configured model is built for, after its one-line checks (:class:`ModelInputs`)."""
    return model_inputs(config.model).federation(config, federation)


def client_features(config, data: ClientData, device: str = "cpu") -> ClientData:
    """``data`` as the configured model takes it: a frozen part's features in place of its images (unchanged for a
    model that declares no :class:`ModelInputs`)."""
    return model_inputs(config.model).client_data(config, data, device)


@functools.lru_cache(maxsize=1)
def _backbone(inputs: FrozenFeatures, options, weights: str, device: str) -> nn.Module:
    """One frozen part per process, kept for the next client it hosts (``weights``, the file's digest, tells a file
    rewritten in place from the one loaded)."""
    return inputs.backbone(options, device).to(memory_format=torch.channels_last)


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


def cache_name(config, data: ClientData, device: str, weights: str) -> str:
    """The cache file's name for one client's features (see the module docstring); ``weights``: the frozen part's
    :meth:`FrozenFeatures.weights_key`."""
    model = config.model
    kind = torch.device(device).type
    images = checksum({"train": data.train.x, "test": data.test.x, **_validation_images(data)})
    key = "\0".join([VERSION, model.name, weights, kind, images])
    digest = hashlib.sha256(key.encode()).hexdigest()
    safe = [re.sub(r"[^A-Za-z0-9_]+", "_", str(part))[:40] for part in (config.data.benchmark, data.domain)]
    size = data.train.x.shape[-1] if data.train.x.ndim == 4 else 0
    return f"features-{VERSION}-{model.name}-{safe[0]}-{safe[1]}-client{data.client_id}-{size}px-{digest[:20]}"


def _validation_images(data: ClientData) -> dict:
    """A source's validation images (``data.validation_fraction``) by name, or nothing."""
    return {} if data.validation is None else {"validation": data.validation.x}
