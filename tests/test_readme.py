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
    assert len([line for line in code.splitlines() if line.strip()]) < 45  # a complete method, formatted
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


ROOT = Path(__file__).resolve().parents[1]
HISTORY = re.compile(
    r"issue #?\d+|\bsession\b|\b(first|second|third|fourth|fifth) (pass|session)\b|\bpass(es)? \d+\b", re.I
)


def test_readme_and_docs_tell_no_history():
    """README and docs describe the product as it is: no issue numbers, sessions or passes (git log keeps those)."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = HISTORY.search(line)
            assert not match, f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()!r}"


def _reproduce_commands() -> list[str]:
    return re.findall(r"`(fedsim reproduce [^`]*)`", README)


def test_every_results_table_is_in_the_readme_with_the_command_that_writes_it():
    commands = _reproduce_commands()
    tables = sorted(p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "results").rglob("table.md"))
    assert tables, "results/ holds no table"
    for folder in tables:
        wanted = re.compile(rf"--out {re.escape(folder)}(\s|$)")
        assert any(wanted.search(c) for c in commands), (
            f"{folder}: no `fedsim reproduce ... --out {folder}` in the README"
        )
        assert (ROOT / folder / "spec.yaml").is_file(), f"{folder}: the spec that made it is missing"


def test_results_hold_only_what_reproduce_writes():
    allowed = {"results.csv", "table.md", "claims.md", "spec.yaml"}
    for path in (ROOT / "results").rglob("*"):
        if path.is_file():
            assert path.name in allowed or path.suffix == ".png", f"{path.relative_to(ROOT)} is not a reproduce output"


def test_the_commands_the_readme_shows_exist():
    from fedsim.experiments.cli import build_parser
    from fedsim.experiments.reproduce_spec import available, load_spec

    parser = build_parser()
    commands = {a for action in parser._subparsers._group_actions for a in action.choices}
    for name in re.findall(r"^fedsim (\w+)", "\n".join(re.findall(r"```(?:sh)?\n(.*?)```", README, re.S)), re.M):
        assert name in commands, f"README shows `fedsim {name}`, which the CLI does not have"
    for command in _reproduce_commands():
        words = command.split()
        if "--spec" in words:
            load_spec(None, str(ROOT / words[words.index("--spec") + 1]))
        elif words[2] != "PAPER":
            assert words[2] in available(), command
    for link in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"
