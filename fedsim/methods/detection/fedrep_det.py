"""FedRep for detection (Collins et al., ICML 2021, Alg. 1): shared body, personal head.

The body (backbone + feature pyramid) is shared and averaged as in
:mod:`fedsim.methods.detection.fedavg_det`; the FCOS head (classification, regression and
centerness towers) is each participant's own. A local update first trains the head
for ``head_iters`` steps with the body frozen, then the body for ``client_iters`` steps
with the head frozen (the paper's tau_h head epochs, then one body epoch). Personal
heads start from w_b's; client i's model M_i (family ``personal``) is the global body
with its own head; ``global`` keeps w_b's head (used by the unlabeled target).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.errors import UserError
from fedsim.messages import LocalSettings
from fedsim.methods.detection.base import DetectionParams, uploads_refusal
from fedsim.methods.detection.fedavg_det import FedAvgDetection
from fedsim.methods.detection.training import DetectionSet
from fedsim.models.detector import Detector, head_keys
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed


@METHODS.register("fedrep_det")
class FedRepDetection(FedAvgDetection):
    """FedRep for detection: averaged body, personal FCOS head (head steps, then body steps)."""

    privacy_refusal = uploads_refusal("each client's head ('share_personal')")

    @dataclass(frozen=True)
    class Params(DetectionParams):
        head_iters: int = 30  # head-only steps before the body steps of each local update

        def __post_init__(self):
            super().__post_init__()
            if self.head_iters < 0:
                raise UserError(f"method.head_iters must be 0 or more, got {self.head_iters}")

    personal_keys = staticmethod(head_keys)

    def local_steps(self, model: Detector, data: DetectionSet, settings: LocalSettings, seed: int) -> float:
        loss = 0.0
        for part, frozen, steps, stage in (
            (model.head, model.backbone, self.params.head_iters, "head"),
            (model.backbone, model.head, self.params.client_iters, "body"),
        ):
            frozen.requires_grad_(False)
            try:
                seed_of_stage = derive_seed(seed, stage)
                loss = self.local_train(model, data, steps, settings, seed_of_stage, parameters=part.parameters())
            finally:
                frozen.requires_grad_(True)
        return loss
