"""Evaluation of the detection methods: predictor families, their detections and scores (FedOD, Su et al. 2022).

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

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.data.detection import client_targets
from fedsim.detection.fusion import fuse
from fedsim.detection.metrics import MatchRecords, accumulate, comprehensive, match_records
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import Method, Replies, ServerState
from fedsim.methods.common.training import load_numpy
from fedsim.models.detector import Detector

Weights = dict[str, np.ndarray]


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


@torch.no_grad()
def detect_all(model: Detector, images: np.ndarray, batch: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Detections (boxes, scores, labels) of every image, in order."""
    out = []
    for start in range(0, len(images), batch):
        for det in model.detect(torch.from_numpy(np.ascontiguousarray(images[start:start + batch]))):
            out.append((det["boxes"].numpy().astype(np.float64), det["scores"].numpy().astype(np.float64), det["labels"].numpy().astype(np.int64)))
    return out


class DetectionEvaluation(Method):
    """The evaluation half of :class:`fedsim.methods._detection_common.DetectionMethod` (its base).

    Uses the roles that ``DetectionMethod.__init__`` sets (annotated below) and ``DetectionMethod.is_final``.
    """

    server_id: int
    server_domain: str
    client_ids: list[int]
    target_ids: list[int]

    # ---- server half ------------------------------------------------------
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
    def test_targets(self, state: dict, data: ClientData) -> list[tuple[np.ndarray, np.ndarray]]:
        if state["test"] is None:
            state["test"] = client_targets(self.config.data, data, "test")
        return state["test"]

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
