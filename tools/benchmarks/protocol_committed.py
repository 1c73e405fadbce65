"""What the committed results took: the ``wall_seconds`` of every ``results/**/results.csv``, by paper and by kind.

``results/<A>/results.csv`` was made by ``experiments/specs/results/<A>.yaml`` and ``results/<A>/<B>/results.csv`` by
``experiments/specs/results/<A>-<B>.yaml``; the spec's file name says the paper (``fada``, ``fada-guard`` and
``fada-real`` are FADA's; ``baselines*`` belong to none). Each trial counts once (several rows of results.csv may
read one trial: FedDaDiL's R and E). ``wall_seconds`` is the run's own time (the Simulator's): a trial's start-up
outside the run (its data, its process and actors) is not in it. :func:`committed_kinds` matches committed trials to
the kinds of a grid by their settings (:func:`tools.benchmarks.protocol_grid.settings_key`), so a kind's estimate can
be read beside what runs of the same settings took.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from tools.benchmarks.protocol_grid import settings_key

log = logging.getLogger(__name__)

REPOSITORY = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPOSITORY / "results"
SPECS_DIR = REPOSITORY / "experiments" / "specs" / "results"


@dataclass(frozen=True)
class Committed:
    """One committed results.csv: its name (``A`` or ``A-B``), the spec that made it, its paper, its trials."""

    name: str
    folder: str  # results/A or results/A/B
    csv_path: Path
    spec: Optional[Path]  # None: no experiments/specs/results/<name>.yaml
    paper: Optional[str]  # None: no paper's (the baselines)
    walls: dict  # trial id -> wall_seconds

    @property
    def seconds(self) -> float:
        return sum(self.walls.values())


def paper_of(name: str, papers: Iterable[str]) -> Optional[str]:
    """The paper a results name belongs to: the longest paper name it is or starts with (then a dash)."""
    found = [p for p in papers if name == p or name.startswith(f"{p}-")]
    return max(found, key=len) if found else None


def trial_rows(csv_path: Path) -> dict[str, dict]:
    """trial id -> its first row with a wall_seconds (rows reading the same trial repeat its time)."""
    with csv_path.open() as fh:
        rows: dict[str, dict] = {}
        for row in csv.DictReader(fh):
            if row.get("trial_id") and row.get("wall_seconds") and row["trial_id"] not in rows:
                rows[row["trial_id"]] = row
    return rows


def committed_results(
    papers: Iterable[str], results_dir: Path = RESULTS_DIR, specs_dir: Path = SPECS_DIR
) -> list[Committed]:
    """Every results.csv one or two folders under ``results_dir``, with its spec and paper."""
    papers = list(papers)
    found = []
    for csv_path in sorted([*results_dir.glob("*/results.csv"), *results_dir.glob("*/*/results.csv")]):
        parts = csv_path.parent.relative_to(results_dir).parts
        name, folder = "-".join(parts), "/".join((results_dir.name, *parts))
        spec = specs_dir / f"{name}.yaml"
        walls = {trial: float(row["wall_seconds"]) for trial, row in trial_rows(csv_path).items()}
        spec_path = spec if spec.is_file() else None
        found.append(Committed(name, folder, csv_path, spec_path, paper_of(name, papers), walls))
    return sorted(found, key=lambda e: e.name)


def of_spec(entries: list[Committed], spec_path: Path, papers: Iterable[str]) -> list[Committed]:
    """The committed results of a spec file: the one it made (a committed spec), else its paper's."""
    made = [e for e in entries if e.spec is not None and e.spec.resolve() == spec_path.resolve()]
    paper = paper_of(spec_path.stem, papers)
    return made or [e for e in entries if paper is not None and e.paper == paper]


def totals(entries: list[Committed]) -> tuple[float, int]:
    """Summed wall_seconds and trials."""
    return sum(e.seconds for e in entries), sum(len(e.walls) for e in entries)


def variant_keys(spec_path: Path) -> dict[tuple[str, str, str], str]:
    """(run, benchmark entry, target) -> settings key of that variant of a committed spec."""
    from fedsim.experiments.reproduce_spec import load_spec, to_sweep
    from fedsim.experiments.sweep_grid import VARIANT_KEY

    spec = load_spec(None, str(spec_path))
    sweep = to_sweep(spec)
    return {
        (run, bench, target): settings_key(sweep.config_for({VARIANT_KEY: name}))
        for name, run, bench, target in spec.variants()
    }


def committed_kinds(entries: list[Committed], keys: set[str]) -> dict[str, tuple[float, int]]:
    """settings key (of ``keys``) -> mean wall_seconds and number of the committed trials of those settings."""
    walls: dict[str, list[float]] = {}
    for entry in entries:
        if entry.spec is None:
            continue
        try:
            variants = variant_keys(entry.spec)
        except Exception as exc:  # a committed spec this code cannot read: its trials match no kind
            log.warning("%s: not read (%s); its trials are left out of the kinds' committed times", entry.spec, exc)
            continue
        for row in trial_rows(entry.csv_path).values():
            key = variants.get((row.get("run"), row.get("benchmark"), row.get("target_domain")))
            if key in keys:
                walls.setdefault(key, []).append(float(row["wall_seconds"]))
    return {key: (sum(v) / len(v), len(v)) for key, v in walls.items()}


def format_committed(entries: list[Committed]) -> str:
    """One line per committed results.csv, by paper, with each paper's total in trial-hours."""
    lines = ["## Committed results (wall_seconds of each results.csv: the runs' own time)", ""]
    lines += ["| paper | results | trials | trial-hours |", "|---|---|---:|---:|"]
    papers = sorted({e.paper or "" for e in entries}, key=lambda p: (p == "", p))
    for paper in papers:
        mine = [e for e in entries if (e.paper or "") == paper]
        for entry in mine:
            lines.append(f"| {paper or '(none)'} | {entry.folder} | {len(entry.walls)} | {entry.seconds / 3600:.2f} |")
        seconds, trials = totals(mine)
        lines.append(f"| **{paper or '(none)'}** | all | {trials} | {seconds / 3600:.2f} |")
    return "\n".join(lines) + "\n"
