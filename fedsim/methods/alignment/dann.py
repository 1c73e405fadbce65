"""DANN, centralized (Ganin et al., JMLR 2016): the pooled reference FedDANN approximates.

The "federated vs centralized" comparison of the FedDaDiL paper: FedDANN's discriminator, parameters and
schedule (lambda ramp 2/(1+exp(-10p))-1, learning rate mu_0/(1+10p)^0.75, Sec. 5.2.2), trained on the server
over the pooled data (:class:`~fedsim.methods.alignment.pooled.CentralizedAlignment`), the target's
batch encoded by the current encoder at every step. ``target_batch`` and ``target_normalization`` do not apply.
"""

from __future__ import annotations

from fedsim.losses import DANNLoss, DomainLoss
from fedsim.methods.alignment.feddann import FedDANN
from fedsim.methods.alignment.pooled import CentralizedAlignment
from fedsim.registry import METHODS


@METHODS.register("dann")
class DANN(CentralizedAlignment):
    """DANN, centralized (Ganin et al. 2016): the pooled-data reference of FedDANN, same discriminator and schedule."""

    Params = FedDANN.Params

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        return DANNLoss(in_features, self.params.discriminator_hidden, self.params.discriminator_layers)

    def domain_lr_scale(self) -> float:
        return self.params.discriminator_lr_scale
