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

Evaluation (every evaluated round) reports *families* of predictors. For the model
M_i that client i deploys (the global model, its personal model, or their ensemble),
with S the server's test set and T_i client i's test set::

    s_i = mAP(M_i on S),  p_i = mAP(M_i on T_i),  u_i = mAP(M_i on S u T_i)
    A_s = mean_i s_i,  A_p = mean_i p_i,  A_u = mean_i u_i
    A_com(alpha) = alpha A_s + (1 - alpha) A_p          (FedOD, Su et al. 2022)

and the same with AP50. Each holder matches its own detections with pycocotools and
sends only match records (:mod:`fedsim.detection.metrics`); u_i merges the records of
S and T_i, exactly as pycocotools would on the pooled set. Scoring a personal M_i on
S needs M_i on the server host: FedOD's w_i are there anyway (the teachers it
distils); FedBN/FedRep clients upload their personal parts for that in evaluated
rounds, an evaluation-only exchange that never enters training. For a global
family ``target`` is its mAP on the unlabeled target domain. ``source_accuracy``
holds the primary family's mAP per domain and ``target_accuracy`` its target mAP.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch

from fedsim.config import MethodConfig
from fedsim.data.base import ClientData
from fedsim.data.detection import client_targets, is_detection_benchmark
from fedsim.detection.fusion import fuse
from fedsim.detection.metrics import MatchRecords, accumulate, comprehensive, match_records
from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Method, Replies, ServerState
from fedsim.methods.training import load_numpy, model_to_numpy, weighted_average
from fedsim.models.detector import Detector, DetectorSpec, build_detector
from fedsim.registry import BENCHMARKS
from fedsim.seeding import derive_seed

log = logging.getLogger(__name__)

Weights = dict[str, np.ndarray]


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


@dataclass(frozen=True)
class Family:
    """A predictor reported under ``name``: global (one model for all) or per client (M_i)."""

    name: str
    per_client: bool
    client_sources: tuple[str, ...]  # what a client evaluates on its own test set (see ``resolve_source``)
    server_sources: Callable[[int], tuple[str, ...]]  # what the server host evaluates on S for client i
    fusion: Optional[str] = None  # fuse the sources' detections (wbf, nms, soft_nms, nmw); None: one source


def prefixed(tensors: Mapping[str, np.ndarray], prefix: str) -> Weights:
    """The tensors stored under ``prefix/``, without it."""
    head = prefix + "/"
    return {k[len(head):]: v for k, v in tensors.items() if k.startswith(head)}


def with_prefix(weights: Mapping[str, np.ndarray], prefix: str) -> Weights:
    return {f"{prefix}/{k}": v for k, v in weights.items()}


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


