"""Name -> class registries for methods, benchmarks and models.

``METHODS.register("fedavg")`` decorates a class; ``METHODS.get("fedavg")``
returns it, and an unknown name raises :class:`fedsim.errors.UserError` listing
the registered names and the closest match.
"""
from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

from fedsim.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of classes (or factories) of one kind."""

    def __init__(self, kind: str, cli_flag: str):
        self.kind = kind
        self.cli_flag = cli_flag
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            try:
                obj.registry_name = name  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
            return obj

        return decorator

    def get(self, name: str) -> T:
        _ensure_builtins_loaded()
        if name not in self._entries:
            raise UserError(unknown_name_message(self.kind, name, self.names(), self.cli_flag))
        return self._entries[name]

    def names(self) -> list[str]:
        _ensure_builtins_loaded()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        _ensure_builtins_loaded()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def unknown_name_message(kind: str, name: str, valid: list[str], flag: str) -> str:
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {kind} {name!r}: {hint}choose one of {', '.join(valid)} with {flag}"


METHODS: Registry = Registry("method", "--method")
BENCHMARKS: Registry = Registry("benchmark", "--benchmark")
MODELS: Registry = Registry("model", "--set model.name=...")

_loaded = False


def _ensure_builtins_loaded() -> None:
    """Import the built-in methods, benchmarks and models so they register."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import fedsim.data.benchmarks  # noqa: F401
    import fedsim.methods  # noqa: F401
    import fedsim.models  # noqa: F401
