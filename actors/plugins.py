"""The run's plugins on Ray workers: the runtime environment that lets every actor import them.

A plugin (a method, benchmark or model given by a dotted path or an entry point) lives in the user's own package.
Installed in site-packages, it is on every worker of a local cluster as it is on the driver, and on a cluster's
nodes once installed there (``cluster.yaml``'s setup commands). Otherwise (a folder on ``PYTHONPATH``, the working
directory, an editable install) fedsim gives the workers what the driver imports:

* a fresh local cluster (no ``run.address``): the package's parent folder on the workers' ``PYTHONPATH``;
* a cluster the run joins (``run.address``): the package itself, uploaded with Ray's ``py_modules``;
* a Ray the caller initialized already: each actor of the run gets the parent folder on its ``PYTHONPATH`` (a
  cluster on another machine needs the package in the caller's ``ray.init(runtime_env=...)``).

Entry-point names travel as a table in ``FEDSIM_PLUGINS`` (:mod:`fedsim.registry`), so a worker resolves them
without the distribution's metadata. ``ray.runtime_env`` (``pip``, ``py_modules``, ``env_vars``, ...) is merged in
where fedsim starts or joins the cluster.
"""

from __future__ import annotations

import importlib.util
import json
import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from fedsim.errors import UserError
from fedsim.registry import PLUGINS_ENV, adopt, entry_point_table, plugin_targets


@dataclass(frozen=True)
class Plugins:
    """What the workers of a run need to import its plugins."""

    modules: tuple[str, ...] = ()  # top-level modules to ship: folders of packages, or single .py files
    roots: tuple[str, ...] = ()  # the folders holding them (for PYTHONPATH)
    table: tuple[tuple[str, str, str], ...] = ()  # (entry-point group, name, "module:attribute")

    def __bool__(self) -> bool:
        return bool(self.modules or self.table)

    def table_json(self) -> str:
        table: dict[str, dict[str, str]] = {}
        for group, name, target in self.table:
            table.setdefault(group, {})[name] = target
        return json.dumps(table, sort_keys=True)


def _installed_folders() -> list[Path]:
    paths = sysconfig.get_paths()
    folders = [paths[key] for key in ("purelib", "platlib", "stdlib", "platstdlib") if key in paths]
    folders += list(site.getsitepackages()) + [site.getusersitepackages()]
    return [Path(folder).resolve() for folder in folders if folder]


def _location(module: str) -> Optional[Path]:
    """The folder of package ``module`` or its .py file; None when it is installed (or fedsim, or built in)."""
    if module == "fedsim" or module in sys.builtin_module_names:
        return None
    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        place = Path(list(spec.submodule_search_locations)[0])
    elif spec.origin and spec.origin.endswith(".py"):
        place = Path(spec.origin)
    else:
        return None  # a compiled or frozen module: installed
    place = place.resolve()
    installed = _installed_folders()
    return None if any(place.is_relative_to(folder) for folder in installed) else place


def plugins_of(configs: Iterable) -> Plugins:
    """The plugins of ``configs`` that the workers cannot import by themselves, and the entry-point table."""
    configs = list(configs)
    modules: list[str] = []
    for target in plugin_targets(configs):
        place = _location(target.partition(":")[0].split(".")[0])
        if place is not None and str(place) not in modules:
            modules.append(str(place))
    roots = tuple(dict.fromkeys(str(Path(m).parent) for m in modules))
    table = entry_point_table(configs)
    rows = tuple((group, name, target) for group, names in sorted(table.items()) for name, target in names.items())
    return Plugins(tuple(modules), roots, rows)


def _pythonpath(entries: Iterable[str]) -> str:
    """``entries`` (each a folder or a PYTHONPATH of several), then this process's PYTHONPATH, as one PYTHONPATH."""
    parts = [p for entry in [*entries, os.environ.get("PYTHONPATH", "")] for p in entry.split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


def job_runtime_env(plugins: Plugins, user_env: Optional[dict], joins: bool) -> Optional[dict]:
    """The ``runtime_env`` of ``ray.init`` for a cluster this process starts (``joins`` False) or joins: the user's
    ``ray.runtime_env`` with the plugins added (None when there is nothing to add)."""
    env = {key: (list(value) if isinstance(value, (list, tuple)) else value) for key, value in (user_env or {}).items()}
    if plugins:
        env_vars = dict(env.get("env_vars") or {})
        env_vars[PLUGINS_ENV] = plugins.table_json()
        if joins:
            env["py_modules"] = list(env.get("py_modules") or []) + list(plugins.modules)
        elif plugins.roots:
            env_vars["PYTHONPATH"] = _pythonpath(list(plugins.roots) + [env_vars.get("PYTHONPATH", "")])
        env["env_vars"] = {key: value for key, value in env_vars.items() if value != ""}
    return env or None


def actor_runtime_env(plugins: Plugins) -> Optional[dict]:
    """The ``runtime_env`` of each actor of a run in a Ray this run did not start: the plugins' folders on
    ``PYTHONPATH`` and the entry-point table, unless this process already runs in such an environment."""
    if not plugins or covered(plugins):
        return None
    env_vars = {PLUGINS_ENV: plugins.table_json()}
    if plugins.roots:
        env_vars["PYTHONPATH"] = _pythonpath(plugins.roots)
    return {"env_vars": env_vars}


def covered(plugins: Plugins) -> bool:
    """Whether this process runs in an environment fedsim made for these plugins (a Tune trial of a sweep, a server
    actor): its children inherit it, so they need nothing more."""
    text = os.environ.get(PLUGINS_ENV)
    if text is None:
        return False
    try:
        passed = json.loads(text)
    except ValueError:
        return False
    has = {(group, name, target) for group, names in passed.items() for name, target in names.items()}
    return set(plugins.table) <= has and all(
        importlib.util.find_spec(Path(m).stem) is not None for m in plugins.modules
    )


def check_user_env(configs: Iterable) -> Optional[dict]:
    """The one ``ray.runtime_env`` of ``configs`` (a sweep's trials must agree on it)."""
    envs = []
    for config in configs:
        if config.ray.runtime_env not in envs:
            envs.append(config.ray.runtime_env)
    if len(envs) > 1:
        raise UserError("ray.runtime_env differs between the trials of this sweep: give every trial the same one")
    return envs[0] if envs else None


def plugin_settings(plugins: Plugins) -> dict:
    """What a Tune trial needs to import the plugins where the sweep's Ray was initialized by the caller (the
    workers then share the driver's machine): the folders and the entry-point table."""
    return {"roots": list(plugins.roots), "table": json.loads(plugins.table_json())}


def adopt_settings(settings: Optional[dict]) -> None:
    """In a Tune trial: the plugin folders that exist here on ``sys.path``, the entry-point names known."""
    if not settings:
        return
    for root in settings.get("roots", []):
        if os.path.isdir(root) and root not in sys.path:
            sys.path.append(root)
    adopt(settings.get("table", {}))
