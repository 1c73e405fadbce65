"""FADA's client operations (Peng, Huang, Zhu & Saenko, ICLR 2020, Alg. 1) and their helpers.

The sources' ``fit``, ``adversarial`` (Sec. 3.2, Eq. 3) and ``disentangle``
(Sec. 3.3, Eq. 4-7) stages, the target's ``features``, ``align`` and ``update``
(dynamic attention, Sec. 3.1) stages, and ``evaluate``. :mod:`fedsim.methods.fada`
describes the round and holds the method (its server half and client set-up).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ClientData
from fedsim.losses import dann_schedule
from fedsim.losses.fada import (
    domain_accuracy,
    domain_confusion_loss,
    domain_identifier_loss,
    entropy,
    mine_lower_bound,
    reconstruction_loss,
)
from fedsim.messages import Instruction, Reply
from fedsim.methods._fada_gap import gap_statistic, softmax
from fedsim.methods._feature_alignment import TARGET_FEATURES, encode_subset
from fedsim.methods.base import Method
from fedsim.methods.common.training import evaluate_model, load_numpy, model_to_numpy, train_epochs
from fedsim.models.fada_parts import FADANet
from fedsim.seeding import derive_seed, numpy_rng

DELTA = "delta:"  # reply-tensor prefix of a source's model delta
FEATURE_GRAD = "feature_grad"


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


class FADAClientStages(Method):
    """The client half of :class:`fedsim.methods.fada.FADA`: one method per stage (an executor operation)."""

    def adversarial_weight(self, progress: float) -> float:
        """lambda of the confusion loss at training progress ``progress`` in [0, 1] (Ganin et al., JMLR 2016, Sec. 5.2.2 ramp)."""
        scale = dann_schedule(progress) if self.params.schedule == "dann" else 1.0
        return self.params.lambda_adv * scale

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
