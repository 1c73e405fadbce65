"""docs/privacy.md's "What each method discloses", generated from the methods' own declarations.

Each built-in method's ``privacy_exchanges`` (its stages, at the method's default settings) gives one row per
training exchange: who sends it, what it carries, who reads it, and how each ``privacy.unit`` treats it; each
``privacy_refusal`` gives one line. ``python -m tools.docs.privacy_disclosure`` writes the section between its
markers; tests/test_privacy_declarations.py checks that the page holds what this module generates.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fedsim.config import load_config
from fedsim.privacy.exchanges import (
    CLIENTS,
    EACH,
    SOURCES,
    TARGETS,
    UNIFORM,
    WEIGHTED,
    Exchanges,
    Stage,
    declaring_class,
    method_exchanges,
    supported_methods,
)
from fedsim.registry import METHODS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "privacy.md"
BEGIN, END = "<!-- privacy-disclosure: begin -->", "<!-- privacy-disclosure: end -->"

SENDERS = {SOURCES: "the sources", TARGETS: "the target's clients", CLIENTS: "every client"}
#: the noise on one reply under ``privacy.unit=client``, by how the server combines the replies (docs/privacy.md,
#: "The two modes": central, then local)
CLIENT_NOISE = {
    WEIGHTED: "clipped to C and noised: σ = z·C·max(w)/(w_k·√m) in the central mode, z·C in the local one",
    UNIFORM: "clipped to C and noised: σ = z·C/√m in the central mode, z·C in the local one",
    EACH: "clipped to C and noised: σ = z·C, each reply being read on its own",
}
HEADER = (
    "| method | stage | who sends | what a reply carries | who reads it | `unit: client` | `unit: record` |",
    "|---|---|---|---|---|---|---|",
)


def client_treatment(stage: Stage) -> str:
    """How ``privacy.unit=client`` treats the replies of ``stage``."""
    if stage.setup:
        return "never noised (a setup stage)"
    if not stage.tensors:
        return "nothing to noise, nothing spent"
    return CLIENT_NOISE[stage.combined]


def record_treatment(exchanges: Exchanges, stage: Stage) -> str:
    """How ``privacy.unit=record`` treats the replies of ``stage``, or why it refuses the method."""
    if stage.records and not stage.record_mechanism:
        return f"refused: it sends {stage.records}, values of single records that DP-SGD does not bound"
    unbounded = next((s.operation for s in exchanges.stages if s.records and not s.record_mechanism), None)
    if unbounded:
        return f"refused with the method (its `{unbounded}` exchange)"
    if exchanges.record_level:
        return f"refused: {exchanges.record_level}"
    if stage.setup:
        return "never noised (a setup stage)"
    if not stage.tensors:
        return "nothing to noise, nothing spent"
    if stage.record_mechanism:
        return stage.record_mechanism
    return "not noised again: a function of the sender's DP-SGD steps (post-processing)"


def method_rows(name: str) -> list[str]:
    """The table rows of built-in method ``name``'s training exchanges, at its default settings."""
    declared = method_exchanges(load_config(None, [f"method.name={name}"]))
    rows = []
    for stage in declared.stages:
        cells = (
            f"`{name}`",
            f"`{stage.operation}`",
            SENDERS[stage.senders],
            stage.sends,
            stage.readers,
            client_treatment(stage),
            record_treatment(declared, stage),
        )
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def refusals() -> list[str]:
    """One line per built-in method that declares why privacy cannot apply to it."""
    lines = []
    for name in sorted(METHODS.builtin_names()):
        owner = declaring_class(METHODS.get(name))
        if owner is not None and "privacy_refusal" in owner.__dict__:
            lines.append(f"- `{name}` {owner.__dict__['privacy_refusal']}.")
    return lines


def section() -> str:
    """The generated text between the markers (markers excluded)."""
    rows = [row for name in supported_methods() for row in method_rows(name)]
    intro = (
        "Generated from each method's `privacy_exchanges` at its default settings\n"
        "(`python -m tools.docs.privacy_disclosure`). m: the replies of the call; w: the weights the server gives\n"
        "them; z: the noise multiplier; C: `privacy.clip`."
    )
    refused = "Refused under both units (the method's `privacy_refusal`; one line, exit code 2):"
    return "\n".join((intro, "", *HEADER, *rows, "", refused, "", *refusals()))


def page_section(text: str) -> str:
    """The text between the markers of ``text``."""
    match = re.search(re.escape(BEGIN) + r"\n(.*)\n" + re.escape(END), text, re.S)
    if match is None:
        raise SystemExit(f"{PAGE} has no {BEGIN} ... {END} markers")
    return match.group(1)


def main() -> int:
    text = PAGE.read_text()
    old = page_section(text)
    PAGE.write_text(text.replace(f"{BEGIN}\n{old}\n{END}", f"{BEGIN}\n{section()}\n{END}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
