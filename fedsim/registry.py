"""Name -> class registries for methods, benchmarks and models, built-in or from the user's own package.

``METHODS.register("fedavg")`` decorates a class; ``METHODS.get("fedavg")`` returns it, and an unknown name raises
:class:`fedsim.errors.UserError` listing the registered names and the closest match. A name is one of:

* a built-in: ``get("fedavg")`` first imports only ``fedsim.methods.fedavg`` (a built-in lives in the file or
  package named after it, at the top of the package or in a family's package one level down, as
  ``fedsim.methods.dictionary.feddadil``), so a FedAvg process never pays for POT, scikit-learn or torchvision;
  listing the names, or a name whose file is named otherwise, imports every module of the package
  (:mod:`fedsim.discovery`);
* a dotted path, ``mypkg.methods:FedAvgM``: the object it names, registered under that path;
* the name of an entry point of an installed distribution, in the group ``fedsim.methods``, ``fedsim.benchmarks``
  or ``fedsim.models`` (``fedavgm = mypkg.methods:FedAvgM``), registered under that name. An entry point named as
  a built-in is refused.

A plugin must be of the registry's kind (a Method or Benchmark subclass, a model function). Ray workers resolve
entry-point names through the table in the ``FEDSIM_PLUGINS`` environment variable (see :func:`entry_point_table`),
so a package shipped to them without its installed metadata still answers to its entry-point names.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Iterator, Optional, TypeVar

from fedsim.discovery import EntryPoint, is_path, load_path
from fedsim.errors import UserError

T = TypeVar("T")

PLUGINS_ENV = "FEDSIM_PLUGINS"
"""The environment variable holding {entry-point group: {name: "module:attribute"}} (JSON), set by fedsim for the
processes it starts on Ray (:func:`entry_point_table`)."""
#: entry-point names adopted in this process (:func:`adopt`), consulted as the environment variable is
_adopted: dict[str, dict[str, str]] = {}


def adopt(table: dict[str, dict[str, str]]) -> None:
    """Make the entry-point names of ``table`` ({group: {name: "module:attribute"}}) known in this process."""
    for group, names in table.items():
        _adopted.setdefault(group, {}).update(names)


def _table(group: str) -> dict[str, str]:
    """The entry-point names of ``group`` passed to this process (``FEDSIM_PLUGINS`` and :func:`adopt`)."""
    text = os.environ.get(PLUGINS_ENV, "")
    try:
        passed = json.loads(text) if text else {}
    except ValueError:
        raise UserError(f"the environment variable {PLUGINS_ENV} is not valid JSON: unset it") from None
    return {**(passed.get(group) or {}), **_adopted.get(group, {})}


class Registry(Generic[T]):
    """A named collection of classes (or factories) of one kind."""

    def __init__(
        self,
        kind: str,
        cli_flag: str,
        package: str,
        group: str,
        base: Optional[str],
        expected: str,
        one_module: bool = False,
        required: Optional[dict[str, str]] = None,
    ):
        """``group``: the entry-point group of plugins; ``base``: "module:Class" a plugin must subclass (None: any
        callable); ``expected``: what a plugin must be, in the error that refuses another object; ``one_module``:
        ``package`` is one module holding every built-in, listed in the order they are registered; ``required``:
        {class attribute: what it is} a plugin must declare as a non-empty name."""
        self.kind = kind
        """What the registry holds, in messages: "method", "benchmark" or "model"."""
        self.cli_flag = cli_flag
        """How a user names one, in the error for an unknown name (``--method``)."""
        self.package = package
        """The package of the built-ins, one module or package per name (``fedsim.methods``)."""
        self.group = group
        """The entry-point group of plugins (``fedsim.methods``)."""
        self.base = base
        """The "module:Class" a plugin must subclass (None: any callable)."""
        self.expected = expected
        """What a plugin must be, in the error that refuses another object."""
        self._entries: dict[str, T] = {}
        self._all_loaded = False
        self.unavailable: dict[str, str] = {}
        """Module or plugin name -> why it cannot be loaded (a missing optional dependency, a broken plugin)."""
        self.targets: dict[str, str] = {}
        """Plugin name -> the "module:attribute" it loads (dotted paths and entry points)."""
        self.origins: dict[str, str] = {}
        """Plugin name -> where it comes from, for ``fedsim list``."""
        self.one_module = one_module
        """The built-ins all live in the module ``package`` (scores, privacy mechanisms), not one file each."""
        self.required = dict(required or {})
        """{class attribute: what it is} a plugin must declare as a non-empty name (a score's metric name)."""
        self._entry_points: Optional[tuple[dict[str, EntryPoint], dict[str, str]]] = None

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator that registers the class (or factory) it decorates under ``name`` and sets its
        ``registry_name`` (``@METHODS.register("fedavg")``); another object under the same name raises ValueError."""

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
        """The class (or factory) registered as ``name``: a built-in, a dotted path ``module.path:Attribute`` or an
        entry point's name, loaded on first use; an unknown name raises :class:`fedsim.errors.UserError` listing the
        registered names and the closest match."""
        if not self._load(name):
            message = unknown_name_message(self.kind, name, self.names(), self.cli_flag)
            raise UserError(f"{message}, or a plugin as module.path:Attribute")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def builtin_names(self) -> list[str]:
        """The built-in names, in the order they are registered."""
        self._load_all()
        return [name for name, obj in self._entries.items() if self._is_builtin(obj)]

    def check(self, name: str) -> None:
        """Raise :meth:`get`'s UserError now for a name that is not a built-in's file or package (a built-in's
        module is imported where it is used: a driver that builds no model never imports torch)."""
        self.plugin_target(name)

    def plugin_target(self, name: str) -> Optional[str]:
        """The "module:attribute" a plugin's name loads, loading it; None for a built-in, found by its file alone."""
        if not is_path(name) and name.isidentifier() and self._has_module(name):
            return None
        self.get(name)
        return self.targets.get(name)

    def _has_module(self, name: str) -> bool:
        """Whether the built-in package has a module or package ``name`` (found without importing the package)."""
        if self.one_module:
            return False
        return self._module_of(name) is not None

    def _module_of(self, name: str) -> Optional[str]:
        """The built-in module or package ``name``, at the top of the package or in a family's package one level
        down (``fedsim.methods.dictionary.feddadil``), found by its file without importing; None if there is none."""
        spec = importlib.util.find_spec(self.package)
        for folder in [Path(folder) for folder in (spec.submodule_search_locations or [])] if spec else []:
            for place in [folder, *sorted(init.parent for init in folder.glob("*/__init__.py"))]:
                if (place / f"{name}.py").is_file() or (place / name / "__init__.py").is_file():
                    return ".".join([self.package, *place.relative_to(folder).parts, name])
        return None

    def names(self) -> list[str]:
        """Every built-in name and every installed entry point's (each loaded; one that fails is unavailable)."""
        self._load_all()
        found, _ = self.entry_points()
        for name in sorted(found):
            if name not in self.unavailable:
                try:
                    self._load(name)
                except UserError as exc:
                    if name in self._entries or self._is_ambiguous(name):
                        raise  # a clash with a built-in, or two declarations: the installation needs fixing
                    self.unavailable[name] = str(exc)
        listed = [name for name in self._entries if not is_path(name)]
        return listed if self.one_module else sorted(listed)

    def plugins(self) -> dict[str, str]:
        """{name: origin} of the plugins registered in this process (entry points once :meth:`names` ran)."""
        return dict(sorted(self.origins.items()))

    def __contains__(self, name: str) -> bool:
        return self._load(name)

    def entry_points(self) -> tuple[dict[str, EntryPoint], dict[str, str]]:
        """The installed entry points of this registry's group (read once per process)."""
        if self._entry_points is None:
            from fedsim.discovery import entry_points

            self._entry_points = entry_points(self.group)
        return self._entry_points

    def _is_ambiguous(self, name: str) -> bool:
        return name in self.entry_points()[1]

    def _load(self, name: str) -> bool:
        """Make ``name`` registered: a dotted path, a built-in, an entry point or a name passed to this process."""
        if not isinstance(name, str):
            return False
        if is_path(name):
            if name not in self._entries:
                self._add_plugin(name, name, name)
            return True
        if self.one_module:
            self._load_all()
        elif name not in self._entries and name.isidentifier() and not name.startswith("_"):
            module = self._module_of(name)
            if module is not None:
                importlib.import_module(module)
        found, ambiguous = self.entry_points()
        if name in self._entries:
            if name in found and name not in self.targets and self._is_builtin(self._entries[name]):
                raise UserError(
                    f"the entry point {name!r} of {found[name].origin} has the name of the built-in {self.kind} "
                    f"{name!r}: rename it in that package's entry points (group {self.group})"
                )
            return True
        if name in ambiguous:
            raise UserError(ambiguous[name])
        if name in found:
            self._add_plugin(name, found[name].value, found[name].origin)
            return True
        passed = _table(self.group)
        if name in passed:
            self._add_plugin(name, passed[name], f"{passed[name]} (entry point)")
            return True
        self._load_all()
        return name in self._entries

    def _is_builtin(self, obj: Any) -> bool:
        module = str(getattr(obj, "__module__", ""))
        return module == self.package or module.startswith(self.package + ".")

    def _add_plugin(self, name: str, target: str, origin: str) -> None:
        """Load ``target`` ("module:attribute"), check it is of this registry's kind, register it as ``name``."""
        what = f"{self.kind} {name!r}" if name == target else f"{self.kind} {name!r} ({target})"
        obj = load_path(target, what)
        if self.base is not None:
            module, _, attribute = self.base.partition(":")
            base = getattr(importlib.import_module(module), attribute)
            fits = isinstance(obj, type) and issubclass(obj, base)
        else:
            fits = callable(obj)
        if not fits:
            shown = f"the class {obj.__name__}" if isinstance(obj, type) else f"an object of type {type(obj).__name__}"
            raise UserError(f"{what} is {shown}, not a {self.kind}: give {self.expected}")
        for attribute, meaning in self.required.items():
            value = getattr(obj, attribute, None)
            if not (isinstance(value, str) and value.isidentifier()):
                raise UserError(
                    f'{what} declares no {attribute} ({meaning}), it has {value!r}: set {attribute} = "..." '
                    f"(letters, digits, underscores) in the class {obj.__name__}"
                )
        self._entries[name] = obj
        self.targets[name] = target
        self.origins[name] = origin
        if "registry_name" not in getattr(obj, "__dict__", {}):  # its own name, not one inherited from a built-in
            try:
                obj.registry_name = name  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass

    def _load_all(self) -> None:
        if not self._all_loaded:
            from fedsim.discovery import import_submodules

            self._all_loaded = True
            if self.one_module:
                importlib.import_module(self.package)
            else:
                self.unavailable.update(import_submodules(self.package))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def unknown_name_message(kind: str, name: str, valid: list[str], flag: str) -> str:
    """The one-line error for an unknown ``name`` of a ``kind``: the closest of ``valid`` (when one is close), then
    every valid name and the ``flag`` that takes it."""
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {kind} {name!r}: {hint}choose one of {', '.join(valid)} with {flag}"


METHODS: Registry = Registry(
    "method", "--method", "fedsim.methods", "fedsim.methods", "fedsim.methods.base:Method",
    "a subclass of fedsim.methods.base.Method",
)  # fmt: skip
"""The federated methods (``method.name``, ``--method``): subclasses of :class:`fedsim.methods.base.Method`."""
BENCHMARKS: Registry = Registry(
    "benchmark", "--benchmark", "fedsim.data.benchmarks", "fedsim.benchmarks", "fedsim.data.base:Benchmark",
    "a subclass of fedsim.data.base.Benchmark",
)  # fmt: skip
"""The benchmarks (``data.benchmark``, ``--benchmark``): subclasses of :class:`fedsim.data.base.Benchmark`."""
MODELS: Registry = Registry(
    "model", "--set model.name=...", "fedsim.models", "fedsim.models", None,
    "a function (input_shape, num_classes, hidden) returning a fedsim.models.Classifier",
)  # fmt: skip
"""The models (``model.name``): functions ``(input_shape, num_classes, hidden)`` returning a
:class:`fedsim.models.Classifier`."""


SCORES: Registry = Registry(
    "score", "--set run.scores=...", "fedsim.selection.statistics", "fedsim.scores", "fedsim.selection.scores:Score",
    "a subclass of fedsim.selection.Score", one_module=True, required={"name": "its metric is score_<name>"},
)  # fmt: skip
"""The model-selection scores (``run.scores``): subclasses of :class:`fedsim.selection.Score`."""
MECHANISMS: Registry = Registry(
    "privacy mechanism", "--set privacy.mode=...", "fedsim.privacy.mechanism", "fedsim.privacy",
    "fedsim.privacy.mechanism:Mechanism", "a subclass of fedsim.privacy.Mechanism", one_module=True,
)  # fmt: skip
"""The privacy mechanisms (``privacy.mechanism``): subclasses of :class:`fedsim.privacy.Mechanism`."""


def named_parts(config) -> list[tuple[Registry, str]]:
    """The (registry, name) of a config's method, benchmark and model ("auto" models left out)."""
    parts = [(METHODS, config.method.name), (BENCHMARKS, config.data.benchmark)]
    parts += [(MODELS, config.model.name)] if config.model.name != "auto" else []
    scores = [name.strip() for name in str(config.run.scores).split(",")]
    parts += [(SCORES, name) for name in scores if name and name.lower() not in ("auto", "none")]
    return parts + ([(MECHANISMS, config.privacy.mode)] if config.privacy.active else [])


def plugin_targets(configs: Iterable) -> list[str]:
    """The "module:attribute" of every plugin the configs use (dotted paths and entry points), in order."""
    targets: list[str] = []
    for config in configs:
        for registry, name in named_parts(config):
            target = registry.plugin_target(name)
            if target and target not in targets:
                targets.append(target)
    return targets


def entry_point_table(configs: Iterable) -> dict[str, dict[str, str]]:
    """{group: {name: "module:attribute"}} of the entry-point names the configs use: what another process needs to
    resolve them without the distribution's metadata (:data:`PLUGINS_ENV`, :func:`adopt`)."""
    table: dict[str, dict[str, str]] = {}
    for config in configs:
        for registry, name in named_parts(config):
            target = registry.plugin_target(name)
            if target and not is_path(name):
                table.setdefault(registry.group, {})[name] = target
    return table
