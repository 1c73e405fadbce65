"""docs/extending.md as written: its blocks, saved as the package ``mypkg``, run through fedsim.

The method, the benchmark, the model, the score and the privacy mechanism are found by their dotted paths (the
package importable) and, through the entry points of the page's pyproject.toml, by their short names on the command
line.
"""

import json
import math
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "extending.md").read_text()
MODULES = {
    "methods": "method",
    "data": "data",
    "nets": "nets",
    "scores": "scores",
    "privacy": "privacy",
}  # mypkg/<module>.py <- the page's block


def example(name: str) -> str:
    match = re.search(rf"<!-- extending-example: {name} -->\n```\w+\n(.*?)```", PAGE, re.S)
    assert match, f"docs/extending.md has no example {name!r}"
    return match.group(1)


def write_package(root: Path) -> Path:
    """The page's package: pyproject.toml, mypkg/__init__.py and one module per block."""
    (root / "mypkg").mkdir(parents=True)
    (root / "pyproject.toml").write_text(example("pyproject"))
    (root / "mypkg" / "__init__.py").write_text("")
    for module, block in MODULES.items():
        (root / "mypkg" / f"{module}.py").write_text(example(block))
    return root


def write_entry_points(root: Path) -> None:
    """What installing the package records: its entry points, in a dist-info folder beside it on the path."""
    project = tomllib.loads(example("pyproject"))["project"]
    info = root / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = [
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
        for group, entries in project["entry-points"].items()
    ]
    info.joinpath("entry_points.txt").write_text("\n".join(groups))


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = write_package(tmp_path / "mypkg")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]


def test_the_method_example_is_short_and_complete(package):
    code = example("method")
    assert len([line for line in code.splitlines() if line.strip()]) < 50  # a complete method, formatted
    from mypkg.methods import FedAvgM

    assert FedAvgM.operations == {"fit", "evaluate"}
    assert FedAvgM.Params().beta == 0.9


def test_the_run_example_runs_the_three_by_their_dotted_paths(package, capsys):
    exec(compile(example("run"), "docs/extending.md:run", "exec"), {})
    accuracy, sources = capsys.readouterr().out.splitlines()[0].split(" ", 1)
    assert 0.5 < float(accuracy) <= 1.0  # three classes: above chance
    assert "d1" in sources and "d2" in sources and "d0" not in sources  # the default target, d0


def test_the_benchmark_options_are_checked(package):
    import fedsim
    from fedsim.errors import UserError

    with pytest.raises(UserError, match="data.domains must be 2 or more"):
        fedsim.run(method="fedavg", benchmark="mypkg.data:Blobs", rounds=1, set={"data.domains": 1})


def test_the_yaml_example_names_them_as_the_command_line_does(package, tmp_path):
    import fedsim

    text = re.search(r"```yaml\n(.*?)```", PAGE, re.S).group(1)
    (tmp_path / "my.yaml").write_text(text)
    config = fedsim.make_config(tmp_path / "my.yaml")
    assert config.method.params.beta == 0.5 and config.run.rounds == 5


