"""Feature alignment against an unlabeled target: FedDANN and FedMMD (one exchange of encoded target features,
then FedAvg on the sources; :mod:`.base`), their pooled references DANN and MMD (:mod:`.pooled`), the step
objective and its schedule (:mod:`.objective`) and FedMMD's batched local training (:mod:`.vectorized`)."""

from fedsim.methods.alignment.dann import DANN
from fedsim.methods.alignment.feddann import FedDANN
from fedsim.methods.alignment.fedmmd import FedMMD
from fedsim.methods.alignment.mmd import MMD

__all__ = ["DANN", "MMD", "FedDANN", "FedMMD"]
