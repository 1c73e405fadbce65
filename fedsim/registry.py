"""Name -> class registries for methods, benchmarks and models.

``METHODS.register("fedavg")`` decorates a class; ``METHODS.get("fedavg")``
returns it, and an unknown name raises :class:`fedsim.errors.UserError` listing
the registered names and the closest match.

Loading is lazy: ``get("fedavg")`` first imports only ``fedsim.methods.fedavg``
(a built-in lives in the file named after it), so a FedAvg process never pays
for POT, scikit-learn or torchvision. Listing the names, or a name whose file
is named otherwise, imports every module of the package (see
:mod:`fedsim.discovery`), so a new method is still one new file.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from typing import Callable, Generic, Iterator, TypeVar

from fedsim.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of classes (or factories) of one kind."""

    def __init__(self, kind: str, cli_flag: str, package: str):
        self.kind = kind
        self.cli_flag = cli_flag
        self.package = package
        self._entries: dict[str, T] = {}
        self._all_loaded = False
        self.unavailable: dict[str, str] = {}  # module name -> missing optional dependency

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
        if not self._load(name):
            raise UserError(unknown_name_message(self.kind, name, self.names(), self.cli_flag))
        return self._entries[name]

    def names(self) -> list[str]:
        self._load_all()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return self._load(name)

    def _load(self, name: str) -> bool:
        """Make ``name`` registered if any module of the package registers it."""
        if name in self._entries:
            return True
        if isinstance(name, str) and name.isidentifier() and not name.startswith("_"):
            module = f"{self.package}.{name}"
            if importlib.util.find_spec(module) is not None:
                importlib.import_module(module)
                if name in self._entries:
                    return True
        self._load_all()
        return name in self._entries

    def _load_all(self) -> None:
        if not self._all_loaded:
            from fedsim.discovery import import_submodules

            self.unavailable = import_submodules(self.package)
            self._all_loaded = True

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def unknown_name_message(kind: str, name: str, valid: list[str], flag: str) -> str:
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {kind} {name!r}: {hint}choose one of {', '.join(valid)} with {flag}"


METHODS: Registry = Registry("method", "--method", "fedsim.methods")
BENCHMARKS: Registry = Registry("benchmark", "--benchmark", "fedsim.data.benchmarks")
MODELS: Registry = Registry("model", "--set model.name=...", "fedsim.models")
