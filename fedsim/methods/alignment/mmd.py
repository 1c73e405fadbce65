"""MMD (DAN's multi-kernel MMD, Long et al., ICML 2015), centralized: the pooled reference FedMMD approximates.

The same server-side loop as :mod:`fedsim.methods.alignment.dann` (sources and the
target's unlabeled inputs pooled once, each step's target batch encoded by the
current encoder, Ganin et al.'s lambda ramp and lr annealing), with FedMMD's
loss object and kernel parameters.
"""

from __future__ import annotations

from fedsim.losses import DomainLoss, MMDLoss
from fedsim.methods.alignment.fedmmd import FedMMD
from fedsim.methods.alignment.pooled import CentralizedAlignment
from fedsim.registry import METHODS


@METHODS.register("mmd")
class MMD(CentralizedAlignment):
    """MMD, centralized (Long et al. 2015): the pooled-data reference of FedMMD, same kernels and schedule."""

    Params = FedMMD.Params

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        return MMDLoss(self.params.bandwidths, self.params.kernel_multipliers)
