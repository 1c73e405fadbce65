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


FLOORS = ("common", "families")


def _floor_modules(package: str) -> list[Path]:
    return sorted((ROOT / "fedsim" / "methods" / package).rglob("*.py"))


def _absolute_imports(text: str, module: str, is_package: bool = False) -> set[str]:
    """Every module the source ``text`` of ``module`` imports, relative imports (``from .. import x`` too) made
    absolute."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _concrete_method_imports(imported: set[str], concrete: set[str]) -> list[str]:
    """The modules ``fedsim.methods.<name>`` among ``imported`` whose ``name`` is in ``concrete``."""
    found = set()
    for name in imported:
        parts = name.split(".")
        if parts[:2] == ["fedsim", "methods"] and len(parts) > 2 and parts[2] in concrete:
            found.add(".".join(parts[:3]))
    return sorted(found)


METHODS_DIR = ROOT / "fedsim" / "methods"
#: the names at the top of ``fedsim/methods``: a method's module, or the package of a method with parts of its own
TOP = {p.stem for p in METHODS_DIR.glob("*.py")} | {p.parent.name for p in METHODS_DIR.glob("*/__init__.py")}
CONCRETE = TOP - {"__init__", "base", *FLOORS}


@pytest.mark.parametrize(
    "path", [p for floor in FLOORS for p in _floor_modules(floor)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_common_and_families_never_import_a_concrete_method(path):
    """The shared floors are built from base and common pieces: a concrete method is never their dependency."""
    imported = _absolute_imports(path.read_text(), _module_name(path), path.name == "__init__.py")
    offenders = _concrete_method_imports(imported, CONCRETE)
    assert not offenders, f"{path.relative_to(ROOT)} imports the concrete method module(s) {offenders}"


def test_the_floor_check_sees_absolute_and_relative_imports():
    text = (
        "from fedsim.methods.fedavg import FedAvg\nfrom ..fedbn import split\nfrom .. import fedprox\n"
        "from . import batches\nfrom fedsim.methods.base import Method\nimport fedsim.methods.fedrep\n"
    )
    imported = _absolute_imports(text, "fedsim.methods.common.sample")
    offenders = _concrete_method_imports(imported, {"fedavg", "fedbn", "fedprox", "fedrep"})
    assert offenders == [
        "fedsim.methods.fedavg",
        "fedsim.methods.fedbn",
        "fedsim.methods.fedprox",
        "fedsim.methods.fedrep",
    ]


def test_only_registered_methods_sit_at_the_top_of_methods():
    from fedsim.registry import METHODS

    registered = {".".join(METHODS.get(name).__module__.split(".")[:3]) for name in METHODS.names()}
    assert {f"fedsim.methods.{name}" for name in CONCRETE} == registered
