"""FedDANN: DANN (Ganin et al., JMLR 2016) in the federated setting, as the baseline of Peng et al. (FADA, ICLR 2020).

Each source client trains a private domain discriminator through gradient
reversal (Eq. 9-10) against encoded target features sent by the target client;
the model weights are averaged as in FedAvg. The exchange and the local loop
are :class:`fedsim.methods.common.alignment.FeatureAlignment`'s; only the
loss object differs from FedMMD.
"""
from __future__ import annotations

from dataclasses import dataclass

from fedsim.errors import UserError
from fedsim.losses import DANNLoss, DomainLoss
from fedsim.methods.common.alignment import AlignmentParams, FeatureAlignment
from fedsim.registry import METHODS


@METHODS.register("feddann")
class FedDANN(FeatureAlignment):
    """FedDANN: adversarial alignment of source features to target features (Ganin et al. 2016)."""

    @dataclass(frozen=True)
    class Params(AlignmentParams):
        discriminator_hidden: int = 256  # units per hidden layer of the domain discriminator
        discriminator_layers: int = 2  # hidden layers of the domain discriminator

        def __post_init__(self):
            super().__post_init__()
            if self.discriminator_hidden < 1 or self.discriminator_layers < 0:
                raise UserError(
                    f"method.discriminator_hidden must be positive and method.discriminator_layers 0 or more, "
                    f"got {self.discriminator_hidden} and {self.discriminator_layers}"
                )

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        return DANNLoss(in_features, self.params.discriminator_hidden, self.params.discriminator_layers)
