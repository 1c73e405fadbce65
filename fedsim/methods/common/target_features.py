"""The target's encoded features, as FADA and the feature-alignment methods (FedDANN, FedMMD) send them to the
sources: a seeded random subset of the target's inputs through the global encoder, and the payload key they travel
under."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedsim.methods.common.training import CHUNK, encode_in_chunks
from fedsim.seeding import numpy_rng

TARGET_FEATURES = "target_features"  # payload key of the target features in the sources' fit instruction


@torch.no_grad()
def encode_subset(
    model: nn.Module,
    x: np.ndarray,
    count: int,
    seed: int,
    device: torch.device,
    chunk: int = CHUNK,
    batch_statistics: bool = False,
) -> np.ndarray:
    """Encoder features of a seeded random subset of ``count`` rows of ``x`` (all rows if fewer).

    ``batch_statistics``: normalize by the statistics of each ``chunk`` of target
    inputs (train-mode batch norm), as the sources' features are by their own
    batches; the running statistics this updates are discarded (the weights are
    reloaded before every operation). Otherwise eval mode (running statistics).
    """
    count = min(int(count), len(x))
    index = np.sort(numpy_rng(seed).choice(len(x), size=count, replace=False))
    model.train(batch_statistics)
    return encode_in_chunks(model.features, x[index], device, chunk).numpy().astype(np.float32, copy=False)
