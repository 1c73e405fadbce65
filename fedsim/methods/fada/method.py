"""FADA: Federated Adversarial Domain Adaptation (Peng, Huang, Zhu & Saenko, ICLR 2020, Alg. 1).

Every client keeps its own model (:class:`fedsim.methods.fada.networks.FADANet`: generator G, invariant
branch of the disentangler D, classifier C): sources G_i/C_i, the target G_t/C_t. A round runs the
stages of Alg. 1 in its order, each one ``ctx.call``; the switches ``attention``, ``adversarial`` and
``disentangle`` give the paper's models I (attention), II (I + adversarial), III (II + disentangle):

1. ``fit`` (sources): from the target model w_t, ``local_epochs`` of cross-entropy on G_i -> D_inv -> C_i.
2. Adversarial alignment (Sec. 3.2, Eq. 3), ``adversarial_steps`` alternations, each three exchanges:
   ``features`` (target): G_t's features of ``target_batch`` fresh seeded unlabeled inputs;
   ``adversarial`` (sources, one batch): the private domain identifier DI_i learns source vs target,
   G_i learns to confuse it, and the gradient of the confusion w.r.t. the target features goes back;
   ``align`` (target): one step of G_t along their mean. Only features and gradients travel.
3. ``disentangle`` (Sec. 3.3, Eq. 4-7; sources): D_i splits G_i's features into f_di (classified by
   C_i) and f_ds (a class identifier at maximal entropy, minimal mutual information with f_di by MINE,
   and f_di and f_ds rebuild G_i(x)); back-propagated into G_i (``disentangle_generator``; off: G_i fixed).
4. ``update`` (target, Sec. 3.1, Eq. 1-2): attention a_i = softmax(gain of the sources' deltas Delta_i = w_i - w_t
   on the target's invariant features / temperature), by ``gap_form`` (uniform with ``attention`` off:
   :mod:`fedsim.methods.fada.attention`); w_t <- w_t + sum_i a_i Delta_i goes to the server. With ``guard:
   consensus`` (fedsim's addition, off by default: :mod:`fedsim.methods.fada.guard`) the round's alignment is
   dropped when it lowers the target's agreement with the sources.

Each client evaluates its own model; ``target_accuracy`` is G_t/C_t's. The target never reads
``train.y``; its batch-norm statistics change only through the sources' deltas. Parameters and their defaults'
sources: :mod:`fedsim.methods.fada.params`; losses: :mod:`fedsim.methods.fada.losses`; networks:
:mod:`fedsim.methods.fada.networks`; deviations: ``docs/fada.md``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.losses import dann_schedule
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Method, Replies, ServerState, client_operation
from fedsim.methods.common.precision import autocast
from fedsim.methods.common.selection_hooks import ClassifierPredictor, selection_reply
from fedsim.methods.common.target_features import TARGET_FEATURES, encode_subset
from fedsim.methods.common.training import (
    encode_in_chunks,
    evaluate_model,
    load_numpy,
    make_optimizer,
    model_to_numpy,
    train_epochs,
)
from fedsim.methods.fada.attention import apply_deltas, delta_tensors, gather_deltas, split_deltas, weigh_sources
from fedsim.methods.fada.batches import labeled_batch, labeled_batches
from fedsim.methods.fada.exchanges import fada_exchanges
from fedsim.methods.fada.guard import GUARD_METRICS, consensus_guard, guard_inputs
from fedsim.methods.fada.losses import AdversarialAlignment, Disentanglement, MINELoss
from fedsim.methods.fada.networks import (
    FADANet,
    SourceParts,
    align_generator,
    build_fada_net,
    feature_width,
    preserved_buffers,
)
from fedsim.methods.fada.params import FADAParams
from fedsim.models import build_model
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed

FEATURE_GRAD = "feature_grad"  # a source's reply tensor in the adversarial stage: d(confusion)/d(target features)


@METHODS.register("fada")
class FADA(Method):
    """FADA (Peng et al. 2020): per-client models, dynamic attention, adversarial alignment, disentanglement."""

    Params = FADAParams
    privacy_exchanges = staticmethod(fada_exchanges)  # every reply used on its own, by the target or the sources
    transient_state_keys = ("alignment", "align_optimizer", "round_start")  # the adversarial stage's, within a round
    disclosed_state_keys = ("net",)  # each client's model is sent on purpose: w_t by the target, w_i - w_t by a source

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.check_setting(config, federation)
        self.target_id = federation.target_ids[0]
        many = config.data.clients_per_domain > 1  # metrics name sources by domain, or by domain and client
        self.labels = {c.client_id: f"{c.domain}-{c.client_id}" if many else c.domain for c in federation.clients}

    @classmethod
    def check_setting(cls, config, federation) -> None:
        if (count := len(federation.target_ids)) != 1:
            raise UserError(
                f"fada trains one target model on one target client, but the target domain has {count} clients: "
                "pass --clients-per-domain 1"
            )
        if getattr(config.model.options, "head", None) == "linear":
            raise UserError(
                "fada splits the model into a feature generator and a classifier, and a linear head leaves the "
                "generator no weights: pass --set model.head=mlp"
            )

    def build_net(self) -> FADANet:
        torch.manual_seed(derive_seed(self.config.run.seed, "model-init"))  # every client starts from the same weights
        base = build_model(self.config.model, self.federation.input_shape, self.federation.num_classes)
        return build_fada_net(base, self.federation.input_shape).to(self.device)

    def adversarial_weight(self, progress: float) -> float:
        """lambda of the confusion loss at training progress ``progress`` in [0, 1] (Ganin et al., JMLR 2016,
        Sec. 5.2.2 ramp)."""
        return self.params.lambda_adv * (dann_schedule(progress) if self.params.schedule == "dann" else 1.0)

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return {"weights": model_to_numpy(self.build_net())}  # the target model w_t, as the target client starts

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """Alg. 1: local classification, adversarial alignment, disentanglement, then dynamic attention on the
        target. The round's last stage on the sources sends their deltas."""
        p = self.params
        sources = self.sample_clients(ctx.round, self.federation.source_ids)
        last = "disentangle" if p.disentangle else "adversarial" if p.adversarial else "fit"
        replies = ctx.call("fit", state["weights"], sources, {"send_delta": last == "fit"})
        metrics: dict[str, Any] = {"train_loss": {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}}
        if p.adversarial:
            replies = self.adversarial_stage(ctx, sources, last == "adversarial", metrics)
        if p.disentangle:
            replies = ctx.call("disentangle", None, sources, {"send_delta": True})
            metrics.update({key: self.per_source(replies, key) for key in Disentanglement.METRICS})
            metrics["mean_mine_estimate"] = float(np.mean(list(metrics["mine_estimate"].values())))
        return {**state, "weights": self.attention_stage(ctx, sources, replies, metrics)}, metrics

    def per_source(self, replies: Replies, key: str) -> dict[str, float]:
        return {self.labels[cid]: float(r.metrics[key]) for cid, r in replies.items() if key in r.metrics}

    def adversarial_stage(self, ctx, sources: list[int], send_delta: bool, metrics: dict) -> Replies:
        """Sec. 3.2 (Eq. 3): per alternation, fresh target features go to the sources; the mean of their gradients
        of the confusion w.r.t. those features moves G_t."""
        tid, steps, norms = self.target_id, self.params.adversarial_steps, []
        for step in range(1, steps + 1):
            seed = derive_seed(ctx.seed(tid, "features"), step)  # the inputs of this step's features, for align
            target = ctx.call("features", None, [tid], seed=seed)[tid]
            payload = {TARGET_FEATURES: target.tensors["features"]}  # one dict for every source: serialized once
            values = {"step": step, "send_delta": send_delta and step == steps}
            replies = ctx.call("adversarial", payload, sources, values)
            gradients = {str(cid): r.tensors[FEATURE_GRAD] for cid, r in replies.items()}
            aligned = ctx.call("align", gradients, [tid], {"step": step}, seed=seed)[tid]
            norms.append(aligned.metrics["feature_grad_norm"])
        for key in ("domain_identifier_accuracy", "confusion_loss", "target_confusion_loss"):
            metrics[key] = self.per_source(replies, key)  # means over the round's steps (the target's: the last step)
        accuracies = list(metrics["domain_identifier_accuracy"].values())
        metrics["mean_domain_identifier_accuracy"] = float(np.mean(accuracies))
        metrics["target_feature_grad_norm"] = float(np.mean(norms))
        return replies

    def attention_stage(self, ctx, sources: list[int], replies: Replies, metrics: dict) -> dict:
        """Sec. 3.1: the sources' deltas go to the target, which weighs them; returns the new target model."""
        tid, p = self.target_id, self.params
        # the guard drops the alignment when the domain identifiers won the round
        won = p.adversarial and metrics["mean_domain_identifier_accuracy"] >= p.guard_identifier_accuracy
        values = {"sources": [int(c) for c in sources], "identifiers_won": bool(won)}
        updated = ctx.call("update", gather_deltas(replies), [tid], values)[tid]
        metrics["attention"] = {self.labels[cid]: updated.metrics[f"attention:{cid}"] for cid in sources}
        metrics.update({key: updated.metrics[key] for key in GUARD_METRICS if key in updated.metrics})
        if p.attention:  # gap_statistic: the dispersion I, its share or Tibshirani's Gap of w_t
            metrics["gap_statistic"] = updated.metrics["gap_statistic"]
            metrics["gap_gain"] = {self.labels[cid]: updated.metrics[f"gap_gain:{cid}"] for cid in sources}
        return dict(updated.tensors)

    def evaluation_tensors(self, state: ServerState) -> None:
        return None  # each client evaluates its own model: nothing is sent

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        state: dict[str, Any] = {"net": self.build_net()}
        if not data.is_target:
            p = self.params
            torch.manual_seed(derive_seed(self.config.run.seed, "fada-parts", data.client_id))
            width = feature_width(state["net"].encoder, self.federation.input_shape)
            parts = SourceParts(width, self.federation.num_classes, p.parts_hidden, p.identifier_hidden).to(self.device)
            mine_optimizer = torch.optim.Adam(parts.statistics.parameters(), lr=p.mine_lr)  # kept across rounds
            state.update(parts=parts, mine=MINELoss(p.mine_rate).to(self.device), mine_optimizer=mine_optimizer)
        return state

    @staticmethod
    def require(data: ClientData, operation: str, target: bool) -> None:
        """Check the client's role (never train.y: the target's labels are not read, not even to test them)."""
        if data.is_target != target:
            where = "runs on the target client only" if target else "trains on labels: it runs on source clients only"
            raise ValueError(f"FADA operation {operation!r} {where}")

    def source_reply(self, instruction: Instruction, state: Any, data: ClientData, tensors: dict, metrics: dict):
        """The stage's reply; the last stage of the round adds Delta_i = w_i - w_t, per named tensor."""
        if instruction.values["send_delta"]:
            tensors.update(delta_tensors(state["start"], model_to_numpy(state["net"])))
        return Reply(data.client_id, tensors, metrics, num_examples=len(data.train))

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source: start from the target model, local epochs of cross-entropy on G_i, D_inv, C_i."""
        self.require(data, "fit", target=False)
        net, method = state["net"], instruction.local
        load_numpy(net, instruction.tensors)
        state["start"] = {name: np.array(value, copy=True) for name, value in instruction.tensors.items()}
        seed, optimizer = instruction.seed, make_optimizer(net, method)
        loss = train_epochs(net, data.train, method.local_epochs, method.batch_size, optimizer, seed, self.device)
        return self.source_reply(instruction, state, data, {}, {"train_loss": loss}), state

    @client_operation
    def features(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target: G_t's features of a seeded subset of its unlabeled inputs (target batch statistics)."""
        self.require(data, "features", target=True)
        net, chunk = state["net"], instruction.local.batch_size
        with preserved_buffers(net):
            x, count, seed = data.train.x, self.params.target_batch, instruction.seed
            encoded = encode_subset(net, x, count, seed, self.device, chunk=chunk, batch_statistics=True)
        metrics = {"num_features": float(len(encoded))}
        return Reply(data.client_id, {"features": encoded}, metrics, num_examples=len(encoded)), state

    @client_operation
    def adversarial(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source, one alternation on one batch (Eq. 3): DI_i learns source vs target features, then G_i confuses
        it; returns d(confusion)/d(target features). The optimizers live from step 1 to the last step."""
        self.require(data, "adversarial", target=False)
        p, net = self.params, state["net"]
        method, step, seed = instruction.local, instruction.values["step"], instruction.seed
        if step == 1:
            di = state["parts"].domain_identifier
            state["alignment"] = AdversarialAlignment(net, di, make_optimizer(di, method), make_optimizer(net, method))
        alignment = state["alignment"]
        target = torch.tensor(np.asarray(instruction.tensors[TARGET_FEATURES]), device=self.device)  # a copy
        weight = self.adversarial_weight((instruction.round - 1 + step / p.adversarial_steps) / self.config.run.rounds)
        draw = torch.Generator().manual_seed(seed)
        batch = labeled_batch(data.train, method.batch_size, p.adversarial_steps, step - 1, draw, self.device)
        pick = torch.Generator().manual_seed(derive_seed(seed, step, "target-batch"))  # the target rows it meets
        with autocast(self.device):
            gradient, metrics = alignment.alternate(batch, weight, target, pick)
        if step == p.adversarial_steps:
            del state["alignment"]
        return self.source_reply(instruction, state, data, {FEATURE_GRAD: gradient}, metrics), state

    @client_operation
    def align(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target: one step of G_t along the sources' mean gradient of the confusion loss w.r.t. its features."""
        self.require(data, "align", target=True)
        net, count, method, step = state["net"], self.params.target_batch, instruction.local, instruction.values["step"]
        if step == 1:
            state["align_optimizer"] = make_optimizer(net.encoder, method)  # G_t's, kept through the round's steps
            state["round_start"] = model_to_numpy(net)  # w_t before the alignment, for the consensus guard
        gradients, optimizer = instruction.tensors, state["align_optimizer"]
        with autocast(self.device):
            norm = align_generator(
                net, data.train.x, gradients, count, instruction.seed, optimizer, method.batch_size, self.device
            )
        if step == self.params.adversarial_steps:
            del state["align_optimizer"]
        return Reply(data.client_id, {}, {"feature_grad_norm": norm}, num_examples=len(data.train)), state

    @client_operation
    def disentangle(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source: Eq. 4 (cross-entropy on both parts), Eq. 5 (entropy), Eq. 6 (MINE), Eq. 7 (reconstruction)."""
        self.require(data, "disentangle", target=False)
        p, net, parts = self.params, state["net"], state["parts"]
        method = instruction.local
        objective = Disentanglement(
            *(net, parts, state["mine"], state["mine_optimizer"], p.disentangle_optimizers(method)),
            *(p.lambda_entropy, p.lambda_mi, p.lambda_recon, p.disentangle_generator),
        )
        generator = torch.Generator().manual_seed(instruction.seed)  # the batches and the MINE pairings
        fixed = contextlib.nullcontext() if p.disentangle_generator else preserved_buffers(net)  # G_i's statistics
        with fixed, autocast(self.device):
            for xb, yb in labeled_batches(data.train, method.batch_size, p.disentangle_steps, generator, self.device):
                objective.step(xb, yb, generator)
        return self.source_reply(instruction, state, data, {}, objective.metrics()), state

    @client_operation
    def update(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target (Sec. 3.1, Eq. 1-2): attention a_i from the gains of w_t + Delta_i over w_t (uniform: ``attention``
        off), w_t <- w_t + sum_i a_i Delta_i, or w_start + sum_i a_i Delta_i by the :func:`consensus_guard`."""
        self.require(data, "update", target=True)
        p, net, seed, start = self.params, state["net"], instruction.seed, state.pop("round_start", None)
        current, sources = model_to_numpy(net), [int(c) for c in instruction.values["sources"]]
        deltas = split_deltas(instruction.tensors, sources, list(current))
        k = p.gap_clusters or self.federation.num_classes
        gap = (p.gap_samples, k, p.gap_references, p.attention_temperature, p.gap_form) if p.attention else None
        encode = lambda w, inputs: self.outputs(net, w, inputs, net.invariant_features)  # noqa: E731
        weights, metrics = weigh_sources(encode, current, deltas, data.train.x, sources, seed, gap)
        updated, guarded = apply_deltas(current, deltas, weights), {}
        if p.guard == "consensus" and start is not None:  # inert without an alignment (model I)
            inputs = guard_inputs(data.train.x, p.gap_samples, derive_seed(seed, "consensus-guard"))
            predict, won = lambda w, x: self.outputs(net, w, x, net), bool(instruction.values["identifiers_won"])
            updated, guarded = consensus_guard(predict, start, current, deltas, weights, inputs, won)
        load_numpy(net, updated)
        return Reply(data.client_id, model_to_numpy(net), {**metrics, **guarded}, num_examples=len(data.train)), state

    @torch.no_grad()
    def outputs(self, net: FADANet, weights, x: np.ndarray, part) -> np.ndarray:
        """``part`` (D_inv(G(x)), or the logits with ``net`` itself) of the model with ``weights``, in eval mode."""
        load_numpy(net, weights)
        net.eval()
        return encode_in_chunks(part, x, self.device).numpy()

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Each client evaluates its own model on its labeled test part (target: G_t/C_t); the selection statistics
        are that model's too (features: G's, ``FADANet.features``)."""
        reply = Reply(data.client_id, {}, evaluate_model(state["net"], data.test, self.device), len(data.test))
        predictor = ClassifierPredictor(state["net"], self.device)
        return selection_reply(self.selection_scores, instruction, data, reply, {"": predictor}), state
