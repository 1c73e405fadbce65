"""Models with an explicit encoder / head split (no forward hooks).

``build_model(model_config, input_shape, num_classes)`` picks a registered
model; ``"auto"`` chooses ``cnn`` for C x H x W inputs, ``cnn1d`` for C x L time series and ``mlp`` for vectors. Model
files are imported on demand by the registry (the detector, which needs
torchvision, only by the detection methods).

Models of images hold their convolution weights channels-last (``torch.channels_last``), a layout the convolutions,
batch norms and poolings after them keep and the CPU kernels run faster than torch's default one
(``python -m tools.benchmarks.layout`` compares the two). The two layouts compute the same sums in another order.
Weights leave a model C-ordered all the same (the methods send numpy copies of its state dict) and keep the model's
layout when loaded back.

A model function that declares a parameter named after one of :data:`SETTINGS` gets that ``model.<setting>`` too
(the ResNets of :mod:`fedsim.models.resnet` take ``weights``, ``backbone`` and ``head``).
"""

from __future__ import annotations

import inspect

import torch

from fedsim.errors import UserError
from fedsim.models.classifier import Classifier
from fedsim.registry import MODELS

SETTINGS = ("weights", "backbone", "head")
"""``model`` settings passed to the model functions that declare a parameter of that name."""


def build_model(model_config, input_shape: tuple[int, ...], num_classes: int) -> Classifier:
    name = model_config.name
    if name == "auto":
        if len(input_shape) == 3:
            name = "cnn"
        elif len(input_shape) == 2:
            name = "cnn1d"
        elif len(input_shape) == 1:
            name = "mlp"
        else:
            raise UserError(
                f"no model for inputs of shape {tuple(input_shape)}: give N x D features, N x C x L time series or "
                "N x C x H x W images"
            )
    factory = MODELS.get(name)
    declared = inspect.signature(factory).parameters
    settings = {key: getattr(model_config, key, None) for key in SETTINGS if key in declared}
    plugin = MODELS.targets.get(name)
    try:
        model = factory(input_shape=tuple(input_shape), num_classes=num_classes, hidden=model_config.hidden, **settings)
    except Exception as exc:
        if plugin:  # the user's own code: its traceback, with a line naming the plugin
            exc.add_note(f"raised by the model plugin {name!r} ({plugin})")
        raise
    if not isinstance(model, Classifier):
        raise UserError(
            f"model {name!r} returned an object of type {type(model).__name__}, not a fedsim.models.Classifier: "
            "return Classifier(encoder, head) (fedsim.models.classifier)"
        )
    return model.to(memory_format=torch.channels_last) if len(input_shape) == 3 else model


__all__ = ["Classifier", "build_model"]
