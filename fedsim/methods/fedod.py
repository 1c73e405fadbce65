"""FedOD: cross-domain federated object detection (Su et al., "Cross-domain Federated Object Detection", 2022).

The server holds a large labeled set (hosted on the *server host*, see
``_detection_common``); each client holds a small labeled set of a shifted domain.

1. Base stage: w_b is trained on the server's data; w_g = w_b.
2. Every round: each client fine-tunes the current w_g on its data for ``client_iters``
   steps into its personal model w_i, keeps it, and sends it. The server host
   initializes a student as the plain mean of {w_g, w_1, ..., w_N} and trains it for
   ``distill_iters`` steps on the server's labeled images with

       L = lambda_det L_FCOS(student, server labels)
         + lambda_feat sum_i sum_l CWD_T(P_l^student, P_l^{w_i})          (every pyramid level)
         + lambda_cls  sum_i sum_l CWD_T(cls_l^student, cls_l^{w_i})      (classification maps)
         + lambda_reg  sum_i sum_l || reg_l^student - reg_l^{w_i} ||^2    (regression maps, mean)

   where CWD_T is channel-wise distillation (Shu et al., ICCV 2021, Eq. 2-3): each
   channel's H x W map becomes a distribution by a softmax with temperature T, and
   T^2 KL(teacher || student) is averaged over channels and images; the teachers' terms
   are summed, not averaged. The teachers run in eval mode on the same (flipped)
   batch. The student is the new w_g, sent to every client next round.
3. After the last round each client ensembles w_g and w_i by weighted boxes fusion of
   their detections (``fusion_weights``, ``fusion_iou``); NMS, soft-NMS and NMW are
   reported next to it, as in the paper's comparison.

``mode`` gives the paper's baselines as configurations of this file:
``baseline1`` = the base model alone (no rounds of training after the base stage);
``baseline2`` = the base model ensembled with each client's fine-tune of it (rounds of
client fine-tuning from w_b, no distillation: w_g stays w_b).

Families reported (see ``_detection_common`` for A_s, A_p, A_u, A_com): ``wb`` (the base
model), ``wg`` (fedod), ``wi`` (the personal models), and in the last round ``ens_wbf``,
``ens_nms``, ``ens_soft_nms``, ``ens_nmw`` (w_i with w_g; with w_b in ``baseline2``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fedsim.data.base import ClientData
from fedsim.detection.fusion import CONF_TYPES, fuse
from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply
from fedsim.methods._detection_common import DetectionMethod, DetectionParams, Family, Weights, prefixed, with_prefix
from fedsim.methods.base import ServerState
from fedsim.methods.common.training import load_numpy, model_to_numpy, weighted_average
from fedsim.registry import METHODS

MODES = ("fedod", "baseline1", "baseline2")
FUSIONS = ("wbf", "nms", "soft_nms", "nmw")


def channel_wise_distillation(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 KL(softmax(teacher_c / T) || softmax(student_c / T)) over H x W, averaged over images and channels (Shu et al. 2021)."""
    n, c = student.shape[:2]
    s = student.reshape(n * c, -1) / temperature
    t = teacher.reshape(n * c, -1) / temperature
    kl = (F.softmax(t, dim=1) * (F.log_softmax(t, dim=1) - F.log_softmax(s, dim=1))).sum(dim=1)
    return kl.mean() * temperature ** 2


