"""FedRep for classification (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, Alg. 1): shared representation,
personal heads.

Each labeled source client keeps its own linear head (the ``head.*`` tensors of
the model) as private state; a local update first trains the head for
``head_epochs`` epochs with the representation frozen, then the representation
(every other tensor, batch-norm statistics included) for ``method.local_epochs``
epochs with the head frozen (the paper's tau_h = 10 head epochs, then one
representation epoch, Sec. 5). Only the representation goes back; the server
averages it weighted by sample count, as FedAvg. Heads start from the global
initialization's head.

The head epochs. In Alg. 1 the representation phi^t is fixed while the head
takes its tau_h steps, so phi^t(x) is computed once per round, without gradients
(:func:`frozen_features`), and the head trains on those features: one forward
pass of the encoder instead of tau_h, no backward through it (the head's loss,
and so its update, is the same as with a frozen encoder re-run every epoch for
a model without batch norm, Collins et al.'s case). With batch norm, each input
is normalized by the statistics of a fixed chunk of ``method.batch_size``
training inputs (train mode, as in the representation epochs) rather than of a
re-drawn mini-batch, and the running statistics are left as the server sent
them (phi^t frozen, buffers included); the representation epochs then update
them as usual. ``head_loss`` (last head epoch) and ``train_loss`` (last
representation epoch) are reported per client.

Target rule (ours, not the paper's: FedRep has no unlabeled client). The target
has no head and no labels to train one. At evaluation only, each source sends its
head (an evaluation-only exchange, ``share_head``: the head's parameters and its
training-sample count, counted in bytes like any exchange) and the target predicts
with the average of the sources' class probabilities softmax(head_k(phi(x))),
weighted by sample count (its selection scores read the same mixture p, as
logits log p). What this discloses: each source's personal head and
its number of training samples, to the server and the target, once per
evaluation; heads never travel during training. Sources evaluate with their own
head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Method, ServerState, client_operation
from fedsim.methods.common.aggregation import weighted_average
from fedsim.methods.common.classifier import GlobalClassifier
from fedsim.methods.common.precision import autocast, full
from fedsim.methods.common.selection_hooks import ClassifierPredictor, model_tensors, selection_reply
from fedsim.methods.common.training import (
    device_rows,
    encode_in_chunks,
    evaluate_model,
    load_numpy,
    make_optimizer,
    minibatches,
    model_to_numpy,
    train_epochs,
)
from fedsim.privacy.dpsgd import dp_sgd_epochs, record_plan
from fedsim.privacy.exchanges import Exchanges, fit_exchanges
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed

HEAD = "head."  # state-dict prefix of the personal part


def split_head(tensors: dict) -> tuple[dict, dict]:
    """(representation tensors, head tensors)."""
    return {k: v for k, v in tensors.items() if not k.startswith(HEAD)}, {
        k: v for k, v in tensors.items() if k.startswith(HEAD)
    }


@torch.no_grad()
def frozen_features(model: nn.Module, x: np.ndarray, chunk: int, device: torch.device) -> torch.Tensor:
    """phi^t(x) of every training input, without gradients, in train mode: batch norm normalizes each chunk of
    ``chunk`` inputs by its own statistics, as the training batches are (a final chunk of one joins the one before).
    The running statistics this moves are the caller's to restore."""
    model.train()
    bounds = list(range(0, len(x), chunk)) + [len(x)]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]
    with autocast(device):
        parts = [full(model.features(torch.from_numpy(x[a:b]).to(device))) for a, b in zip(bounds[:-1], bounds[1:])]
    return torch.cat(parts)


def local_update_epochs(config) -> int:
    """The epochs of one local update: the head's (``method.head_epochs``) then the representation's
    (``method.local_epochs``), what record-level DP-SGD plans a round."""
    return config.method.params.head_epochs + config.method.local_epochs


