"""The readability rules of the project, checked on the source: short functions, and no private (underscore)
module reached from another package. A module's length is not checked: a file holds one responsibility."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedsim", "actors", "experiments", "tools")
SOURCES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
MAX_FUNCTION_LINES = 60


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_functions_are_short(path):
    text = path.read_text()
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def _imported_modules(tree: ast.AST, module: str) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else ".".join(module.split(".")[: -node.level] + [node.module])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _private_module(parts: list[str]):
    """The index of the first underscore *module* (a file ``_name.py``) in a dotted name, or None."""
    for i, part in enumerate(parts):
        if (
            part.startswith("_")
            and not part.startswith("__")
            and (ROOT.joinpath(*parts[: i + 1]).with_suffix(".py")).is_file()
        ):
            return i
    return None


def test_no_underscore_module_is_imported_from_another_package():
    """A private module is used only inside its own package; a private name only inside its own top-level package."""
    offenders = []
    for path in SOURCES + sorted((ROOT / "tests").glob("*.py")):
        module = _module_name(path)
        package = ".".join(module.split(".")[:-1])
        for imported in _imported_modules(ast.parse(path.read_text()), module):
            parts = imported.split(".")
            if parts[0] not in PACKAGES:
                continue
            index = _private_module(parts)
            if index is not None and ".".join(parts[:index]) != package:
                offenders.append(f"{module} imports the private module {'.'.join(parts[: index + 1])}")
            elif (
                index is None
                and parts[-1].startswith("_")
                and not parts[-1].startswith("__")
                and module.split(".")[0] in PACKAGES
            ):
                if parts[0] != module.split(".")[0]:
                    offenders.append(f"{module} imports the private name {imported}")
    assert not offenders, offenders


METHODS_DIR = ROOT / "fedsim" / "methods"
#: the names at the top of ``fedsim/methods``: a method's module, the package of a method with parts of its own, or
#: a family's package (its methods and what they alone share)
TOP = {p.stem for p in METHODS_DIR.glob("*.py")} | {p.parent.name for p in METHODS_DIR.glob("*/__init__.py")}
CONCRETE = TOP - {"__init__", "base", "common"}

#: the installed import names (fedsim, with the repository's actors/ and experiments/ installed under it) and tools/,
#: each with the folder that holds it
INSTALLED = {"fedsim": ROOT / "fedsim", "fedsim.actors": ROOT / "actors", "fedsim.experiments": ROOT / "experiments"}
FOLDERS = {**INSTALLED, "tools": ROOT / "tools"}

#: every module's floor, the ground first; each floor holds rooms (a module, or a package and everything under it,
#: named by its prefix, so a module added or moved inside a room stands on its floor). A module imports its own floor
#: and the floors below, never one above; the toolkits' rooms never import each other (losses and models stand
#: apart), and a concrete method is imported by concrete methods (and tools) only (the registry finds it by name).
FLOORS = (
    ("ground", ("fedsim.errors", "fedsim.coercion", "fedsim.seeding", "fedsim.messages", "fedsim.optim")),
    ("registry", ("fedsim.discovery", "fedsim.registry")),
    ("privacy and selection", ("fedsim.privacy", "fedsim.selection")),
    ("data", ("fedsim.data",)),
    ("config", ("fedsim.recipes", "fedsim.config", "fedsim.validation")),
    ("toolkits", ("fedsim.ot", "fedsim.detection", "fedsim.models", "fedsim.losses")),
    ("method pieces", ("fedsim.methods.common",)),
    ("method interface", ("fedsim.methods", "fedsim.methods.base")),
    ("methods", tuple(f"fedsim.methods.{name}" for name in sorted(CONCRETE))),
    ("runtime", ("fedsim.runtime",)),
    ("entry", ("fedsim", "fedsim.api")),
    ("actors", ("fedsim.actors",)),
    ("experiments", ("fedsim.experiments",)),
    ("tools", ("tools",)),
)
APART = {"toolkits"}
#: the floors that may import a concrete method's modules: the methods themselves, and the tools that explain a
#: method's result from its parts (tools/diagnostics)
READ_METHODS = {"methods", "tools"}
FLOOR_OF = {room: level for level, (_, rooms) in enumerate(FLOORS) for room in rooms}
PACKAGE_FACES = {"fedsim", "fedsim.methods"}  # rooms that are the package's own module only, not what lies under it


def _modules() -> dict[str, Path]:
    """Every module's import name -> its file (a package's ``__init__.py`` is the package)."""
    found = {}
    for prefix, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((prefix, *parts))] = path
    return found


MODULES = _modules()


def _room(name: str):
    """The room of the dotted module ``name`` (the longest room that holds it), or None."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in FLOOR_OF and (n == len(parts) or prefix not in PACKAGE_FACES):
            return prefix
    return None


def _as_module(name: str) -> str:
    """``name`` cut to the longest prefix that is a known module or package (``a.b.Name`` -> ``a.b``)."""
    parts = name.split(".")
    while len(parts) > 1 and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts)


