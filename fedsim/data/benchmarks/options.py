"""Reading a benchmark's optional settings from the ``data`` section, with one-line errors."""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

import numpy as np

from fedsim.errors import UserError
from fedsim.registry import unknown_name_message


def choice(
    config, field: str, kind: str, choices: Iterable[str], default: str, aliases: Optional[Mapping[str, str]] = None
) -> str:
    """``data.<field>`` (``default`` when absent or empty), one of ``choices`` after ``aliases``."""
    value = str(getattr(config, field, None) or default)
    value = (aliases or {}).get(value, value)
    choices = list(choices)
    if value not in choices:
        raise UserError(unknown_name_message(kind, value, choices, f"--set data.{field}=..."))
    return value


def count(config, field: str, benchmark: str, minimum: int = 2) -> Optional[int]:
    """``data.<field>`` as an integer of at least ``minimum``, or None when absent."""
    value = getattr(config, field, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise UserError(
            f"data.{field} must be an integer of at least {minimum} for the {benchmark} benchmark, got {value!r}"
        )
    return int(value)


def check_domain(benchmark: str, domain: str, domains: Iterable[str]) -> None:
    """Raise one line naming the domains when ``domain`` is not one of them."""
    domains = list(domains)
    if domain not in domains:
        raise UserError(unknown_name_message(f"domain of benchmark {benchmark!r}", domain, domains, "--target"))
