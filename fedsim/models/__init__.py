"""Models with an explicit encoder / head split (no forward hooks).

``build_model(model_config, input_shape, num_classes)`` picks a registered
model; ``"auto"`` chooses ``cnn`` for C x H x W inputs and ``mlp`` for vectors. Model
files are imported on demand by the registry (the detector, which needs
torchvision, only by the detection methods).
"""

from __future__ import annotations

from fedsim.errors import UserError
from fedsim.models.classifier import Classifier
from fedsim.registry import MODELS


def build_model(model_config, input_shape: tuple[int, ...], num_classes: int) -> Classifier:
    name = model_config.name
    if name == "auto":
        if len(input_shape) == 3:
            name = "cnn"
        elif len(input_shape) == 1:
            name = "mlp"
        else:
            raise UserError(
                f"no model for inputs of shape {tuple(input_shape)}: give N x D features or N x C x H x W images"
            )
    factory = MODELS.get(name)
    return factory(input_shape=tuple(input_shape), num_classes=num_classes, hidden=model_config.hidden)


__all__ = ["Classifier", "build_model"]
