"""Feature alignment with an exchange of encoded target features: the base of FedDANN and FedMMD.

One round has two stages (the federated DANN/MMD baselines of Peng et al., FADA, ICLR 2020):

1. ``features``: each target client encodes a seeded random subset of ``target_batch`` of its unlabeled
   training inputs with the global encoder and sends the feature vectors (never inputs, never labels).
2. ``fit``: every source client receives the global weights plus the concatenated target features and runs
   E local epochs of  cross_entropy(head(f_s), y_s) + lambda * domain_loss(f_s, f_t); the server averages the
   weights as FedAvg does (McMahan et al., AISTATS 2017, Alg. 1).

A subclass chooses the loss with :meth:`AlignmentSchedule.make_domain_loss`; it stays in the source client's
private state across rounds. The schedule of lambda and of the learning rate is Ganin et al.'s (JMLR 2016,
Sec. 5.2.2), counted in local steps over ``run.rounds``. With ``target_normalization = "batch"`` the target
encodes, and evaluates, with batch-norm statistics of its own inputs (AdaBN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.losses import DomainLoss, dann_schedule
from fedsim.losses.domain import dann_lr_factor
from fedsim.messages import Instruction, Reply
from fedsim.methods.alignment.exchanges import feature_alignment_exchanges
from fedsim.methods.alignment.objective import (
    SCHEDULES,
    AlignmentModules,
    AlignmentObjective,
    PrivateAlignmentObjective,
    alignment_optimizer,
    feature_dim,
    steps_per_epoch,
)
from fedsim.methods.base import Method, ServerState, client_operation
from fedsim.methods.common.aggregation import federated_average
from fedsim.methods.common.batchnorm import reestimate_bn
from fedsim.methods.common.classifier import GlobalClassifier
from fedsim.methods.common.selection_hooks import ClassifierPredictor, model_tensors, selection_reply
from fedsim.methods.common.target_features import TARGET_FEATURES, encode_subset
from fedsim.methods.common.training import device_rows, evaluate_model, load_numpy, model_to_numpy, train_epochs
from fedsim.models.normalization import bn_keys
from fedsim.privacy.dpsgd import record_plan
from fedsim.privacy.rows import privatize_rows, rows_plan
from fedsim.seeding import derive_seed, numpy_rng


@dataclass(frozen=True)
class AlignmentParams:
    """Parameters shared by every feature-alignment method."""

    lambda_domain: float = 1.0  # weight of the domain loss (Ganin et al. 2016 and Long et al. 2015 use 1)
    schedule: str = "dann"  # "dann": lambda_domain * (2 / (1 + exp(-10 p)) - 1); "constant": lambda_domain
    target_batch: int = 256  # target features each target client sends per round
    target_normalization: str = "batch"  # "batch": target batch-norm statistics, like the sources'; "running": eval
    lr_schedule: str = "dann"  # "dann": method.lr / (1 + 10 p)^0.75 (Ganin et al. 2016, Sec. 5.2.2); "constant"

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


class AlignmentSchedule(Method):
    """The domain loss and its schedule, shared by the federated and the centralized alignment methods:
    lambda = lambda_domain * (2 / (1 + exp(-10 p)) - 1) and mu_p = mu_0 / (1 + 10 p)^0.75 (Ganin et al. 2016)."""

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        """The domain loss object (built once per source client, or once on the server, and kept)."""
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


class FeatureAlignment(AlignmentSchedule):
    """FedAvg on sources + a domain loss against encoded target features; subclasses choose the loss."""

    Params = AlignmentParams
    privacy_exchanges = staticmethod(feature_alignment_exchanges)  # target features, then FedAvg

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.classifier = GlobalClassifier(config, federation, self.device)  # initialization, training, evaluation

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return {"weights": self.classifier.initial_weights()}

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """Stage 1: the targets encode; stage 2: the sources fit against those features; FedAvg's mean."""
        feature_replies = ctx.call("features", state["weights"], self.federation.target_ids)
        target_features = np.concatenate([r.tensors["features"] for r in feature_replies.values()])  # client-id order
        payload = {**state["weights"], TARGET_FEATURES: target_features}  # one dict for every source: serialized once
        replies = ctx.call("fit", payload, self.federation.source_ids)
        weights, metrics = federated_average(replies)
        for key in sorted({k for r in replies.values() for k in r.metrics} - {"train_loss"}):
            metrics[key] = {str(cid): r.metrics[key] for cid, r in replies.items() if key in r.metrics}
        metrics["domain_weight"] = self.domain_weight(ctx.round / self.config.run.rounds)
        metrics["target_features"] = int(len(target_features))
        return {**state, "weights": weights}, metrics

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        state = {"model": self.classifier.shared()}  # "model" is transient (see Method.transient_state_keys)
        if not data.is_target:
            torch.manual_seed(derive_seed(self.config.run.seed, "domain-loss", data.client_id))
            width = feature_dim(state["model"], self.federation.input_shape)
            state["domain_loss"] = self.make_domain_loss(width).to(self.device)
        return state

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """The global weights; the target, whose features were normalized by its own batches, with its own BN
        statistics (AdaBN on its unlabeled training inputs). The selection statistics are this model's (features:
        ``model.features``, the aligned ones)."""
        model = state["model"]
        load_numpy(model, model_tensors(instruction))
        if data.is_target and self.params.target_normalization == "batch" and bn_keys(model):
            reestimate_bn(model, data.train.x, self.device)  # inputs only: the target's train.y is None
        reply = Reply(data.client_id, {}, evaluate_model(model, data.test, self.device), num_examples=len(data.test))
        predictor = ClassifierPredictor(model, self.device)
        return selection_reply(self.selection_scores, instruction, data, reply, {"": predictor}), state

    @client_operation
    def features(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Target client: encoded features of a random subset of its unlabeled training inputs; under
        ``privacy.unit=record`` each row clipped and noised before it leaves (:mod:`fedsim.privacy.rows`)."""
        model = state["model"]
        load_numpy(model, instruction.tensors)
        encoded = encode_subset(
            model,
            data.train.x,
            self.params.target_batch,
            instruction.seed,
            self.device,
            chunk=instruction.local.batch_size,
            batch_statistics=self.params.target_normalization == "batch",
        )
        rows = rows_plan(self.config, "features")  # privacy.unit=record
        if rows is not None:
            encoded = privatize_rows(encoded, rows, numpy_rng(derive_seed(instruction.seed, "privacy-rows")))
        return Reply(
            data.client_id, {"features": encoded}, {"num_features": float(len(encoded))}, num_examples=len(encoded)
        ), state

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Source client: E local epochs of cross-entropy + lambda * domain loss against the received features."""
        if data.train.y is None:
            raise ValueError("fit needs labels: only source clients train, the target client only sends features")
        settings, seed = instruction.local, instruction.seed
        model, domain_loss = state["model"], state["domain_loss"]
        load_numpy(model, {k: v for k, v in instruction.tensors.items() if k != TARGET_FEATURES})
        target = torch.tensor(np.asarray(instruction.tensors[TARGET_FEATURES])).to(self.device)
        optimizer = alignment_optimizer(model, domain_loss, settings, self.domain_lr_scale())  # fresh each round
        private = record_plan(self.config, len(data.train))
        if private is not None:
            return self.fit_private(instruction, state, data, target, optimizer, private)
        batches, trained = steps_per_epoch(len(data.train), settings.batch_size)
        objective = AlignmentObjective(
            domain_loss,
            target,
            torch.Generator().manual_seed(derive_seed(seed, "target-batch")),
            self.step_schedule(instruction.round, settings.local_epochs * batches),
            batches,
            trained,
            optimizer,
        )
        domain_loss.train()
        epochs, batch_size = settings.local_epochs, settings.batch_size
        train_epochs(model, data.train, epochs, batch_size, optimizer, seed, self.device, step_loss=objective)
        return Reply(data.client_id, model_to_numpy(model), objective.metrics(), num_examples=len(data.train)), state

    def fit_private(self, instruction: Instruction, state: Any, data: ClientData, target, optimizer, private):
        """``fit`` under ``privacy.unit=record``: DP-SGD over the model and the discriminator together, each sampled
        record's cross-entropy + domain term clipped on its own (:class:`PrivateAlignmentObjective`); the schedule
        counts DP-SGD's steps (ceil(n / batch_size) an epoch)."""
        from fedsim.privacy.dpsgd import dp_sgd_epochs

        settings, seed = instruction.local, instruction.seed
        model, domain_loss = state["model"], state["domain_loss"]
        if not domain_loss.per_record:
            raise UserError(
                f"privacy.unit=record cannot apply to method {self.config.method.name!r}: its domain loss "
                f"{type(domain_loss).__name__} couples a batch's records, so no record has a gradient of its own to "
                "clip; use privacy.unit=client"
            )
        objective = PrivateAlignmentObjective(
            target,
            torch.Generator().manual_seed(derive_seed(seed, "target-batch")),
            self.step_schedule(instruction.round, settings.local_epochs * private.steps_per_epoch),
            settings.batch_size,
            optimizer,
        )
        modules = AlignmentModules(model, domain_loss)
        x, y = device_rows(data.train.x, self.device), device_rows(data.train.y, self.device)
        loss = dp_sgd_epochs(
            modules,
            x,
            y,
            settings.local_epochs,
            private,
            optimizer,
            seed,
            self.device,
            objective,
            before_step=objective.before_step,
        )
        metrics = {"train_loss": float(loss), "lr": float(optimizer.param_groups[0]["lr"])}
        return Reply(data.client_id, model_to_numpy(model), metrics, num_examples=len(data.train)), state
