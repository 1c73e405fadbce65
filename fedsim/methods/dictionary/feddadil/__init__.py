"""FedDaDiL (Castellon, Montesuma et al., ICASSP 2024) and its server's merge of the clients' atom versions; the
dictionary learning it shares with DaDiL sits beside it in :mod:`fedsim.methods.dictionary`."""

from fedsim.methods.dictionary.feddadil.method import FedDaDiL

__all__ = ["FedDaDiL"]
