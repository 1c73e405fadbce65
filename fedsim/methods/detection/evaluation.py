"""Evaluation of the detection methods: predictor families, their detections and scores (FedOD, Su et al. 2022).

Evaluation (every evaluated round) reports *families* of predictors. For the model
M_i that client i deploys (the global model, its personal model, or their ensemble),
with S the server's test set and T_i client i's test set::

    s_i = mAP(M_i on S),  p_i = mAP(M_i on T_i)
    u_i = mAP(M_i on S u T_1 u ... u T_N)                        (the paper's L_U)
    A_s = mean_i s_i,  A_p = mean_i p_i,  A_u = mean_i u_i
    A_com(alpha) = alpha A_s + (1 - alpha) A_p          (FedOD, Su et al. 2022)

and the same with AP50. A_u is the paper's: its L_U scores a client's local model on the
server's set and on every client's set, so client j scores M_i on T_j for every i (an
evaluation that never enters training: M_i reaches client j only in the evaluation's
instruction). fedsim's narrower forms are kept under their own names:
``A_u_deployed`` = mean_i mAP(M_i on S, M_j on T_j for every client j), each T_j scored
by the model its own client deploys, and ``A_u_own`` = mean_i mAP(M_i on S u T_i); for a
global model A_u and A_u_deployed are one number, its mAP on the pooled set. Each holder matches its own detections
with pycocotools and sends only match records (:mod:`fedsim.detection.metrics`); the unions
merge records, exactly as pycocotools would on the pooled set. Scoring a personal M_i on S
needs M_i on the server host, and on T_j on client j: FedOD's w_i are on the server host
anyway (the teachers it distils) and the clients upload them for the other clients in
evaluated rounds; FedBN/FedRep clients upload their personal parts in evaluated rounds. Both
are evaluation-only exchanges. For a global family ``target`` is its mAP on the unlabeled
target domain. ``source_accuracy`` holds the primary family's mAP per domain and
``target_accuracy`` its target mAP.

A model source names weights: ``payload:<prefix>`` (sent in the instruction under
``<prefix>/``) or ``own:<key>`` (held in the client's private ``own`` dict); ``|``
overlays several (a global model with a personal part on top). Every holder receives the
payload tensors its predictors name, and no other (:func:`payload_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch

from fedsim.data.base import ArraySplit
from fedsim.detection.fusion import fuse
from fedsim.detection.metrics import MatchRecords, accumulate, comprehensive, match_records
from fedsim.methods.common.training import load_numpy
from fedsim.models.detector import Detector

Weights = dict[str, np.ndarray]
SCORES = ("s", "p", "u", "s50", "p50", "u50", "ud", "ud50", "uo", "uo50")


@dataclass(frozen=True)
class Family:
    """A predictor reported under ``name``: global (one model for all) or per client (M_i)."""

    name: str
    per_client: bool
    client_sources: tuple[str, ...]  # what a client evaluates on its own test set
    server_sources: Callable[[int], tuple[str, ...]]  # what the server host evaluates on S for client i
    fusion: Optional[str] = None  # fuse the sources' detections (wbf, nms, soft_nms, nmw); None: one source
    options: Mapping[str, Any] = field(default_factory=dict)  # keyword arguments of fedsim.detection.fusion.fuse
    #: what another client evaluates on its test set for client i's M_i (the paper's A_u); None: server_sources
    peer_sources: Optional[Callable[[int], tuple[str, ...]]] = None

    def peers(self, cid: int) -> tuple[str, ...]:
        """The model sources with which another client runs client ``cid``'s M_i."""
        return (self.peer_sources or self.server_sources)(cid)


@dataclass(frozen=True)
class DetectionRoles:
    """Who holds what: the server host (the server's own labeled data), the labeled clients, the unlabeled target."""

    server_domain: str
    server_id: int
    client_ids: tuple[int, ...]
    target_ids: tuple[int, ...]


def prefixed(tensors: Mapping[str, np.ndarray], prefix: str) -> Weights:
    """The tensors stored under ``prefix/``, without it."""
    head = prefix + "/"
    return {k[len(head) :]: v for k, v in tensors.items() if k.startswith(head)}


def with_prefix(weights: Mapping[str, np.ndarray], prefix: str) -> Weights:
    return {f"{prefix}/{k}": v for k, v in weights.items()}


