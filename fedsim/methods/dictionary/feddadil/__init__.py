"""FedDaDiL (Castellon, Montesuma et al., ICASSP 2024) and its server's merge of the clients' atom versions; the
dictionary learning it shares with DaDiL sits in :mod:`fedsim.methods.common` and
:mod:`fedsim.methods.families.dictionary`."""

from fedsim.methods.feddadil.method import FedDaDiL

__all__ = ["FedDaDiL"]
