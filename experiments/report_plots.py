"""The plots of `fedsim report` (matplotlib's Agg canvas, no display): target accuracy per round,
against local epochs and against bytes communicated; :func:`figure` and :func:`finish` give every
plot of the package the same size, labels, grid and legend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedsim.experiments.grouping import group_label, groups, mean_std

PLOTS = ("accuracy_per_round.png", "accuracy_vs_local_epochs.png", "accuracy_vs_bytes.png")


def figure(width: float = 6.4, height: float = 4.2):
    from matplotlib.figure import Figure  # Agg canvas, no pyplot state, no display needed

    fig = Figure(figsize=(width, height), dpi=110)
    return fig, fig.add_subplot(1, 1, 1)


def _colors(grouped: dict) -> dict:
    import matplotlib

    methods = sorted({dict(k).get("method") for k in grouped}, key=str)
    cmap = matplotlib.colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def _curves(members: list[dict], x_key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-round target accuracy of a group: x (mean over seeds), mean and std, evaluated rounds only."""
    by_round: dict[int, list[tuple[float, float]]] = {}
    for r in members:
        for h in r["history"]:
            if h.get("target_accuracy") is not None:
                by_round.setdefault(int(h["round"]), []).append((float(h[x_key]), float(h["target_accuracy"])))
    rounds = sorted(by_round)
    x = np.array([np.mean([p[0] for p in by_round[k]]) for k in rounds])
    y = np.array([np.mean([p[1] for p in by_round[k]]) for k in rounds])
    s = np.array([np.std([p[1] for p in by_round[k]], ddof=1) if len(by_round[k]) > 1 else 0.0 for k in rounds])
    return x, y, s


_STYLES = ["-", "--", ":", "-."]


def _linestyle(grouped: dict, key: tuple) -> str:
    """Colour = method, line style = local epochs."""
    epochs = sorted({dict(k).get("local_epochs") for k in grouped}, key=str)
    return _STYLES[epochs.index(dict(key).get("local_epochs")) % len(_STYLES)]


def finish(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """Labels, grid and legend as every report plot has them; saves the figure to ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # an empty plot (no trial finished yet) has nothing to name
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_accuracy_per_round(records: list[dict], path: Path, title: str) -> Path:
    grouped = groups(records)
    colors = _colors(grouped)
    fig, ax = figure()
    for key, members in grouped.items():
        x, y, s = _curves(members, "round")
        if len(x) == 0:
            continue
        params = dict(key)
        color = colors[params.get("method")]
        ax.plot(x, y, _linestyle(grouped, key), color=color, marker="o", ms=3, label=group_label(key))
        if s.any():
            ax.fill_between(x, y - s, y + s, color=color, alpha=0.15)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return finish(fig, ax, path, "round", "target accuracy", f"Target accuracy per round{title}")


def plot_accuracy_vs_local_epochs(records: list[dict], path: Path, title: str) -> Path:
    lines: dict[tuple, dict[Any, list]] = {}
    for r in records:
        if r.get("status", "finished") != "finished":
            continue
        key = tuple((k, v) for k, v in r["params"].items() if k not in ("seed", "local_epochs"))
        lines.setdefault(key, {}).setdefault(r["params"].get("local_epochs"), []).append(r.get("target_accuracy"))
    colors = _colors({k: None for k in lines})
    fig, ax = figure()
    for key, by_epochs in lines.items():
        xs = sorted((e for e in by_epochs if e is not None), key=float)
        stats = [mean_std(by_epochs[e]) for e in xs]
        keep = [(float(e), m, s or 0.0) for e, (m, s, _) in zip(xs, stats) if m is not None]
        if not keep:
            continue
        ex, mean, std = (np.array(v) for v in zip(*keep))
        ax.errorbar(
            ex, mean, yerr=std, marker="o", capsize=3, color=colors[dict(key).get("method")], label=group_label(key)
        )
    ticks = sorted({float(e) for by_epochs in lines.values() for e in by_epochs if e is not None})
    if ticks:
        ax.set_xticks(ticks)
    return finish(
        fig,
        ax,
        path,
        "local epochs per round",
        "final target accuracy",
        f"Final target accuracy vs local epochs{title}",
    )


def plot_accuracy_vs_bytes(records: list[dict], path: Path, title: str) -> Path:
    grouped = groups(records)
    colors = _colors(grouped)
    fig, ax = figure()
    for key, members in grouped.items():
        x, y, _ = _curves(members, "bytes_total")
        if len(x) == 0:
            continue
        ax.plot(
            x / 1e6,
            y,
            _linestyle(grouped, key),
            marker="o",
            ms=3,
            color=colors[dict(key).get("method")],
            label=group_label(key),
        )
    return finish(
        fig,
        ax,
        path,
        "MB communicated (sent + received, cumulative)",
        "target accuracy",
        f"Target accuracy vs communication{title}",
    )
