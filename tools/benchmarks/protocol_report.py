"""The tables of a full protocol's estimate: its kinds, where its time goes, and one line per paper.

Every figure says how it was got: measured (the cut trial of a kind, the grid's own time) or scaled (rounds and
evaluations of the cut to the full run's, a trial to the kind's trials, trial-seconds to wall seconds by the trials
the grid runs at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tools.benchmarks.protocol_scale import COLD, GRID, HOUR, SUB_PARTS, KindEstimate, Totals
from tools.benchmarks.protocol_split import STARTUP_PARTS

HOW = {
    "training": "scaled: the cut's rounds, per stage",
    "evaluation": "scaled: the cut's evaluations, per stage",
    "checkpoints": "scaled: the cut's mean x the run's checkpoints",
    STARTUP_PARTS[0]: "measured once per kind (cut), x trials",
    STARTUP_PARTS[1]: "measured once per kind (cut), x trials",
    COLD: "measured: a kind's cut trial in a fresh process less in a warm one, x the grid's processes",
}
LABELS = {
    "training": "training (rounds less evaluation, checkpoints)",
    "evaluation": "evaluation (predictors included)",
    "checkpoints": "checkpoints",
    STARTUP_PARTS[0]: "start-up: data, process/actor start and stop",
    STARTUP_PARTS[1]: "start-up: setup exchange, callbacks (in the run)",
    COLD: "start-up: the first trial of each trial process (imports, first calls)",
}


def hours(seconds: Optional[float]) -> str:
    return "" if seconds is None else f"{seconds / HOUR:.2f}"


def kinds_table(kinds: list[KindEstimate]) -> list[str]:
    """One line per kind: its trials, how many at once, its rounds and the cut's, measured and scaled seconds (a
    trial's mean: with a shared stage, its trials that replay it take that stage's seconds less)."""
    lines = [
        "| kind | trials | at once | rounds | evaluations | cut: rounds | cut trial s (measured) "
        "| trial s (scaled) | in the run s (scaled) | committed in the run s (trials) | compute the shared stage |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k in kinds:
        committed = f"{k.committed[0]:.1f} ({k.committed[1]})" if k.committed else ""
        lines.append(
            f"| {k.name} | {k.trials} | {k.at_once} | {k.shape.text()} | {len(k.shape.evaluated())} "
            f"| {k.cut.text()} | {k.cut_seconds:.1f} | {k.mean_seconds:.1f} | {k.mean_in_run:.1f} | {committed} "
            f"| {computes_text(k)} |"
        )
    return lines


def computes_text(kind: KindEstimate) -> str:
    """How many of a kind's trials compute the shared stage, and its seconds where others replay it."""
    if kind.computes is None:
        return ""
    return f"{kind.computes} of {kind.trials}" + (f" ({kind.shared:.1f} s)" if kind.shared else "")


def part_rows(totals: Totals, grid_how: str) -> list[tuple[str, str, Optional[float], float]]:
    """(part, how, trial-seconds or None, wall seconds), sub-parts under their parent, in the table's order."""
    rows: list[tuple[str, str, Optional[float], float]] = []
    for part in totals.trial:
        rows.append((LABELS[part], HOW[part], totals.trial[part], totals.wall[part]))
        for name in [n for n, parent in SUB_PARTS.items() if parent == part]:
            if name in totals.sub_trial:
                rows.append((f"  of which {name}", f"scaled as {part}", totals.sub_trial[name], totals.sub_wall[name]))
            else:
                rows.append((f"  of which {name}: not reported by the methods", "", None, 0.0))
    rows.append((f"{GRID} (no trial running)", grid_how, None, totals.wall[GRID]))
    rows.append(("total", "", sum(totals.trial.values()), totals.wall_seconds))
    return rows


