"""Federated methods: a simple method is a module named after it (``fedavg``, ``fedprox``, ``fedbn``, ``fedrep``,
``centralized``), a method with parts of its own a package of that name (``fada``), and a family of methods a
package that owns what its members share (``alignment``, ``detection``, ``dictionary``: FedDaDiL is
``fedsim.methods.dictionary.feddadil``); ``METHODS.get(name)`` imports a built-in's module on demand.

Floors, the ground first: :mod:`fedsim.methods.common` (what several families share), :mod:`fedsim.methods.base`
(the interface), then the methods and the families; no import runs up.
"""

from fedsim.methods.base import Method

__all__ = ["Method"]
