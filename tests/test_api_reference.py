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
from html import unescape
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


def docstring(page: str, name: str) -> str:
    """The text of the docstring pdoc shows for ``name`` (``Class.attribute`` or a module member) on a page: what
    lies between its anchor and the next member's, tags dropped; "" when it has none."""
    start = page.index(f'id="{name}"')
    following = [i for i in (page.find('<div id="', start + 1), page.find('<section id="', start + 1)) if i >= 0]
    member = page[start : min(following, default=len(page))]
    found = re.search(r'<div class="docstring">(.*?)</div>', member, re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", "", found.group(1))).split()) if found else ""


@pytest.mark.parametrize(
    "page, name, text",
    [
        ("fedsim/config.html", "DataConfig.seed", "independent of run.seed"),
        ("fedsim/config.html", "RunConfig.clients_per_round", "a fraction in (0, 1), that share"),
        ("fedsim/methods/base.html", "Method.Params", "frozen parameter dataclass"),
        ("fedsim/methods/base.html", "Method.disclosed_state_keys", "Peng et al., ICLR 2020"),
        ("fedsim/messages.html", "Instruction.seed", "draws all its random numbers"),
        ("fedsim/api.html", "RunResult.summary", "What summary.json holds"),
        ("fedsim/api.html", "BACKENDS", "module:function"),
        ("fedsim/registry.html", "Registry.targets", 'the "module:attribute" it loads'),
        ("fedsim/data/base.html", "Benchmark.default_target", 'data.target is "auto"'),
        ("fedsim/data/scenario.html", "Federation.source_ids", "source clients"),
    ],
)
def test_a_member_shows_its_docstring(reference, page, name, text):
    """pdoc shows a variable's or a field's docstring, the string right after it (a ``#:`` comment stays unseen)."""
    shown = docstring((reference / page).read_text(), name)
    assert text in shown, f"{page}: {name} shows {shown!r}, without {text!r}"


def test_the_package_page_links_to_the_api_it_lends(reference):
    """``fedsim.run`` is loaded on first use, so pdoc cannot list it: the package's docstring links to it."""
    page = (reference / "fedsim.html").read_text()
    for name in ("run", "make_config", "run_experiment", "RunResult"):
        assert f'href="fedsim/api.html#{name}"' in page, f"fedsim.html does not link to fedsim.api.{name}"


def test_a_reference_between_modules_is_a_link(reference):
    """``:class:`fedsim.runtime.context.RoundContext``` in a docstring becomes a link to that page."""
    html = (reference / "fedsim" / "methods" / "base.html").read_text()
    assert 'href="../runtime/context.html#RoundContext"' in html


def test_a_module_that_cannot_be_documented_fails_the_check(tmp_path):
    """The check sees pdoc's warnings: a module it cannot find is one, printed and not fatal to pdoc itself."""
    result = build(tmp_path, ["fedsim.errors", "fedsim.no_such_module"])
    assert warnings_in(result.stderr), result.stderr[-2000:]
