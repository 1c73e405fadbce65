"""The README and docs/ as a user reads them: their examples run, their commands exist, their results tables name
the command and the commit that wrote them, and they tell no history (docs/extending.md's examples:
tests/test_extending.py)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "docs" / "results.md").read_text()
SPECS = ROOT / "experiments" / "specs" / "results"
README_MAX_LINES = 250


def _example(name: str) -> str:
    match = re.search(rf"<!-- readme-example: {name} -->\n```python\n(.*?)```", README, re.S)
    assert match, f"README example {name!r} not found"
    return match.group(1)


def test_the_api_example_runs(capsys):
    exec(compile(_example("api"), "README:api", "exec"), {})
    accuracy, sources = capsys.readouterr().out.splitlines()[0].split(" ", 1)
    assert 0.1 < float(accuracy) <= 1.0 and "mnist" in sources


HISTORY = re.compile(
    r"issue #?\d+|\bsession\b|\b(first|second|third|fourth|fifth) (pass|session)\b|\bpass(es)? \d+\b"
    r"|\bearlier\b|before this change|\bpreviously\b|\bformerly\b",
    re.I,
)


def test_readme_and_docs_tell_no_history():
    """README and docs describe the product as it is: no issue numbers, sessions, passes or what the code was
    before (git log keeps those)."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = HISTORY.search(line)
            assert not match, f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()!r}"


def test_the_readme_is_short():
    lines = len(README.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: at most {README_MAX_LINES} (detail goes to docs/)"


def _reproduce_commands(text: str) -> list[str]:
    return [" ".join(c.split()) for c in re.findall(r"`(fedsim reproduce [^`]*)`", text)]


def _spec_of(folder: str) -> Path:
    """The spec that writes ``results/A/B``: ``experiments/specs/results/A-B.yaml``."""
    return SPECS / (folder.removeprefix("results/").replace("/", "-") + ".yaml")


def _result_folders() -> list[str]:
    folders = sorted(p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "results").rglob("table.md"))
    assert folders, "results/ holds no table"
    return folders


def test_every_results_table_is_in_docs_results_with_the_command_that_writes_it():
    commands = _reproduce_commands(RESULTS)
    for folder in _result_folders():
        wanted = re.compile(rf"--out {re.escape(folder)}(\s|$)")
        assert any(wanted.search(c) for c in commands), (
            f"{folder}: no `fedsim reproduce ... --out {folder}` in docs/results.md"
        )
        assert _spec_of(folder).is_file(), f"{folder}: the spec that made it, {_spec_of(folder)}, is missing"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_every_results_command_names_the_commit_of_its_results():
    """Each command in docs/results.md is followed by ``commit `<hash>``` naming the commit that holds the directory's
    results.csv (what ``git log -1 -- results/DIR/results.csv`` gives)."""
    try:
        shallow = _git("rev-parse", "--is-shallow-repository") == "true"
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no history to compare with")
    text = " ".join(RESULTS.split())
    for folder in _result_folders():
        match = re.search(rf"--out {re.escape(folder)}`,? \(?commit `([0-9a-f]{{7,40}})`", text)
        assert match, f"docs/results.md: the command of {folder} names no commit (`... --out {folder}` (commit `...`))"
        if not shallow:
            committed = _git("log", "-1", "--format=%H", "--", f"{folder}/results.csv")
            assert committed.startswith(match.group(1)), (
                f"docs/results.md names commit {match.group(1)} for {folder}; its results.csv is from {committed[:7]}"
            )


def test_results_hold_only_what_reproduce_writes():
    allowed = {"results.csv", "table.md", "claims.md", "selection.md", "selection.csv"}
    for path in (ROOT / "results").rglob("*"):
        if path.is_file():
            assert path.name in allowed or path.suffix == ".png", f"{path.relative_to(ROOT)} is not a reproduce output"


def test_the_commands_the_readme_and_docs_show_exist():
    from fedsim.experiments.cli import build_parser
    from fedsim.experiments.reproduce_spec import available, load_spec

    parser = build_parser()
    commands = {a for action in parser._subparsers._group_actions for a in action.choices}
    for name in re.findall(
        r"^(?:\.venv/bin/)?fedsim (\w+)", "\n".join(re.findall(r"```(?:sh)?\n(.*?)```", README, re.S)), re.M
    ):
        assert name in commands, f"README shows `fedsim {name}`, which the CLI does not have"
    for command in _reproduce_commands(README) + _reproduce_commands(RESULTS):
        words = command.split()
        if "--spec" in words:
            load_spec(None, str(ROOT / words[words.index("--spec") + 1]))
        elif words[2] != "PAPER":
            assert words[2] in available(), command


def test_the_links_of_the_readme_and_docs_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+:", link):
                continue  # a web address
            assert (page.parent / link).exists(), f"{page.relative_to(ROOT)} links to {link}, which does not exist"
