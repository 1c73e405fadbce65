"""A small CNN for C x H x W images (two 5x5 conv blocks with batch norm, sized for 2 CPU cores)."""

from __future__ import annotations

from torch import nn

from fedsim.models.classifier import Classifier
from fedsim.registry import MODELS


@MODELS.register("cnn")
def small_cnn(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> Classifier:
    channels, height, width = input_shape
    encoder = nn.Sequential(
        nn.Conv2d(channels, 16, kernel_size=5, padding=2),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=5, padding=2),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (height // 4) * (width // 4), hidden),
        nn.ReLU(),
    )
    return Classifier(encoder, nn.Linear(hidden, num_classes))
