"""The plot of a selection report (matplotlib's Agg canvas, as :mod:`fedsim.experiments.report_plots`):
``selection.png``, per group the target accuracy of the default, of each score's pick and of the oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from fedsim.experiments.report_plots import figure, finish
from fedsim.experiments.selection_rows import DEFAULT, ORACLE, SelectionRow


def _short(group: tuple) -> str:
    """A group's values only (``fedavg, digits, usps``): the axis has room for little."""
    return ", ".join(str(v) for _, v in group) or "all trials"


def plot_selection(rows: list[SelectionRow], scores: Sequence[str], path: Path) -> Path:
    """Grouped bars, one group of bars per selection group: the default (grey), each score's pick, the oracle
    (hatched: it reads target labels); whiskers = sample std over seeds; a missing choice has no bar."""
    import matplotlib

    rules = [DEFAULT, *scores, ORACLE]
    cmap = matplotlib.colormaps["tab10"]
    colors = {DEFAULT: "0.55", ORACLE: "0.15", **{s: cmap(i % 10) for i, s in enumerate(scores)}}
    width = 0.8 / len(rules)
    fig, ax = figure(width=max(6.4, 0.35 * len(rules) * max(1, len(rows)) + 2.0), height=4.6)
    x = np.arange(len(rows))
    for i, rule in enumerate(rules):
        choices = [dict(row.choices()).get(rule) for row in rows]
        where = [j for j, c in enumerate(choices) if c is not None and c.accuracy is not None]
        if not where:
            continue
        ax.bar(
            x[where] + (i - (len(rules) - 1) / 2) * width,
            [choices[j].accuracy for j in where],
            width,
            yerr=[choices[j].accuracy_std or 0.0 for j in where],
            capsize=2,
            color=colors[rule],
            hatch="//" if rule == ORACLE else None,
            edgecolor="white" if rule == ORACLE else None,
            label={DEFAULT: "default", ORACLE: "oracle (target labels)"}.get(rule, f"picked by {rule}"),
        )
    tilted = len(rows) > 3
    ax.set_xticks(
        x, [_short(row.group) for row in rows], rotation=20 if tilted else 0, ha="right" if tilted else "center"
    )
    ax.set_ylim(bottom=0)
    return finish(
        fig, ax, path, "group", "target accuracy", "Target accuracy of each score's pick, the default and the oracle"
    )
