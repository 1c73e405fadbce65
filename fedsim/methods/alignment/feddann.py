"""FedDANN: DANN (Ganin et al., JMLR 2016) in the federated setting, as the baseline of Peng et al. (FADA, ICLR 2020).

Each source client trains a private domain discriminator through gradient
reversal (Eq. 9-10) against encoded target features sent by the target client;
the model weights are averaged as in FedAvg. The exchange and the local loop
are :class:`fedsim.methods.alignment.base.FeatureAlignment`'s; only the
loss object differs from FedMMD.

Defaults (never from target labels): the discriminator is one hidden layer of 100 units, the domain classifier
of Ganin et al.'s MNIST -> MNIST-M architecture (JMLR 2016, Sec. 5.2.2); its learning rate is ``method.lr``
(paper: every layer trained from scratch shares one rate); ``lambda_domain = 1`` (paper); the digits config's
0.1 is a rule on the sources' accuracy (docs/feddann.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.errors import UserError
from fedsim.losses import DANNLoss, DomainLoss
from fedsim.methods.alignment.base import AlignmentParams, FeatureAlignment
from fedsim.methods.alignment.exchanges import feddann_exchanges
from fedsim.registry import METHODS


@METHODS.register("feddann")
class FedDANN(FeatureAlignment):
    """FedDANN: adversarial alignment of source features to target features (Ganin et al. 2016)."""

    privacy_exchanges = staticmethod(feddann_exchanges)  # what privacy noises; its answer to privacy.unit=record

    copes_with_missing_replies = True  # it aggregates the replies that arrive

    @dataclass(frozen=True)
    class Params(AlignmentParams):
        discriminator_hidden: int = 100  # units per hidden layer (Ganin et al. 2016, MNIST architecture)
        discriminator_layers: int = 1  # hidden layers of the domain discriminator (idem)
        discriminator_lr_scale: float = 1.0  # discriminator lr = method.lr * this (same rate: all layers from scratch)

        def __post_init__(self):
            super().__post_init__()
            if self.discriminator_hidden < 1 or self.discriminator_layers < 0:
                raise UserError(
                    f"method.discriminator_hidden must be positive and method.discriminator_layers 0 or more, "
                    f"got {self.discriminator_hidden} and {self.discriminator_layers}"
                )
            if self.discriminator_lr_scale <= 0:
                raise UserError(f"method.discriminator_lr_scale must be positive, got {self.discriminator_lr_scale}")

    def domain_lr_scale(self) -> float:
        return self.params.discriminator_lr_scale

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        return DANNLoss(in_features, self.params.discriminator_hidden, self.params.discriminator_layers)
