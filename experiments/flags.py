"""What every command shares about its flags: range checks of the numeric ones, one rule per flag, and the
names a default ``--out`` folder is made of.

``fedsim run --rounds 0``, ``fedsim sweep --local-epochs 1,-1`` and ``fedsim reproduce --seeds -1``
all end the same way: one line naming the flag, the allowed range and the value, exit code 2,
before anything is written or started.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from fedsim.errors import UserError

#: flag (argparse dest) -> (type, lowest value, whether the lowest value itself is allowed)
NUMERIC_FLAGS: dict[str, tuple[type, float, bool]] = {
    "rounds": (int, 1, True),
    "local_epochs": (int, 1, True),
    "clients_per_domain": (int, 1, True),
    "seed": (int, 0, True),
    "seeds": (int, 0, True),
    "cpus_per_client": (float, 0, False),
    "gpus_per_client": (float, 0, True),
    "clients_per_round": (float, 0, False),
    "inject_faults": (int, 0, True),
    "num_samples": (int, 1, True),
    "grace_period": (int, 1, True),
}


def _rule(kind: type, lowest: float, inclusive: bool) -> str:
    noun = "an integer" if kind is int else "a number"
    if inclusive:
        return f"{noun} of {lowest:g} or more"
    return f"{noun} above {lowest:g}"


def check_number(flag: str, text: Any) -> Any:
    """One flag value (text) -> the number, or a UserError naming the flag, its range and the value."""
    kind, lowest, inclusive = NUMERIC_FLAGS[flag]
    name = "--" + flag.replace("_", "-")
    try:
        value = float(text)
        if kind is int:
            if value != int(value):
                raise ValueError
            value = int(value)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"{name} must be {_rule(kind, lowest, inclusive)}, got {text!r}") from None
    if value < lowest or (value == lowest and not inclusive):
        raise UserError(f"{name} must be {_rule(kind, lowest, inclusive)}, got {text!r}")
    return value


def check_numeric_flags(args: argparse.Namespace, lists: tuple[str, ...] = ()) -> None:
    """Every numeric flag given on the command line; ``lists`` names flags that take comma lists."""
    for flag in NUMERIC_FLAGS:
        text = getattr(args, flag, None)
        if text is None:
            continue
        if flag not in lists and "," in str(text):
            continue  # a list where one value goes: the command says how to sweep it
        for item in str(text).split(",") if flag in lists else [str(text)]:
            if item.strip():
                check_number(flag, item.strip())


def safe_name(name: str) -> str:
    """A name as part of a folder name: a plugin's dotted path with its ':' and other odd characters as '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name))


def parse_list(flag: str, text: str, kind: type, example: str) -> list:
    """'1,5' -> [1, 5]; empty items, wrong types and repeats are one-line errors."""
    items = [item.strip() for item in str(text).split(",")]
    if any(not item for item in items):
        raise UserError(
            f"bad list for --{flag} {text!r}: give comma-separated values without blanks, e.g. --{flag} {example}"
        )
    values = []
    for item in items:
        try:
            value = kind(item) if kind is not int else int(item, 10)
        except ValueError:
            raise UserError(
                f"bad value {item!r} in --{flag} {text!r}: "
                f"give comma-separated {kind.__name__}s, e.g. --{flag} {example}"
            ) from None
        if value in values:
            raise UserError(f"--{flag} {text!r} lists {item!r} twice: give each value once")
        values.append(value)
    return values
