"""LeNet-5 (LeCun et al. 1998), the model of the ``fedavg-lenet-10`` overhead job."""

from __future__ import annotations

from torch import nn

from fedsim.models.classifier import Classifier
from fedsim.registry import MODELS


@MODELS.register("lenet5")
def lenet5(input_shape: tuple[int, ...], num_classes: int, hidden: int = 84) -> Classifier:
    channels, height, width = input_shape
    encoder = nn.Sequential(
        nn.Conv2d(channels, 6, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * ((height // 2 - 4) // 2) * ((width // 2 - 4) // 2), 120),
        nn.ReLU(),
        nn.Linear(120, hidden),
        nn.ReLU(),
    )
    return Classifier(encoder, nn.Linear(hidden, num_classes))
