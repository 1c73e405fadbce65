"""Dataset dictionary learning (Montesuma et al., ECAI 2023) and its federated form (Castellon, Montesuma et al.,
ICASSP 2024): DaDiL and FedDaDiL with what they alone use, the atoms, loss and barycenters (:mod:`.learning`),
class-balanced sampling (:mod:`.sampling`), the DaDiL-R / DaDiL-E predictors (:mod:`.predictors`) and the feature
space with its encoder stage (:mod:`.base`)."""

from fedsim.methods.dictionary.dadil import DaDiL
from fedsim.methods.dictionary.feddadil import FedDaDiL

__all__ = ["DaDiL", "FedDaDiL"]
