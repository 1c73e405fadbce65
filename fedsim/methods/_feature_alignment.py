"""Feature alignment with an exchange of encoded target features (base of FedDANN and FedMMD).

One round has two exchanges (the federated DANN/MMD baselines of Peng et al.,
FADA, ICLR 2020):

1. ``features``: each target client encodes a seeded random subset of
   ``target_batch`` of its *unlabeled* training inputs with the global model's
   encoder and sends the feature vectors (never inputs, never labels).
2. ``fit``: every source client receives the global weights plus the
   concatenated target features (one shared tensor dict, serialized once) and
   runs E local epochs of

       cross_entropy(head(f_s), y_s) + lambda * domain_loss(f_s, f_t)

   where ``f_s`` is the encoding of its labeled batch and ``f_t`` a random
   batch of the received target features (for DANN, lambda scales the
   reversed gradient reaching the features, see ``DomainLoss.objective``).
   The server averages the model weights as FedAvg does (McMahan et al.,
   AISTATS 2017, Alg. 1).

The domain loss comes from :meth:`FeatureAlignment.make_domain_loss`, the one
hook FedDANN and FedMMD override. It lives in the source client's private state
across rounds (DANN's discriminator is never sent, nor averaged).

Normalization. Source features are computed in training mode (batch-norm on the
source batch) and, by default (``target_normalization = "batch"``), target
features on the target client in training mode too, batch by batch of
``method.batch_size``: each domain is normalized by its own batch statistics, in
separate forward passes, so source and target never share a batch-norm batch.
``"running"`` encodes the target in eval mode (the sources' running statistics)
instead; on digits that left a normalization gap the discriminator could exploit. Measured on
digits -> usps, one shared batch made DANN worse than source-only (36.5 vs
58.6) while separate passes gave 70.6. The target features are a constant
during the source's local epochs: the alignment moves the source features, and
the target's encoding follows through the shared weights in later rounds.

``lambda`` is ``lambda_domain`` times, with ``schedule = "dann"``, the ramp
2 / (1 + exp(-10 p)) - 1 over the training progress p (Ganin et al., JMLR 2016,
Sec. 5.2.2), p counted in local steps over ``run.rounds`` rounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.losses import DomainLoss, dann_schedule
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Replies, ServerState
from fedsim.methods.fedavg import FedAvg
from fedsim.methods.common.training import load_numpy, make_optimizer, model_to_numpy
from fedsim.seeding import derive_seed, numpy_rng

TARGET_FEATURES = "target_features"  # payload key of the target features in the sources' fit instruction
SCHEDULES = ("dann", "constant")


@dataclass(frozen=True)
class AlignmentParams:
    """Parameters shared by every feature-alignment method."""

    lambda_domain: float = 1.0  # weight of the domain loss (Ganin et al. 2016 and Long et al. 2015 use 1)
    schedule: str = "dann"  # "dann": lambda_domain * (2 / (1 + exp(-10 p)) - 1); "constant": lambda_domain
    target_batch: int = 256  # target features each target client sends per round
    target_normalization: str = "batch"  # "batch": target batch-norm statistics, like the sources'; "running": eval mode

    def __post_init__(self):
        if self.lambda_domain < 0:
            raise UserError(f"method.lambda_domain must be 0 or more, got {self.lambda_domain}")
        if self.schedule not in SCHEDULES:
            raise UserError(f"method.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.target_normalization not in ("batch", "running"):
            raise UserError(f"method.target_normalization must be 'batch' or 'running', got {self.target_normalization!r}")
        if self.target_batch < 2:
            raise UserError(f"method.target_batch must be at least 2, got {self.target_batch}")


@torch.no_grad()
def encode_subset(
    model: nn.Module, x: np.ndarray, count: int, seed: int, device: torch.device, chunk: int = 512, batch_statistics: bool = False
) -> np.ndarray:
    """Encoder features of a seeded random subset of ``count`` rows of ``x`` (all rows if fewer).

    ``batch_statistics``: normalize by the statistics of each ``chunk`` of target
    inputs (train-mode batch norm), as the sources' features are by their own
    batches; the running statistics this updates are discarded (the weights are
    reloaded before every operation). Otherwise eval mode (running statistics).
    """
    count = min(int(count), len(x))
    index = np.sort(numpy_rng(seed).choice(len(x), size=count, replace=False))
    model.train(batch_statistics)
    parts = [model.features(torch.from_numpy(x[index[i : i + chunk]]).to(device)).cpu() for i in range(0, count, chunk)]
    return torch.cat(parts).numpy().astype(np.float32, copy=False)


def feature_dim(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Width of the encoder's output, from one forward pass of zeros in eval mode."""
    model.eval()
    with torch.no_grad():
        device = next(model.parameters()).device
        return int(model.features(torch.zeros((1, *input_shape), device=device)).shape[-1])


