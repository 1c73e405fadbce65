"""A fully convolutional 1-D encoder for multivariate time series (C channels x L steps), the TEP benchmark's.

The architecture of Montesuma et al.'s TEP domain-adaptation benchmark (``eddardd/tep-domain-adaptation``,
``benchmark/deep_learning/fully_convolutional.py``, ``FullyConvolutionalEncoder`` with ``instance_norm=True`` as
their notebooks build it): three convolutions over time with "same" padding, kernel sizes 9, 5 and 3, 128, 256 and
128 channels, each followed by instance normalization (no affine parameters, no running statistics) and a ReLU,
then the mean over time. The last convolution's channels are the features the head classifies: ``hidden``
(default 128, the authors'); the head is one linear layer, as theirs. 302 K parameters for 34 channels.
"""

from __future__ import annotations

from torch import nn

from fedsim.errors import UserError
from fedsim.models.classifier import Classifier
from fedsim.registry import MODELS


class TimeMean(nn.Module):
    """The mean over the last (time) axis: (N, C, L) -> (N, C)."""

    def forward(self, x):
        return x.mean(dim=-1)


def conv_block(inputs: int, outputs: int, kernel: int) -> list[nn.Module]:
    return [nn.Conv1d(inputs, outputs, kernel_size=kernel, padding="same"), nn.InstanceNorm1d(outputs), nn.ReLU()]


@MODELS.register("cnn1d")
def fully_convolutional_1d(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> Classifier:
    if len(input_shape) != 2:
        raise UserError(
            f"model cnn1d takes time series of shape (channels, length), got inputs of shape {tuple(input_shape)}"
        )
    channels = input_shape[0]
    encoder = nn.Sequential(
        *conv_block(channels, 128, 9), *conv_block(128, 256, 5), *conv_block(256, hidden, 3), TimeMean()
    )
    return Classifier(encoder, nn.Linear(hidden, num_classes))
