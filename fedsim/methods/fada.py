"""FADA: Federated Adversarial Domain Adaptation (Peng, Huang, Zhu & Saenko, ICLR 2020, Alg. 1).

Every client keeps its own model (:class:`fedsim.models.fada_parts.FADANet`:
generator G, invariant branch of the disentangler D, classifier C): sources
G_i/C_i, the target G_t/C_t. One round runs these stages, each one executor
call (the switches ``attention``, ``adversarial``, ``disentangle`` give the
paper's ablations: model I = attention, II = I + adversarial, III = II + disentangle):

1. ``fit`` (sources): load the target model w_t (each round starts from it, as
   FedAvg starts from the global model), ``local_epochs`` of cross-entropy on
   G_i -> D_inv -> C_i.
2. adversarial alignment (Sec. 3.2, Eq. 3), if ``adversarial``:
   ``features`` (target): G_t's features of a seeded subset of ``target_batch``
   unlabeled inputs; ``adversarial`` (each source): the private domain
   identifier DI_i learns source (1) vs target (0) features, then G_i is trained
   to confuse it (cross-entropy to 1/2); the source sends back the gradient of
   the confusion loss with respect to the received target features;
   ``align`` (target): one SGD step of G_t along the mean of those feature
   gradients (back-propagated through G_t on the same inputs). Only feature
   vectors and feature gradients cross the network.
3. disentanglement (Sec. 3.3, Eq. 4-7), if ``disentangle`` (sources, G_i fixed):
   D_i splits G_i's features into f_di (classified by C_i) and f_ds; (a) C_i and
   the class identifier CI_i learn the labels from f_di and f_ds; (b) D_i's
   specific branch maximizes the entropy of CI_i(f_ds); (c) the MINE statistics
   network maximizes the bias-corrected bound on I(f_di; f_ds); (d) D_i minimizes
   that estimate plus the L2 reconstruction error of R_i([f_di, f_ds]) against G_i(x).
   D_i minimizes the positive part of the estimate: mutual information is never
   negative, and a D_i that pushes a fixed T's bound below zero only exploits T
   (measured on digits: the estimate ran to -9, then the weights to NaN).
4. ``update`` (target): dynamic attention (Sec. 3.1). The sources' deltas
   Delta_i = w_i - w_t (from their last stage) go to the target, which computes
   the gap statistic (Tibshirani et al. 2001) of k-means on its invariant
   features before and after applying each Delta_i; the attention is
   softmax(gain_i / attention_temperature) (uniform with ``attention`` off), and
   w_t <- w_t + sum_i a_i Delta_i. The target sends its new weights to the server,
   which sends them to the sources next round.

Gap statistic cost: ``gap_samples`` target inputs (eval mode), k = ``gap_clusters``
(0: the number of classes), ``gap_references`` uniform reference sets drawn over
the box aligned with the features' principal components (Tibshirani's method
(b)), the same uniform draws for "before" and every "after" (common random
numbers, so the gains do not carry
reference noise), scikit-learn KMeans with one k-means++ initialization, a
random_state derived from the seed, and one thread (identical on every backend):
(sources + 1) x (gap_references + 1) k-means fits per round on the target.

Evaluation: each client evaluates its own model (sources G_i/C_i after their
local stages, the target G_t/C_t); ``target_accuracy`` is the target model's.
The target's training operations (``features``, ``align``, ``update``) never
read ``train.y``: they only encode inputs. Batch-norm running statistics of the
target change only through the sources' deltas: the target-side forward passes
in training mode restore them afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.losses.fada import MINELoss
from fedsim.messages import Instruction
from fedsim.methods._fada_gap import gap_statistic, softmax
from fedsim.methods._fada_stages import DELTA, FEATURE_GRAD, FADAClientStages, batch_indices, preserved_buffers
from fedsim.methods._feature_alignment import TARGET_FEATURES
from fedsim.methods.base import ServerState
from fedsim.methods.common.training import model_to_numpy
from fedsim.models import build_model
from fedsim.models.fada_parts import FADANet, SourceParts, build_fada_net, feature_width
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed

# the stage helpers live in ``_fada_stages`` and ``_fada_gap``; they stay importable from here
__all__ = ["FADA", "FADAParams", "batch_indices", "gap_statistic", "preserved_buffers", "softmax"]


@dataclass(frozen=True)
class FADAParams:
    attention: bool = True  # dynamic attention from gap-statistic gains; off: uniform weights
    adversarial: bool = True  # federated adversarial alignment stage
    disentangle: bool = True  # representation disentanglement stage
    lambda_adv: float = 0.1  # weight of the confusion loss on G_i and G_t (times the schedule)
    schedule: str = "dann"  # "dann": lambda_adv * (2 / (1 + exp(-10 p)) - 1) over training progress p; "constant"
    target_batch: int = 256  # target features sent per round for the adversarial stage
    adversarial_steps: int = 0  # mini-batches per round of the adversarial stage (0: one pass over the local data)
    disentangle_steps: int = 0  # mini-batches per round of the disentanglement stage (0: one pass)
    identifier_hidden: int = 256  # units per hidden layer of the domain identifier (2 layers)
    parts_hidden: int = 128  # hidden units of the class identifier and the MINE statistics network
    lambda_entropy: float = 1.0  # weight of the class-identifier entropy maximized by D_i (Eq. 5)
    lambda_mi: float = 0.1  # weight of the MINE estimate minimized by D_i (Eq. 6)
    lambda_recon: float = 1.0  # weight of the reconstruction L2 (Eq. 7)
    mine_rate: float = 0.01  # moving-average rate of the MINE gradient correction (Belghazi et al. 2018, Sec. 3.2)
    mine_lr: float = 1e-4  # Adam learning rate of the MINE statistics network (kept across rounds)
    gap_samples: int = 256  # target inputs encoded for the gap statistic
    gap_references: int = 5  # uniform reference sets B of the gap statistic
    gap_clusters: int = 0  # k of k-means (0: the number of classes)
    attention_temperature: float = 1.0  # softmax temperature over the gap gains (the paper: 1)

    def __post_init__(self):
        positive = {
            "target_batch": self.target_batch - 1, "identifier_hidden": self.identifier_hidden, "parts_hidden": self.parts_hidden,
            "gap_samples": self.gap_samples - 1, "gap_references": self.gap_references,
            "attention_temperature": self.attention_temperature, "mine_lr": self.mine_lr,
        }
        for name, value in positive.items():
            if not value > 0:
                minimum = "2 or more" if name in ("target_batch", "gap_samples") else "positive"
                raise UserError(f"method.{name} must be {minimum}, got {getattr(self, name)}")
        for name in ("lambda_adv", "lambda_entropy", "lambda_mi", "lambda_recon", "adversarial_steps", "disentangle_steps", "gap_clusters"):
            if getattr(self, name) < 0:
                raise UserError(f"method.{name} must be 0 or more, got {getattr(self, name)}")
        if self.schedule not in ("dann", "constant"):
            raise UserError(f"method.schedule must be 'dann' or 'constant', got {self.schedule!r}")
        if not 0 < self.mine_rate <= 1:
            raise UserError(f"method.mine_rate must be in (0, 1], got {self.mine_rate}")


@METHODS.register("fada")
class FADA(FADAClientStages):
    """FADA: per-client models, dynamic attention, federated adversarial alignment, disentanglement (Peng et al. 2020)."""

    Params = FADAParams
    operations = ("fit", "features", "adversarial", "align", "disentangle", "update", "evaluate")
    transient_state_keys = ()  # every client keeps its own model: nothing is a shared cache

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        if len(federation.target_ids) != 1:
            raise UserError(
                f"fada trains one target model on one target client, but the target domain has {len(federation.target_ids)} "
                "clients: pass --clients-per-domain 1"
            )
        self.target_id = federation.target_ids[0]
        many = config.data.clients_per_domain > 1
        self.labels = {c.client_id: f"{c.domain}-{c.client_id}" if many else c.domain for c in federation.clients}

    def build_net(self) -> FADANet:
        torch.manual_seed(derive_seed(self.config.run.seed, "model-init"))  # every client starts from the same weights
        base = build_model(self.config.model, self.federation.input_shape, self.federation.num_classes)
        return build_fada_net(base, self.federation.input_shape).to(self.device)

    def source_stages(self) -> list[str]:
        return ["fit"] + ["adversarial"] * self.params.adversarial + ["disentangle"] * self.params.disentangle

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return {"weights": model_to_numpy(self.build_net())}  # the target model w_t, as the target client starts

    def configure_round(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        raise NotImplementedError("FADA exchanges several times per round: call run_round")

    def stage_config(self, rnd: int, cid: int, operation: str, last: str) -> dict:
        return {"seed": self.client_seed(rnd, cid, operation), "round": rnd, "send_delta": operation == last}

    def per_source(self, replies, key: str) -> dict[str, float]:
        return {self.labels[cid]: float(r.metrics[key]) for cid, r in replies.items() if key in r.metrics}

    def run_round(self, rnd: int, state: ServerState, executor) -> tuple[ServerState, dict]:
        p = self.params
        sources = self.sample_clients(rnd, self.federation.source_ids)
        last = self.source_stages()[-1]
        tid = self.target_id
        metrics: dict[str, Any] = {}
        replies = executor.run({cid: Instruction("fit", state["weights"], self.stage_config(rnd, cid, "fit", last)) for cid in sources})
        metrics["train_loss"] = {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}
        final = replies
        if p.adversarial:
            seed = self.client_seed(rnd, tid, "features")
            target = executor.run({tid: Instruction("features", {}, {"seed": seed, "round": rnd})})[tid]
            payload = {TARGET_FEATURES: target.tensors["features"]}  # one dict for every source: serialized once
            replies = executor.run(
                {cid: Instruction("adversarial", payload, self.stage_config(rnd, cid, "adversarial", last)) for cid in sources}
            )
            gradients = {str(cid): r.tensors[FEATURE_GRAD] for cid, r in replies.items()}
            aligned = executor.run({tid: Instruction("align", gradients, {"seed": seed, "round": rnd})})[tid]
            metrics["domain_identifier_accuracy"] = self.per_source(replies, "domain_identifier_accuracy")
            metrics["mean_domain_identifier_accuracy"] = float(np.mean(list(metrics["domain_identifier_accuracy"].values())))
            metrics["confusion_loss"] = self.per_source(replies, "confusion_loss")
            metrics["target_confusion_loss"] = self.per_source(replies, "target_confusion_loss")
            metrics["target_feature_grad_norm"] = aligned.metrics["feature_grad_norm"]
            final = replies
        if p.disentangle:
            replies = executor.run(
                {cid: Instruction("disentangle", {}, self.stage_config(rnd, cid, "disentangle", last)) for cid in sources}
            )
            for key in ("mine_estimate", "class_identifier_accuracy", "class_identifier_entropy", "reconstruction_loss"):
                metrics[key] = self.per_source(replies, key)
            metrics["mean_mine_estimate"] = float(np.mean(list(metrics["mine_estimate"].values())))
            final = replies
        deltas = {f"{cid}:{name[len(DELTA):]}": t for cid, r in final.items() for name, t in r.tensors.items() if name.startswith(DELTA)}
        update_config = {"seed": self.client_seed(rnd, tid, "update"), "round": rnd, "sources": [int(c) for c in sources]}
        updated = executor.run({tid: Instruction("update", deltas, update_config)})[tid]
        metrics["attention"] = {self.labels[cid]: updated.metrics[f"attention:{cid}"] for cid in sources}
        if p.attention:
            metrics["gap_statistic"] = updated.metrics["gap_statistic"]
            metrics["gap_gain"] = {self.labels[cid]: updated.metrics[f"gap_gain:{cid}"] for cid in sources}
        return {**state, "weights": dict(updated.tensors)}, metrics

    def configure_evaluate(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        empty: dict = {}  # each client evaluates its own model: nothing to send
        return {cid: Instruction("evaluate", empty, {"round": rnd}) for cid in self.federation.client_ids}

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        state: dict[str, Any] = {"net": self.build_net()}
        if not data.is_target:
            p = self.params
            torch.manual_seed(derive_seed(self.config.run.seed, "fada-parts", data.client_id))
            width = feature_width(state["net"].encoder, self.federation.input_shape)
            state["parts"] = SourceParts(width, self.federation.num_classes, p.parts_hidden, p.identifier_hidden).to(self.device)
            state["mine"] = MINELoss(p.mine_rate).to(self.device)
            state["mine_optimizer"] = torch.optim.Adam(state["parts"].statistics.parameters(), lr=p.mine_lr)
        return state
