"""A two-layer perceptron for feature vectors (Office-Caltech DeCAF features, TEP sensors, ...)."""

from __future__ import annotations

from torch import nn

from fedsim.models.classifier import Classifier
from fedsim.registry import MODELS


@MODELS.register("mlp")
def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> Classifier:
    (dim,) = input_shape
    encoder = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
    return Classifier(encoder, nn.Linear(hidden, num_classes))
