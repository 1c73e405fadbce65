"""DANN, centralized (Ganin et al., JMLR 2016): the pooled reference FedDANN approximates.

The "federated vs centralized" comparison of the FedDaDiL paper: the same loss
objects and schedule as :mod:`fedsim.methods.common.alignment` (lambda ramp
2/(1+exp(-10p))-1, learning rate mu_0/(1+10p)^0.75, Sec. 5.2.2), trained on the
server over the pooled data, as :class:`~fedsim.methods.centralized.Centralized`
pools the sources:

* round 1: every source client uploads its training inputs and labels, the
  target client its *unlabeled* training inputs (``upload_inputs``: no labels,
  it has none); the pool moves once and is counted in ``bytes_received``;
* every round: ``method.local_epochs`` epochs over the pooled sources; each step
  draws a target batch of the same size, encodes it with the *current* encoder
  in its own forward pass (so batch norm normalizes each domain by its own
  batch, and the encoder gets the alignment gradient through the target too,
  as in the paper, unlike FedDANN's constant target features) and adds
  lambda * domain loss. The discriminator lives in the server state
  (``domain_loss``), trained with ``method.lr * discriminator_lr_scale``.

The target evaluates the broadcast weights with its own batch-norm statistics
(AdaBN on its unlabeled inputs) when the model has batch norm, as FedDANN's
target does. ``target_batch`` and ``target_normalization`` do not apply here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedsim.data.base import ArraySplit, ClientData
from fedsim.losses import DANNLoss, DomainLoss
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import ServerState, client_operation
from fedsim.methods.centralized import Centralized
from fedsim.methods.common.alignment import (
    AlignmentObjective,
    FeatureAlignment,
    alignment_optimizer,
    feature_dim,
    steps_per_epoch,
)
from fedsim.methods.common.training import evaluate_model, load_numpy, model_to_numpy, train_epochs
from fedsim.methods.fedbn import reestimate_bn
from fedsim.methods.feddann import FedDANN
from fedsim.models.normalization import bn_keys
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed


class CentralizedAlignment(Centralized):
    """Pooled sources + pooled unlabeled target inputs, trained on the server with a domain loss."""

    centralized = True  # replies carry client data on purpose: the contract tests know this

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        raise NotImplementedError

    domain_lr_scale = FeatureAlignment.domain_lr_scale
    domain_weight = FeatureAlignment.domain_weight
    lr_factor = FeatureAlignment.lr_factor
    step_schedule = FeatureAlignment.step_schedule

    def gather_target(self, ctx) -> np.ndarray:
        replies = ctx.call("upload_inputs", None, sorted(self.federation.target_ids))
        return np.concatenate([np.asarray(replies[cid].tensors["x"]) for cid in sorted(replies)])

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        if "pool" not in state:
            state = {**state, "pool": self.gather_pool(ctx), "target_pool": self.gather_target(ctx)}
        pool, method = state["pool"], self.config.method
        with torch.random.fork_rng(devices=[]):  # building the models seeds torch: leave the global RNG as it was
            model = self.pooled.shared()
            load_numpy(model, state["weights"])
            torch.manual_seed(derive_seed(self.config.run.seed, "domain-loss", "server"))
            domain_loss = self.make_domain_loss(feature_dim(model, self.federation.input_shape)).to(self.device)
        if state.get("domain_loss"):
            load_numpy(domain_loss, state["domain_loss"])
        seed = ctx.seed(-1, "centralized")
        batches, trained = steps_per_epoch(len(pool["y"]), method.batch_size)
        optimizer = alignment_optimizer(model, domain_loss, method, self.domain_lr_scale())
        objective = AlignmentObjective(
            domain_loss,
            torch.from_numpy(np.asarray(state["target_pool"])),
            torch.Generator().manual_seed(derive_seed(seed, "target-batch")),
            self.step_schedule(ctx.round, method.local_epochs * batches),
            batches,
            trained,
            optimizer,
            encode_target=True,
        )
        domain_loss.train()
        split = ArraySplit(pool["x"], pool["y"])
        train_epochs(
            model, split, method.local_epochs, method.batch_size, optimizer, seed, self.device, step_loss=objective
        )
        state = {**state, "weights": model_to_numpy(model), "domain_loss": model_to_numpy(domain_loss)}
        metrics = {
            **objective.metrics(),
            "pool_size": int(len(pool["y"])),
            "target_pool_size": int(len(state["target_pool"])),
        }
        return state, {**metrics, "domain_weight": self.domain_weight(ctx.round / self.config.run.rounds)}

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """The broadcast weights; the target with its own BN statistics (AdaBN on its unlabeled inputs) if the model has BN."""
        model = state["model"]
        load_numpy(model, instruction.tensors)
        if data.is_target and bn_keys(model):
            reestimate_bn(model, data.train.x, self.device)
        return Reply(
            data.client_id, {}, evaluate_model(model, data.test, self.device), num_examples=len(data.test)
        ), state

    @client_operation
    def upload_inputs(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """The target client: its unlabeled training inputs (it holds no labels), for the pooled alignment."""
        return Reply(data.client_id, {"x": np.asarray(data.train.x)}, {}, num_examples=len(data.train)), state


@METHODS.register("dann")
class DANN(CentralizedAlignment):
    """DANN, centralized (Ganin et al. 2016): the pooled-data reference of FedDANN, same discriminator and schedule."""

    Params = FedDANN.Params

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        return DANNLoss(in_features, self.params.discriminator_hidden, self.params.discriminator_layers)

    def domain_lr_scale(self) -> float:
        return self.params.discriminator_lr_scale
