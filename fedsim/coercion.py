"""Loose values into typed ones: a config scalar against its field's type, a mapping into a frozen dataclass with
every key known, and an instruction's values into the dataclass its reader declares.

A bad config value is one :class:`fedsim.errors.UserError` line naming the key; a bad instruction value, a bug of
the server half that sent it, is one TypeError line naming the operation and the value.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping

from fedsim.errors import UserError


@dataclass(frozen=True)
class NoOptions:
    """A benchmark without options of its own."""


def bare_off(value):
    """``"off"`` for what YAML makes of a bare ``off`` (false, or its text "False"); any other value as it is."""
    return "off" if value in ("False", False) else value


def _coerce_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise UserError(f"{where} must be true or false, got {value!r}")


def _coerce_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        raise UserError(f"{where} must be an integer, got {value!r}")
    try:
        as_float = float(value)
        if as_float != int(as_float):
            raise ValueError
        return int(as_float)
    except (ValueError, OverflowError):
        raise UserError(f"{where} must be an integer, got {value!r}") from None


def _coerce_float(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise UserError(f"{where} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where} must be a number, got {value!r}") from None


def coerce_value(value: Any, annotation: Any, where: str) -> Any:
    """Check and convert one scalar to the field's type."""
    hint = annotation
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is Any:
        return value
    if hint is bool:
        return _coerce_bool(value, where)
    if hint is int:
        return _coerce_int(value, where)
    if hint is float:
        return _coerce_float(value, where)
    if hint is str:
        if isinstance(value, (dict, list)):
            raise UserError(f"{where} must be a string, got {value!r}")
        return str(value)
    if origin in (tuple, list) or hint in (tuple, list):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where} must be a list, got {value!r}")
        inner = args[0] if args else Any
        return tuple(coerce_value(v, inner, where) for v in value)
    return value


def closest(name: str, valid: list[str]) -> str:
    """The valid name closest to ``name``, as a hint (or the list of valid names)."""
    match = difflib.get_close_matches(name, valid, n=1)
    return f"did you mean {match[0]!r}?" if match else f"valid keys: {', '.join(sorted(valid))}"


def build_checked(
    cls: type, values: dict, where: str, extra_valid: tuple[str, ...] = (), moved: Mapping[str, str] | None = None
) -> Any:
    """``cls(**values)`` with every key known (``moved``: old dotted key -> new) and every value of its field's type."""
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in valid:
            new = (moved or {}).get(f"{where}.{key}")
            hint = f"it moved to {new!r} (Ray backend settings)" if new else closest(key, valid + list(extra_valid))
            raise UserError(f"unknown config key '{where}.{key}': {hint}")
        kwargs[key] = coerce_value(value, hints[key], f"{where}.{key}")
    return cls(**kwargs)


def _of_type(value: Any, hint: Any) -> bool:
    """Whether an instruction value fits its field's annotation (scalars, Optional and Literal checked; anything
    else taken as it is)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return any(_of_type(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str):
        return isinstance(value, hint)
    return True


def read_values(cls: type, values: Mapping[str, Any], operation: str, shared: bool = False) -> Any:
    """The frozen dataclass ``cls`` of what an instruction of ``operation`` carries in its ``values``: each field
    from its key (its default when absent), of its annotated type. A required field missing, a value of another
    type, or (unless the values are ``shared`` with another reader) a key that is no field is one TypeError line."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown and not shared:
        raise TypeError(f"instruction {operation!r} carries {unknown}, which it does not read: it reads {names}")
    kwargs = {}
    for f in fields(cls):
        if f.name not in values:
            if f.default is MISSING and f.default_factory is MISSING:
                raise TypeError(f"instruction {operation!r} lacks its value {f.name!r}: its server half must send it")
            continue
        value = values[f.name]
        if not _of_type(value, hints[f.name]):
            raise TypeError(f"instruction {operation!r}: value {f.name}={value!r} is not of type {hints[f.name]}")
        kwargs[f.name] = value
    return cls(**kwargs)
