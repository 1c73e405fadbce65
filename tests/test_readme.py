"""The README's examples run as written: the method written in the new form, and the Python API."""

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _example(name: str) -> str:
    match = re.search(rf"<!-- readme-example: {name} -->\n```python\n(.*?)```", README, re.S)
    assert match, f"README example {name!r} not found"
    return match.group(1)


def test_the_method_example_is_short_and_runs(toy_overrides, tmp_path):
    code = _example("method")
    assert len(code.strip().splitlines()) < 40
    exec(compile(code, "README:method", "exec"), {})
    from fedsim.api import run_experiment
    from fedsim.config import load_config
    from fedsim.registry import METHODS

    assert METHODS.get("fedavgm").operations == {"fit", "evaluate"}
    # defined in this process only, so the local backend (Ray actors import a method from its file by name)
    config = load_config(None, toy_overrides + ["method.name=fedavgm", "method.beta=0.5", "run.backend=local"])
    summary = run_experiment(config, tmp_path / "run").summary
    assert summary["method"] == "fedavgm" and 0.34 < summary["target_accuracy"] <= 1.0


def test_the_api_example_runs(capsys):
    exec(compile(_example("api"), "README:api", "exec"), {})
    accuracy, sources = capsys.readouterr().out.splitlines()[0].split(" ", 1)
    assert 0.1 < float(accuracy) <= 1.0 and "mnist" in sources
