"""An installed fedsim adds one import name, ``fedsim``, and works from a folder holding a user's own ``actors/`` and
``experiments/`` packages (a research repository's usual names)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: repository folder -> the import path it installs under (pyproject.toml's package-dir mapping)
INSTALLED_AS = {"fedsim": "fedsim", "actors": "fedsim/actors", "experiments": "fedsim/experiments"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")  # a copy: the build's own build/ folder never reaches the checkout
    for name in ("pyproject.toml", "README.md", *INSTALLED_AS):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(
            ROOT / name,
            source / name,
            **({"ignore": shutil.ignore_patterns("__pycache__")} if name in INSTALLED_AS else {}),
        )
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore:Editable installation"},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert "warning" not in build.stderr.lower(), build.stderr[-3000:]
    (path,) = out.glob("*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_installs_only_the_fedsim_import_name(wheel):
    top = {name.split("/")[0] for name in wheel.namelist()}
    assert top == {"fedsim", "fedsim_da-0.1.0.dist-info"}
    entry_points = wheel.read("fedsim_da-0.1.0.dist-info/entry_points.txt").decode()
    assert "fedsim = fedsim.experiments.cli:entry" in entry_points


def test_the_wheel_holds_every_module_and_spec_of_the_product(wheel):
    """The explicit package list in pyproject.toml misses no folder: each module, config and spec is installed."""
    names = set(wheel.namelist())
    wanted = {
        f"{INSTALLED_AS[folder]}/{path.relative_to(ROOT / folder).as_posix()}"
        for folder in INSTALLED_AS
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts
    }
    missing = sorted(wanted - names)
    assert not missing, f"not installed (add the package to [tool.setuptools] packages): {missing[:10]}"
    assert "fedsim/experiments/specs/fada.yaml" in names and "fedsim/experiments/configs/digits-fedavg.yaml" in names
    assert not any(name.startswith(("tools/", "tests/", "fedsim/tools/")) for name in names)


def _user_repository(tmp_path: Path) -> Path:
    """A folder laid out like a research repository: its own ``actors`` and ``experiments`` packages, which fail to
    import (so any import of them by fedsim would show)."""
    repo = tmp_path / "my-research"
    for name in ("actors", "experiments"):
        (repo / name).mkdir(parents=True)
        (repo / name / "__init__.py").write_text(f"raise ImportError('the user repository own {name} package')\n")
    return repo


def _settings(toy_overrides: list[str]) -> list[str]:
    return [s for s in toy_overrides if not s.startswith("run.progress")] + ["run.rounds=2", "run.seed=3"]


def test_run_and_the_python_api_on_ray_from_a_folder_with_its_own_actors_and_experiments(toy_overrides, tmp_path):
    repo = _user_repository(tmp_path)
    env = {**os.environ, "PYTHONPATH": "", "TQDM_DISABLE": "1"}
    fedsim = str(Path(sys.executable).with_name("fedsim"))
    flags = [f for s in _settings(toy_overrides) for f in ("--set", s)]
    cli = subprocess.run(
        [fedsim, "run", "-q", "--backend", "ray", "--out", str(tmp_path / "cli"), *flags],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    cli_summary = json.loads((tmp_path / "cli" / "summary.json").read_text())

    code = (
        "import json, sys, fedsim\n"
        "settings = dict(s.split('=', 1) for s in json.loads(sys.argv[1]))\n"
        "result = fedsim.run(backend='ray', out=sys.argv[2], set=settings)\n"
        "print(json.dumps(result.summary['target_accuracy']))\n"
    )
    api = subprocess.run(
        [sys.executable, "-c", code, json.dumps(_settings(toy_overrides)), str(tmp_path / "api")],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
    )
    assert api.returncode == 0, api.stderr[-3000:]
    assert json.loads(api.stdout.splitlines()[-1]) == cli_summary["target_accuracy"]
    assert 0.3 < cli_summary["target_accuracy"] <= 1.0
