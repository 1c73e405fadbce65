"""Finding methods, benchmarks and models: the built-in modules, dotted paths and installed entry points.

A built-in is one file (or package) of its fedsim package, registered by its ``@register`` decorator:
:func:`import_submodules` imports them all. A plugin is any importable object named by a dotted path
(``mypkg.methods:FedAvgM``, :func:`load_path`) or by the name of an entry point of an installed distribution
(:func:`entry_points`). A module whose optional dependency is missing (:class:`fedsim.errors.MissingDependency`)
is skipped and its reason returned, so listing works without, say, torchvision.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from dataclasses import dataclass

from fedsim.errors import UserError, typed_first_line

#: separates the module from the attribute in a dotted path (``module.path:Attribute``, as in entry points)
PATH_SEPARATOR = ":"


def import_submodules(package_name: str) -> dict[str, str]:
    """Import the public modules of a package; returns {module name: why it was skipped}."""
    from fedsim.errors import MissingDependency

    skipped: dict[str, str] = {}
    package = importlib.import_module(package_name)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            try:
                importlib.import_module(f"{package_name}.{info.name}")
            except MissingDependency as exc:
                skipped[info.name] = str(exc)
    return skipped


def is_path(name: object) -> bool:
    """Whether ``name`` is a dotted path (``module.path:Attribute``) rather than a registered name."""
    return isinstance(name, str) and PATH_SEPARATOR in name


def load_path(path: str, what: str) -> object:
    """The object ``module.path:Attribute`` names, imported; ``what`` (e.g. "method 'a.b:C'") names it in the one
    UserError line raised when the path is malformed, the module cannot be imported or lacks the attribute."""
    module_name, _, attribute = path.partition(PATH_SEPARATOR)
    parts = module_name.split(".") + attribute.split(".")
    if not all(part.isidentifier() for part in parts):
        raise UserError(f"bad {what}: write a plugin as module.path:Attribute, e.g. mypkg.methods:MyMethod")
    try:
        obj = importlib.import_module(module_name)
    except UserError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UserError(
                f"cannot import module {module_name!r} of {what}: install the package that holds it, "
                "or add the folder that holds it to PYTHONPATH"
            ) from None
        raise UserError(
            f"importing {module_name!r} for {what} failed: it needs the module {exc.name!r}, which is not installed"
        ) from None
    except Exception as exc:  # noqa: BLE001 (any error of the user's module becomes one line naming it)
        raise UserError(
            f"importing {module_name!r} for {what} failed ({typed_first_line(exc)}): fix that module"
        ) from None
    for depth, part in enumerate(attribute.split(".")):
        if not hasattr(obj, part):
            owner = ".".join([module_name] + attribute.split(".")[:depth])
            names = [name for name in dir(obj) if not name.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "check the name after ':'"
            raise UserError(f"{owner!r} has no attribute {part!r} ({what}): {hint}")
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class EntryPoint:
    """One installed entry point: its name, the ``module:attribute`` it loads, and the distribution declaring it."""

    name: str
    value: str
    distribution: str

    @property
    def origin(self) -> str:
        return f"{self.value} (entry point of {self.distribution})" if self.distribution else self.value


def entry_points(group: str) -> tuple[dict[str, EntryPoint], dict[str, str]]:
    """The entry points of ``group`` by name, and {name: why it is ambiguous} for names that two distributions
    declare with different values (the same declaration found twice on the path counts once)."""
    from importlib.metadata import entry_points as installed

    found: dict[str, EntryPoint] = {}
    ambiguous: dict[str, str] = {}
    for ep in installed(group=group):
        dist = getattr(ep, "dist", None)
        label = f"{dist.name} {dist.version}" if dist is not None else ""
        value = ep.value.split("[")[0].strip()  # extras ("[gpu]") name optional dependencies, not the object
        entry = EntryPoint(ep.name, value, label)
        seen = found.setdefault(ep.name, entry)
        if seen.value != value:
            ambiguous[ep.name] = (
                f"entry point {ep.name!r} of group {group} is declared twice, as {seen.origin} and as "
                f"{entry.origin}: uninstall one of them, or give the one you want as its dotted path {value}"
            )
    return found, ambiguous
