"""FedOD: cross-domain federated object detection (Su et al., "Cross-domain Federated Object Detection", 2022).

The server holds a large labeled set (hosted on the *server host*, see
:mod:`fedsim.methods.detection.base`); each client holds a small labeled set of a shifted domain.

1. Base stage: w_b is trained on the server's data; w_g = w_b.
2. Every round: each client fine-tunes the current w_g on its data for ``client_iters``
   steps into its personal model w_i, keeps it, and sends it. The server host
   initializes a student as the plain mean of {w_g, w_1, ..., w_N} and trains it for
   ``distill_iters`` steps on the server's labeled images with

       L = lambda_det L_FCOS(student, server labels)
         + lambda_feat (1/N) sum_i sum_l CWD_T(P_l^student, P_l^{w_i})          (every pyramid level)
         + lambda_cls  (1/N) sum_i sum_l CWD_T(cls_l^student, cls_l^{w_i})      (classification maps)
         + lambda_reg  (1/N) sum_i sum_l || reg_l^student - reg_l^{w_i} ||^2    (regression maps, mean)

   where CWD_T is channel-wise distillation (Shu et al., ICCV 2021, Eq. 2-3): each
   channel's H x W map becomes a distribution by a softmax with temperature T, and
   T^2 KL(teacher || student) is averaged over channels and images; the teachers' terms
   are averaged over the N teachers, as the paper's multi-teacher loss is (two identical
   teachers distil exactly as one). The teachers run in eval mode on the same (flipped)
   batch. The student is the new w_g, sent to every client next round.
   T and the lambdas: FedOD's values are not in its reachable sources; CWD's detection
   code uses T = 1 and weight 5 per FPN level. The defaults here (T = 4, lambda_feat = 0.1
   over the summed levels) are a deviation, a rule on the loss balance on the server's
   data (docs/fedod.md).
3. After the last distillation (round R) each client fine-tunes the final w_g^R once more
   (``fit`` with slot ``final``: client_iters steps, its bytes counted like any
   exchange) into w_i^(R+1), and ensembles w_g^R and w_i^(R+1) by weighted boxes fusion
   of their detections (``fusion_weights``, ``fusion_iou``), as the paper ensembles the
   fine-tune of the final global model; NMS, soft-NMS and NMW are reported next to it.


``mode`` gives the paper's baselines as configurations of this method:
``baseline1`` = the base model alone (no rounds of training after the base stage);
``baseline2`` = the base model ensembled with each client's fine-tune of it (rounds of
client fine-tuning from w_b, no distillation: w_g stays w_b).

Families reported (see :mod:`fedsim.methods.detection.evaluation` for A_s, A_p, A_u,
A_com; A_u is the paper's L_U, each client's model on S and on every client's test set, for
which the clients share their models in evaluated rounds, an evaluation-only exchange):
``wb`` (the base model), ``wg`` (fedod), ``wi`` (w_i of the round: w_i^R in the last), and
in the last round ``wi_first`` (w_i^1, when R > 1: the paper's claim that w_i gains over the
rounds), ``wi_final`` (w_i^(R+1), fedod) and ``ens_wbf``, ``ens_nms``,
``ens_soft_nms``, ``ens_nmw`` (w_i^(R+1) with w_g^R; w_i^R with w_b in ``baseline2``,
whose w_i are always fine-tunes of w_b). Other fusion settings can be scored on the same models in the same
evaluation: ``variant_confs`` adds ``ens_wbf_<conf>`` (WBF with that fused score),
``variant_weights`` (pairs g, p) adds ``ens_<fusion>_w<g>_<p>`` for every fusion.

Parameters and their defaults' sources: :mod:`fedsim.methods.detection.fedod.params`; the distillation loss:
:mod:`fedsim.methods.detection.fedod.distillation`; deviations: ``docs/fedod.md``.
"""

from __future__ import annotations

from typing import Any

from fedsim.data.base import ClientData
from fedsim.detection.fusion import METHODS as FUSIONS
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import ServerState, client_operation
from fedsim.methods.common.aggregation import weighted_average
from fedsim.methods.common.training import load_numpy, model_to_numpy
from fedsim.methods.detection.base import DetectionMethod, uploads_refusal
from fedsim.methods.detection.evaluation import Family, Weights, prefixed, with_prefix
from fedsim.methods.detection.fedod.distillation import multi_teacher_loss
from fedsim.methods.detection.fedod.params import FedODParams
from fedsim.registry import METHODS

#: a client's own slot -> the name under which the server host keeps the same model (``<name>@<client>``)
SERVER_SLOT = {"personal": "teacher", "first": "first", "final": "final"}


