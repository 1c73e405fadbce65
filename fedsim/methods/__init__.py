"""Federated methods, one file each, named after the method; ``METHODS.get(name)`` imports it on demand."""

from fedsim.methods.base import Method

__all__ = ["Method"]