@torch.no_grad()
def detect_all(model: Detector, images: np.ndarray, batch: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Detections (boxes, scores, labels) of every image, in order."""
    out = []
    for start in range(0, len(images), batch):
        for det in model.detect(torch.from_numpy(np.ascontiguousarray(images[start : start + batch]))):
            out.append(
                (
                    det["boxes"].numpy().astype(np.float64),
                    det["scores"].numpy().astype(np.float64),
                    det["labels"].numpy().astype(np.int64),
                )
            )
    return out


# ---- server half -------------------------------------------------------------
def predictor_values(families: list[Family], roles: DetectionRoles) -> dict[int, dict]:
    """Each evaluating client's instruction values: the predictors it scores on its own test set.

    The server host scores every M_i on S (``<family>@<client>``); a client scores its own
    M_i (``<family>``) and every other client's (``<family>@<client>``, the paper's A_u); the
    target scores the global families only, unfused.
    """
    server = {}
    for fam in families:
        spec = {"fusion": fam.fusion, "options": dict(fam.options)}
        if fam.per_client:
            for cid in roles.client_ids:
                server[f"{fam.name}@{cid}"] = {"sources": list(fam.server_sources(cid)), **spec}
        else:
            server[fam.name] = {"sources": list(fam.server_sources(roles.server_id)), **spec}

    def client(cid: int) -> dict:
        predictors = {}
        for fam in families:
            spec = {"fusion": fam.fusion, "options": dict(fam.options)}
            predictors[fam.name] = {"sources": list(fam.client_sources), **spec}
            if fam.per_client:
                for other in roles.client_ids:
                    if other != cid:
                        predictors[f"{fam.name}@{other}"] = {"sources": list(fam.peers(other)), **spec}
        return {"predictors": predictors}

    target = {
        "predictors": {
            fam.name: {"sources": list(fam.client_sources), "fusion": None, "options": {}}
            for fam in families
            if not fam.per_client
        }
    }
    values = {roles.server_id: {"predictors": server}}
    values.update({cid: client(cid) for cid in roles.client_ids})
    values.update({cid: target for cid in roles.target_ids})
    return values


def payload_prefixes(values: Mapping[str, Any]) -> frozenset[str]:
    """The ``payload:<prefix>`` names that one holder's predictors (its instruction values) read."""
    return frozenset(
        part.partition(":")[2]
        for spec in values["predictors"].values()
        for source in spec["sources"]
        for part in source.split("|")
        if part.startswith("payload:")
    )


def payload_for(pool: Mapping[str, np.ndarray], values: Mapping[int, Mapping[str, Any]]) -> dict[int, Weights]:
    """Each holder's evaluation tensors: the tensors of ``pool`` under the prefixes its predictors read, no other
    (holders that read the same prefixes share one dict, serialized once). KeyError for a prefix ``pool`` lacks."""
    shared: dict[frozenset, Weights] = {}
    out = {}
    for cid, held in values.items():
        prefixes = payload_prefixes(held)
        if prefixes not in shared:
            chosen = {k: v for k, v in pool.items() if k.partition("/")[0] in prefixes}
            missing = prefixes - {k.partition("/")[0] for k in chosen}
            if missing:
                raise KeyError(f"no evaluation tensors for payload {sorted(missing)}")
            shared[prefixes] = chosen
        out[cid] = shared[prefixes]
    return out


def family_scores(
    fam: Family, records: Callable[[int, str], MatchRecords], roles: DetectionRoles, num_classes: int, alpha: float
) -> dict:
    """A_s, A_p, A_u (the paper's), A_u_deployed, A_u_own, A_com (mAP and AP50) of one family, per client and
    averaged; ``target`` for a global family."""
    per_client = {}
    on_clients = {cid: records(cid, fam.name) for cid in roles.client_ids}
    for cid in roles.client_ids:
        on_server = records(roles.server_id, f"{fam.name}@{cid}" if fam.per_client else fam.name)
        own = on_clients[cid]
        # M_i on every client's test set T_j: client j's records of M_i (its own for j = i or a global model)
        everywhere = [
            on_clients[j] if j == cid or not fam.per_client else records(j, f"{fam.name}@{cid}")
            for j in roles.client_ids
        ]
        s, p = accumulate([on_server], num_classes), accumulate([own], num_classes)
        u = accumulate([on_server, *everywhere], num_classes)
        ud = accumulate([on_server, *on_clients.values()], num_classes)
        uo = accumulate([on_server, own], num_classes)
        per_client[str(cid)] = {
            "s": s["mAP"],
            "p": p["mAP"],
            "u": u["mAP"],
            "s50": s["AP50"],
            "p50": p["AP50"],
            "u50": u["AP50"],
            "ud": ud["mAP"],
            "ud50": ud["AP50"],
            "uo": uo["mAP"],
            "uo50": uo["AP50"],
        }
    mean = {key: float(np.mean([c[key] for c in per_client.values()])) for key in SCORES}
    entry = {
        "A_s": mean["s"],
        "A_p": mean["p"],
        "A_u": mean["u"],
        "A_com": comprehensive(mean["s"], mean["p"], alpha),
        "AP50_s": mean["s50"],
        "AP50_p": mean["p50"],
        "AP50_u": mean["u50"],
        "AP50_com": comprehensive(mean["s50"], mean["p50"], alpha),
        "A_u_deployed": mean["ud"],
        "AP50_u_deployed": mean["ud50"],
        "A_u_own": mean["uo"],
        "AP50_u_own": mean["uo50"],
        "clients": per_client,
    }
    if not fam.per_client and roles.target_ids:
        target = accumulate([records(cid, fam.name) for cid in roles.target_ids], num_classes)
        entry["target"], entry["target_AP50"] = target["mAP"], target["AP50"]
    return entry


