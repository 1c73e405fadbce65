"""Range checks of a method's parameters, raised as :class:`fedsim.errors.UserError` naming ``method.<name>``."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from fedsim.errors import UserError


def check_params(
    params: Any,
    at_least_two: Iterable[str] = (),
    positive: Iterable[str] = (),
    non_negative: Iterable[str] = (),
    choices: Mapping[str, Sequence] | None = None,
) -> None:
    """Raise on the first of ``params``' named fields out of its range: ``at_least_two`` (>= 2), ``positive`` (> 0),
    ``non_negative`` (>= 0), ``choices`` (a field name -> its allowed values)."""
    rules = (
        ("2 or more", lambda v: v >= 2, at_least_two),
        ("positive", lambda v: v > 0, positive),
        ("0 or more", lambda v: v >= 0, non_negative),
    )
    for wanted, holds, names in rules:
        for name in names:
            if not holds(getattr(params, name)):
                raise UserError(f"method.{name} must be {wanted}, got {getattr(params, name)}")
    for name, allowed in (choices or {}).items():
        if getattr(params, name) not in allowed:
            raise UserError(f"method.{name} must be one of {tuple(allowed)}, got {getattr(params, name)!r}")
