"""FADA: Federated Adversarial Domain Adaptation (Peng, Huang, Zhu & Saenko, ICLR 2020, Alg. 1).

Every client keeps its own model (:class:`fedsim.models.fada_parts.FADANet`: generator G, invariant
branch of the disentangler D, classifier C): sources G_i/C_i, the target G_t/C_t. One round runs these
stages in the order of Alg. 1, each one ``ctx.call`` (the switches ``attention``, ``adversarial``,
``disentangle`` give the paper's ablations: model I = attention, II = I + adversarial, III = II + disentangle):

1. ``fit`` (sources): load the target model w_t (each round starts from it, as FedAvg starts from the
   global model), ``local_epochs`` of cross-entropy on G_i -> D_inv -> C_i.
2. adversarial alignment (Sec. 3.2, Eq. 3), if ``adversarial``: ``features`` (target): G_t's features
   of a seeded subset of ``target_batch`` unlabeled inputs; ``adversarial`` (each source): the private
   domain identifier DI_i learns source (1) vs target (0) features, then G_i is trained to confuse it
   (cross-entropy to 1/2); the source sends back the gradient of the confusion loss with respect to the
   received target features; ``align`` (target): one SGD step of G_t along the mean of those feature
   gradients (back-propagated through G_t on the same inputs). Only feature vectors and feature
   gradients cross the network.
3. ``disentangle`` (Sec. 3.3, Eq. 4-7), if ``disentangle`` (sources, G_i fixed): D_i splits G_i's
   features into f_di (classified by C_i) and f_ds; (a) C_i and the class identifier CI_i learn the
   labels from f_di and f_ds; (b) D_i's specific branch maximizes the entropy of CI_i(f_ds); (c) the
   MINE statistics network maximizes the bias-corrected bound on I(f_di; f_ds); (d) D_i minimizes that
   estimate plus the L2 reconstruction error of R_i([f_di, f_ds]) against G_i(x)
   (:class:`fedsim.losses.fada.Disentanglement`). D_i minimizes the positive part of the estimate:
   mutual information is never negative, and a D_i that pushes a fixed T's bound below zero only
   exploits T (measured on digits: the estimate ran to -9, then the weights to NaN).
4. ``update`` (target): dynamic attention (Sec. 3.1, :mod:`fedsim.methods.common.attention`). The
   sources' deltas Delta_i = w_i - w_t (from their last stage) go to the target, which computes the gap
   statistic (Tibshirani et al. 2001) of k-means on its invariant features before and after applying
   each Delta_i; the attention is softmax(gain_i / attention_temperature) (uniform with ``attention``
   off), and w_t <- w_t + sum_i a_i Delta_i. The target sends its new weights to the server, which
   sends them to the sources next round.

Evaluation: each client evaluates its own model (sources G_i/C_i after their local stages, the target
G_t/C_t); ``target_accuracy`` is the target model's. The target's training operations (``features``,
``align``, ``update``) never read ``train.y``: they only encode inputs. Batch-norm running statistics
of the target change only through the sources' deltas: the target-side forward passes in training
mode restore them afterwards.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from fedsim.data.base import ArraySplit, ClientData
from fedsim.errors import UserError
from fedsim.losses import dann_schedule
from fedsim.losses.fada import AdversarialAlignment, Disentanglement, MINELoss
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Method, Replies, ServerState, client_operation
from fedsim.methods.common.alignment import TARGET_FEATURES, encode_subset
from fedsim.methods.common.attention import apply_deltas, gap_gains, softmax
from fedsim.methods.common.training import (
    encode_in_chunks, evaluate_model, load_numpy, make_optimizer, minibatches, model_to_numpy, train_epochs,
)
from fedsim.models import build_model
from fedsim.models.fada_parts import FADANet, SourceParts, build_fada_net, feature_width, preserved_buffers
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed, numpy_rng

DELTA = "delta:"  # reply-tensor prefix of a source's model delta
FEATURE_GRAD = "feature_grad"


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


def batch_steps(count: int, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """``steps`` mini-batches (skipped batches of one counted) over consecutive shuffled epochs of
    :func:`~fedsim.methods.common.training.minibatches`, the last one cut short; one epoch when ``steps`` is 0."""
    per_epoch = -(-count // batch_size)
    left = steps or per_epoch
    while left > 0 and per_epoch > 0:
        yield from itertools.islice(minibatches(count, batch_size, generator), min(left, per_epoch))
        left -= per_epoch


def labeled_batches(split: ArraySplit, batch_size: int, steps: int, generator: torch.Generator, device) -> Iterator[tuple]:
    """(inputs, labels) on ``device`` for each index batch of :func:`batch_steps`."""
    x, y = torch.from_numpy(split.x), torch.from_numpy(split.y)
    for idx in batch_steps(len(x), batch_size, steps, generator):
        yield x[idx].to(device), y[idx].to(device)


@METHODS.register("fada")
class FADA(Method):
    """FADA: per-client models, dynamic attention, federated adversarial alignment, disentanglement (Peng et al. 2020)."""

    Params = FADAParams
    transient_state_keys = ()  # every client keeps its own model: nothing is a shared cache

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.check_setting(config, federation)
        self.target_id = federation.target_ids[0]
        many = config.data.clients_per_domain > 1
        self.labels = {c.client_id: f"{c.domain}-{c.client_id}" if many else c.domain for c in federation.clients}

    @classmethod
    def check_setting(cls, config, federation) -> None:
        if len(federation.target_ids) != 1:
            raise UserError(
                f"fada trains one target model on one target client, but the target domain has {len(federation.target_ids)} "
                "clients: pass --clients-per-domain 1"
            )

    def build_net(self) -> FADANet:
        torch.manual_seed(derive_seed(self.config.run.seed, "model-init"))  # every client starts from the same weights
        base = build_model(self.config.model, self.federation.input_shape, self.federation.num_classes)
        return build_fada_net(base, self.federation.input_shape).to(self.device)

    def adversarial_weight(self, progress: float) -> float:
        """lambda of the confusion loss at training progress ``progress`` in [0, 1] (Ganin et al., JMLR 2016, Sec. 5.2.2 ramp)."""
        scale = dann_schedule(progress) if self.params.schedule == "dann" else 1.0
        return self.params.lambda_adv * scale

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return {"weights": model_to_numpy(self.build_net())}  # the target model w_t, as the target client starts

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """Alg. 1: local classification, adversarial alignment, disentanglement, then dynamic attention on the target."""
        p = self.params
        sources = self.sample_clients(ctx.round, self.federation.source_ids)
        last = "disentangle" if p.disentangle else "adversarial" if p.adversarial else "fit"  # sends the deltas
        replies = ctx.call("fit", state["weights"], sources, {"send_delta": last == "fit"})
        metrics: dict[str, Any] = {"train_loss": {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}}
        if p.adversarial:
            replies = self.adversarial_stage(ctx, sources, last == "adversarial", metrics)
        if p.disentangle:
            replies = ctx.call("disentangle", None, sources, {"send_delta": True})
            for key in Disentanglement.METRICS:
                metrics[key] = self.per_source(replies, key)
            metrics["mean_mine_estimate"] = float(np.mean(list(metrics["mine_estimate"].values())))
        return {**state, "weights": self.attention_stage(ctx, sources, replies, metrics)}, metrics

    def per_source(self, replies: Replies, key: str) -> dict[str, float]:
        return {self.labels[cid]: float(r.metrics[key]) for cid, r in replies.items() if key in r.metrics}

    def adversarial_stage(self, ctx, sources: list[int], send_delta: bool, metrics: dict) -> Replies:
        """Sec. 3.2: the target's features go to the sources; the mean of their feature gradients moves G_t."""
        tid = self.target_id
        target = ctx.call("features", None, [tid])[tid]
        payload = {TARGET_FEATURES: target.tensors["features"]}  # one dict for every source: serialized once
        replies = ctx.call("adversarial", payload, sources, {"send_delta": send_delta})
        gradients = {str(cid): r.tensors[FEATURE_GRAD] for cid, r in replies.items()}
        aligned = ctx.call("align", gradients, [tid], {"seed": ctx.seed(tid, "features")})[tid]  # the features' inputs
        metrics["domain_identifier_accuracy"] = self.per_source(replies, "domain_identifier_accuracy")
        metrics["mean_domain_identifier_accuracy"] = float(np.mean(list(metrics["domain_identifier_accuracy"].values())))
        metrics["confusion_loss"] = self.per_source(replies, "confusion_loss")
        metrics["target_confusion_loss"] = self.per_source(replies, "target_confusion_loss")
        metrics["target_feature_grad_norm"] = aligned.metrics["feature_grad_norm"]
        return replies

    def attention_stage(self, ctx, sources: list[int], replies: Replies, metrics: dict) -> dict:
        """Sec. 3.1: the sources' deltas go to the target, which weighs them; returns the new target model."""
        tid = self.target_id
        deltas = {f"{cid}:{name[len(DELTA):]}": t for cid, r in replies.items() for name, t in r.tensors.items() if name.startswith(DELTA)}
        updated = ctx.call("update", deltas, [tid], {"sources": [int(c) for c in sources]})[tid]
        metrics["attention"] = {self.labels[cid]: updated.metrics[f"attention:{cid}"] for cid in sources}
        if self.params.attention:
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
            state["parts"] = SourceParts(width, self.federation.num_classes, p.parts_hidden, p.identifier_hidden).to(self.device)
            state["mine"] = MINELoss(p.mine_rate).to(self.device)
            state["mine_optimizer"] = torch.optim.Adam(state["parts"].statistics.parameters(), lr=p.mine_lr)
        return state

    @staticmethod
    def require_source(data: ClientData, operation: str) -> None:
        if data.is_target:  # the role, never train.y: the target's labels are not read, not even to test them
            raise ValueError(f"FADA operation {operation!r} trains on labels: it runs on source clients only")

    @staticmethod
    def require_target(data: ClientData, operation: str) -> None:
        if not data.is_target:
            raise ValueError(f"FADA operation {operation!r} runs on the target client only")

    def source_reply(self, instruction: Instruction, state: Any, data: ClientData, tensors: dict, metrics: dict) -> Reply:
        """The stage's reply; the last stage of the round adds Delta_i = w_i - w_t, per named tensor."""
        if instruction.config.get("send_delta"):
            start = state["start"]
            for name, value in model_to_numpy(state["net"]).items():
                tensors[DELTA + name] = value - start[name]
        return Reply(data.client_id, tensors, metrics, num_examples=len(data.train))

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source: start from the target model, local epochs of cross-entropy on G_i, D_inv, C_i."""
        self.require_source(data, "fit")
        net, method = state["net"], self.config.method
        load_numpy(net, instruction.tensors)
        state["start"] = {name: np.array(value, copy=True) for name, value in instruction.tensors.items()}
        optimizer = make_optimizer(net, method)
        loss = train_epochs(net, data.train, method.local_epochs, method.batch_size, optimizer, instruction.config["seed"], self.device)
        return self.source_reply(instruction, state, data, {}, {"train_loss": loss}), state

    @client_operation
    def features(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target: G_t's features of a seeded subset of its unlabeled inputs (target batch statistics)."""
        self.require_target(data, "features")
        net = state["net"]
        with preserved_buffers(net):
            encoded = encode_subset(
                net, data.train.x, self.params.target_batch, instruction.config["seed"], self.device,
                chunk=self.config.method.batch_size, batch_statistics=True,
            )
        return Reply(data.client_id, {"features": encoded}, {"num_features": float(len(encoded))}, num_examples=len(encoded)), state

    @client_operation
    def adversarial(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source: DI_i learns source vs target features, then G_i confuses it (Eq. 3); returns d(confusion)/d(target features).

        Alg. 1 alternates a classification step and an alignment step on each mini-batch; here the
        alignment runs as its own stage, so G_i's step keeps the classification loss of the same source
        batch (cross-entropy + lambda_adv * confusion, on G_i, D_inv, C_i). Without it a pass of pure
        confusion steps erased the classifier (digits: source accuracy fell to chance).
        """
        self.require_source(data, "adversarial")
        p, method, seed = self.params, self.config.method, instruction.config["seed"]
        net, identifier = state["net"], state["parts"].domain_identifier
        target = torch.tensor(np.asarray(instruction.tensors[TARGET_FEATURES]), device=self.device)  # a copy: read-only arrays
        alignment = AdversarialAlignment(
            net, identifier, make_optimizer(identifier, method), make_optimizer(net, method), target,
            torch.Generator().manual_seed(derive_seed(seed, "target-batch")),
        )
        net.train()
        identifier.train()
        rnd, rounds = instruction.config["round"], self.config.run.rounds
        steps = p.adversarial_steps or -(-len(data.train) // method.batch_size)
        batches = labeled_batches(data.train, method.batch_size, p.adversarial_steps, torch.Generator().manual_seed(seed), self.device)
        for step, (xb, yb) in enumerate(batches, start=1):
            alignment.step(xb, yb, self.adversarial_weight((rnd - 1 + step / steps) / rounds))
        gradient, target_confusion = alignment.target_gradient(self.adversarial_weight(rnd / rounds))
        metrics = {**alignment.metrics(), "target_confusion_loss": target_confusion}
        tensors = {FEATURE_GRAD: gradient.cpu().numpy().astype(np.float32)}
        return self.source_reply(instruction, state, data, tensors, metrics), state

    @client_operation
    def align(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target: one SGD step of G_t along the sources' mean gradient of the confusion loss w.r.t. its features.

        Chunk by chunk of ``method.batch_size`` rows, as ``features`` encoded them (the same batch
        statistics), each chunk back-propagated as it is encoded: the gradients accumulate in that order.
        """
        self.require_target(data, "align")
        net, method, x = state["net"], self.config.method, data.train.x
        ordered = [np.asarray(instruction.tensors[k]) for k in sorted(instruction.tensors, key=int)]
        gradient = torch.stack([torch.tensor(g, device=self.device) for g in ordered]).mean(0)
        count = min(self.params.target_batch, len(x))
        index = np.sort(numpy_rng(instruction.config["seed"]).choice(len(x), size=count, replace=False))  # as encode_subset
        if len(index) != len(gradient):
            raise ValueError(f"align got gradients for {len(gradient)} target features, expected {len(index)}")
        optimizer = make_optimizer(net.encoder, method)
        chunk = method.batch_size
        with preserved_buffers(net):
            net.train()
            optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(index), chunk):
                part = net.features(torch.from_numpy(x[index[start : start + chunk]]).to(self.device))
                (part * gradient[start : start + chunk]).sum().backward()
            optimizer.step()
        return Reply(data.client_id, {}, {"feature_grad_norm": float(gradient.norm())}, num_examples=len(index)), state

    @client_operation
    def disentangle(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source: Eq. 4 (cross-entropy on both parts), Eq. 5 (entropy), Eq. 6 (MINE), Eq. 7 (reconstruction); G_i fixed."""
        self.require_source(data, "disentangle")
        p, method = self.params, self.config.method
        net, parts = state["net"], state["parts"]
        optimizers = {
            "classify": make_optimizer([*net.invariant.parameters(), *net.head.parameters(), *parts.specific.parameters(),
                                        *parts.class_identifier.parameters()], method),
            "entropy": make_optimizer(parts.specific, method),
            "statistics": state["mine_optimizer"],  # Adam, kept across rounds: SGD at the task's rate made T diverge
            "disentangle": make_optimizer([*net.invariant.parameters(), *parts.specific.parameters(), *parts.reconstructor.parameters()], method),
        }
        objective = Disentanglement(net, parts, state["mine"], optimizers, p.lambda_entropy, p.lambda_mi, p.lambda_recon)
        generator = torch.Generator().manual_seed(instruction.config["seed"])  # the batches and the MINE pairings
        sums = dict.fromkeys(Disentanglement.METRICS, 0.0)
        batches = 0
        net.train()
        parts.train()
        with preserved_buffers(net):
            for xb, yb in labeled_batches(data.train, method.batch_size, p.disentangle_steps, generator, self.device):
                with torch.no_grad():
                    generated = net.features(xb)
                permutation = torch.randperm(len(xb), generator=generator).to(self.device)
                for key, value in objective.step(generated, yb, permutation).items():
                    sums[key] += value
                batches += 1
        metrics = {k: v / batches if batches else float("nan") for k, v in sums.items()}
        return self.source_reply(instruction, state, data, {}, metrics), state

    @client_operation
    def update(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target: dynamic attention over the sources' deltas from gap-statistic gains, then w_t += sum_i a_i Delta_i."""
        self.require_target(data, "update")
        p, net, x = self.params, state["net"], data.train.x
        sources = [int(c) for c in instruction.config["sources"]]
        current = model_to_numpy(net)
        deltas = [{name: np.asarray(instruction.tensors[f"{cid}:{name}"]) for name in current} for cid in sources]
        metrics: dict[str, float] = {}
        if p.attention:
            seed = instruction.config["seed"]
            rng = numpy_rng(seed)
            inputs = x[np.sort(rng.choice(len(x), size=min(p.gap_samples, len(x)), replace=False))]
            k = p.gap_clusters or self.federation.num_classes
            encode = lambda weights: self.invariant_features(net, weights, inputs)  # noqa: E731
            before, gains = gap_gains(encode, current, deltas, k, p.gap_references, rng, seed)
            metrics.update({f"gap_gain:{cid}": gain for cid, gain in zip(sources, gains)})
            metrics["gap_statistic"] = before
            weights = softmax(np.asarray(gains), p.attention_temperature)
        else:
            weights = np.full(len(sources), 1.0 / len(sources))
        metrics.update({f"attention:{cid}": float(w) for cid, w in zip(sources, weights)})
        load_numpy(net, apply_deltas(current, deltas, weights))
        return Reply(data.client_id, model_to_numpy(net), metrics, num_examples=len(data.train)), state

    @torch.no_grad()
    def invariant_features(self, net: FADANet, weights, x: np.ndarray) -> np.ndarray:
        """D_inv(G(x)) of the model with ``weights``, in eval mode."""
        load_numpy(net, weights)
        net.eval()
        return encode_in_chunks(net.invariant_features, x, self.device).numpy()

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Each client evaluates its own model on its labeled test part (target: G_t/C_t)."""
        return Reply(data.client_id, {}, evaluate_model(state["net"], data.test, self.device), num_examples=len(data.test)), state