def _fedsim(args: list[str], root: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "fedsim.experiments.cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_command_line_example_runs_by_entry_points_and_dotted_paths(tmp_path):
    root = write_package(tmp_path / "mypkg")
    write_entry_points(root)
    lines = [shlex.split(line, comments=True) for line in example("cli").splitlines() if line.strip()]
    assert all(words[0] == "fedsim" for words in lines), lines
    for number, words in enumerate(lines):
        args = words[1:] + (["--out", str(tmp_path / f"run{number}"), "-q"] if words[1] == "run" else [])
        result = _fedsim(args, root, tmp_path)
        assert result.returncode == 0, f"{' '.join(words)}:\n{result.stderr[-3000:]}"
        if words[1] == "list":
            assert re.search(r"^\s*fedavgm\s+classification\s+FedAvgM \(Hsu et al. 2019\)", result.stdout, re.M)
            assert re.search(r"^\s*blobs\s+classification\s+Gaussian blobs", result.stdout, re.M)
            assert re.search(r"^\s*wide_mlp\s+model.layers hidden layers", result.stdout, re.M)
            assert re.search(r"^\s+options: model.layers$", result.stdout, re.M)
            assert re.search(r"^\s*top_probability\s+the target's mean largest softmax", result.stdout, re.M)
            assert re.search(r"^\s*even_split\s+Gaussian noise of std z C / sqrt\(m\)", result.stdout, re.M)
        else:
            summary = json.loads((tmp_path / f"run{number}" / "summary.json").read_text())
            assert 0.5 < summary["target_accuracy"] <= 1.0, summary


GUIDE = {"model.name": "mypkg.nets:wide_mlp", "run.tensorboard": False}
PRIVACY = {"privacy.mode": "mypkg.privacy:EvenSplit", "privacy.noise_multiplier": 1.0, "privacy.clip": 5.0}


def test_the_guide_s_method_reports_the_scores_with_privacy_on(package):
    """The page's FedAvgM calls the selection hook: run.scores=auto reports score_*, here with its privacy
    mechanism on."""
    import fedsim

    result = fedsim.run(
        method="mypkg.methods:FedAvgM",
        benchmark="mypkg.data:Blobs",
        rounds=1,
        set={**GUIDE, **PRIVACY, "run.scores": "auto"},
    )
    from fedsim.selection import SCORES, resolve_scores

    scores = {k: v for k, v in result.summary.items() if k.startswith("score_")}
    assert set(scores) == {SCORES.get(n).column() for n in resolve_scores("auto", False)} >= {"score_entropy"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in scores.values()), scores
    assert result.history[-1]["privacy_epsilon"] > 0


def test_the_guide_s_score_reports_under_its_name_with_the_guide_s_method(package):
    import fedsim

    result = fedsim.run(
        method="mypkg.methods:FedAvgM",
        benchmark="mypkg.data:Blobs",
        rounds=1,
        set={**GUIDE, "run.scores": "entropy,mypkg.scores:TopProbability"},
    )
    summary = result.summary
    assert 1 / 3 <= summary["score_top_probability"] <= 1 and math.isfinite(summary["score_entropy"]), summary


def test_the_guide_s_method_copes_with_sources_that_drop_out(package):
    import fedsim

    result = fedsim.run(
        method="mypkg.methods:FedAvgM",
        benchmark="mypkg.data:Blobs",
        rounds=3,
        set={**GUIDE, "clients.dropout": 0.5, "run.scores": "none"},
    )
    assert result.summary["rounds"] == 3 and 0 <= result.summary["target_accuracy"] <= 1


def test_the_guide_s_model_option_reaches_the_model(package):
    import fedsim
    from fedsim.errors import UserError

    config = fedsim.make_config(method="fedavg", benchmark="mypkg.data:Blobs", set={**GUIDE, "model.layers": 3})
    from fedsim.models import build_model

    model = build_model(config.model, (8,), 3)
    assert config.model.options.layers == 3 and len(model.encoder) == 6
    with pytest.raises(UserError, match=r"model.layers must be 1 or more, got 0"):
        fedsim.make_config(method="fedavg", benchmark="mypkg.data:Blobs", set={**GUIDE, "model.layers": 0})
    with pytest.raises(UserError, match=r"unknown config key 'model.layer' for model .*: did you mean 'layers'"):
        fedsim.make_config(method="fedavg", benchmark="mypkg.data:Blobs", set={**GUIDE, "model.layer": 3})


def test_the_guide_s_method_declares_its_privacy_exchanges(package):
    import fedsim

    result = fedsim.run(
        method="mypkg.methods:FedAvgM",
        benchmark="mypkg.data:Blobs",
        rounds=1,
        set={"run.tensorboard": False, "privacy.noise_multiplier": 1.0, "privacy.clip": 5.0},
    )
    assert result.history[-1]["privacy_epsilon"] > 0


def test_the_exchanges_example_declares_what_one_fit_does(package):
    """The page's declaration written out is FedAvgM's ``staticmethod(one_fit)``: the same stage, calls and
    record-level answer, read by fedsim.privacy from the class that declares it."""
    import fedsim
    from fedsim.privacy import method_exchanges, one_fit

    namespace = {}
    exec(compile(example("exchanges"), "docs/extending.md:exchanges", "exec"), namespace)
    config = fedsim.make_config(method="mypkg.methods:FedAvgM", benchmark="mypkg.data:Blobs", set=GUIDE)
    written, short, read = namespace["fedavgm_exchanges"](config), one_fit(config), method_exchanges(config)
    fields = [(s.operation, s.senders, s.combined, s.records, s.readers) for s in written.stages]
    assert fields == [(s.operation, s.senders, s.combined, s.records, s.readers) for s in short.stages]
    assert written.calls(1, None) == short.calls(1, None) == read.calls(1, None) == (("fit", True),)
    assert written.record_refusal() == short.record_refusal() == read.record_refusal() == ""