@torch.no_grad()
def detect_all(model: Detector, images: np.ndarray, batch: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Detections (boxes, scores, labels) of every image, in order."""
    out = []
    for start in range(0, len(images), batch):
        for det in model.detect(torch.from_numpy(np.ascontiguousarray(images[start:start + batch]))):
            out.append((det["boxes"].numpy().astype(np.float64), det["scores"].numpy().astype(np.float64), det["labels"].numpy().astype(np.int64)))
    return out


class DetectionMethod(Method):
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

    # evaluation ------------------------------------------------------------
    def families(self, rnd: int) -> list[Family]:
        raise NotImplementedError

    def primary(self) -> str:
        """The family whose mAP fills source_accuracy / target_accuracy."""
        raise NotImplementedError

    def eval_payloads(self, rnd: int, state: ServerState) -> tuple[Weights, Weights]:
        """(tensors for the clients and the target, tensors for the server host)."""
        raise NotImplementedError

    def configure_evaluate(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        families = self.families(rnd)
        client_payload, server_payload = self.eval_payloads(rnd, state)
        server_predictors = {}
        for fam in families:
            if fam.per_client:
                for cid in self.client_ids:
                    server_predictors[f"{fam.name}@{cid}"] = {"sources": list(fam.server_sources(cid)), "fusion": fam.fusion}
            else:
                server_predictors[fam.name] = {"sources": list(fam.server_sources(self.server_id)), "fusion": fam.fusion}
        client_predictors = {fam.name: {"sources": list(fam.client_sources), "fusion": fam.fusion} for fam in families}
        target_predictors = {fam.name: {"sources": list(fam.client_sources), "fusion": None} for fam in families if not fam.per_client}
        instructions = {self.server_id: Instruction("evaluate", server_payload, {"round": rnd, "predictors": server_predictors})}
        for cid in self.client_ids:
            instructions[cid] = Instruction("evaluate", client_payload, {"round": rnd, "predictors": client_predictors})
        for cid in self.target_ids:
            instructions[cid] = Instruction("evaluate", client_payload, {"round": rnd, "predictors": target_predictors})
        return instructions

    def summarize_evaluation(self, rnd: int, replies: Replies) -> dict:
        k = self.federation.num_classes
        alpha = self.params.alpha
        records = {cid: reply for cid, reply in replies.items()}

        def rec(cid: int, label: str) -> MatchRecords:
            return MatchRecords.from_tensors(records[cid].tensors, label)

        detection: dict[str, dict] = {}
        for fam in self.families(rnd):
            per_client = {}
            for cid in self.client_ids:
                on_server = rec(self.server_id, f"{fam.name}@{cid}" if fam.per_client else fam.name)
                own = rec(cid, fam.name)
                s, p, u = accumulate([on_server], k), accumulate([own], k), accumulate([on_server, own], k)
                per_client[str(cid)] = {"s": s["mAP"], "p": p["mAP"], "u": u["mAP"], "s50": s["AP50"], "p50": p["AP50"], "u50": u["AP50"]}
            mean = {key: float(np.mean([c[key] for c in per_client.values()])) for key in ("s", "p", "u", "s50", "p50", "u50")}
            entry = {
                "A_s": mean["s"], "A_p": mean["p"], "A_u": mean["u"], "A_com": comprehensive(mean["s"], mean["p"], alpha),
                "AP50_s": mean["s50"], "AP50_p": mean["p50"], "AP50_u": mean["u50"], "AP50_com": comprehensive(mean["s50"], mean["p50"], alpha),
                "clients": per_client,
            }
            if not fam.per_client and self.target_ids:
                target = accumulate([rec(cid, fam.name) for cid in self.target_ids], k)
                entry["target"], entry["target_AP50"] = target["mAP"], target["AP50"]
            detection[fam.name] = entry
        metrics: dict[str, Any] = {"detection": detection}
        primary = self.primary()
        source_accuracy = {}
        for domain in self.federation.source_domains:
            if domain == self.server_domain:
                source_accuracy[domain] = detection[primary]["A_s"]
            else:
                ids = [c for c in self.client_ids if self.federation.info(c).domain == domain]
                source_accuracy[domain] = accumulate([rec(c, primary) for c in ids], k)["mAP"]
        metrics["source_accuracy"] = source_accuracy
        metrics["mean_source_accuracy"] = float(np.mean(list(source_accuracy.values())))
        if "target" in detection[primary]:
            metrics["target_accuracy"] = detection[primary]["target"]
        if self.is_final(rnd):
            metrics["final_detection"] = detection
            metrics["final_alpha"] = alpha
        return metrics

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        torch.manual_seed(derive_seed(self.config.run.seed, "client-model", data.client_id))  # overwritten before every use
        return {"model": self.new_model(), "own": {}, "train": None, "test": None}

    def train_set(self, state: dict, data: ClientData) -> DetectionSet:
        if state["train"] is None:
            state["train"] = DetectionSet.build(data.train.x, client_targets(self.config.data, data, "train"))
        return state["train"]

    def test_targets(self, state: dict, data: ClientData) -> list[tuple[np.ndarray, np.ndarray]]:
        if state["test"] is None:
            state["test"] = client_targets(self.config.data, data, "test")
        return state["test"]

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

    def resolve_source(self, source: str, instruction: Instruction, state: dict) -> Weights:
        """``payload:<prefix>`` (weights in the instruction) or ``own:<key>`` (held privately); ``|`` overlays."""
        merged: Weights = {}
        for part in source.split("|"):
            kind, _, key = part.partition(":")
            if kind == "payload":
                found = prefixed(instruction.tensors, key)
            elif kind == "own":
                found = state["own"].get(key)
            else:
                raise ValueError(f"bad model source {part!r}: use payload:<prefix> or own:<key>")
            if not found:
                raise KeyError(f"client has no weights for source {part!r}")
            merged.update(found)
        return merged

    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Detect with every requested predictor on this client's test images; reply with match records only."""
        model = state["model"]
        truth = self.test_targets(state, data)
        detections: dict[str, list] = {}
        tensors: dict[str, np.ndarray] = {}
        size = (data.test.x.shape[-2], data.test.x.shape[-1])
        for label, spec in instruction.config["predictors"].items():
            per_source = []
            for source in spec["sources"]:
                if source not in detections:
                    load_numpy(model, self.resolve_source(source, instruction, state))
                    detections[source] = detect_all(model, data.test.x, self.params.eval_batch)
                per_source.append(detections[source])
            if spec["fusion"] is None:
                if len(per_source) != 1:
                    raise ValueError(f"predictor {label!r} has {len(per_source)} sources and no fusion method")
                dets = per_source[0]
            else:
                dets = [self.fuse_image(spec["fusion"], parts, size) for parts in zip(*per_source)]
            tensors.update(match_records(truth, dets, self.federation.num_classes).to_tensors(label))
        return Reply(data.client_id, tensors, {"images": float(len(data.test))}, num_examples=len(data.test)), state

    def fuse_image(self, method: str, parts: Sequence, size: tuple[int, int]):
        return fuse(list(parts), size, method=method)


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
