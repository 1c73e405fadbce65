"""FedAvg for detection (McMahan et al., AISTATS 2017, Alg. 1), the FedOD paper's first federated baseline.

After the base stage (w_b on the server's data, see :mod:`fedsim.methods.detection.base`),
every round the server host and every labeled client load the global detector (with
their own personal part on top, for FedBN and FedRep), train it for ``client_iters``
steps on their own data, keep the personal part and send the rest; the server
replaces the shared tensors by their sample-weighted mean. Personal parts start from
w_b. One model for everyone: family ``global``; with a personal part, client i's model
M_i is family ``personal``, and ``global`` keeps w_b's personal keys (used by the
unlabeled target, which has no part of its own).

Scoring M_i on the server's test set needs M_i on the server host: in evaluated rounds
the clients upload their personal parts for that (``share_personal``), an
evaluation-only exchange that never enters training.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional

from fedsim.data.base import ClientData
from fedsim.messages import Instruction, LocalSettings, Reply
from fedsim.methods.base import ServerState, client_operation
from fedsim.methods.common.aggregation import weighted_average
from fedsim.methods.common.training import load_numpy, model_to_numpy
from fedsim.methods.detection.base import DetectionMethod, detection_refusal
from fedsim.methods.detection.evaluation import Family, Weights, with_prefix
from fedsim.methods.detection.training import DetectionSet
from fedsim.models.detector import Detector
from fedsim.registry import METHODS


@METHODS.register("fedavg_det")
class FedAvgDetection(DetectionMethod):
    """FedAvg for detection: the server host and the clients average one FCOS detector."""

    privacy_refusal = detection_refusal(
        "and the sensitivity of an FCOS update (BN statistics, GroupNorm towers) is not analysed in fedsim"
    )

    #: the state-dict keys each participant keeps for itself (FedBN: batch norm; FedRep: the head); None: none
    personal_keys: ClassVar[Optional[Callable[[Detector], set[str]]]] = None

    # ---- server half ------------------------------------------------------
    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        state, metrics = self.base_stage(ctx, state)
        weights = state["weights"]  # one payload for every participant: serialized once
        replies = ctx.call("fit", weights, [self.roles.server_id, *self.roles.client_ids])
        shared = weighted_average([r.tensors for r in replies.values()], [r.num_examples for r in replies.values()])
        metrics["train_loss"] = {str(cid): r.metrics["train_loss"] for cid, r in replies.items()}
        return {**state, "weights": {**weights, **shared}}, metrics

    def families(self, rnd: int) -> list[Family]:
        fams = [Family("global", False, ("payload:global",), lambda cid: ("payload:global",))]
        if self.personal_keys is not None:
            fams.append(
                Family(
                    "personal",
                    True,
                    ("payload:global|own:personal",),
                    lambda cid: (f"payload:global|payload:personal@{cid}",),
                )
            )
        return fams

    def primary(self) -> str:
        return "global" if self.personal_keys is None else "personal"

    def evaluation_payloads(self, ctx, state: ServerState) -> tuple[Weights, Weights]:
        shared = with_prefix(state["weights"], "global")
        server = dict(shared)
        if self.personal_keys is not None:
            uploads = ctx.call("share_personal", None, self.roles.client_ids)
            for cid, reply in uploads.items():
                server.update(with_prefix(reply.tensors, f"personal@{cid}"))
        return shared, server

    # ---- client half ------------------------------------------------------
    def local_steps(self, model: Detector, data: DetectionSet, settings: LocalSettings, seed: int) -> float:
        """The local update (FedRep overrides it with its head-then-body schedule)."""
        return self.local_train(model, data, self.params.client_iters, settings, seed)

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        model = state["model"]
        load_numpy(model, {**instruction.tensors, **state["own"].get("personal", {})})
        loss = self.local_steps(model, self.train_set(state, data), instruction.local, instruction.seed)
        weights = model_to_numpy(model)
        personal = self.personal_keys(model) if self.personal_keys is not None else set()
        if personal:
            state["own"]["personal"] = {k: weights[k] for k in personal}
        shared = {k: v for k, v in weights.items() if k not in personal}
        return Reply(data.client_id, shared, {"train_loss": loss}, num_examples=len(data.train)), state

    @client_operation
    def share_personal(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Evaluation only: the personal part, so that the server host can score M_i on its test set."""
        return Reply(data.client_id, dict(state["own"]["personal"]), {}, num_examples=len(data.train)), state
