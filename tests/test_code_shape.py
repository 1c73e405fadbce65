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

#: fedsim's floors, the ground first; each floor holds rooms (a module, or a package and everything under it). A module
#: imports its own floor and the floors below, never one above; the toolkits' rooms never import each other (losses
#: and models stand apart), and a concrete method is imported by concrete methods only (the registry finds it by name).
FLOORS = (
    ("ground", ("fedsim.errors", "fedsim.seeding", "fedsim.messages", "fedsim.optim")),
    (
        "library",
        (
            "fedsim.registry",
            "fedsim.discovery",
            "fedsim.validation",
            "fedsim.config",
            "fedsim.recipes",
            "fedsim.data",
            "fedsim.selection",
            "fedsim.privacy",
        ),
    ),
    ("toolkits", ("fedsim.ot", "fedsim.detection", "fedsim.models", "fedsim.losses")),
    ("method pieces", ("fedsim.methods.common",)),
    ("method interface", ("fedsim.methods", "fedsim.methods.base")),
    ("methods", tuple(f"fedsim.methods.{name}" for name in sorted(CONCRETE))),
    ("runtime", ("fedsim.runtime",)),
    ("entry", ("fedsim", "fedsim.api")),
)
APART = {"toolkits"}
FLOOR_OF = {room: level for level, (_, rooms) in enumerate(FLOORS) for room in rooms}
PACKAGE_FACES = {"fedsim", "fedsim.methods"}  # rooms that are the package's own module only, not what lies under it


def _dotted(path: Path) -> str:
    """The import name of a source file (a package's ``__init__.py`` is the package)."""
    name = _module_name(path)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _room(name: str):
    """The room of the dotted module ``name`` (the longest room that holds it), or None."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in FLOOR_OF and (n == len(parts) or prefix not in PACKAGE_FACES):
            return prefix
    return None


def _as_module(name: str) -> str:
    """``name`` cut to the longest prefix that is a module or package of fedsim (``a.b.Name`` -> ``a.b``)."""
    parts = name.split(".")
    while len(parts) > 1:
        path = ROOT.joinpath(*parts)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            break
        parts.pop()
    return ".".join(parts)


def _imported_fedsim_modules(text: str, module: str, is_package: bool) -> set[str]:
    """The fedsim modules that the source ``text`` of ``module`` imports, relative imports made absolute (lazy and
    type-checking imports count too: they are dependencies all the same)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {_as_module(name) for name in names if name.split(".")[0] == "fedsim"}


def _upward_imports(module: str, text: str, is_package: bool = False) -> list[str]:
    """Why each import of ``module`` breaks the floors: it runs up, crosses the toolkits' floor, reaches a concrete
    method from outside the methods, or leaves the library."""
    here = _room(module)
    offences = []
    for imported in sorted(_imported_fedsim_modules(text, module, is_package)):
        there = _room(imported)
        if there is None:
            offences.append(f"{module} imports {imported}, which stands on no floor")
        elif there == here:
            continue
        elif FLOOR_OF[there] > FLOOR_OF[here]:
            offences.append(f"{module} imports {imported} from the floor above ({FLOORS[FLOOR_OF[there]][0]})")
        elif FLOOR_OF[there] == FLOOR_OF[here] and FLOORS[FLOOR_OF[here]][0] in APART:
            offences.append(f"{module} imports {imported}: the {FLOORS[FLOOR_OF[here]][0]} stand apart")
        elif FLOORS[FLOOR_OF[there]][0] == "methods" and FLOORS[FLOOR_OF[here]][0] != "methods":
            offences.append(f"{module} imports the concrete method {imported}: only the registry names one")
    return offences


FEDSIM_SOURCES = sorted((ROOT / "fedsim").rglob("*.py"))


def test_every_module_of_fedsim_stands_on_a_floor():
    homeless = [_dotted(p) for p in FEDSIM_SOURCES if _room(_dotted(p)) is None]
    assert not homeless, f"modules on no floor (add them to FLOORS in {Path(__file__).name}): {homeless}"


@pytest.mark.parametrize("path", FEDSIM_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_runs_up_the_floors(path):
    if _room(_dotted(path)) is None:
        pytest.skip("on no floor: test_every_module_of_fedsim_stands_on_a_floor fails")
    offences = _upward_imports(_dotted(path), path.read_text(), path.name == "__init__.py")
    assert not offences, offences


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


def test_only_registered_methods_sit_at_the_top_of_methods():
    from fedsim.registry import METHODS

    registered = {".".join(METHODS.get(name).__module__.split(".")[:3]) for name in METHODS.names()}
    assert {f"fedsim.methods.{name}" for name in CONCRETE} == registered
