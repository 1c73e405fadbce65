"""Models with an explicit encoder / head split (no forward hooks).

``build_model(model_config, input_shape, num_classes)`` picks a registered
model; ``"auto"`` chooses ``cnn`` for C x H x W inputs and ``mlp`` for vectors. Model
files are imported on demand by the registry (the detector, which needs
torchvision, only by the detection methods).

Models of images hold their convolution weights channels-last (``torch.channels_last``), a layout the convolutions,
batch norms and poolings after them keep: on this project's CPUs a local epoch takes 0.87-0.88x the time of torch's
default layout for LeNet-5 and 0.71-0.75x for the small CNN, an evaluation pass 0.48-0.66x
(``python -m tools.benchmarks.layout``; docs/performance.md). The two layouts compute the same sums in
another order. Weights leave a model C-ordered all the same (:func:`fedsim.methods.common.training.model_to_numpy`
copies them) and keep the model's layout when loaded back.
"""

from __future__ import annotations

import torch

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
    model = factory(input_shape=tuple(input_shape), num_classes=num_classes, hidden=model_config.hidden)
    return model.to(memory_format=torch.channels_last) if len(input_shape) == 3 else model


__all__ = ["Classifier", "build_model"]