def head_loss(head: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """cross-entropy(head(phi^t(x)), y): the head update's loss."""
    return nn.functional.cross_entropy(head(features), labels)


def train_head(head: nn.Module, features: torch.Tensor, y: np.ndarray, epochs: int, method, seed: int) -> float:
    """Alg. 1's head update: ``epochs`` epochs of SGD on cross-entropy(head(phi^t(x)), y) over the fixed features;
    returns the mean loss of the last epoch."""
    labels = torch.from_numpy(y).to(features.device)
    optimizer = make_optimizer(head.parameters(), method)
    generator = torch.Generator().manual_seed(seed)
    head.train()
    last = 0.0
    for _ in range(epochs):
        total, count = 0.0, 0
        for idx in minibatches(len(labels), method.batch_size, generator):
            optimizer.zero_grad(set_to_none=True)
            with autocast(features.device):
                loss = head_loss(head, features[idx], labels[idx])
            loss.backward()
            optimizer.step()
            total, count = total + float(loss.detach()) * len(idx), count + len(idx)
        last = total / max(count, 1)
    return last


@METHODS.register("fedrep")
class FedRep(Method):
    """FedRep (Collins et al. 2021): averaged representation, personal heads; the target averages the sources' heads."""

    copes_with_missing_replies = True  # it aggregates the replies that arrive

    @staticmethod
    def privacy_exchanges(config) -> Exchanges:
        """One ``fit`` a round, the representation without the head; under ``privacy.unit=record`` the head's and
        the representation's epochs are both DP-SGD's, planned together."""
        return fit_exchanges(
            "the representation after the head's and the representation's epochs (the model without its head, which "
            "stays on the source), clipped as its difference from the global one; not in the data's space",
            record_epochs=local_update_epochs,
        )

    @dataclass(frozen=True)
    class Params:
        head_epochs: int = 10  # head-only epochs before the representation's (Collins et al. 2021, Sec. 5: tau_h = 10)

        def __post_init__(self):
            if self.head_epochs < 0:
                raise UserError(f"method.head_epochs must be 0 or more, got {self.head_epochs}")

    disclosed_state_keys = ("head",)  # sent on purpose, in the evaluation-only exchange (see the module docstring)

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.classifier = GlobalClassifier(config, federation, self.device)

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return {"weights": split_head(self.classifier.initial_weights())[0]}

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        clients = self.sample_clients(ctx.round, self.federation.source_ids)
        replies = ctx.call("fit", state["weights"], clients)
        weights = weighted_average([r.tensors for r in replies.values()], [r.num_examples for r in replies.values()])
        keys = sorted({key for r in replies.values() for key in r.metrics})  # train_loss, head_loss
        return {**state, "weights": weights}, {
            key: {str(cid): r.metrics[key] for cid, r in replies.items() if key in r.metrics} for key in keys
        }

    def evaluate_round(self, ctx, state: ServerState) -> dict:
        """Sources send their heads (evaluation only); sources test their own head, the target the weighted mixture."""
        heads = ctx.call("share_head", None, self.federation.source_ids)
        payload = dict(state["weights"])
        for cid, reply in sorted(heads.items()):
            payload.update({f"heads.{cid}.{key}": value for key, value in reply.tensors.items()})
            payload[f"heads.{cid}.count"] = np.asarray(float(reply.num_examples))
        replies = ctx.call("evaluate", self.selection_payload(ctx, payload), self.federation.client_ids)
        return self.summarize_evaluation(ctx.round, replies)

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        return {"model": self.classifier.shared(), "head": None}  # "head": numpy, None until the first fit

    def own_head(self, state: dict) -> dict:
        return state["head"] if state["head"] is not None else split_head(self.classifier.initial_weights())[1]

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """tau_h head epochs on the frozen representation's features, then the representation's epochs (head
        frozen); only phi goes back."""
        model, method, seed = state["model"], instruction.local, instruction.seed
        load_numpy(model, {**instruction.tensors, **self.own_head(state)})
        metrics = {}
        private = record_plan(self.config, len(data.train), local_update_epochs(self.config))  # privacy.unit=record
        if self.params.head_epochs:
            features = frozen_features(model, data.train.x, method.batch_size, self.device)
            load_numpy(
                model, instruction.tensors, strict=False
            )  # phi^t is frozen: undo the BN statistics the encoding moved
            if private is None:
                metrics["head_loss"] = train_head(
                    model.head, features, data.train.y, self.params.head_epochs, method, derive_seed(seed, 1)
                )
            else:
                optimizer = make_optimizer(model.head.parameters(), method)
                labels = device_rows(data.train.y, self.device)
                metrics["head_loss"] = float(
                    dp_sgd_epochs(
                        model.head,
                        features.float(),
                        labels,
                        self.params.head_epochs,
                        private,
                        optimizer,
                        derive_seed(seed, 1),
                        self.device,
                        head_loss,
                    )
                )
        model.head.requires_grad_(False)
        try:
            optimizer = make_optimizer(model.encoder.parameters(), method)
            metrics["train_loss"] = train_epochs(
                model,
                data.train,
                method.local_epochs,
                method.batch_size,
                optimizer,
                derive_seed(seed, 2),
                self.device,
                private=private,
            )
        finally:
            model.head.requires_grad_(True)
        body, state["head"] = split_head(model_to_numpy(model))
        return Reply(data.client_id, body, metrics, num_examples=len(data.train)), state

    @client_operation
    def share_head(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Evaluation-only: this source's head and its training-sample count (the weight of its vote)."""
        return Reply(data.client_id, dict(self.own_head(state)), {}, num_examples=len(data.train)), state

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """A source: its own head; the target: the sources' heads' mixture. The selection statistics are the same
        predictor's (features: phi(x), ``model.features``)."""
        tensors = model_tensors(instruction)
        body = {k: v for k, v in tensors.items() if not k.startswith("heads.")}
        model = state["model"]
        if not data.is_target:
            load_numpy(model, {**body, **self.own_head(state)})
            metrics, predictor = evaluate_model(model, data.test, self.device), ClassifierPredictor(model, self.device)
        else:
            metrics = self.mixture_metrics(model, body, tensors, data)
            predictor = MixturePredictor(self, model, body, tensors)
        reply = Reply(data.client_id, {}, metrics, num_examples=len(data.test))
        return selection_reply(self.selection_scores, instruction, data, reply, {"": predictor}), state

    @torch.no_grad()
    def mixture_metrics(self, model: nn.Module, body: dict, tensors: dict, data: ClientData) -> dict[str, float]:
        """Accuracy and NLL of sum_k n_k softmax(head_k(phi(x))) / sum_k n_k on the target's test split."""
        probabilities = self.mixture_probabilities(model, body, tensors, data.test.x)
        y = torch.from_numpy(data.test.y)
        correct = float((probabilities.argmax(1) == y).sum())
        loss = float(-torch.log(probabilities[torch.arange(len(y)), y].clamp_min(1e-12)).sum())
        return {"correct": correct, "total": float(len(y)), "loss_sum": loss}

    @torch.no_grad()
    def mixture_probabilities(self, model: nn.Module, body: dict, tensors: dict, x: np.ndarray) -> torch.Tensor:
        """sum_k n_k softmax(head_k(phi(x))) / sum_k n_k (float64), the target's prediction."""
        sources = sorted({int(k.split(".")[1]) for k in tensors if k.startswith("heads.")})
        if not sources:
            raise ValueError("the target needs the sources' heads to predict (the share_head exchange)")
        counts = np.asarray([float(tensors[f"heads.{cid}.count"]) for cid in sources])
        probabilities = torch.zeros(len(x), self.federation.num_classes, dtype=torch.float64)
        for cid, weight in zip(sources, counts / counts.sum()):
            prefix = f"heads.{cid}."
            load_numpy(
                model,
                {
                    **body,
                    **{
                        k[len(prefix) :]: v
                        for k, v in tensors.items()
                        if k.startswith(prefix) and k != prefix + "count"
                    },
                },
            )
            model.eval()
            logits = encode_in_chunks(model, x, self.device, 512)
            probabilities += weight * torch.softmax(logits.double(), dim=1)
        return probabilities


class MixturePredictor(ClassifierPredictor):
    """The target's predictor for the selection scores: logits log p of the sources' heads' mixture p; features
    phi(x) (the body every head shares)."""

    def __init__(self, method: FedRep, model: nn.Module, body: dict, tensors: dict):
        super().__init__(model, method.device)
        self.method, self.body, self.tensors = method, body, tensors

    def logits(self, x: np.ndarray) -> np.ndarray:
        probabilities = self.method.mixture_probabilities(self.model, self.body, self.tensors, x)
        return torch.log(probabilities.clamp_min(torch.finfo(torch.float64).tiny)).numpy()