class FeatureAlignment(FedAvg):
    """FedAvg on sources + a domain loss against encoded target features; subclasses choose the loss."""

    Params = AlignmentParams
    operations = ("fit", "evaluate", "features")

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        """The domain loss object of one source client (built once, kept private across rounds)."""
        raise NotImplementedError

    def domain_weight(self, progress: float) -> float:
        """lambda at training progress ``progress`` in [0, 1]."""
        scale = dann_schedule(progress) if self.params.schedule == "dann" else 1.0
        return self.params.lambda_domain * scale

    # ---- server half ------------------------------------------------------
    def configure_round(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        raise NotImplementedError(f"{type(self).__name__} exchanges twice per round: call run_round")

    def configure_features(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        weights = state["weights"]
        return {
            cid: Instruction("features", weights, {"seed": self.client_seed(rnd, cid, "features"), "round": rnd})
            for cid in self.federation.target_ids
        }

    def configure_fit(self, rnd: int, state: ServerState, target_features: np.ndarray) -> dict[int, Instruction]:
        payload = {**state["weights"], TARGET_FEATURES: target_features}  # one dict for every source: serialized once
        return {
            cid: Instruction("fit", payload, {"seed": self.client_seed(rnd, cid, "fit"), "round": rnd})
            for cid in self.federation.source_ids
        }

    def run_round(self, rnd: int, state: ServerState, executor) -> tuple[ServerState, dict]:
        feature_replies = executor.run(self.configure_features(rnd, state))
        target_features = np.concatenate([r.tensors["features"] for r in feature_replies.values()])  # client-id order
        replies = executor.run(self.configure_fit(rnd, state, target_features))
        state, metrics = self.aggregate(rnd, state, replies)
        metrics["domain_weight"] = self.domain_weight(rnd / self.config.run.rounds)
        metrics["target_features"] = int(len(target_features))
        return state, metrics

    def aggregate(self, rnd: int, state: ServerState, replies: Replies) -> tuple[ServerState, dict]:
        state, metrics = super().aggregate(rnd, state, replies)
        for key in sorted({k for r in replies.values() for k in r.metrics} - {"train_loss"}):
            metrics[key] = {str(cid): r.metrics[key] for cid, r in replies.items() if key in r.metrics}
        return state, metrics

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        state = super().init_client(data)
        if not data.is_target:
            torch.manual_seed(derive_seed(self.config.run.seed, "domain-loss", data.client_id))
            width = feature_dim(state["model"], self.federation.input_shape)
            state["domain_loss"] = self.make_domain_loss(width).to(self.device)
        return state

    def features(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target client: encoded features of a random subset of its unlabeled training inputs."""
        model = state["model"]
        load_numpy(model, instruction.tensors)
        encoded = encode_subset(
            model, data.train.x, self.params.target_batch, instruction.config["seed"], self.device,
            chunk=self.config.method.batch_size, batch_statistics=self.params.target_normalization == "batch",
        )
        return Reply(data.client_id, {"features": encoded}, {"num_features": float(len(encoded))}, num_examples=len(encoded)), state

    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source client: E local epochs of cross-entropy + lambda * domain loss against the received target features."""
        if data.train.y is None:
            raise ValueError("fit needs labels: only source clients train, the target client only sends features")
        model, domain_loss = state["model"], state["domain_loss"]
        load_numpy(model, {k: v for k, v in instruction.tensors.items() if k != TARGET_FEATURES})
        target = torch.tensor(np.asarray(instruction.tensors[TARGET_FEATURES])).to(self.device)
        optimizer = make_optimizer(nn.ModuleList([model, domain_loss]), self.config.method)  # fresh each round
        x, y = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y)
        epochs, batch_size = self.config.method.local_epochs, self.config.method.batch_size
        order_gen = torch.Generator().manual_seed(instruction.config["seed"])  # same batch order as FedAvg
        target_gen = torch.Generator().manual_seed(derive_seed(instruction.config["seed"], "target-batch"))
        steps = epochs * -(-len(x) // batch_size)
        rnd, rounds = instruction.config["round"], self.config.run.rounds
        cross_entropy = nn.CrossEntropyLoss()
        model.train()
        domain_loss.train()
        step = 0
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=order_gen)
            sums: dict[str, float] = {}
            count = 0
            for start in range(0, len(x), batch_size):
                idx = order[start : start + batch_size]
                step += 1
                if len(idx) < 2 and len(x) >= 2:
                    continue  # batch norm needs two samples
                weight = self.domain_weight((rnd - 1 + step / steps) / rounds)
                pick = torch.randperm(len(target), generator=target_gen)[: len(idx)]
                xb, yb = x[idx].to(self.device), y[idx].to(self.device)
                optimizer.zero_grad(set_to_none=True)
                source_features = model.features(xb)
                task = cross_entropy(model.head(source_features), yb)
                term, value = domain_loss.objective(source_features, target[pick], weight)
                (task + term).backward()
                optimizer.step()
                batch = {"train_loss": float(task.detach()), "domain_loss": float(value.detach()), **domain_loss.last_metrics}
                for key, value in batch.items():
                    sums[key] = sums.get(key, 0.0) + value * len(idx)
                count += len(idx)
        metrics = {key: value / max(count, 1) for key, value in sums.items()}  # means over the last epoch
        return Reply(data.client_id, model_to_numpy(model), metrics, num_examples=len(data.train)), state
