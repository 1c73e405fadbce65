"""Shared halves of the detection methods (FedOD and its baselines FedAvg, FedBN, FedRep).

Roles. A detection benchmark names a ``server_domain`` (``server`` for scenes and
coco): the FedOD server's own large labeled set. It is hosted like any client (the
*server host*, one client of the federation, built in whatever process hosts it), so
the server process itself holds no data; the server's training steps (the base model,
FedOD's distillation) are operations run on that host, and models reach it through
the object store as every instruction does. The other labeled domains are the
*clients*; the framework's target domain is an unlabeled client that only evaluates
global models. No image and no box leaves the process hosting it.

Base stage. Round 1 first trains the base model w_b on the server host
(``base_iters`` SGD steps from a seeded initialization, or from ``weights``, a local
weights file; ``base_iters = 0`` keeps the file's weights as w_b).

Evaluation (the families of predictors and their scores A_s, A_p, A_u, A_com) is in
:mod:`fedsim.methods._detection_eval`; its names stay importable from here.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from fedsim.config import MethodConfig
from fedsim.data.base import ClientData
from fedsim.data.detection import client_targets, is_detection_benchmark
from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply
from fedsim.methods._detection_eval import DetectionEvaluation, Family, Weights, detect_all, prefixed, with_prefix
from fedsim.methods.base import ServerState
from fedsim.methods.common.training import load_numpy, model_to_numpy, weighted_average
from fedsim.models.detector import Detector, DetectorSpec, build_detector
from fedsim.registry import BENCHMARKS
from fedsim.seeding import derive_seed

__all__ = [
    "DetectionMethod", "DetectionParams", "DetectionSet", "ExtraLoss", "FederatedDetection", "flip_batch", "make_optimizer",
    "train_steps",
    # from ``_detection_eval``
    "Family", "Weights", "detect_all", "prefixed", "with_prefix",
]

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



def make_optimizer(model: torch.nn.Module, method: MethodConfig, parameters=None) -> torch.optim.Optimizer:
    params = [p for p in (parameters if parameters is not None else model.parameters()) if p.requires_grad]
    return torch.optim.SGD(params, lr=method.lr, momentum=method.momentum, weight_decay=method.weight_decay)


@dataclass
class DetectionSet:
    """A labeled image set in torch form, built once per client."""

    images: torch.Tensor  # (N, 3, S, S) float in [0, 1]
    targets: list[dict[str, torch.Tensor]]

    @staticmethod
    def build(x: np.ndarray, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> "DetectionSet":
        targets = [{"boxes": torch.from_numpy(np.asarray(b, np.float32).reshape(-1, 4)), "labels": torch.from_numpy(np.asarray(lab, np.int64))} for b, lab in pairs]
        return DetectionSet(torch.from_numpy(np.ascontiguousarray(x)), targets)

    def __len__(self) -> int:
        return len(self.images)


def flip_batch(images: torch.Tensor, targets: list[dict], flips: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
    """Mirror the images where ``flips`` is True, and their boxes (x -> W - x)."""
    if not flips.any():
        return images, targets
    width = images.shape[-1]
    images = torch.where(flips[:, None, None, None], images.flip(-1), images)
    out = []
    for target, flip in zip(targets, flips.tolist()):
        if flip and len(target["boxes"]):
            boxes = target["boxes"].clone()
            boxes[:, 0], boxes[:, 2] = width - target["boxes"][:, 2], width - target["boxes"][:, 0]
            target = {**target, "boxes": boxes}
        out.append(target)
    return images, out


ExtraLoss = Callable[[torch.Tensor, dict], torch.Tensor]


def train_steps(
    model: Detector,
    data: DetectionSet,
    steps: int,
    batch_size: int,
    optimizer: torch.optim.Optimizer,
    seed: int,
    flip: bool = True,
    grad_clip: float = 10.0,
    extra_loss: Optional[ExtraLoss] = None,
    detection_weight: float = 1.0,
) -> float:
    """``steps`` SGD steps of the FCOS loss (+ ``extra_loss(images, student maps)``); mean loss of the last 10 steps.

    Batches walk through seeded permutations of the set (epochs without replacement).
    """
    if steps == 0:
        return 0.0
    generator = torch.Generator().manual_seed(int(seed))
    batch_size = max(1, min(batch_size, len(data)))
    model.train()
    queue: list[int] = []
    losses = []
    for _ in range(steps):
        while len(queue) < batch_size:
            queue.extend(torch.randperm(len(data), generator=generator).tolist())
        index, queue = queue[:batch_size], queue[batch_size:]
        images = data.images[index]
        targets = [data.targets[i] for i in index]
        flips = torch.rand(len(index), generator=generator) < 0.5
        if flip:
            images, targets = flip_batch(images, targets, flips)
        maps = model.maps(images)
        loss = detection_weight * sum(model.loss(maps, targets).values())
        if extra_loss is not None:
            loss = loss + extra_loss(images, maps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
    return float(np.mean(losses[-10:]))


class DetectionMethod(DetectionEvaluation):
    """Base of the detection methods: roles, base stage, detector, training and evaluation plumbing."""

    task = "detection"
    Params = DetectionParams
    operations = ("train_base", "fit", "evaluate")

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        name = getattr(type(self), "registry_name", type(self).__name__)
        benchmark_cls = BENCHMARKS.get(config.data.benchmark)
        if not is_detection_benchmark(benchmark_cls):
            raise UserError(f"method {name!r} detects objects: run it on a detection benchmark, e.g. --benchmark scenes (or coco)")
        if config.data.partition != "iid":
            raise UserError(f"method {name!r} splits detection images IID only: drop --set data.partition={config.data.partition}")
        server_domain = benchmark_cls.server_domain
        if config.data.target == server_domain:
            raise UserError(f"the server's domain {server_domain!r} cannot be the target: pick a client domain with --target")
        hosts = [c.client_id for c in federation.clients if c.domain == server_domain]
        if not hosts:
            raise UserError(f"benchmark {config.data.benchmark!r} has no server domain {server_domain!r} in this run: keep it in data.sources (or name the server's folder {server_domain!r})")
        if len(hosts) > 1:
            raise UserError(f"the server's data is one set: run {name!r} with data.clients_per_domain=1 (got {len(hosts)} clients for {server_domain!r})")
        self.server_id = hosts[0]
        self.server_domain = server_domain
        self.client_ids = [c for c in federation.source_ids if c != self.server_id]
        if not self.client_ids:
            raise UserError(f"method {name!r} needs at least one labeled client domain besides {server_domain!r}")
        self.target_ids = list(federation.target_ids)
        self.spec = DetectorSpec(
            num_classes=federation.num_classes, image_size=int(federation.input_shape[-1]), width=self.params.width,
            fpn_channels=self.params.fpn_channels, head_convs=self.params.head_convs, weights=self.params.weights,
        )

    # ---- helpers ----------------------------------------------------------
    def new_model(self, seed: Optional[int] = None, from_file: bool = False) -> Detector:
        """A detector; ``from_file`` loads ``method.weights`` (done by the server process only, for the initial model)."""
        spec = self.spec if from_file else DetectorSpec(**{**self.spec.__dict__, "weights": None})
        return build_detector(spec, seed=seed).to(self.device)

    def is_evaluated(self, rnd: int) -> bool:
        return rnd % self.config.run.eval_every == 0 or rnd == self.config.run.rounds

    def is_final(self, rnd: int) -> bool:
        return rnd == self.config.run.rounds

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        weights = model_to_numpy(self.new_model(seed=derive_seed(self.config.run.seed, "model-init"), from_file=True))
        return {"weights": weights, "base": None}

    def base_stage(self, state: ServerState, executor) -> tuple[ServerState, dict]:
        """Train w_b on the server host once (round 1); ``state['base']`` keeps it."""
        if state.get("base") is not None:
            return state, {}
        if self.params.base_iters == 0:
            return {**state, "base": state["weights"]}, {}
        seed = derive_seed(self.config.run.seed, "base")
        reply = executor.run({self.server_id: Instruction("train_base", state["weights"], {"seed": seed})})[self.server_id]
        base = dict(reply.tensors)
        log.info("base model w_b: %d steps on the server host, final loss %.3f", self.params.base_iters, reply.metrics["train_loss"])
        return {**state, "weights": base, "base": base}, {"base_loss": reply.metrics["train_loss"]}

    def global_tensors(self, state: ServerState) -> dict:
        return dict(state["weights"])

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        torch.manual_seed(derive_seed(self.config.run.seed, "client-model", data.client_id))  # overwritten before every use
        return {"model": self.new_model(), "own": {}, "train": None, "test": None}

    def train_set(self, state: dict, data: ClientData) -> DetectionSet:
        if state["train"] is None:
            state["train"] = DetectionSet.build(data.train.x, client_targets(self.config.data, data, "train"))
        return state["train"]

    def local_train(self, model: Detector, data: DetectionSet, steps: int, seed: int, parameters=None, extra_loss=None, detection_weight: float = 1.0) -> float:
        optimizer = make_optimizer(model, self.config.method, parameters)
        return train_steps(
            model, data, steps, self.config.method.batch_size, optimizer, seed, flip=self.params.flip,
            grad_clip=self.params.grad_clip, extra_loss=extra_loss, detection_weight=detection_weight,
        )

    def train_base(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Server host: the base model w_b, ``base_iters`` steps on the server's own labeled data."""
        if data.domain != self.server_domain:
            raise ValueError(f"train_base runs on the server host, not on client {data.client_id}")
        model = state["model"]
        load_numpy(model, instruction.tensors)
        loss = self.local_train(model, self.train_set(state, data), self.params.base_iters, instruction.config["seed"])
        return Reply(data.client_id, model_to_numpy(model), {"train_loss": loss}, num_examples=len(data.train)), state


