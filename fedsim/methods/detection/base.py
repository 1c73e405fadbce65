"""What the detection methods share (FedOD and its baselines FedAvg, FedBN, FedRep): roles, detector, base stage.

Roles. A detection benchmark declares a ``server_domain`` (``server`` for scenes and
coco): the FedOD server's own large labeled set. It is hosted like any client (the
*server host*, one client of the federation, built in whatever process hosts it), so
the server process itself holds no data; the server's training steps (the base model,
FedOD's distillation) are operations run on that host, and models reach it through
the object store as every instruction does. The other labeled domains are the
*clients*; the framework's target domain is an unlabeled client that only evaluates
global models. No image and no box leaves the process hosting it: images and boxes
arrive in each client's ``ClientData`` (``train.targets`` / ``test.targets``).

Base stage. Round 1 first trains the base model w_b on the server host
(``base_iters`` SGD steps from a seeded initialization, or from ``weights``, a local
weights file; ``base_iters = 0`` keeps the file's weights as w_b).

Evaluation (the families of predictors and their scores A_s, A_p, A_u, A_com; A_u the paper's, over S and
every client's test set) is in :mod:`fedsim.methods.detection.evaluation`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.messages import Instruction, LocalSettings, Reply
from fedsim.methods.base import Method, Replies, ServerState, client_operation
from fedsim.methods.common.training import load_numpy, make_optimizer, model_to_numpy
from fedsim.methods.detection.evaluation import (
    DetectionRoles,
    Family,
    Weights,
    payload_for,
    predictor_values,
    score_predictors,
    summarize,
)
from fedsim.methods.detection.training import DetectionSet, train_steps
from fedsim.models.detector import Detector, DetectorSpec, build_detector
from fedsim.registry import BENCHMARKS
from fedsim.seeding import derive_seed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DetectionParams:
    """Parameters every detection method shares (detector size, training steps, evaluation)."""

    width: int = 16  # backbone width (stages w, 2w, 4w, 8w, 8w)
    fpn_channels: int = 32
    head_convs: int = 2
    weights: Optional[str] = None  # local weights file (.npz of named arrays or torch state_dict) for the initial model
    base_iters: int = 400  # SGD steps of the base stage on the server's data (0: the initial model is w_b)
    client_iters: int = 60  # local SGD steps per round (one step = one batch of method.batch_size images)
    grad_clip: float = 10.0  # gradient-norm clipping (0: off)
    flip: bool = True  # random horizontal flips while training
    alpha: float = 0.3  # A_com = alpha A_s + (1 - alpha) A_p
    eval_batch: int = 50

    def __post_init__(self):
        for name in ("base_iters", "client_iters"):
            if getattr(self, name) < 0:
                raise UserError(f"method.{name} must be 0 or more, got {getattr(self, name)}")
        if not 0 <= self.alpha <= 1:
            raise UserError(f"method.alpha must lie in [0, 1], got {self.alpha}")
        if self.grad_clip < 0 or self.eval_batch < 1:
            raise UserError("method.grad_clip must be 0 or more and method.eval_batch at least 1")


def detection_roles(config, federation, name: str) -> DetectionRoles:
    """The server host, the labeled clients and the target of a run; UserError for a scenario that has none."""
    if config.data.partition != "iid":
        raise UserError(
            f"method {name!r} splits detection images IID only: drop --set data.partition={config.data.partition}"
        )
    server_domain = BENCHMARKS.get(config.data.benchmark).server_domain
    if server_domain is None:
        raise UserError(
            f"benchmark {config.data.benchmark!r} names no server domain: run {name!r} on a detection "
            "benchmark, e.g. --benchmark scenes (or coco)"
        )
    if config.data.target == server_domain:
        raise UserError(
            f"the server's domain {server_domain!r} cannot be the target: pick a client domain with --target"
        )
    hosts = [c.client_id for c in federation.clients if c.domain == server_domain]
    if not hosts:
        raise UserError(
            f"benchmark {config.data.benchmark!r} has no server domain {server_domain!r} in this run: keep it "
            f"in data.sources (or name the server's folder {server_domain!r})"
        )
    if len(hosts) > 1:
        raise UserError(
            f"the server's data is one set: run {name!r} with data.clients_per_domain=1 (got {len(hosts)} "
            f"clients for {server_domain!r})"
        )
    clients = tuple(c for c in federation.source_ids if c != hosts[0])
    if not clients:
        raise UserError(f"method {name!r} needs at least one labeled client domain besides {server_domain!r}")
    return DetectionRoles(server_domain, hosts[0], clients, tuple(federation.target_ids))


def detection_refusal(why: str) -> str:
    """A detection method's ``privacy_refusal``, ``why`` its own reason (``and ...``)."""
    return (
        "is a detection method, which fedsim's privacy layer does not cover: the server host trains on its own "
        f"labeled images in the same exchanges as the clients, {why}"
    )


