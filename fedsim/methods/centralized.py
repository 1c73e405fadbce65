"""Centralized source-only training: the pooled-data reference that FedAvg source-only approximates.

The "source-only" row of domain adaptation tables (e.g. Ganin et al., JMLR
2016; Peng et al., ICCV 2019): one model trained in one place on the pooled
labeled source domains, then tested on the target without adaptation. FedAvg
source-only optimizes the same objective without sharing data; the gap between
the two is the price of federation (usually read as an upper bound for
FedAvg; on the embedded digits it is not: see the README).

It runs on the same simulator so the numbers are comparable: same model and
initialization as FedAvg, same standardization, same evaluation. In round 1
every source client uploads its training inputs and labels once; the server
keeps the pool (numpy arrays, so checkpoints carry it) in client-id order,
which makes the local and Ray backends identical for a seed. Raw source data
crossing the wire is the point of this baseline and is counted in
``bytes_received``. The target's data is never uploaded: the target client
only evaluates the broadcast weights, as in FedAvg.

Every round the server runs ``method.local_epochs`` epochs of mini-batch SGD
over the pool (``method.batch_size``, a fresh optimizer per round as in
FedAvg), on its own device, with FedAvg's model and training loop (a
:class:`~fedsim.methods.common.classifier.GlobalClassifier`). ``run.clients_per_round``
does not apply: the pool always holds every source client.
"""

from __future__ import annotations

from typing import Any

import torch

from fedsim.data.base import ArraySplit, ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Method, ServerState, client_operation
from fedsim.methods.common.classifier import GlobalClassifier
from fedsim.methods.common.pooling import gather_sources, labeled_upload
from fedsim.methods.common.selection_hooks import ClassifierPredictor, model_tensors, selection_reply
from fedsim.methods.common.training import model_to_numpy
from fedsim.registry import METHODS


@METHODS.register("centralized")
class Centralized(Method):
    """Centralized source-only reference: one model trained on the pooled source data, which FedAvg approximates."""

    centralized = True  # replies carry client data on purpose: the contract tests know this

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.classifier = GlobalClassifier(config, federation, self.device)  # the clients' evaluation model
        self.pooled = GlobalClassifier(config, federation, self.device)  # the server's model, trained on the pool

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return {"weights": self.classifier.initial_weights()}

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """Gather the pool once, then ``method.local_epochs`` epochs of SGD on it (a fresh optimizer per round)."""
        if "pool" not in state:
            state = {**state, "pool": gather_sources(ctx, self.federation.source_ids)}
        pool = state["pool"]
        with torch.random.fork_rng(devices=[]):  # building the model seeds torch: leave the global RNG as it was
            model = self.pooled.shared()
        split, settings = ArraySplit(pool["x"], pool["y"]), self.client_settings(ctx.round)
        loss = self.pooled.train(model, state["weights"], split, settings, ctx.seed(-1, "centralized"))
        return {**state, "weights": model_to_numpy(model)}, {"train_loss": loss, "pool_size": int(len(pool["y"]))}

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        return {"model": self.classifier.shared()}  # "model" is transient (see Method.transient_state_keys)

    @client_operation
    def upload(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Send the (standardized) training inputs and labels to the server: the centralized setting."""
        return labeled_upload(data), state

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Every client (the target included) tests the broadcast weights, as in FedAvg; the selection statistics of
        the same model (features: ``model.features``)."""
        metrics = self.classifier.evaluate(state["model"], model_tensors(instruction), data.test)
        reply = Reply(data.client_id, {}, metrics, num_examples=len(data.test))
        predictor = ClassifierPredictor(state["model"], self.device)
        return selection_reply(self.selection_scores, instruction, data, reply, {"": predictor}), state
