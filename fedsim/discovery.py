"""Import every module of a package so its ``@register`` decorators run.

A new method, benchmark or model is one new file: no list to edit. A module
whose optional dependency is missing (:class:`fedsim.errors.MissingDependency`)
is skipped and its reason returned, so listing works without, say, torchvision.
"""

from __future__ import annotations

import importlib
import pkgutil


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
