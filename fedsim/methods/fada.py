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

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.losses import dann_schedule
from fedsim.losses.fada import (
    MINELoss,
    domain_accuracy,
    domain_confusion_loss,
    domain_identifier_loss,
    entropy,
    mine_lower_bound,
    reconstruction_loss,
)
from fedsim.messages import Instruction, Reply
from fedsim.methods._feature_alignment import TARGET_FEATURES, encode_subset
from fedsim.methods.base import Method, ServerState
from fedsim.methods.training import evaluate_model, load_numpy, model_to_numpy, train_epochs
from fedsim.models import build_model
from fedsim.models.fada_parts import FADANet, SourceParts, build_fada_net, feature_width
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


# ----------------------------------------------------------------------------- gap statistic


def kmeans_log_inertia(points: np.ndarray, k: int, seed: int) -> float:
    """log W_k: W_k = sum_r D_r / (2 n_r) is the k-means within-cluster sum of squares (Tibshirani et al. 2001, Eq. 2)."""
    from sklearn.cluster import KMeans

    k = max(1, min(int(k), len(points)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer distinct points than clusters: inertia 0, floored below
        inertia = KMeans(n_clusters=k, n_init=1, max_iter=100, random_state=seed % (1 << 31)).fit(points).inertia_
    return float(np.log(max(inertia, 1e-12)))


def gap_statistic(features: np.ndarray, k: int, uniform: np.ndarray, seed: int) -> float:
    """Gap_n(k) = mean_b log W*_kb - log W_k (Tibshirani et al. 2001, Eq. 3).

    Reference sets by their method (b): uniform over the box aligned with the
    principal components of the centered features (X = U D V^T, ranges of X V,
    back-transformed by V^T). ``uniform`` holds B draws U[0, 1) of shape
    (B, n, d), scaled here to that box. Larger = the features cluster better
    than uniform noise over the same box. Method (b) rather than the
    axis-aligned box (a): on digits, (a) gave the sparse, partly collapsed
    ReLU features of an untrained source the largest gain by far (attention
    0.75 on a source at chance accuracy), (b) much less.
    """
    from threadpoolctl import threadpool_limits

    points = np.asarray(features, dtype=np.float64)
    if points.ndim != 2 or uniform.shape[1:] != points.shape:
        raise ValueError(f"gap_statistic needs n x d features and B x n x d draws, got {points.shape} and {uniform.shape}")
    with threadpool_limits(1):  # one thread: the same sums on every backend (entering it costs ~0.1 s: once per gap)
        centered = points - points.mean(0)
        _, _, vt = np.linalg.svd(centered, full_matrices=False)
        rotated = centered @ vt.T
        low, high = rotated.min(0), rotated.max(0)
        reference = [kmeans_log_inertia((low + u[:, : len(low)] * (high - low)) @ vt, k, seed) for u in uniform]
        return float(np.mean(reference) - kmeans_log_inertia(centered, k, seed))


def softmax(values: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(values, dtype=np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


# ----------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def preserved_buffers(model: nn.Module) -> Iterator[None]:
    """Restore the buffers (batch-norm running statistics) after training-mode forward passes."""
    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(saved[name])


def batch_indices(n: int, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """``steps`` mini-batches of a seeded shuffle (one pass when steps == 0), skipping batches of one sample."""
    wanted = steps if steps > 0 else -(-n // batch_size)
    done = 0
    while done < wanted:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            if done >= wanted:
                return
            done += 1
            idx = order[start : start + batch_size]
            if len(idx) >= 2 or n < 2:  # batch norm needs two samples
                yield idx


def sgd(params, method_config) -> torch.optim.Optimizer:
    return torch.optim.SGD(list(params), lr=method_config.lr, momentum=method_config.momentum, weight_decay=method_config.weight_decay)


def as_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.tensor(np.asarray(array), device=device)  # a copy: object-store arrays are read-only


@METHODS.register("fada")
class FADA(Method):
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

    def adversarial_weight(self, progress: float) -> float:
        """lambda of the confusion loss at training progress ``progress`` in [0, 1] (Ganin et al., JMLR 2016, Sec. 5.2.2 ramp)."""
        scale = dann_schedule(progress) if self.params.schedule == "dann" else 1.0
        return self.params.lambda_adv * scale

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

    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source: start from the target model, local epochs of cross-entropy on G_i, D_inv, C_i."""
        self.require_source(data, "fit")
        net = state["net"]
        load_numpy(net, instruction.tensors)
        state["start"] = {name: np.array(value, copy=True) for name, value in instruction.tensors.items()}
        loss = train_epochs(
            net, data.train, self.config.method.local_epochs, self.config.method.batch_size,
            sgd(net.parameters(), self.config.method), seed=instruction.config["seed"], device=self.device,
        )
        return self.source_reply(instruction, state, data, {}, {"train_loss": loss}), state

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

    def adversarial(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source: DI_i learns source vs target features, then G_i confuses it (Eq. 3); returns d(confusion)/d(target features).

        Alg. 1 alternates a classification step and an alignment step on each
        mini-batch; here the alignment runs as its own stage, so G_i's step keeps
        the classification loss of the same source batch (cross-entropy +
        lambda_adv * confusion, on G_i, D_inv, C_i). Without it a pass of pure
        confusion steps erased the classifier (digits: source accuracy fell to chance).
        """
        self.require_source(data, "adversarial")
        p, method = self.params, self.config.method
        net, identifier = state["net"], state["parts"].domain_identifier
        target = as_tensor(instruction.tensors[TARGET_FEATURES], self.device)
        x = torch.from_numpy(data.train.x)
        seed = instruction.config["seed"]
        order_gen = torch.Generator().manual_seed(seed)
        target_gen = torch.Generator().manual_seed(derive_seed(seed, "target-batch"))
        y = torch.from_numpy(data.train.y)
        identifier_opt, generator_opt = sgd(identifier.parameters(), method), sgd(net.parameters(), method)
        cross_entropy = nn.CrossEntropyLoss()
        net.train()
        identifier.train()
        accuracies, confusions = [], []
        rnd, rounds = instruction.config["round"], self.config.run.rounds
        steps = p.adversarial_steps or -(-len(x) // method.batch_size)
        for step, idx in enumerate(batch_indices(len(x), method.batch_size, p.adversarial_steps, order_gen), start=1):
            weight = self.adversarial_weight((rnd - 1 + step / steps) / rounds)
            source = net.features(x[idx].to(self.device))
            picked = target[torch.randperm(len(target), generator=target_gen)[: len(idx)]]
            source_logits, target_logits = identifier(source.detach()), identifier(picked)
            identifier_opt.zero_grad(set_to_none=True)
            domain_identifier_loss(source_logits, target_logits).backward()
            identifier_opt.step()
            accuracies.append(domain_accuracy(source_logits, target_logits))
            identifier.requires_grad_(False)
            confusion = domain_confusion_loss(identifier(source))
            task = cross_entropy(net.head(net.invariant(source)), y[idx].to(self.device))
            generator_opt.zero_grad(set_to_none=True)
            (task + weight * confusion).backward()
            generator_opt.step()
            identifier.requires_grad_(True)
            confusions.append(float(confusion.detach()))
        features = target.clone().requires_grad_(True)
        target_confusion = domain_confusion_loss(identifier(features))
        (gradient,) = torch.autograd.grad(self.adversarial_weight(rnd / rounds) * target_confusion, features)
        metrics = {
            "domain_identifier_accuracy": float(np.mean(accuracies)) if accuracies else float("nan"),
            "confusion_loss": float(np.mean(confusions)) if confusions else float("nan"),
            "target_confusion_loss": float(target_confusion.detach()),
        }
        tensors = {FEATURE_GRAD: gradient.cpu().numpy().astype(np.float32)}
        return self.source_reply(instruction, state, data, tensors, metrics), state

    def align(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target: one SGD step of G_t along the sources' mean gradient of the confusion loss w.r.t. its features."""
        self.require_target(data, "align")
        net, method = state["net"], self.config.method
        gradient = torch.stack([as_tensor(instruction.tensors[k], self.device) for k in sorted(instruction.tensors, key=int)]).mean(0)
        count = min(self.params.target_batch, len(data.train.x))
        index = np.sort(numpy_rng(instruction.config["seed"]).choice(len(data.train.x), size=count, replace=False))  # as in features
        if len(index) != len(gradient):
            raise ValueError(f"align got gradients for {len(gradient)} target features, expected {len(index)}")
        optimizer = sgd(net.encoder.parameters(), method)
        chunk = method.batch_size
        with preserved_buffers(net):
            net.train()
            optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(index), chunk):  # the same chunks as ``features``: the same batch statistics
                part = net.features(torch.from_numpy(data.train.x[index[start : start + chunk]]).to(self.device))
                (part * gradient[start : start + chunk]).sum().backward()
            optimizer.step()
        return Reply(data.client_id, {}, {"feature_grad_norm": float(gradient.norm())}, num_examples=len(index)), state

    def disentangle(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source: Eq. 4 (cross-entropy on both parts), Eq. 5 (entropy), Eq. 6 (MINE), Eq. 7 (reconstruction); G_i fixed."""
        self.require_source(data, "disentangle")
        p, method = self.params, self.config.method
        net, parts, mine = state["net"], state["parts"], state["mine"]
        x, y = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y)
        gen = torch.Generator().manual_seed(instruction.config["seed"])
        classify_opt = sgd(
            [*net.invariant.parameters(), *net.head.parameters(), *parts.specific.parameters(), *parts.class_identifier.parameters()], method
        )
        entropy_opt = sgd(parts.specific.parameters(), method)
        statistics_opt = state["mine_optimizer"]  # Adam, kept across rounds: SGD at the task's rate made T diverge
        disentangle_opt = sgd([*net.invariant.parameters(), *parts.specific.parameters(), *parts.reconstructor.parameters()], method)
        cross_entropy = nn.CrossEntropyLoss()

        def step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
            net.zero_grad(set_to_none=True)
            parts.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        sums = {"mine_estimate": 0.0, "class_identifier_accuracy": 0.0, "class_identifier_entropy": 0.0, "reconstruction_loss": 0.0}
        batches = 0
        net.train()
        parts.train()
        with preserved_buffers(net):
            for idx in batch_indices(len(x), method.batch_size, p.disentangle_steps, gen):
                xb, yb = x[idx].to(self.device), y[idx].to(self.device)
                with torch.no_grad():
                    generated = net.features(xb)
                # Eq. 4: C_i on the invariant part and CI_i on the specific part learn the labels
                ci_logits = parts.class_identifier(parts.specific(generated))
                step(classify_opt, cross_entropy(net.head(net.invariant(generated)), yb) + cross_entropy(ci_logits, yb))
                # Eq. 5: the specific branch makes CI_i maximally uncertain
                ci_logits = parts.class_identifier(parts.specific(generated))
                step(entropy_opt, -p.lambda_entropy * entropy(ci_logits))
                # Eq. 6: T maximizes the bias-corrected MINE bound on I(f_di; f_ds)
                invariant, specific = net.invariant(generated), parts.specific(generated)
                permutation = torch.randperm(len(idx), generator=gen).to(self.device)
                joint, marginal = parts.mine_scores(invariant.detach(), specific.detach(), permutation)
                step(statistics_opt, -mine.surrogate(joint, marginal))
                # Eq. 6-7: D_i minimizes the MI estimate; R_i rebuilds G_i(x) from both parts
                parts.statistics.requires_grad_(False)
                joint, marginal = parts.mine_scores(invariant, specific, permutation)
                estimate = mine_lower_bound(joint, marginal)
                rebuilt = reconstruction_loss(parts.reconstruct(invariant, specific), generated)
                step(disentangle_opt, p.lambda_mi * torch.relu(estimate) + p.lambda_recon * rebuilt)
                parts.statistics.requires_grad_(True)
                with torch.no_grad():
                    sums["mine_estimate"] += float(estimate)
                    sums["class_identifier_accuracy"] += float((ci_logits.argmax(1) == yb).float().mean())
                    sums["class_identifier_entropy"] += float(entropy(ci_logits))
                    sums["reconstruction_loss"] += float(rebuilt)
                batches += 1
        metrics = {k: v / batches if batches else float("nan") for k, v in sums.items()}
        return self.source_reply(instruction, state, data, {}, metrics), state

    @torch.no_grad()
    def invariant_features(self, net: FADANet, x: np.ndarray, chunk: int = 512) -> np.ndarray:
        net.eval()
        parts = [net.invariant_features(torch.from_numpy(x[i : i + chunk]).to(self.device)).cpu() for i in range(0, len(x), chunk)]
        return torch.cat(parts).numpy()

    def update(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target: dynamic attention over the sources' deltas from gap-statistic gains, then w_t += sum_i a_i Delta_i."""
        self.require_target(data, "update")
        p = self.params
        net = state["net"]
        sources = [int(c) for c in instruction.config["sources"]]
        current = model_to_numpy(net)
        deltas = [{name: np.asarray(instruction.tensors[f"{cid}:{name}"]) for name in current} for cid in sources]
        metrics: dict[str, float] = {}
        if p.attention:
            seed = instruction.config["seed"]
            rng = numpy_rng(seed)
            count = min(p.gap_samples, len(data.train.x))
            inputs = data.train.x[np.sort(rng.choice(len(data.train.x), size=count, replace=False))]
            k = p.gap_clusters or self.federation.num_classes
            before_features = self.invariant_features(net, inputs)
            uniform = rng.random((p.gap_references, *before_features.shape))
            before = gap_statistic(before_features, k, uniform, seed)
            gains = []
            for cid, delta in zip(sources, deltas):
                load_numpy(net, self.apply(current, [delta], [1.0]))
                gain = gap_statistic(self.invariant_features(net, inputs), k, uniform, seed) - before
                gains.append(gain)
                metrics[f"gap_gain:{cid}"] = gain
            weights = softmax(np.asarray(gains), p.attention_temperature)
            metrics["gap_statistic"] = before
        else:
            weights = np.full(len(sources), 1.0 / len(sources))
        for cid, w in zip(sources, weights):
            metrics[f"attention:{cid}"] = float(w)
        load_numpy(net, self.apply(current, deltas, weights))
        return Reply(data.client_id, model_to_numpy(net), metrics, num_examples=len(data.train)), state

    @staticmethod
    def apply(current: dict[str, np.ndarray], deltas: list[dict[str, np.ndarray]], weights) -> dict[str, np.ndarray]:
        """current + sum_i w_i delta_i per named tensor (in float64; integer buffers rounded)."""
        out = {}
        for name, value in current.items():
            total = value.astype(np.float64) + sum(float(w) * d[name].astype(np.float64) for w, d in zip(weights, deltas))
            out[name] = (np.rint(total) if np.issubdtype(value.dtype, np.integer) else total).astype(value.dtype)
        return out

    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Each client evaluates its own model on its labeled test part (target: G_t/C_t)."""
        return Reply(data.client_id, {}, evaluate_model(state["net"], data.test, self.device), num_examples=len(data.test)), state