def summarize(
    families: list[Family],
    replies: Mapping[int, Any],
    roles: DetectionRoles,
    federation,
    alpha: float,
    primary: str,
    final: bool,
) -> dict:
    """Evaluation replies -> ``detection`` (every family's scores), the primary family's ``source_accuracy``
    (mAP per source domain) and ``target_accuracy``; in the last round also ``final_detection`` and ``final_alpha``."""
    k = federation.num_classes

    def records(cid: int, label: str) -> MatchRecords:
        return MatchRecords.from_tensors(replies[cid].tensors, label)

    detection = {fam.name: family_scores(fam, records, roles, k, alpha) for fam in families}
    metrics: dict[str, Any] = {
        "detection": detection,
        "primary_A_com": detection[primary]["A_com"],
    }  # per round: the curves
    source_accuracy = {}
    for domain in federation.source_domains:
        if domain == roles.server_domain:
            source_accuracy[domain] = detection[primary]["A_s"]
        else:
            ids = [c for c in roles.client_ids if federation.info(c).domain == domain]
            source_accuracy[domain] = accumulate([records(c, primary) for c in ids], k)["mAP"]
    metrics["source_accuracy"] = source_accuracy
    metrics["mean_source_accuracy"] = float(np.mean(list(source_accuracy.values())))
    if "target" in detection[primary]:
        metrics["target_accuracy"] = detection[primary]["target"]
    if final:
        metrics["final_detection"] = detection
        metrics["final_alpha"] = alpha
    return metrics


# ---- client half -------------------------------------------------------------
def resolve_source(source: str, tensors: Mapping[str, np.ndarray], own: Mapping[str, Weights]) -> Weights:
    """The weights a model source names (see the module docstring)."""
    merged: Weights = {}
    for part in source.split("|"):
        kind, _, key = part.partition(":")
        if kind == "payload":
            found = prefixed(tensors, key)
        elif kind == "own":
            found = own.get(key)
        else:
            raise ValueError(f"bad model source {part!r}: use payload:<prefix> or own:<key>")
        if not found:
            raise KeyError(f"client has no weights for source {part!r}")
        merged.update(found)
    return merged


def score_predictors(
    model: Detector,
    predictors: Mapping[str, dict],
    tensors: Mapping[str, np.ndarray],
    own: Mapping[str, Weights],
    test: ArraySplit,
    num_classes: int,
    batch: int,
) -> dict[str, np.ndarray]:
    """Detect with every predictor on a test split (each model source once); the match records of each, as tensors."""
    detections: dict[str, list] = {}
    out: dict[str, np.ndarray] = {}
    size = (test.x.shape[-2], test.x.shape[-1])
    for label, spec in predictors.items():
        per_source = []
        for source in spec["sources"]:
            if source not in detections:
                load_numpy(model, resolve_source(source, tensors, own))
                detections[source] = detect_all(model, test.x, batch)
            per_source.append(detections[source])
        if spec["fusion"] is None:
            if len(per_source) != 1:
                raise ValueError(f"predictor {label!r} has {len(per_source)} sources and no fusion method")
            dets = per_source[0]
        else:
            dets = [fuse(list(parts), size, method=spec["fusion"], **spec["options"]) for parts in zip(*per_source)]
        out.update(match_records(test.targets, dets, num_classes).to_tensors(label))
    return out