class FederatedDetection(DetectionMethod):
    """FedAvg over the server host and the clients, with an optional personal part kept locally (FedBN, FedRep).

    Round r: every labeled participant (the server host and the clients) loads the
    global model with its own personal part on top, trains ``client_iters`` steps, keeps
    the personal part and sends the rest; the server replaces the shared tensors by
    their sample-weighted mean (McMahan et al. 2017, Alg. 1). Personal parts start
    from w_b. Clients without a personal part (the target) use the global model,
    whose personal keys stay w_b's.
    """

    operations = ("train_base", "fit", "evaluate", "share_personal")

    def personal_keys(self, model: Detector) -> set[str]:
        return set()

    def families(self, rnd: int) -> list[Family]:
        fams = [Family("global", False, ("payload:global",), lambda cid: ("payload:global",))]
        if self.has_personal():
            fams.append(Family("personal", True, ("payload:global|own:personal",), lambda cid: (f"payload:global|payload:personal@{cid}",)))
        return fams

    def has_personal(self) -> bool:
        if not hasattr(self, "_has_personal"):
            self._has_personal = bool(self.personal_keys(self.new_model()))
        return self._has_personal

    def primary(self) -> str:
        return "personal" if self.has_personal() else "global"

    def eval_payloads(self, rnd: int, state: ServerState) -> tuple[Weights, Weights]:
        shared = with_prefix(state["weights"], "global")
        server = dict(shared)
        for cid, part in state.get("personal", {}).items():
            server.update(with_prefix(part, f"personal@{cid}"))
        return shared, server

    def participants(self) -> list[int]:
        return [self.server_id] + self.client_ids

    def run_round(self, rnd: int, state: ServerState, executor) -> tuple[ServerState, dict]:
        state, metrics = self.base_stage(state, executor)
        weights = state["weights"]
        replies = executor.run({cid: Instruction("fit", weights, {"seed": self.client_seed(rnd, cid, "fit"), "round": rnd}) for cid in self.participants()})
        shared = weighted_average([r.tensors for r in replies.values()], [r.num_examples for r in replies.values()])
        state = {**state, "weights": {**weights, **shared}}
        metrics["train_loss"] = {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}
        if self.has_personal() and self.is_evaluated(rnd):
            uploads = executor.run({cid: Instruction("share_personal", {}, {"round": rnd}) for cid in self.client_ids})
            state["personal"] = {cid: dict(r.tensors) for cid, r in uploads.items()}
        return state, metrics

    # ---- client half ------------------------------------------------------
    def local_steps(self, model: Detector, data: DetectionSet, seed: int) -> float:
        """The local update (FedRep overrides it with its head-then-body schedule)."""
        return self.local_train(model, data, self.params.client_iters, seed)

    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        model = state["model"]
        load_numpy(model, {**instruction.tensors, **state["own"].get("personal", {})})
        loss = self.local_steps(model, self.train_set(state, data), instruction.config["seed"])
        weights = model_to_numpy(model)
        personal = self.personal_keys(model)
        if personal:
            state["own"]["personal"] = {k: weights[k] for k in personal}
        shared = {k: v for k, v in weights.items() if k not in personal}
        return Reply(data.client_id, shared, {"train_loss": loss}, num_examples=len(data.train)), state

    def share_personal(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Evaluation only: the personal part, so that the server host can score M_i on its test set."""
        return Reply(data.client_id, dict(state["own"]["personal"]), {}, num_examples=len(data.train)), state
