"""The global classifier of the FedAvg family: seeded initialization, one model per process, local training.

FedAvg, FedProx, FedBN, the alignment methods, FedDaDiL's encoder stage and the centralized references all
start from the same initialization (seeded by the run's seed alone, so every backend and every method
gets the same initial weights) and train with :func:`fedsim.methods.common.training.train_epochs`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from fedsim.data.base import ArraySplit
from fedsim.messages import LocalSettings, Tensors
from fedsim.methods.common.training import (
    StepLoss,
    evaluate_model,
    load_numpy,
    make_optimizer,
    model_to_numpy,
    train_epochs,
)
from fedsim.models import build_model
from fedsim.seeding import derive_seed


class GlobalClassifier:
    """Builds and trains the experiment's classifier; holds one model per process as a reusable cache."""

    def __init__(self, config, federation, device: torch.device):
        self.config = config
        self.federation = federation
        self.device = device
        self._shared: Optional[nn.Module] = None

    def build(self) -> nn.Module:
        """A fresh model with the run's initial weights (seeds torch's global generator, as every client does)."""
        torch.manual_seed(derive_seed(self.config.run.seed, "model-init"))
        group_norm = self.config.privacy.active and self.config.privacy.unit == "record"  # DP-SGD's per-example grads
        return build_model(self.config.model, self.federation.input_shape, self.federation.num_classes, group_norm)

    def initial_weights(self) -> dict:
        """The run's initial weights as numpy arrays (:meth:`build`'s model): the same for every backend and method
        of a seed, e.g. FedAvg's w_0 (McMahan et al., AISTATS 2017, Alg. 1)."""
        return model_to_numpy(self.build())

    def shared(self) -> nn.Module:
        """One model per process, shared by every client hosted there: weights are reloaded before each use."""
        if self._shared is None:
            self._shared = self.build().to(self.device)
        return self._shared

    def train(
        self,
        model: nn.Module,
        weights: Tensors,
        split: ArraySplit,
        settings: LocalSettings,
        seed: int,
        step_loss: Optional[StepLoss] = None,
    ) -> float:
        """Load ``weights``, run ``settings.local_epochs`` epochs with a fresh SGD optimizer (McMahan et al.,
        Alg. 1), its batches drawn from ``seed``; DP-SGD's steps under ``privacy.unit=record``."""
        from fedsim.privacy.dpsgd import record_plan

        load_numpy(model, weights)
        optimizer = make_optimizer(model, settings)
        epochs, batch_size = settings.local_epochs, settings.batch_size
        private = record_plan(self.config, len(split.x))
        return train_epochs(model, split, epochs, batch_size, optimizer, seed, self.device, step_loss, private)

    def evaluate(self, model: nn.Module, weights: Tensors, split: ArraySplit) -> dict[str, float]:
        """Load ``weights`` into ``model`` and score it on a labeled ``split``: ``correct`` and ``total`` counts and
        the summed cross-entropy ``loss_sum`` (:func:`fedsim.methods.common.training.evaluate_model`)."""
        load_numpy(model, weights)
        return evaluate_model(model, split, self.device)
