"""The parameters of FADA (Peng, Huang, Zhu & Saenko, ICLR 2020), :class:`fedsim.methods.fada.FADA`'s ``Params``.

The switches ``attention``, ``adversarial`` and ``disentangle`` give the paper's models I, II and III (Sec. 4);
each default names its source, and ``docs/fada.md`` gives the reasons. The authors' code is not public; the loss
weights ``lambda_adv``, ``lambda_mi``, ``lambda_recon`` and the constant schedule are those of the first author's DAL
(Peng, Huang, Sun & Saenko, ICML 2019; VisionLearningGroup/DAL, ``DAL_digits_release/solver_disentangle.py``), whose
disentanglement and MINE FADA follows (Sec. 3.3). DAL's optimizer (Adam 2e-4, weight decay 5e-4, batch 128) is not
taken for the local training, which stays FedAvg's so that the compute-matched controls compare like with like; it
is taken for the disentanglement stage, where FedAvg's SGD let a source's features diverge (``docs/fada.md``).
The consensus guard (``guard``) is fedsim's addition, not the paper's, and off by default (the paper's FADA):
:mod:`fedsim.methods.fada.guard`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.coercion import bare_off
from fedsim.errors import UserError
from fedsim.methods.common.checks import check_params
from fedsim.methods.fada.attention import GAIN_FORMS
from fedsim.methods.fada.guard import GUARDS


@dataclass(frozen=True)
class FADAParams:
    """FADA's settings, each with the source of its default (``docs/fada.md`` gives the reasons)."""

    attention: bool = True  # dynamic attention (the paper's models I-III); off: uniform weights
    gap_form: str = "share"  # the gain: the paper's dispersion I made scale-free, by a rule on the sources
    disentangle_generator: bool = True  # Eq. 4-7 train G_i too (the paper); false: G_i fixed in that stage
    adversarial: bool = True  # the adversarial alignment stage (the paper's models II and III)
    disentangle: bool = True  # the representation disentanglement stage (the paper's model III)
    lambda_adv: float = 0.01  # weight of the confusion loss on G_i and G_t: DAL's adversarial weight (module docstring)
    schedule: str = "constant"  # lambda_adv throughout (DAL); "dann": times 2 / (1 + exp(-10 p)) - 1 (Ganin et al.)
    target_batch: int = 32  # target features sent per alternation (a cost rule: one source batch's worth)
    adversarial_steps: int = 10  # D / G_i / G_t alternations per round (not in the paper: a cost rule)
    disentangle_steps: int = 0  # mini-batches per round of the disentanglement stage (0: one pass)
    identifier_hidden: int = 256  # units per hidden layer of the domain identifier (2 layers)
    parts_hidden: int = 128  # hidden units of the class identifier and the MINE statistics network
    lambda_entropy: float = 1.0  # weight of the class-identifier entropy maximized by D_i (Eq. 5): DAL's 1
    lambda_mi: float = 1e-4  # weight of the MINE estimate minimized by D_i (Eq. 6): DAL's
    lambda_recon: float = 0.01  # weight of the reconstruction L2 (Eq. 7): DAL's
    disentangle_optimizer: str = "dal"  # Eq. 4-7's updates: "dal", Adam (DAL's); "local", FedAvg's SGD (diverged)
    disentangle_lr: float = 2e-4  # DAL's Adam learning rate
    disentangle_weight_decay: float = 5e-4  # DAL's Adam weight decay
    mine_rate: float = 0.01  # moving-average rate of the MINE gradient correction (Belghazi et al. 2018, Sec. 3.2)
    mine_lr: float = 1e-4  # Adam learning rate of the MINE statistics network (kept across rounds)
    gap_samples: int = 256  # target inputs encoded for the gains
    gap_references: int = 5  # uniform reference sets B of the gap statistic (``gap_form: tibshirani``)
    gap_clusters: int = 0  # k of k-means (0: the number of classes)
    attention_temperature: float = 1.0  # softmax temperature over the gains (the paper's softmax: 1)
    # fedsim's addition, not in the paper (off: the paper's FADA); "consensus": the target keeps its round's alignment
    # only if it agrees with the sources (docs/fada.md measures what it costs the target and keeps for the sources)
    guard: str = "off"
    guard_identifier_accuracy: float = 0.99  # mean domain-identifier accuracy at which the alignment is dropped

    def __post_init__(self):
        object.__setattr__(self, "guard", bare_off(self.guard))  # YAML reads a bare `off` as false
        positive = (
            "identifier_hidden",
            "parts_hidden",
            "gap_references",
            "attention_temperature",
            "mine_lr",
            "disentangle_lr",
        )
        check_params(
            self,
            at_least_two=("target_batch", "gap_samples"),
            positive=(*positive, "adversarial_steps"),
            non_negative=(
                "lambda_adv",
                "lambda_entropy",
                "lambda_mi",
                "lambda_recon",
                "disentangle_steps",
                "gap_clusters",
                "disentangle_weight_decay",
            ),
            choices={
                "gap_form": GAIN_FORMS,
                "schedule": ("dann", "constant"),
                "guard": GUARDS,
                "disentangle_optimizer": ("dal", "local"),
            },
        )
        for name in ("mine_rate", "guard_identifier_accuracy"):
            if not 0 < getattr(self, name) <= 1:
                raise UserError(f"method.{name} must be in (0, 1], got {getattr(self, name)}")

    def disentangle_optimizers(self, local_settings):
        """The factory (parameters -> optimizer) of the disentanglement stage's updates (Eq. 4-7): DAL's Adam, or
        the local training's SGD (``local_settings``) with ``disentangle_optimizer: local``."""
        import torch

        from fedsim.methods.common.training import make_optimizer

        if self.disentangle_optimizer == "local":
            return lambda params: make_optimizer(params, local_settings)
        return lambda params: torch.optim.Adam(
            params, lr=self.disentangle_lr, weight_decay=self.disentangle_weight_decay
        )
