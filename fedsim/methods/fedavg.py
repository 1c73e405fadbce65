"""FedAvg, source-only (McMahan et al., AISTATS 2017, Algorithm 1).

Labeled source clients run E local epochs of SGD from the global weights; the
server replaces the global weights by the mean of the returned weights,
weighted by each client's number of training samples. The unlabeled target
client never trains: it only evaluates the global model on its test part.
"""
from __future__ import annotations

from typing import Any

from fedsim.data.base import ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Method, Replies, ServerState
from fedsim.methods.training import evaluate_model, load_numpy, make_optimizer, model_to_numpy, train_epochs, weighted_average
from fedsim.models import build_model
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed


@METHODS.register("fedavg")
class FedAvg(Method):
    def build_model(self):
        import torch

        torch.manual_seed(derive_seed(self.config.run.seed, "model-init"))
        return build_model(self.config.model, self.federation.input_shape, self.federation.num_classes)

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return {"weights": model_to_numpy(self.build_model())}

    def configure_round(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        weights = state["weights"]  # one dict shared by all instructions: serialized once
        return {
            cid: Instruction("fit", weights, {"seed": self.client_seed(rnd, cid, "fit"), "round": rnd})
            for cid in self.sample_clients(rnd, self.federation.source_ids)
        }

    def aggregate(self, rnd: int, state: ServerState, replies: Replies) -> tuple[ServerState, dict]:
        weights = weighted_average([r.tensors for r in replies.values()], [r.num_examples for r in replies.values()])
        train_loss = {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}
        return {**state, "weights": weights}, {"train_loss": train_loss}

    def configure_evaluate(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        weights = state["weights"]
        return {cid: Instruction("evaluate", weights, {"round": rnd}) for cid in self.federation.client_ids}

    # ---- client half ------------------------------------------------------
    def shared_model(self):
        """One model per process, shared by every client hosted there: weights are reloaded before each use."""
        if getattr(self, "_shared_model", None) is None:
            self._shared_model = self.build_model().to(self.device)
        return self._shared_model

    def init_client(self, data: ClientData) -> Any:
        return {"model": self.shared_model()}  # "model" is transient (see Method.transient_state_keys)

    def local_objective(self, instruction: Instruction):
        """Extra term added to the local loss (none for FedAvg; FedProx adds its proximal term)."""
        return None

    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        model = state["model"]
        load_numpy(model, instruction.tensors)
        optimizer = make_optimizer(model, self.config.method)  # fresh each round, as in Algorithm 1
        loss = train_epochs(
            model,
            data.train,
            self.config.method.local_epochs,
            self.config.method.batch_size,
            optimizer,
            seed=instruction.config["seed"],
            device=self.device,
            extra_loss=self.local_objective(instruction),
        )
        reply = Reply(data.client_id, model_to_numpy(model), {"train_loss": loss}, num_examples=len(data.train))
        return reply, state

    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        model = state["model"]
        load_numpy(model, instruction.tensors)
        return Reply(data.client_id, {}, evaluate_model(model, data.test, self.device), num_examples=len(data.test)), state
