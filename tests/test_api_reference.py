"""The API reference builds from the docstrings without a warning: what ``make docs`` runs, into a temporary folder.

pdoc reports what it cannot document (a module that fails to import, a type annotation it cannot parse, a bad
``__all__``) as Python warnings on stderr and still writes the pages; here any warning fails the build, except the
deprecation notices third-party packages give at import (they say nothing about fedsim's docstrings).
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: shown as a warning: everything but the deprecation notices of imported packages
WARNINGS = "default,ignore::DeprecationWarning,ignore::PendingDeprecationWarning"


def api_modules() -> list[str]:
    """The pdoc arguments of ``make docs``: the Makefile's ``API_MODULES``, continuation lines joined."""
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^API_MODULES\s*:?=(.*)$", makefile, re.M)
    assert match, "the Makefile defines no API_MODULES (the modules of `make docs`)"
    return shlex.split(match.group(1))


def build(out: Path, modules: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": WARNINGS}
    return subprocess.run(
        [sys.executable, "-m", "pdoc", "-o", str(out), *modules],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def warnings_in(stderr: str) -> list[str]:
    """The first line of every warning printed: pdoc's own form (``Warn: message``, ``SomeWarning: message``) or
    Python's (``file:line: SomeWarning: message``, for a warning given before pdoc takes over the printing)."""
    return re.findall(r"^.*\b(?:Warn|\w*Warning): .*$", stderr, re.M)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("api")
    result = build(out, api_modules())
    assert result.returncode == 0, f"pdoc failed:\n{result.stderr[-4000:]}"
    found = warnings_in(result.stderr)
    assert not found, "pdoc warned:\n" + "\n".join(found) + f"\n\nstderr:\n{result.stderr[-4000:]}"
    return out


def test_the_reference_builds_without_a_warning(reference):
    pages = sorted(p.relative_to(reference).as_posix() for p in reference.rglob("*.html"))
    assert "index.html" in pages and "fedsim.html" in pages, pages


@pytest.mark.parametrize(
    "page, names",
    [
        ("fedsim/api.html", ["RunResult", "make_config", "run_experiment"]),
        ("fedsim/config.html", ["ExperimentConfig", "load_config"]),
        ("fedsim/registry.html", ["Registry", "METHODS", "BENCHMARKS", "MODELS"]),
        ("fedsim/methods/base.html", ["Method", "SingleExchange", "Exchange", "client_operation", "Params"]),
        ("fedsim/runtime/context.html", ["RoundContext", "call"]),
        ("fedsim/messages.html", ["Instruction", "Reply"]),
        ("fedsim/data/base.html", ["Benchmark", "Domain", "ClientData"]),
        ("fedsim/models.html", ["build_model"]),
        ("fedsim/errors.html", ["UserError"]),
    ],
)
def test_a_page_documents_its_module(reference, page, names):
    html = (reference / page).read_text()
    for name in names:
        assert f'id="{name}"' in html or f">{name}<" in html, f"{page} does not document {name}"


def test_a_reference_between_modules_is_a_link(reference):
    """``:class:`fedsim.runtime.context.RoundContext``` in a docstring becomes a link to that page."""
    html = (reference / "fedsim" / "methods" / "base.html").read_text()
    assert 'href="../runtime/context.html#RoundContext"' in html


def test_a_module_that_cannot_be_documented_fails_the_check(tmp_path):
    """The check sees pdoc's warnings: a module it cannot find is one, printed and not fatal to pdoc itself."""
    result = build(tmp_path, ["fedsim.errors", "fedsim.no_such_module"])
    assert warnings_in(result.stderr), result.stderr[-2000:]