@METHODS.register("fedod")
class FedOD(DetectionMethod):
    # defaults under the YAML and --set values (3 rounds as in the paper; the detector's step size)
    config_defaults = {"run": {"rounds": 3}, "method": {"lr": 0.02, "batch_size": 16, "weight_decay": 1e-4}}
    """FedOD (Su et al. 2022): client fine-tuning, multi-teacher distillation on the server, WBF ensemble of w_g and w_i."""

    @dataclass(frozen=True)
    class Params(DetectionParams):
        mode: str = "fedod"  # fedod, baseline1 (w_b alone), baseline2 (w_b ensembled with client fine-tunes of it)
        distill_iters: int = 100  # student steps on the server's data per round
        temperature: float = 4.0  # T of the channel-wise distillation
        lambda_det: float = 1.0  # detection loss on the server's labels
        lambda_feat: float = 0.1  # CWD on every feature-pyramid level (its sum over levels and teachers starts ~8x the detection loss)
        lambda_cls: float = 1.0  # CWD on the classification maps
        lambda_reg: float = 1.0  # L2 on the regression maps
        fusion_weights: tuple[float, ...] = (1.0, 1.0)  # (global, personal) model weights of the ensemble
        fusion_iou: float = 0.55  # IoU at which boxes are fused / suppressed
        skip_box_thr: float = 0.0  # boxes below this score are ignored by the fusion
        fusion_conf: str = "avg"  # WBF's fused score: avg, max, box_and_model_avg, absent_model_aware_avg (ensemble-boxes conf_type)

        def __post_init__(self):
            super().__post_init__()
            if self.mode not in MODES:
                raise UserError(f"method.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
            if self.distill_iters < 0 or self.temperature <= 0:
                raise UserError(f"method.distill_iters must be 0 or more and method.temperature positive, got {self.distill_iters} and {self.temperature}")
            if min(self.lambda_det, self.lambda_feat, self.lambda_cls, self.lambda_reg) < 0:
                raise UserError("method.lambda_det, lambda_feat, lambda_cls and lambda_reg must be 0 or more")
            if len(self.fusion_weights) != 2 or min(self.fusion_weights) < 0 or sum(self.fusion_weights) <= 0:
                raise UserError(f"method.fusion_weights must be two non-negative weights (global, personal), got {self.fusion_weights}")
            if not 0 < self.fusion_iou <= 1:
                raise UserError(f"method.fusion_iou must lie in (0, 1], got {self.fusion_iou}")
            if self.fusion_conf not in CONF_TYPES:
                raise UserError(f"method.fusion_conf must be one of {', '.join(CONF_TYPES)}, got {self.fusion_conf!r}")

    operations = ("train_base", "fit", "distill", "keep_teachers", "evaluate")

    # ---- server half ------------------------------------------------------
    def run_round(self, rnd: int, state: ServerState, executor) -> tuple[ServerState, dict]:
        state, metrics = self.base_stage(state, executor)
        if self.params.mode == "baseline1":
            return state, metrics
        weights = state["weights"]  # one payload for every client: serialized once
        replies = executor.run({cid: Instruction("fit", weights, {"seed": self.client_seed(rnd, cid, "fit"), "round": rnd}) for cid in self.client_ids})
        metrics["train_loss"] = {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}
        teachers: Weights = {}
        for cid, reply in replies.items():
            teachers.update(with_prefix(reply.tensors, f"teacher@{cid}"))
        config = {"round": rnd, "teachers": list(replies), "seed": self.client_seed(rnd, self.server_id, "distill")}
        if self.params.mode == "baseline2":
            executor.run({self.server_id: Instruction("keep_teachers", teachers, config)})
            return state, metrics
        payload = {**with_prefix(weights, "global"), **teachers}
        reply = executor.run({self.server_id: Instruction("distill", payload, config)})[self.server_id]
        metrics.update({f"distill_{k}": v for k, v in reply.metrics.items()})
        return {**state, "weights": dict(reply.tensors)}, metrics

    def families(self, rnd: int) -> list[Family]:
        base = Family("wb", False, ("payload:wb",), lambda cid: ("payload:wb",))
        if self.params.mode == "baseline1":
            return [base]
        personal = Family("wi", True, ("own:personal",), lambda cid: (f"own:teacher@{cid}",))
        glob = "wb" if self.params.mode == "baseline2" else "wg"
        fams = [base] if self.params.mode == "baseline2" else [Family("wg", False, ("payload:wg",), lambda cid: ("payload:wg",)), base]
        fams.append(personal)
        if self.is_final(rnd):
            for method in FUSIONS:
                fams.append(Family(f"ens_{method}", True, (f"payload:{glob}", "own:personal"), lambda cid, g=glob: (f"payload:{g}", f"own:teacher@{cid}"), fusion=method))
        return fams

    def primary(self) -> str:
        return "wg" if self.params.mode == "fedod" else "wb"

    def eval_payloads(self, rnd: int, state: ServerState) -> tuple[Weights, Weights]:
        payload = with_prefix(state["base"], "wb")
        if self.params.mode == "fedod":
            payload.update(with_prefix(state["weights"], "wg"))
        return payload, payload

    def fuse_image(self, method: str, parts, size):
        p = self.params
        return fuse(list(parts), size, method=method, weights=p.fusion_weights, iou_thr=p.fusion_iou, skip_box_thr=p.skip_box_thr, conf_type=p.fusion_conf)

    # ---- client half ------------------------------------------------------
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Client: fine-tune the global model into w_i, keep it, send it."""
        if data.train.y is None:
            raise ValueError("fit needs labels: the target client only evaluates")
        model = state["model"]
        load_numpy(model, instruction.tensors)
        loss = self.local_train(model, self.train_set(state, data), self.params.client_iters, instruction.config["seed"])
        state["own"]["personal"] = model_to_numpy(model)
        return Reply(data.client_id, state["own"]["personal"], {"train_loss": loss}, num_examples=len(data.train)), state

    def keep_teachers(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Server host: keep the clients' w_i (to score them and their ensembles on the server's test set)."""
        for cid in instruction.config["teachers"]:
            state["own"][f"teacher@{cid}"] = prefixed(instruction.tensors, f"teacher@{cid}")
        return Reply(data.client_id, {}, {}, num_examples=0), state

    def distill(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Server host: student = mean(w_g, w_1..w_N), then multi-teacher distillation + detection loss on server data."""
        if data.domain != self.server_domain:
            raise ValueError(f"distill runs on the server host, not on client {data.client_id}")
        self.keep_teachers(instruction, state, data)
        p = self.params
        ids = instruction.config["teachers"]
        teacher_weights = [state["own"][f"teacher@{cid}"] for cid in ids]
        student = state["model"]
        load_numpy(student, weighted_average([prefixed(instruction.tensors, "global")] + teacher_weights, [1.0] * (len(ids) + 1)))
        teachers = state.setdefault("teacher_models", [])
        while len(teachers) < len(ids):
            teachers.append(self.new_model())
        for model, weights in zip(teachers, teacher_weights):
            load_numpy(model, weights)
            model.eval()
            model.requires_grad_(False)
        parts = {"feat": 0.0, "cls": 0.0, "reg": 0.0}

        def distillation(images: torch.Tensor, maps: dict) -> torch.Tensor:
            total = images.new_zeros(())
            parts.update(feat=0.0, cls=0.0, reg=0.0)
            for model in teachers[:len(ids)]:
                with torch.no_grad():
                    t_maps = model.maps(images)
                feat = sum(channel_wise_distillation(s, t, p.temperature) for s, t in zip(maps["features"], t_maps["features"]))
                cls = sum(channel_wise_distillation(s, t, p.temperature) for s, t in zip(maps["cls_logits"], t_maps["cls_logits"]))
                reg = sum(F.mse_loss(s, t) for s, t in zip(maps["bbox_regression"], t_maps["bbox_regression"]))
                parts["feat"] += float(feat.detach())
                parts["cls"] += float(cls.detach())
                parts["reg"] += float(reg.detach())
                total = total + p.lambda_feat * feat + p.lambda_cls * cls + p.lambda_reg * reg
            return total

        loss = self.local_train(student, self.train_set(state, data), p.distill_iters, instruction.config["seed"], extra_loss=distillation, detection_weight=p.lambda_det)
        metrics = {"loss": loss, **{f"last_{k}": float(v) for k, v in parts.items()}}
        return Reply(data.client_id, model_to_numpy(student), metrics, num_examples=len(data.train)), state
