"""Data folders a spec's benchmarks read: the files a user supplies, named the same way on every machine.

A spec's benchmark entry may name the registered benchmark it runs (``benchmark:``, default: the entry's name, so
one spec can hold ``office_surf`` and ``office_googlenet`` both on ``office_caltech``) and the folder its files sit
in (``data_root:``, a path relative to the data directory). The data directory comes from ``--data-dir DIR`` or the
environment variable ``FEDSIM_DATA_DIR``; ``--data-root ENTRY=DIR`` gives one entry's folder outright. The resolved
absolute folder is appended to the entry's ``set`` as ``data.root=...``, so reproduce.json keeps it for ``--resume``.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Mapping, Optional

from fedsim.errors import UserError
from fedsim.experiments.reproduce_spec import PaperSpec

DATA_DIR_VARIABLE = "FEDSIM_DATA_DIR"


def parse_data_roots(items: Optional[list[str]]) -> dict[str, str]:
    """``["cwru=DIR", ...]`` (``--data-root``, repeatable) -> ``{"cwru": "DIR"}``."""
    roots = {}
    for item in items or []:
        name, sep, folder = item.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise UserError(f"--data-root {item!r}: give BENCHMARK=DIR, e.g. --data-root cwru=/data/cwru")
        roots[name.strip()] = folder.strip()
    return roots


def _folder(path: Path, how: str) -> str:
    if not path.is_dir():
        raise UserError(f"{how}: {path} is not a folder; give the folder that holds the benchmark's files")
    return str(path.resolve())


def resolve_data_roots(spec: PaperSpec, data_dir: Optional[str], roots: Mapping[str, str]) -> PaperSpec:
    """The spec with ``data.root=<folder>`` added to every benchmark entry that reads files (see the module)."""
    unknown = sorted(set(roots) - set(spec.benchmarks))
    if unknown:
        raise UserError(
            f"--data-root {', '.join(unknown)}: spec {spec.name} has no such benchmark; "
            f"its benchmarks are {', '.join(spec.benchmarks)}"
        )
    data_dir = data_dir or os.environ.get(DATA_DIR_VARIABLE) or None
    raw = copy.deepcopy(spec.raw)
    for name, bench in spec.benchmarks.items():
        if name in roots:
            folder = _folder(Path(roots[name]).expanduser(), f"--data-root {name}")
        elif bench.get("data_root"):
            if data_dir is None:
                raise UserError(
                    f"benchmark {name} of spec {spec.name} reads files from {bench['data_root']}/: pass "
                    f"--data-dir DIR (the folder holding {bench['data_root']}), --data-root {name}=DIR, "
                    f"or set {DATA_DIR_VARIABLE}"
                )
            folder = _folder(Path(data_dir).expanduser() / str(bench["data_root"]), f"benchmark {name}")
        else:
            continue
        entry = dict(raw["benchmarks"][name] or {})
        entry["set"] = [*entry.get("set", []), f"data.root={folder}"]
        raw["benchmarks"][name] = entry
    return PaperSpec(spec.name, raw, spec.origin)
