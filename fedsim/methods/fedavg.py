"""FedAvg, source-only (McMahan et al., AISTATS 2017, Algorithm 1).

Labeled source clients run E local epochs of SGD from the global weights; the
server replaces the global weights by the mean of the returned weights,
weighted by each client's number of training samples. The unlabeled target
client never trains: it only evaluates the global model on its test part.

The server half is numpy only (``server_needs_torch = False``): torch and the
classifier are imported where the client half first uses them.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any, Optional

from fedsim.data.base import ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Exchange, Replies, ServerState, SingleExchange, client_operation
from fedsim.methods.common.aggregation import federated_average
from fedsim.methods.common.selection_hooks import ClassifierPredictor, model_tensors, selection_reply
from fedsim.privacy.exchanges import one_fit
from fedsim.registry import METHODS

if TYPE_CHECKING:
    from fedsim.methods.common.classifier import GlobalClassifier
    from fedsim.methods.common.training import StepLoss


@METHODS.register("fedavg")
class FedAvg(SingleExchange):
    """FedAvg source-only (McMahan et al. 2017): sources train locally, the server averages weights by sample count."""

    copes_with_missing_replies = True  # it aggregates the replies that arrive
    privacy_exchanges = staticmethod(one_fit)  # one fit a round, its model updates averaged by sample count

    server_needs_torch = False
    #: ``fit`` has a batched counterpart for ``resources.vectorize: auto`` (fedsim.methods.common.vectorized)
    vectorized_operations = {"fit": "fit_vectorized"}

    @cached_property
    def classifier(self) -> GlobalClassifier:
        """The model builder and training loop (torch), made on first use: a client's, or ``init_server``'s."""
        from fedsim.methods.common.classifier import GlobalClassifier

        return GlobalClassifier(self.config, self.federation, self.device)

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return {"weights": self.classifier.initial_weights()}

    def configure(self, ctx, state: ServerState) -> Exchange:
        clients = self.sample_clients(ctx.round, self.federation.source_ids)
        return Exchange("fit", state["weights"], clients)

    def aggregate(self, ctx, state: ServerState, replies: Replies) -> tuple[ServerState, dict]:
        weights, metrics = federated_average(replies)
        return {**state, "weights": weights}, metrics

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        return {"model": self.classifier.shared()}  # "model" is transient (see Method.transient_state_keys)

    def local_loss(self, instruction: Instruction) -> Optional[StepLoss]:
        """The local objective of one round (None: cross-entropy; FedProx adds its proximal term)."""
        return None

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        model = state["model"]
        from fedsim.methods.common.training import model_to_numpy

        settings, loss_fn = instruction.local, self.local_loss(instruction)
        loss = self.classifier.train(model, instruction.tensors, data.train, settings, instruction.seed, loss_fn)
        return Reply(data.client_id, model_to_numpy(model), {"train_loss": loss}, num_examples=len(data.train)), state

    def proximal_mu(self) -> float:
        """The proximal coefficient of the batched local update (0: plain cross-entropy, as :meth:`local_loss`)."""
        return 0.0

    def vectorizable(self, operation: str) -> bool:
        """Whether this run's model trains batched faster than in a loop (the rule of ``auto``)."""
        from fedsim.methods.common.vectorized import vectorizable_model

        return vectorizable_model(self.classifier.shared(), self.device)

    def fit_vectorized(self, items: list[tuple[Instruction, Any, ClientData]]) -> list[tuple[Reply, Any]]:
        """:meth:`fit` for several clients at once: the same batches, seeds and SGD, one batched computation."""
        from fedsim.methods.common.vectorized import ClientJob, train_grouped

        mu = self.proximal_mu()
        jobs = [
            ClientJob(data.train.x, data.train.y, ins.tensors, ins.seed, ins.tensors if mu else None)
            for ins, _, data in items
        ]
        settings = [ins.local for ins, _, _ in items]
        weights, losses = train_grouped(self.classifier.shared(), jobs, settings, self.device, mu)
        return [
            (Reply(data.client_id, w, {"train_loss": loss}, num_examples=len(data.train)), state)
            for (_, state, data), w, loss in zip(items, weights, losses)
        ]

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """The global weights on the test part; the selection statistics of the same model (its features: the
        encoder's, ``model.features``)."""
        metrics = self.classifier.evaluate(state["model"], model_tensors(instruction), data.test)
        reply = Reply(data.client_id, {}, metrics, num_examples=len(data.test))
        predictor = ClassifierPredictor(state["model"], self.device)
        return selection_reply(self.selection_scores, instruction, data, reply, {"": predictor}), state
