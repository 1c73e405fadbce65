"""Distillation losses of a detector student against teacher detectors (FedOD's server step)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from fedsim.models.detector import Detector


def channel_wise_distillation(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Channel-wise distillation (Shu et al., ICCV 2021, Eq. 2-3): T^2 KL(softmax(teacher_c / T) ||
    softmax(student_c / T)) over H x W, averaged over images and channels."""
    n, c = student.shape[:2]
    s = student.reshape(n * c, -1) / temperature
    t = teacher.reshape(n * c, -1) / temperature
    kl = (F.softmax(t, dim=1) * (F.log_softmax(t, dim=1) - F.log_softmax(s, dim=1))).sum(dim=1)
    return kl.mean() * temperature**2


def multi_teacher_loss(teachers: list[Detector], params, parts: dict) -> Callable[[torch.Tensor, dict], torch.Tensor]:
    """FedOD's distillation terms of the student's loss (Su et al. 2022), averaged over the N teachers:
    lambda_feat CWD on every pyramid level + lambda_cls CWD on the classification maps + lambda_reg L2 on the
    regression maps (``params`` holds the temperature and the lambdas); ``parts`` gets the last batch's terms, summed
    on the student's device in float64 and read back in one copy per batch. The teachers see ``images`` on that
    device."""
    share = 1.0 / max(len(teachers), 1)

    def distillation(images: torch.Tensor, maps: dict) -> torch.Tensor:
        images = images.to(maps["features"][0].device)
        total = images.new_zeros(())
        terms = images.new_zeros(3, dtype=torch.float64)  # feat, cls, reg
        for model in teachers:
            with torch.no_grad():
                t_maps = model.maps(images)
            feat = sum(
                channel_wise_distillation(s, t, params.temperature)
                for s, t in zip(maps["features"], t_maps["features"])
            )
            cls = sum(
                channel_wise_distillation(s, t, params.temperature)
                for s, t in zip(maps["cls_logits"], t_maps["cls_logits"])
            )
            reg = sum(F.mse_loss(s, t) for s, t in zip(maps["bbox_regression"], t_maps["bbox_regression"]))
            terms = terms + share * torch.stack([feat.detach(), cls.detach(), reg.detach()]).double()
            total = total + share * (params.lambda_feat * feat + params.lambda_cls * cls + params.lambda_reg * reg)
        parts.update(zip(("feat", "cls", "reg"), terms.tolist()))
        return total

    return distillation
