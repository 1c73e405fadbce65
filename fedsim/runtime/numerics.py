"""Non-finite values a run computed, found where they cross the wire (a client's reply, the server's global
tensors): a :class:`~fedsim.errors.NumericalError` naming the method, round, client and quantity."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from fedsim.errors import NumericalError, first_values

#: what a non-finite weight means and what to change (the method's own rates: its docs and its Params)
DIVERGED = "the computation that produced it diverged; lower the method's learning rate (method.lr or its own rates)"


def non_finite(tensors: Mapping[str, Any]) -> Optional[str]:
    """The name of the first floating-point tensor in ``tensors`` holding nan or inf, None when all are finite."""
    for name, value in tensors.items():
        array = np.asarray(value)
        if array.dtype.kind in "fc" and not bool(np.isfinite(array).all()):
            return name
    return None


def check_tensors(tensors: Mapping[str, Any], what: str, **where) -> None:
    """A NumericalError for the first non-finite tensor; its quantity is ``what`` with ``{name}`` filled in
    (``where``: method, round, client)."""
    name = non_finite(tensors)
    if name is not None:
        raise NumericalError(what.format(name=repr(name)), first_values(tensors[name]), DIVERGED, **where)