def _imported_modules_of(text: str, module: str, is_package: bool) -> set[str]:
    """The modules of fedsim and tools that the source ``text`` of ``module`` imports, relative imports made absolute
    (lazy and type-checking imports count too: they are dependencies all the same)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {_as_module(name) for name in names if name.split(".")[0] in ("fedsim", "tools")} - {module}


def _upward_imports(module: str, text: str, is_package: bool = False) -> list[str]:
    """Why each import of ``module`` breaks the floors: it runs up, crosses the toolkits' floor, reaches a concrete
    method from outside the methods, or reaches a module on no floor."""
    here = _room(module)
    offences = []
    for imported in sorted(_imported_modules_of(text, module, is_package)):
        there = _room(imported)
        if there is None:
            offences.append(f"{module} imports {imported}, which stands on no floor")
        elif there == here:
            continue
        elif FLOOR_OF[there] > FLOOR_OF[here]:
            offences.append(f"{module} imports {imported} from the floor above ({FLOORS[FLOOR_OF[there]][0]})")
        elif FLOOR_OF[there] == FLOOR_OF[here] and FLOORS[FLOOR_OF[here]][0] in APART:
            offences.append(f"{module} imports {imported}: the {FLOORS[FLOOR_OF[here]][0]} stand apart")
        elif FLOORS[FLOOR_OF[there]][0] == "methods" and FLOORS[FLOOR_OF[here]][0] not in READ_METHODS:
            offences.append(f"{module} imports the concrete method {imported}: only the registry names one")
    return offences


def test_every_module_stands_on_a_floor():
    homeless = [name for name in MODULES if _room(name) is None]
    assert not homeless, f"modules on no floor (add them to FLOORS in {Path(__file__).name}): {homeless}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_up_the_floors(module):
    if _room(module) is None:
        pytest.skip("on no floor: test_every_module_stands_on_a_floor fails")
    path = MODULES[module]
    offences = _upward_imports(module, path.read_text(), path.name == "__init__.py")
    assert not offences, offences


def _circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each group of modules that import each other (Tarjan's strongly connected components),
    as ``[a, b, ..., a]``; a module importing itself is no circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(imports.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(set(group))

    for node in sorted(imports):
        if node not in index:
            visit(node)
    return [_circle_in(group, imports) for group in groups]


def _circle_in(group: set[str], imports: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, through the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(imports.get(node, set()) & group):
                if other == start:
                    return paths[node] + [start]
                if other not in paths:
                    paths[other] = paths[node] + [other]
                    following.append(other)
        frontier = following
    raise AssertionError(f"no circle in {sorted(group)}")


def test_no_import_circle():
    """No module reaches itself through the imports of fedsim (actors and experiments included) and tools,
    function-level imports included."""
    imports = {
        module: _imported_modules_of(path.read_text(), module, path.name == "__init__.py")
        for module, path in MODULES.items()
    }
    circles = [" -> ".join(circle) for circle in _circles(imports)]
    assert not circles, f"import circles: {circles}"


def test_the_circle_check_names_the_circle():
    imports = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"e", "d"}}
    assert _circles(imports) == [["a", "b", "c", "a"]]
    assert _circles({"x": {"y"}, "y": set()}) == []


def test_installed_import_names_map_to_their_folders():
    assert MODULES["fedsim.experiments.sweep"] == ROOT / "experiments" / "sweep.py"
    assert MODULES["fedsim.actors"] == ROOT / "actors" / "__init__.py"
    assert _as_module("fedsim.experiments.sweep_grid.SweepSpec") == "fedsim.experiments.sweep_grid"
    assert _room("fedsim.experiments.sweep") == "fedsim.experiments" and _room("tools.diagnose") == "tools"


def test_the_floor_check_sees_every_kind_of_offence():
    losses = "from fedsim.models.detector import Detector\nfrom fedsim.methods.common import training\n"
    assert _upward_imports("fedsim.losses.sample", losses + "from fedsim.optim import SGD\n") == [
        "fedsim.losses.sample imports fedsim.methods.common.training from the floor above (method pieces)",
        "fedsim.losses.sample imports fedsim.models.detector: the toolkits stand apart",
    ]
    common = (
        "from ..fedbn import split\nfrom .. import fedprox\nfrom . import training\nimport fedsim.methods.fedrep\n"
        "from fedsim.methods.base import Method\n"
    )
    assert [o.split(" imports ")[1] for o in _upward_imports("fedsim.methods.common.sample", common)] == [
        "fedsim.methods.base from the floor above (method interface)",
        "fedsim.methods.fedbn from the floor above (methods)",
        "fedsim.methods.fedprox from the floor above (methods)",
        "fedsim.methods.fedrep from the floor above (methods)",
    ]
    assert _upward_imports("fedsim.methods.base", "from fedsim.runtime.server import Server\n") == [
        "fedsim.methods.base imports fedsim.runtime.server from the floor above (runtime)"
    ]
    runtime = "from fedsim.methods.fedavg import FedAvg\nfrom fedsim.methods.common.vectorized import ClientJob\n"
    assert _upward_imports("fedsim.runtime.sample", runtime) == [
        "fedsim.runtime.sample imports the concrete method fedsim.methods.fedavg: only the registry names one"
    ]
    assert _upward_imports("fedsim.methods.fedbn", "from fedsim.methods.fedavg import FedAvg\n") == []
    assert _upward_imports("fedsim.data.base", "from fedsim.config import NoParams\n") == [
        "fedsim.data.base imports fedsim.config from the floor above (config)"
    ]
    assert _upward_imports("fedsim.actors.client", "from fedsim.experiments.sweep import run_grid\n") == [
        "fedsim.actors.client imports fedsim.experiments.sweep from the floor above (experiments)"
    ]
    assert _upward_imports("fedsim.experiments.sample", "from tools.golden import main\n") == [
        "fedsim.experiments.sample imports tools.golden from the floor above (tools)"
    ]


def test_only_registered_methods_sit_at_the_top_of_methods():
    from fedsim.registry import METHODS

    registered = {".".join(METHODS.get(name).__module__.split(".")[:3]) for name in METHODS.names()}
    assert {f"fedsim.methods.{name}" for name in CONCRETE} == registered
