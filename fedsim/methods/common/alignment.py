"""Feature alignment with an exchange of encoded target features: what FedDANN and FedMMD share.

One round has two stages (the federated DANN/MMD baselines of Peng et al.,
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
   AISTATS 2017, Alg. 1; a :class:`~fedsim.methods.fedavg.FedAvg` object does it).

The domain loss comes from :meth:`FeatureAlignment.make_domain_loss`, the one
hook FedDANN and FedMMD define (skada style: the methods differ by the loss object
alone). It lives in the source client's private state across rounds (DANN's
discriminator is never sent, nor averaged).

Normalization. Source features are computed in training mode (batch-norm on the
source batch) and, by default (``target_normalization = "batch"``), target
features on the target client in training mode too, batch by batch of
``method.batch_size``: each domain is normalized by its own batch statistics, in
separate forward passes, so source and target never share a batch-norm batch.
``"running"`` encodes the target in eval mode (the sources' running statistics)
instead; on digits that left a normalization gap the discriminator could exploit. Measured on
digits -> usps, one shared batch made DANN worse than source-only (36.5 vs
58.6) while separate passes gave 70.6.

With ``target_normalization = "batch"`` and a model with batch norm, the target
also *evaluates* with statistics of its own inputs (re-estimated on its unlabeled
training inputs, AdaBN, as FedBN's target does): the features it aligned were
normalized by target statistics, so it is tested that way too (per-domain
batch norm, as the domain-specific normalization the separate passes imply).
The MLP of the embedded digits has no batch norm: there it changes nothing.

Training as the papers train (Ganin et al., JMLR 2016, Sec. 5.2.2), p the
training progress in [0, 1] counted in local steps over ``run.rounds`` rounds:

* ``lambda`` is ``lambda_domain`` times, with ``schedule = "dann"``, the ramp
  2 / (1 + exp(-10 p)) - 1 (gamma = 10);
* with ``lr_schedule = "dann"`` the learning rate is annealed as
  mu_p = mu_0 / (1 + 10 p)^0.75 (alpha = 10, beta = 0.75), step by step, the
  fresh optimizer of each round starting from the annealed value;
* the domain loss's own parameters (DANN's discriminator) train with
  ``method.lr`` times :meth:`FeatureAlignment.domain_lr_scale` (1 unless a
  method says otherwise).

Target features are refreshed once per round, before the sources' fit (counted
in ``bytes_sent``/``bytes_received``): the most often a round-based exchange
allows without averaging more often than FedAvg. They are a snapshot of the
round's starting encoder, constant during the local epochs, and one-sided (no
gradient reaches the target's encoding): on digits this staleness, not the 256-point
size, made ``lambda_domain = 1`` collapse the sources (docs/baselines.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.losses import DomainLoss, dann_schedule
from fedsim.losses.domain import dann_lr_factor
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Method, ServerState, client_operation
from fedsim.methods.common.training import (
    CHUNK,
    encode_in_chunks,
    evaluate_model,
    load_numpy,
    make_optimizer,
    model_to_numpy,
    train_epochs,
)
from fedsim.methods.fedavg import FedAvg
from fedsim.methods.fedbn import reestimate_bn
from fedsim.models.normalization import bn_keys
from fedsim.seeding import derive_seed, numpy_rng

TARGET_FEATURES = "target_features"  # payload key of the target features in the sources' fit instruction
SCHEDULES = ("dann", "constant")  # lambda ramp and learning-rate annealing: Ganin et al.'s, or none


@dataclass(frozen=True)
class AlignmentParams:
    """Parameters shared by every feature-alignment method."""

    lambda_domain: float = 1.0  # weight of the domain loss (Ganin et al. 2016 and Long et al. 2015 use 1)
    schedule: str = "dann"  # "dann": lambda_domain * (2 / (1 + exp(-10 p)) - 1); "constant": lambda_domain
    target_batch: int = 256  # target features each target client sends per round
    target_normalization: str = (
        "batch"  # "batch": target batch-norm statistics, like the sources'; "running": eval mode
    )
    lr_schedule: str = (
        "dann"  # "dann": method.lr / (1 + 10 p)^0.75 (Ganin et al. 2016, Sec. 5.2.2); "constant": method.lr
    )

    def __post_init__(self):
        if self.lambda_domain < 0:
            raise UserError(f"method.lambda_domain must be 0 or more, got {self.lambda_domain}")
        if self.schedule not in SCHEDULES:
            raise UserError(f"method.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.lr_schedule not in SCHEDULES:
            raise UserError(f"method.lr_schedule must be one of {', '.join(SCHEDULES)}, got {self.lr_schedule!r}")
        if self.target_normalization not in ("batch", "running"):
            raise UserError(
                f"method.target_normalization must be 'batch' or 'running', got {self.target_normalization!r}"
            )
        if self.target_batch < 2:
            raise UserError(f"method.target_batch must be at least 2, got {self.target_batch}")


@torch.no_grad()
def encode_subset(
    model: nn.Module,
    x: np.ndarray,
    count: int,
    seed: int,
    device: torch.device,
    chunk: int = CHUNK,
    batch_statistics: bool = False,
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
    return encode_in_chunks(model.features, x[index], device, chunk).numpy().astype(np.float32, copy=False)


def feature_dim(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Width of the encoder's output, from one forward pass of zeros in eval mode."""
    model.eval()
    with torch.no_grad():
        device = next(model.parameters()).device
        return int(model.features(torch.zeros((1, *input_shape), device=device)).shape[-1])


