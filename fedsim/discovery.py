"""Import every module of a package so its ``@register`` decorators run.

A new method, benchmark or model is one new file: no list to edit.
"""
from __future__ import annotations

import importlib
import pkgutil


def import_submodules(package_name: str) -> None:
    package = importlib.import_module(package_name)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package_name}.{info.name}")
