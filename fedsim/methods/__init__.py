"""Federated methods, one file each; importing this package registers them."""
from fedsim.methods import fedavg, fedprox  # noqa: F401
from fedsim.methods.base import Method

__all__ = ["Method"]
