"""Centralized alignment: the pooled references (DANN, MMD) that the federated alignment methods approximate.

Round 1: every source client uploads its training inputs and labels, the target client its unlabeled training
inputs (``upload_inputs``); the pool moves once and is counted in ``bytes_received``. Every round the server runs
``local_epochs`` epochs over the pooled sources; each step draws a target batch of the same size, encodes it with
the current encoder in its own forward pass (Ganin et al., JMLR 2016) and adds lambda * domain loss, with the
schedule of :class:`~fedsim.methods.alignment.base.AlignmentSchedule`. The domain loss's parameters live in
the server state (``domain_loss``). The target evaluates with its own batch-norm statistics (AdaBN) when the
model has batch norm.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedsim.data.base import ArraySplit, ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods.alignment.base import AlignmentSchedule
from fedsim.methods.alignment.objective import AlignmentObjective, alignment_optimizer, feature_dim, steps_per_epoch
from fedsim.methods.base import PooledReference, ServerState, client_operation
from fedsim.methods.common import precision
from fedsim.methods.common.batchnorm import reestimate_bn
from fedsim.methods.common.pooling import gather_sources, gather_target_inputs, inputs_upload
from fedsim.methods.common.selection_hooks import ClassifierPredictor, model_tensors, selection_reply
from fedsim.methods.common.training import evaluate_model, load_numpy, model_to_numpy, train_epochs
from fedsim.models.normalization import bn_keys
from fedsim.privacy.exchanges import pooled_refusal
from fedsim.seeding import derive_seed


class CentralizedAlignment(PooledReference, AlignmentSchedule):
    """Pooled sources + pooled unlabeled target inputs, trained on the server with a domain loss."""

    privacy_refusal = pooled_refusal("'upload' and 'upload_inputs' stages")

    # ---- server half ------------------------------------------------------
    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        if "pool" not in state:
            pool = gather_sources(ctx, self.federation.source_ids)
            state = {**state, "pool": pool, "target_pool": gather_target_inputs(ctx, self.federation.target_ids)}
        pool, settings = state["pool"], self.client_settings(ctx.round)
        with torch.random.fork_rng(devices=[]):  # building the models seeds torch: leave the global RNG as it was
            model = self.pooled.shared()
            load_numpy(model, state["weights"])
            torch.manual_seed(derive_seed(self.config.run.seed, "domain-loss", "server"))
            domain_loss = self.make_domain_loss(feature_dim(model, self.federation.input_shape)).to(self.device)
        if state.get("domain_loss"):
            load_numpy(domain_loss, state["domain_loss"])
        seed = ctx.seed(-1, "centralized")
        batches, trained = steps_per_epoch(len(pool["y"]), settings.batch_size)
        optimizer = alignment_optimizer(model, domain_loss, settings, self.domain_lr_scale())
        objective = AlignmentObjective(
            domain_loss,
            torch.from_numpy(np.asarray(state["target_pool"])),
            torch.Generator().manual_seed(derive_seed(seed, "target-batch")),
            self.step_schedule(ctx.round, settings.local_epochs * batches),
            batches,
            trained,
            optimizer,
            encode_target=True,
        )
        domain_loss.train()
        split, epochs = ArraySplit(pool["x"], pool["y"]), settings.local_epochs
        with precision.using(self.config.run.precision):
            train_epochs(model, split, epochs, settings.batch_size, optimizer, seed, self.device, step_loss=objective)
        state = {**state, "weights": model_to_numpy(model), "domain_loss": model_to_numpy(domain_loss)}
        metrics = {
            **objective.metrics(),
            "pool_size": int(len(pool["y"])),
            "target_pool_size": int(len(state["target_pool"])),
        }
        return state, {**metrics, "domain_weight": self.domain_weight(ctx.round / self.config.run.rounds)}

    # ---- client half ------------------------------------------------------
    @client_operation
    def upload_inputs(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """The target client: its unlabeled training inputs (it holds no labels), for the pooled alignment."""
        return inputs_upload(data), state

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """The broadcast weights; the target with its own BN statistics (AdaBN on its unlabeled inputs) if the
        model has BN. The selection statistics are this model's (features: ``model.features``)."""
        model = state["model"]
        load_numpy(model, model_tensors(instruction))
        if data.is_target and bn_keys(model):
            reestimate_bn(model, data.train.x, self.device)
        reply = Reply(data.client_id, {}, evaluate_model(model, data.test, self.device), num_examples=len(data.test))
        predictor = ClassifierPredictor(model, self.device)
        return selection_reply(self.selection_scores, instruction, data, reply, {"": predictor}), state
