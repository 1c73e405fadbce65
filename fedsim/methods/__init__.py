"""Federated methods, each in a module named after it, or a package of that name when it has parts of its own
(``fada``, ``feddadil``, ``fedod``); ``METHODS.get(name)`` imports it on demand.

Floors, the ground first: :mod:`fedsim.methods.common` (the pieces several methods share), :mod:`fedsim.methods.base`
(the interface), :mod:`fedsim.methods.families` (the bases a few methods share), then the methods; no import runs up.
"""

from fedsim.methods.base import Method

__all__ = ["Method"]