def steps_per_epoch(count: int, batch_size: int) -> tuple[int, int]:
    """(batches of one epoch, batches that train): :func:`~fedsim.methods.common.training.minibatches`
    skips a final batch of one, which still counts as a step of the lambda ramp."""
    batches = -(-count // batch_size)
    return batches, batches - int(count % batch_size == 1 and count >= 2)


class AlignmentObjective:
    """The ``step_loss`` of a source's local epochs: cross-entropy(head(f_s), y_s) + lambda * domain loss.

    Each call draws a batch of the target (its own generator), asks ``schedule(step)`` for
    (lambda, learning-rate factor) (``step`` counts the batches of the epochs so far, skipped ones
    included), sets every param group of ``optimizer`` to its ``initial_lr`` times the factor (the step
    that follows uses it) and keeps the per-sample means of the last epoch's task loss, domain loss and
    the loss's diagnostics. ``target`` holds features, or inputs when ``encode_target`` (the centralized
    references: the target batch goes through the encoder in its own forward pass, so its gradient is trained too).
    """

    def __init__(
        self,
        domain_loss: DomainLoss,
        target: torch.Tensor,
        generator: torch.Generator,
        schedule: Callable[[int], tuple[float, float]],
        batches: int,
        trained: int,
        optimizer: Optional[torch.optim.Optimizer] = None,
        encode_target: bool = False,
    ):
        self.domain_loss, self.target, self.generator, self.schedule = domain_loss, target, generator, schedule
        self.batches, self.trained, self.optimizer, self.encode_target = batches, trained, optimizer, encode_target
        self.calls, self.count = 0, 0
        self.sums: dict[str, float] = {}

    def __call__(self, model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        epoch, position = divmod(self.calls, self.trained)
        self.calls += 1
        if position == 0:  # a new epoch: the metrics are the last epoch's
            self.sums, self.count = {}, 0
        weight, lr_factor = self.schedule(epoch * self.batches + position + 1)
        for group in self.optimizer.param_groups if self.optimizer is not None else ():
            group["lr"] = group["initial_lr"] * lr_factor
        pick = torch.randperm(len(self.target), generator=self.generator)[: len(xb)]
        target = self.target[pick].to(xb.device)
        source_features = model.features(xb)
        target_features = model.features(target) if self.encode_target else target
        task = nn.functional.cross_entropy(model.head(source_features), yb)
        term, value = self.domain_loss.objective(source_features, target_features, weight)
        batch = {
            "train_loss": float(task.detach()),
            "domain_loss": float(value.detach()),
            **self.domain_loss.last_metrics,
        }
        batch.update({"lr": float(self.optimizer.param_groups[0]["lr"])} if self.optimizer is not None else {})
        for key, number in batch.items():
            self.sums[key] = self.sums.get(key, 0.0) + number * len(xb)
        self.count += len(xb)
        return task + term

    def metrics(self) -> dict[str, float]:
        """Per-sample means over the last epoch."""
        return {key: value / max(self.count, 1) for key, value in self.sums.items()}


def alignment_optimizer(
    model: nn.Module, domain_loss: DomainLoss, method_config, domain_lr_scale: float
) -> torch.optim.Optimizer:
    """SGD over the model (``method.lr``) and the domain loss's parameters (``method.lr * domain_lr_scale``);
    each group keeps its base rate as ``initial_lr`` for the annealing."""
    groups = [{"params": list(model.parameters()), "initial_lr": method_config.lr}]
    extra = list(domain_loss.parameters())
    if extra:
        groups.append({"params": extra, "initial_lr": method_config.lr * domain_lr_scale})
    optimizer = make_optimizer(groups, method_config)
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"]
    return optimizer


class FeatureAlignment(Method):
    """FedAvg on sources + a domain loss against encoded target features; subclasses choose the loss."""

    Params = AlignmentParams

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.fedavg = FedAvg(config, federation, device)  # initialization, aggregation, evaluation

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        """The domain loss object of one source client (built once, kept private across rounds)."""
        raise NotImplementedError

    def domain_lr_scale(self) -> float:
        """Learning-rate multiplier of the domain loss's own parameters (FedDANN's discriminator)."""
        return 1.0

    def domain_weight(self, progress: float) -> float:
        """lambda at training progress ``progress`` in [0, 1]."""
        scale = dann_schedule(progress) if self.params.schedule == "dann" else 1.0
        return self.params.lambda_domain * scale

    def lr_factor(self, progress: float) -> float:
        """mu_p / mu_0 at training progress ``progress`` in [0, 1]."""
        return dann_lr_factor(progress) if self.params.lr_schedule == "dann" else 1.0

    def step_schedule(self, rnd: int, steps: int) -> Callable[[int], tuple[float, float]]:
        """(lambda, lr factor) of local step ``step`` (1-based) of round ``rnd``, ``steps`` steps per round."""
        rounds = self.config.run.rounds

        def schedule(step: int) -> tuple[float, float]:
            progress = (rnd - 1 + step / steps) / rounds
            return self.domain_weight(progress), self.lr_factor(progress)

        return schedule

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return self.fedavg.init_server()

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """Stage 1: the targets encode; stage 2: the sources fit against those features; FedAvg's mean."""
        feature_replies = ctx.call("features", state["weights"], self.federation.target_ids)
        target_features = np.concatenate([r.tensors["features"] for r in feature_replies.values()])  # client-id order
        payload = {**state["weights"], TARGET_FEATURES: target_features}  # one dict for every source: serialized once
        replies = ctx.call("fit", payload, self.federation.source_ids)
        state, metrics = self.fedavg.aggregate(ctx, state, replies)
        for key in sorted({k for r in replies.values() for k in r.metrics} - {"train_loss"}):
            metrics[key] = {str(cid): r.metrics[key] for cid, r in replies.items() if key in r.metrics}
        metrics["domain_weight"] = self.domain_weight(ctx.round / self.config.run.rounds)
        metrics["target_features"] = int(len(target_features))
        return state, metrics

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        state = self.fedavg.init_client(data)
        if not data.is_target:
            torch.manual_seed(derive_seed(self.config.run.seed, "domain-loss", data.client_id))
            width = feature_dim(state["model"], self.federation.input_shape)
            state["domain_loss"] = self.make_domain_loss(width).to(self.device)
        return state

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """FedAvg's evaluation; the target, whose features were normalized by its own batches, with its own BN statistics."""
        model = state["model"]
        if not (data.is_target and self.params.target_normalization == "batch" and bn_keys(model)):
            return self.fedavg.evaluate(instruction, state, data)
        load_numpy(model, instruction.tensors)
        reestimate_bn(model, data.train.x, self.device)  # inputs only: the target's train.y is None
        return Reply(
            data.client_id, {}, evaluate_model(model, data.test, self.device), num_examples=len(data.test)
        ), state

    @client_operation
    def features(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target client: encoded features of a random subset of its unlabeled training inputs."""
        model = state["model"]
        load_numpy(model, instruction.tensors)
        encoded = encode_subset(
            model,
            data.train.x,
            self.params.target_batch,
            instruction.config["seed"],
            self.device,
            chunk=self.config.method.batch_size,
            batch_statistics=self.params.target_normalization == "batch",
        )
        return Reply(
            data.client_id, {"features": encoded}, {"num_features": float(len(encoded))}, num_examples=len(encoded)
        ), state

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source client: E local epochs of cross-entropy + lambda * domain loss against the received target features."""
        if data.train.y is None:
            raise ValueError("fit needs labels: only source clients train, the target client only sends features")
        method, seed = self.config.method, instruction.config["seed"]
        model, domain_loss = state["model"], state["domain_loss"]
        load_numpy(model, {k: v for k, v in instruction.tensors.items() if k != TARGET_FEATURES})
        target = torch.tensor(np.asarray(instruction.tensors[TARGET_FEATURES])).to(self.device)
        optimizer = alignment_optimizer(model, domain_loss, method, self.domain_lr_scale())  # fresh each round
        batches, trained = steps_per_epoch(len(data.train), method.batch_size)
        objective = AlignmentObjective(
            domain_loss,
            target,
            torch.Generator().manual_seed(derive_seed(seed, "target-batch")),
            self.step_schedule(instruction.config["round"], method.local_epochs * batches),
            batches,
            trained,
            optimizer,
        )
        domain_loss.train()
        train_epochs(
            model, data.train, method.local_epochs, method.batch_size, optimizer, seed, self.device, step_loss=objective
        )
        return Reply(data.client_id, model_to_numpy(model), objective.metrics(), num_examples=len(data.train)), state
