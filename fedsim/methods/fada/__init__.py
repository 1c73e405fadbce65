"""FADA (Peng, Huang, Zhu & Saenko, ICLR 2020) and the parts it alone uses: its parameters, networks, losses,
dynamic attention, the optional consensus guard (fedsim's addition, off by default) and step-counted
mini-batches."""

from fedsim.methods.fada.method import FADA

__all__ = ["FADA"]