def personal_family(name: str, client_slot: str, server_slot: str) -> Family:
    """Client i's own model kept under ``own:<client_slot>``, on the server host under ``own:<server_slot>@i``, sent
    to the other clients for the evaluation as ``payload:<client_slot>@i``."""
    return Family(
        name,
        True,
        (f"own:{client_slot}",),
        lambda cid: (f"own:{server_slot}@{cid}",),
        peer_sources=lambda cid: (f"payload:{client_slot}@{cid}",),
    )


def peer_slots(families: list[Family], client_ids) -> list[str]:
    """The client slots (``personal``, ``first``, ``final``) whose models the other clients' predictors read."""
    slots = set()
    for fam in families:
        if fam.per_client and len(client_ids) > 1:
            for source in fam.peers(client_ids[0]):
                for part in source.split("|"):
                    kind, _, key = part.partition(":")
                    if kind == "payload" and "@" in key:
                        slots.add(key.partition("@")[0])
    return sorted(slots)


@METHODS.register("fedod")
class FedOD(DetectionMethod):
    """FedOD (Su et al. 2022): client fine-tunes, multi-teacher distillation on the server, WBF of w_g and w_i."""

    # defaults under the YAML and --set values (3 rounds as in the paper; the detector's step size)
    config_defaults = {"run": {"rounds": 3}, "method": {"lr": 0.02, "batch_size": 16, "weight_decay": 1e-4}}

    Params = FedODParams
    privacy_refusal = uploads_refusal(
        "each client's whole detector ('share_own', the paper's A_u, and the final fine-tunes)"
    )

    # ---- server half ------------------------------------------------------
    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """Base stage (round 1), client fine-tunes w_i, multi-teacher distillation of w_g on the server host."""
        state, metrics = self.base_stage(ctx, state)
        if self.params.mode == "baseline1":
            return state, metrics
        weights = state["weights"]  # one payload for every client: serialized once
        replies = ctx.call("fit", weights, self.roles.client_ids, {"slot": "personal"})
        metrics["train_loss"] = {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}
        teachers: Weights = {}
        for cid, reply in replies.items():
            teachers.update(with_prefix(reply.tensors, f"teacher@{cid}"))
        server, kept = self.roles.server_id, {"teachers": list(replies), "slot": "teacher"}
        if self.params.mode == "baseline2":
            ctx.call("keep_teachers", teachers, [server], kept)
            return state, metrics
        reply = ctx.call("distill", {**with_prefix(weights, "global"), **teachers}, [server], kept)[server]
        metrics.update({f"distill_{k}": v for k, v in reply.metrics.items()})
        state = {**state, "weights": dict(reply.tensors)}
        if self.is_final(ctx.round):
            metrics["final_fit_loss"] = self.final_fine_tune(ctx, state["weights"])
        return state, metrics

    def final_fine_tune(self, ctx, weights: Weights) -> dict:
        """After the last distillation: every client fine-tunes w_g^R into w_i^(R+1) (kept as ``final``); the
        server host
        gets them (as ``final@<client>``) to score them and their ensembles on S, an evaluation-only upload."""
        replies = ctx.call(
            "fit", weights, self.roles.client_ids, {"slot": "final"}, seed=lambda cid: ctx.seed(cid, "final_fit")
        )
        finals: Weights = {}
        for cid, reply in replies.items():
            finals.update(with_prefix(reply.tensors, f"final@{cid}"))
        ctx.call("keep_teachers", finals, [self.roles.server_id], {"teachers": list(replies), "slot": "final"})
        return {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}

    def families(self, rnd: int) -> list[Family]:
        base = Family("wb", False, ("payload:wb",), lambda cid: ("payload:wb",))
        if self.params.mode == "baseline1":
            return [base]
        fams = (
            [base]
            if self.params.mode == "baseline2"
            else [Family("wg", False, ("payload:wg",), lambda cid: ("payload:wg",)), base]
        )
        fams.append(personal_family("wi", "personal", "teacher"))
        if not self.is_final(rnd):
            return fams
        if rnd > 1:
            fams.append(personal_family("wi_first", "first", "first"))
        glob, own = ("wb", "personal") if self.params.mode == "baseline2" else ("wg", "final")
        if own == "final":
            fams.append(personal_family("wi_final", "final", "final"))
        for name, fusion, options in self.fusion_settings():
            fams.append(
                Family(
                    name,
                    True,
                    (f"payload:{glob}", f"own:{own}"),
                    lambda cid, g=glob, o=own: (f"payload:{g}", f"own:{SERVER_SLOT[o]}@{cid}"),
                    fusion=fusion,
                    options=options,
                    peer_sources=lambda cid, g=glob, o=own: (f"payload:{g}", f"payload:{o}@{cid}"),
                )
            )
        return fams

    def fusion_settings(self) -> list[tuple[str, str, dict]]:
        """(family name, fusion method, fuse() options) of every ensemble scored in the last round."""
        p = self.params
        common = {"iou_thr": p.fusion_iou, "skip_box_thr": p.skip_box_thr}
        settings = [
            (f"ens_{m}", m, {"weights": p.fusion_weights, **common, "conf_type": p.fusion_conf}) for m in FUSIONS
        ]
        settings += [
            (f"ens_wbf_{conf}", "wbf", {"weights": p.fusion_weights, **common, "conf_type": conf})
            for conf in p.variant_confs
        ]
        for g, w in zip(p.variant_weights[::2], p.variant_weights[1::2]):
            settings += [
                (f"ens_{m}_w{g:g}_{w:g}", m, {"weights": (g, w), **common, "conf_type": p.fusion_conf}) for m in FUSIONS
            ]
        return settings

    def primary(self) -> str:
        return "wg" if self.params.mode == "fedod" else "wb"

    def evaluation_payloads(self, ctx, state: ServerState) -> tuple[Weights, Weights]:
        """w_b (and w_g) for everyone; for the clients also every client's own models that the paper's A_u scores
        on the other clients' test sets, uploaded for that (``share_own``, an evaluation-only exchange)."""
        payload = with_prefix(state["base"], "wb")
        if self.params.mode == "fedod":
            payload.update(with_prefix(state["weights"], "wg"))
        slots = peer_slots(self.families(ctx.round), self.roles.client_ids)
        if not slots:
            return payload, payload
        peers = dict(payload)
        for reply in ctx.call("share_own", None, self.roles.client_ids, {"slots": slots}).values():
            peers.update(reply.tensors)
        return peers, payload

    # ---- client half ------------------------------------------------------
    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Client: fine-tune the global model into w_i, keep it (``personal``, in round 1 also ``first``;
        ``final`` after the last distillation), send it."""
        model = state["model"]
        load_numpy(model, instruction.tensors)
        iters = self.params.client_iters
        loss = self.local_train(model, self.train_set(state, data), iters, instruction.local, instruction.seed)
        weights = model_to_numpy(model)
        slot = instruction.values["slot"]
        state["own"][slot] = weights
        if slot == "personal" and instruction.round == 1:
            state["own"]["first"] = weights
        return Reply(data.client_id, weights, {"train_loss": loss}, num_examples=len(data.train)), state

    @client_operation
    def share_own(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Client, evaluation only: its models of the given slots (``<slot>@<client>/``), for the other clients to
        score on their test sets (the paper's A_u); never used in training."""
        tensors: Weights = {}
        for slot in instruction.values["slots"]:
            tensors.update(with_prefix(state["own"][slot], f"{slot}@{data.client_id}"))
        return Reply(data.client_id, tensors, {}, num_examples=len(data.train)), state

    @client_operation
    def keep_teachers(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Server host: keep the clients' w_i (to score them and their ensembles on the server's test set)."""
        slot = instruction.values["slot"]
        for cid in instruction.values["teachers"]:
            state["own"][f"{slot}@{cid}"] = prefixed(instruction.tensors, f"{slot}@{cid}")
            if slot == "teacher" and instruction.round == 1:
                state["own"][f"first@{cid}"] = state["own"][f"teacher@{cid}"]
        return Reply(data.client_id, {}, {}, num_examples=0), state

    @client_operation
    def distill(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Server host: student = mean(w_g, w_1..w_N), then multi-teacher distillation + detection loss on server
        data."""
        if data.client_id != self.roles.server_id:
            raise ValueError(f"distill runs on the server host, not on client {data.client_id}")
        self.keep_teachers(instruction, state, data)
        p = self.params
        ids = instruction.values["teachers"]
        teacher_weights = [state["own"][f"teacher@{cid}"] for cid in ids]
        student = state["model"]
        load_numpy(
            student,
            weighted_average([prefixed(instruction.tensors, "global")] + teacher_weights, [1.0] * (len(ids) + 1)),
        )
        teachers = state.setdefault("teacher_models", [])
        while len(teachers) < len(ids):
            teachers.append(self.new_model())
        for model, weights in zip(teachers, teacher_weights):
            load_numpy(model, weights)
            model.eval()
            model.requires_grad_(False)
        parts = {"feat": 0.0, "cls": 0.0, "reg": 0.0}
        # the distillation terms at zero (the control of the distillation claim): the same server steps on the
        # detection loss alone, the teachers not run
        distilled = max(p.lambda_feat, p.lambda_cls, p.lambda_reg) > 0
        distillation = multi_teacher_loss(teachers[: len(ids)], p, parts) if distilled else None
        loss = self.local_train(
            student,
            self.train_set(state, data),
            p.distill_iters,
            instruction.local,
            instruction.seed,
            extra_loss=distillation,
            detection_weight=p.lambda_det,
        )
        metrics = {"loss": loss, **{f"last_{k}": float(v) for k, v in parts.items()}}
        return Reply(data.client_id, model_to_numpy(student), metrics, num_examples=len(data.train)), state