def uploads_refusal(what: str) -> str:
    """The ``privacy_refusal`` of a detection method whose evaluation uploads ``what`` of each client."""
    return detection_refusal(f"and the evaluation uploads {what}, which is never noised, so no guarantee would hold")


class DetectionMethod(Method):
    """Interface of the detection methods and their shared halves: roles, detector, base stage, evaluation.

    A method names its predictor ``families`` for a round, the ``primary`` one, and the
    ``evaluation_payloads`` (tensors for the clients and the target, tensors for the server host).
    """

    task = "detection"
    Params = DetectionParams
    transient_state_keys = (
        "model",
        "train",
        "teacher_models",
    )  # a shared detector, the torch form of the data, teachers
    #: client-state keys whose content the protocol sends on purpose (the privacy contract test should leave them
    #: out): ``own`` holds FedOD's w_i (uploaded every round as teachers) and, on the server host, those teachers;
    #: FedBN/FedRep's personal parts (uploaded in evaluated rounds so that the server host scores M_i on S)
    disclosed_state_keys: ClassVar[tuple[str, ...]] = ("own",)
    #: who hosts what (:func:`detection_roles`)
    roles: DetectionRoles
    #: the detector's architecture: the method's size parameters, the benchmark's classes and image size
    spec: DetectorSpec

    @classmethod
    def check_setting(cls, config, federation) -> None:
        detection_roles(config, federation, cls.registry_name)

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.roles = detection_roles(config, federation, type(self).registry_name)
        p = self.params
        self.spec = DetectorSpec(
            num_classes=federation.num_classes,
            image_size=int(federation.input_shape[-1]),
            width=p.width,
            fpn_channels=p.fpn_channels,
            head_convs=p.head_convs,
            weights=p.weights,
        )

    def new_model(self, seed: Optional[int] = None, from_file: bool = False) -> Detector:
        """A detector; ``from_file`` loads ``method.weights`` (done by the server process only, for the initial
        model)."""
        spec = self.spec if from_file else DetectorSpec(**{**self.spec.__dict__, "weights": None})
        return build_detector(spec, seed=seed).to(self.device)

    def is_final(self, rnd: int) -> bool:
        return rnd == self.config.run.rounds

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        weights = model_to_numpy(self.new_model(seed=derive_seed(self.config.run.seed, "model-init"), from_file=True))
        return {"weights": weights, "base": None}

    def base_stage(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """Train w_b on the server host once (round 1); ``state['base']`` keeps it."""
        if state.get("base") is not None:
            return state, {}
        if self.params.base_iters == 0:
            return {**state, "base": state["weights"]}, {}
        server, seed = self.roles.server_id, derive_seed(self.config.run.seed, "base")  # w_b: one stream, any round
        reply = ctx.call("train_base", state["weights"], [server], seed=seed)[server]
        base = dict(reply.tensors)
        log.info(
            "base model w_b: %d steps on the server host, final loss %.3f",
            self.params.base_iters,
            reply.metrics["train_loss"],
        )
        return {**state, "weights": base, "base": base}, {"base_loss": reply.metrics["train_loss"]}

    def global_tensors(self, state: ServerState) -> dict:
        return dict(state["weights"])

    def families(self, rnd: int) -> list[Family]:
        raise NotImplementedError

    def primary(self) -> str:
        """The family whose mAP fills source_accuracy / target_accuracy."""
        raise NotImplementedError

    def evaluation_payloads(self, ctx, state: ServerState) -> tuple[Weights, Weights]:
        """(tensors for the clients and the target, tensors for the server host), each under its prefix (a prefix
        names one model in both); may run an exchange to get them. The clients' include the other clients' models
        that the paper's A_u scores on their test sets."""
        raise NotImplementedError

    def evaluate_round(self, ctx, state: ServerState) -> dict:
        """The server host, the clients and the target score their predictors in one exchange; each gets the
        payload tensors its predictors name (:func:`fedsim.methods.detection.evaluation.payload_for`)."""
        values = predictor_values(self.families(ctx.round), self.roles)
        client_payload, server_payload = self.evaluation_payloads(ctx, state)
        payloads = payload_for({**client_payload, **server_payload}, values)
        roles = self.roles
        replies = ctx.call(
            "evaluate",
            lambda cid: payloads[cid],
            [roles.server_id, *roles.client_ids, *roles.target_ids],
            lambda cid: values[cid],
        )
        return self.summarize_evaluation(ctx.round, replies)

    def summarize_evaluation(self, rnd: int, replies: Replies) -> dict:
        final = self.is_final(rnd)
        return summarize(
            self.families(rnd), replies, self.roles, self.federation, self.params.alpha, self.primary(), final
        )

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        torch.manual_seed(
            derive_seed(self.config.run.seed, "client-model", data.client_id)
        )  # weights overwritten before every use
        return {"model": self.new_model(), "own": {}, "train": None}

    def train_set(self, state: dict, data: ClientData) -> DetectionSet:
        if data.train.targets is None:
            raise ValueError(
                f"client {data.client_id} has no boxes for its training images: the target client only evaluates"
            )
        if state["train"] is None:
            state["train"] = DetectionSet.build(data.train.x, data.train.targets)
        return state["train"]

    def local_train(
        self,
        model: Detector,
        data: DetectionSet,
        steps: int,
        settings: LocalSettings,
        seed: int,
        parameters=None,
        extra_loss=None,
        detection_weight: float = 1.0,
    ) -> float:
        """``steps`` SGD steps with ``settings`` on ``parameters`` (default: all the trainable ones) of ``model``."""
        params = [p for p in (parameters if parameters is not None else model.parameters()) if p.requires_grad]
        optimizer = make_optimizer(params, settings)
        p = self.params
        return train_steps(
            model,
            data,
            steps,
            settings.batch_size,
            optimizer,
            seed,
            flip=p.flip,
            grad_clip=p.grad_clip,
            extra_loss=extra_loss,
            detection_weight=detection_weight,
        )

    @client_operation
    def train_base(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Server host: the base model w_b, ``base_iters`` steps on the server's own labeled data."""
        if data.client_id != self.roles.server_id:
            raise ValueError(f"train_base runs on the server host, not on client {data.client_id}")
        model = state["model"]
        load_numpy(model, instruction.tensors)
        iters = self.params.base_iters
        loss = self.local_train(model, self.train_set(state, data), iters, instruction.local, instruction.seed)
        return Reply(data.client_id, model_to_numpy(model), {"train_loss": loss}, num_examples=len(data.train)), state

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Detect with every requested predictor on this client's test images; reply with match records only."""
        predictors = instruction.values["predictors"]
        k, batch = self.federation.num_classes, self.params.eval_batch
        tensors = score_predictors(state["model"], predictors, instruction.tensors, state["own"], data.test, k, batch)
        return Reply(data.client_id, tensors, {"images": float(len(data.test))}, num_examples=len(data.test)), state
