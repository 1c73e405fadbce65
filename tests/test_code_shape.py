"""The readability rules of the project, checked on the source: short modules, short functions, and no
private (underscore) module reached from another package."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedsim", "actors", "experiments")
SOURCES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_short_and_its_functions_too(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, (
        f"{path.name}: {len(text.splitlines())} lines (at most {MAX_MODULE_LINES})"
    )
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
