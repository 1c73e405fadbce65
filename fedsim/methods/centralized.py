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
FedAvg), on its own device (the local backend's GPU when ``resources.gpus_per_client``
asks for one), in ``run.precision``, with FedAvg's model and training loop (a
:class:`~fedsim.methods.common.classifier.GlobalClassifier`). ``run.clients_per_round``
does not apply: the pool always holds every source client.

``method.optimizer=adam`` trains with Adam instead (``torch.optim.Adam``, rate ``method.lr``, L2 penalty
``method.weight_decay``, torch's default betas and epsilon), its state kept across rounds in the server state, so
that R rounds of E epochs are R x E epochs of one Adam run. The TEP authors' source-only recipe (Montesuma et al.,
``tep-domain-adaptation``'s multi-source source-only notebook: ``optimizer_name='adam'``, ``learning_rate=1e-4``,
``l2_penalty=0.0``, ``batch_size=256``, ``n_epochs=70`` over the pooled source windows) is then
``--set method.optimizer=adam,method.lr=1e-4,method.weight_decay=0,method.batch_size=256`` with
``--rounds 70`` (one epoch a round, each evaluated) or ``--rounds 1 --local-epochs 70``: the method's recipe on
``tep`` (:mod:`fedsim.recipes`), which a plain ``fedsim run --method centralized --benchmark tep`` applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedsim.data.base import ArraySplit, ClientData
from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import PooledReference, ServerState, client_operation
from fedsim.methods.common import precision
from fedsim.methods.common.pooling import gather_sources
from fedsim.methods.common.selection_hooks import ClassifierPredictor, model_tensors, selection_reply
from fedsim.methods.common.training import load_numpy, model_to_numpy, train_epochs
from fedsim.privacy.exchanges import pooled_refusal
from fedsim.registry import METHODS

OPTIMIZERS = ("sgd", "adam")


@METHODS.register("centralized")
class Centralized(PooledReference):
    """Centralized source-only reference: one model trained on the pooled source data, which FedAvg approximates."""

    privacy_refusal = pooled_refusal("'upload' stage")

    @dataclass(frozen=True)
    class Params:
        optimizer: str = "sgd"
        """The server's optimizer: "sgd" (fedsim's SGD with ``method.momentum``, a fresh one per round, as FedAvg's
        clients) or "adam" (``torch.optim.Adam``, its state kept across rounds; the TEP authors' recipe)."""

        def __post_init__(self):
            if self.optimizer not in OPTIMIZERS:
                raise UserError(
                    f"method.optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}: "
                    "e.g. --set method.optimizer=adam"
                )

    # ---- server half ------------------------------------------------------
    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """Gather the pool once, then ``method.local_epochs`` epochs on it: SGD with a fresh optimizer per round, or
        Adam continuing from the previous round's state."""
        if "pool" not in state:
            state = {**state, "pool": gather_sources(ctx, self.federation.source_ids)}
        pool = state["pool"]
        with torch.random.fork_rng(devices=[]):  # building the model seeds torch: leave the global RNG as it was
            model = self.pooled.shared()
        split, settings = ArraySplit(pool["x"], pool["y"]), self.client_settings(ctx.round)
        seed, extra = ctx.seed(-1, "centralized"), {}
        with precision.using(self.config.run.precision):
            if self.params.optimizer == "adam":
                loss, extra["optimizer"] = self.train_adam(model, state, split, settings, seed)
            else:
                loss = self.pooled.train(model, state["weights"], split, settings, seed)
        state = {**state, **extra, "weights": model_to_numpy(model)}
        return state, {"train_loss": loss, "pool_size": int(len(pool["y"]))}

    def train_adam(self, model, state: ServerState, split: ArraySplit, settings, seed: int) -> tuple[float, dict]:
        """``settings.local_epochs`` epochs of Adam from the state the last round left (a fresh one in round 1); the
        mean loss of the last epoch and the optimizer's state, on the CPU (checkpoints carry it)."""
        load_numpy(model, state["weights"])
        optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
        if "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])  # load_state_dict moves the moments to the model's device
        epochs, batch_size = settings.local_epochs, settings.batch_size
        loss = train_epochs(model, split, epochs, batch_size, optimizer, seed=seed, device=self.device)
        saved = optimizer.state_dict()
        saved["state"] = {k: {n: t.detach().cpu() for n, t in v.items()} for k, v in saved["state"].items()}
        return loss, saved

    # ---- client half ------------------------------------------------------
    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Every client (the target included) tests the broadcast weights, as in FedAvg; the selection statistics of
        the same model (features: ``model.features``)."""
        metrics = self.classifier.evaluate(state["model"], model_tensors(instruction), data.test)
        reply = Reply(data.client_id, {}, metrics, num_examples=len(data.test))
        predictor = ClassifierPredictor(state["model"], self.device)
        return selection_reply(self.selection_scores, instruction, data, reply, {"": predictor}), state
