"""The parameters of FedOD (Su et al., "Cross-domain Federated Object Detection", 2022),
:class:`fedsim.methods.detection.fedod.FedOD`'s ``Params``: the distillation's and the ensemble's on top of the
detection family's. Each default names its source; ``docs/fedod.md`` gives the reasons."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.detection.fusion import CONF_TYPES
from fedsim.errors import UserError
from fedsim.methods.detection.base import DetectionParams

MODES = ("fedod", "baseline1", "baseline2")


@dataclass(frozen=True)
class FedODParams(DetectionParams):
    """FedOD's settings, each with the source of its default (``docs/fedod.md`` gives the reasons)."""

    mode: str = "fedod"  # fedod, baseline1 (w_b alone), baseline2 (w_b ensembled with client fine-tunes of it)
    distill_iters: int = 100  # student steps on the server's data per round (a cost rule)
    # T of the channel-wise distillation: CWD's segmentation T, a deviation (its detection code: 1; docs/fedod.md)
    temperature: float = 4.0
    lambda_det: float = 1.0  # detection loss on the server's labels
    # CWD summed over the pyramid levels: a rule on the server's data (CWD's detection code: 5 per level)
    lambda_feat: float = 0.1
    lambda_cls: float = 1.0  # CWD on the classification maps
    lambda_reg: float = 1.0  # L2 on the regression maps (lambda_feat = lambda_cls = lambda_reg = 0: the same server
    # steps on the detection loss alone, the control of the distillation claim in experiments/specs/fedod.yaml)
    fusion_weights: tuple[float, ...] = (1.0, 1.0)  # (global, personal) model weights of the ensemble
    fusion_iou: float = 0.55  # IoU at which boxes are fused / suppressed (ensemble-boxes' default)
    skip_box_thr: float = 0.0  # boxes below this score are ignored by the fusion (ensemble-boxes' default)
    # WBF's fused score: avg (ensemble-boxes' default), max, box_and_model_avg, absent_model_aware_avg
    fusion_conf: str = "avg"
    variant_confs: tuple[str, ...] = ()  # more WBF fused scores scored in the last round (ens_wbf_<conf>)
    variant_weights: tuple[float, ...] = ()  # more (global, personal) weight pairs, flat (ens_<fusion>_w<g>_<p>)

    def __post_init__(self):
        super().__post_init__()
        if self.mode not in MODES:
            raise UserError(f"method.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.distill_iters < 0 or self.temperature <= 0:
            raise UserError(
                f"method.distill_iters must be 0 or more and method.temperature positive, got "
                f"{self.distill_iters} and {self.temperature}"
            )
        if min(self.lambda_det, self.lambda_feat, self.lambda_cls, self.lambda_reg) < 0:
            raise UserError("method.lambda_det, lambda_feat, lambda_cls and lambda_reg must be 0 or more")
        pairs = [self.fusion_weights] + [
            self.variant_weights[i : i + 2] for i in range(0, len(self.variant_weights), 2)
        ]
        if any(len(w) != 2 or min(w) < 0 or sum(w) <= 0 for w in pairs):
            raise UserError(
                f"method.fusion_weights and variant_weights must be pairs of non-negative weights (global, "
                f"personal), got {self.fusion_weights} and {self.variant_weights}"
            )
        if not 0 < self.fusion_iou <= 1:
            raise UserError(f"method.fusion_iou must lie in (0, 1], got {self.fusion_iou}")
        for conf in (self.fusion_conf, *self.variant_confs):
            if conf not in CONF_TYPES:
                raise UserError(
                    f"method.fusion_conf and variant_confs must be among {', '.join(CONF_TYPES)}, got {conf!r}"
                )
