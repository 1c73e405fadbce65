"""Training steps of the detection methods: labeled image sets in torch form, flips, the step-counted SGD loop.

The detectors train for a number of *steps* (the FedOD paper's iterations), not epochs,
so this loop is not :func:`fedsim.methods.common.training.train_epochs`: batches walk
through seeded permutations of the set and run on across epoch boundaries (no batch is
dropped), each batch draws its horizontal flips from the same generator, and the
gradient norm is clipped. The optimizer is the one SGD factory of
:mod:`fedsim.methods.common.training`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from fedsim.models.detector import Detector
from fedsim.optim import Optimizer

ExtraLoss = Callable[[torch.Tensor, dict], torch.Tensor]


@dataclass
class DetectionSet:
    """A labeled image set in torch form, built once per client."""

    images: torch.Tensor  # (N, 3, S, S) float in [0, 1]
    targets: list[dict[str, torch.Tensor]]

    @staticmethod
    def build(x: np.ndarray, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> "DetectionSet":
        """From a split's images and its ``targets`` (one ``(boxes, labels)`` pair per image)."""
        targets = [
            {
                "boxes": torch.from_numpy(np.asarray(b, np.float32).reshape(-1, 4)),
                "labels": torch.from_numpy(np.asarray(lab, np.int64)),
            }
            for b, lab in pairs
        ]
        return DetectionSet(torch.from_numpy(np.ascontiguousarray(x)), targets)

    def __len__(self) -> int:
        return len(self.images)


def flip_batch(images: torch.Tensor, targets: list[dict], flips: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
    """Mirror the images where ``flips`` is True, and their boxes (x -> W - x)."""
    if not flips.any():
        return images, targets
    width = images.shape[-1]
    images = torch.where(flips[:, None, None, None], images.flip(-1), images)
    out = []
    for target, flip in zip(targets, flips.tolist()):
        if flip and len(target["boxes"]):
            boxes = target["boxes"].clone()
            boxes[:, 0], boxes[:, 2] = width - target["boxes"][:, 2], width - target["boxes"][:, 0]
            target = {**target, "boxes": boxes}
        out.append(target)
    return images, out


def train_steps(
    model: Detector,
    data: DetectionSet,
    steps: int,
    batch_size: int,
    optimizer: Optimizer,
    seed: int,
    flip: bool = True,
    grad_clip: float = 10.0,
    extra_loss: Optional[ExtraLoss] = None,
    detection_weight: float = 1.0,
) -> float:
    """``steps`` SGD steps of the FCOS loss (+ ``extra_loss(images, student maps)``); mean loss of the last 10 steps."""
    if steps == 0:
        return 0.0
    generator = torch.Generator().manual_seed(int(seed))
    batch_size = max(1, min(batch_size, len(data)))
    model.train()
    queue: list[int] = []
    losses = []
    for _ in range(steps):
        while len(queue) < batch_size:
            queue.extend(torch.randperm(len(data), generator=generator).tolist())
        index, queue = queue[:batch_size], queue[batch_size:]
        images = data.images[index]
        targets = [data.targets[i] for i in index]
        flips = torch.rand(len(index), generator=generator) < 0.5
        if flip:
            images, targets = flip_batch(images, targets, flips)
        maps = model.maps(images)
        loss = detection_weight * sum(model.loss(maps, targets).values())
        if extra_loss is not None:
            loss = loss + extra_loss(images, maps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
    return float(np.mean(losses[-10:]))