def format_estimate(title: str, kinds: list[KindEstimate], totals: Totals, grid_how: str, notes: list[str]) -> str:
    """The kinds, then where the full protocol's time goes, in hours, with how each figure was got."""
    wall = totals.wall_seconds
    lines = [
        f"## {title}",
        "",
        f"{totals.trials} trials in {len(kinds)} kinds: {hours(sum(totals.trial.values()))} trial-hours, "
        f"estimated wall {hours(wall)} h ({wall:.0f} s)",
        "",
        *kinds_table(kinds),
        "",
        "| part | how | trial-hours | wall hours | share |",
        "|---|---|---:|---:|---:|",
    ]
    for name, how, trial, part_wall in part_rows(totals, grid_how):
        share = f"{100 * part_wall / wall:.1f}%" if wall > 0 and (trial is not None or part_wall) else ""
        shown = hours(part_wall) if trial is not None or part_wall else ""
        lines.append(f"| {name} | {how} | {hours(trial)} | {shown} | {share} |")
    lines += ["", *notes]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class PaperLine:
    """One paper in the summary: its estimate, the committed trial-seconds beside it, what measuring it took."""

    paper: str
    kinds: int
    totals: Totals
    committed: tuple[float, int]  # wall_seconds summed over committed trials, and their count
    measured_seconds: float  # wall time of the cut and the --quick run


def format_summary(lines: list[PaperLine]) -> str:
    """One line per paper: trials, trial-hours, estimated wall hours, committed trial-hours, the wall's split."""
    out = [
        "## The full protocols on this machine",
        "",
        "| paper | trials | kinds | trial-hours | wall hours | committed trial-hours (trials) "
        "| training | evaluation | start-up | grid / Tune | measuring took |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for line in lines:
        t, wall = line.totals, line.totals.wall_seconds
        share = {k: f"{100 * v / wall:.1f}%" if wall > 0 else "" for k, v in t.wall.items()}
        share["start-up"] = f"{100 * sum(t.wall[p] for p in (*STARTUP_PARTS, COLD)) / wall:.1f}%" if wall > 0 else ""
        out.append(
            f"| {line.paper} | {t.trials} | {line.kinds} | {hours(sum(t.trial.values()))} | {hours(wall)} "
            f"| {hours(line.committed[0])} ({line.committed[1]}) | {share['training']} | {share['evaluation']} "
            f"| {share['start-up']} | {share[GRID]} | {line.measured_seconds / 60:.1f} min |"
        )
    out += [
        "",
        "trial-hours and wall hours: scaled from one measured cut trial per kind; committed trial-hours: the "
        "wall_seconds of the committed results.csv files (the runs' own time: start-up outside the run not "
        "included; other code, other cuts of the protocol)",
    ]
    return "\n".join(out) + "\n"


def plan_table(kinds: list, at_once: dict, cuts: dict, committed: dict) -> str:
    """The grid's kinds before any run: trials, trials at once, rounds, the cut, committed times of their settings,
    and what the kinds with committed runs would take at those times (in the run only, start-up left out)."""
    from tools.benchmarks.protocol_grid import cut_settings

    lines = [
        "| kind | trials | at once | compute the shared stage | rounds | evaluations | cut: rounds | cut settings "
        "| committed in the run s (trials) |",
        "|---|---:|---:|---:|---|---:|---:|---|---:|",
    ]
    trial_seconds = wall_seconds = 0.0
    for kind in kinds:
        cut, known = cuts[kind.name], committed.get(kind.name)
        shown = f"{known[0]:.1f} ({known[1]})" if known else ""
        lines.append(
            f"| {kind.name} | {len(kind.points)} | {at_once[kind.name]} | {kind.computes} | {kind.shape.text()} "
            f"| {len(kind.shape.evaluated())} | {cut.text()} | {' '.join(cut_settings(kind.shape, cut))} | {shown} |"
        )
        if known:
            trial_seconds += len(kind.points) * known[0]
            wall_seconds += len(kind.points) * known[0] / at_once[kind.name]
    matched = sum(1 for k in kinds if committed.get(k.name))
    lines += [
        "",
        f"at the committed times ({matched} of {len(kinds)} kinds have committed runs of the same settings): "
        f"{hours(trial_seconds)} trial-hours, {hours(wall_seconds)} wall hours in the runs alone",
    ]
    return "\n".join(lines) + "\n"
