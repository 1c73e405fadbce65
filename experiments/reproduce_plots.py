"""The plots of `fedsim reproduce`, per benchmark: final target metric of every row per target
(``accuracy-<benchmark>.png``, bars = mean over seeds, whiskers = sample std), target accuracy per round
of every run (``accuracy_per_round-<benchmark>.png``, one panel per target) and the spec's per-round
series (``series-<metric>.png``, e.g. FedDaDiL's atom drift for several local epochs); with the spec's ``select:``,
after them, the selection report beside table.md (``selection.md``, ``selection.csv``, ``selection.png``:
:func:`fedsim.experiments.reproduce_results.write_selection_report`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedsim.experiments.reproduce_results import cell, value_under, write_selection_report
from fedsim.experiments.reproduce_spec import PaperSpec
from fedsim.experiments.selection import FILES as SELECTION_FILES


def _panels(count: int, width: float = 6.0, height: float = 3.8):
    from matplotlib.figure import Figure  # Agg canvas, no pyplot state

    cols = min(2, count)
    rows = -(-count // cols)
    fig = Figure(figsize=(width * cols, height * rows), dpi=110)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(count)]
    return fig, axes


def _save(fig, axes, path: Path, xlabel: str, ylabel: str) -> Path:
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_final(spec: PaperSpec, lines: list[dict], bench: str, path: Path) -> Path:
    targets = spec.benchmarks[bench]["targets"]
    fig, (ax,) = _panels(1, width=max(6.0, 1.2 * len(targets) * max(1, len(spec.rows)) / 3), height=4.2)
    width = 0.8 / max(1, len(spec.rows))
    for i, row in enumerate(spec.rows):
        stats = [cell(lines, row.name, bench, t, "target") for t in targets]
        means = [m if m is not None else 0.0 for m, _, _ in stats]
        ax.bar(
            np.arange(len(targets)) + i * width,
            means,
            width,
            yerr=[s or 0.0 for _, s, _ in stats],
            capsize=2,
            label=row.label,
        )
    ax.set_xticks(np.arange(len(targets)) + width * (len(spec.rows) - 1) / 2, targets)
    ax.set_title(f"{spec.name} on {bench}: final target metric per row")
    return _save(fig, [ax], path, "target domain", "final target metric")


def _by_round(records: list[dict], key: str) -> tuple[list[int], list[float], list[float]]:
    """Mean and sample std (0 for one seed) over the records (seeds) of a per-round metric, rounds where it is
    reported."""
    values: dict[int, list[float]] = {}
    for record in records:
        for row in record.get("round_metrics", []):
            value = value_under(row, key)
            if value is not None and "round" in row:
                values.setdefault(int(row["round"]), []).append(value)
    rounds = sorted(values)
    spread = [float(np.std(values[r], ddof=1)) if len(values[r]) > 1 else 0.0 for r in rounds]
    return rounds, [float(np.mean(values[r])) for r in rounds], spread


def _records_of(spec: PaperSpec, records: list[dict], run: str, bench: str, target: str) -> list[dict]:
    names = {n for n, (r, b, t, _) in spec.trials().items() if (r, b, t) == (run, bench, target)}
    return [r for r in records if r["params"].get("variant") in names and r["status"] == "finished"]


def plot_rounds(
    spec: PaperSpec,
    records: list[dict],
    bench: str,
    target_list: list[str],
    runs: list[str],
    key: str,
    path: Path,
    split: bool = False,
    title: str = "",
) -> Path:
    """One panel per target, one line per run (per sub-key of ``key`` with ``split``): the mean over seeds, in a
    shaded band of +- one sample std where there are several seeds."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = _panels(len(target_list))
    for ax, target in zip(axes, target_list):
        for run in runs:
            members = _records_of(spec, records, run, bench, target)
            keys = sorted(
                {k for r in members for row in r.get("round_metrics", []) for k in row if k.startswith(key + "/")}
            )
            for sub in keys if split and keys else [key]:
                rounds, values, spread = _by_round(members, sub)
                if rounds:
                    label = run if sub == key else f"{run} {sub[len(key) + 1 :]}"
                    (line,) = ax.plot(rounds, values, marker="o", ms=3, label=label)
                    if any(spread):
                        low, high = np.subtract(values, spread), np.add(values, spread)
                        ax.fill_between(rounds, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(f"{bench} -> {target}: {title or key}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _save(fig, axes, path, "round", key)


def plot_names(spec: PaperSpec) -> list[str]:
    """The files :func:`write_plots` writes for ``spec``: two plots per benchmark, one per series, then the
    selection report of a spec with ``select:``."""
    names = [name for bench in spec.benchmarks for name in (f"accuracy-{bench}.png", f"accuracy_per_round-{bench}.png")]
    names += [f"series-{series['metric']}.png" for series in spec.series]
    return names + (list(SELECTION_FILES) if spec.select else [])


def write_plots(spec: PaperSpec, records: list[dict], lines: list[dict], out: Path) -> list[Path]:
    written = []
    for bench, settings in spec.benchmarks.items():
        written.append(plot_final(spec, lines, bench, out / f"accuracy-{bench}.png"))
        written.append(
            plot_rounds(
                spec,
                records,
                bench,
                settings["targets"],
                list(spec.runs),
                "target_accuracy",
                out / f"accuracy_per_round-{bench}.png",
            )
        )
    for series in spec.series:
        bench = series.get("benchmark") or next(iter(spec.benchmarks))
        targets = [series["target"]] if series.get("target") else spec.benchmarks[bench]["targets"]
        written.append(
            plot_rounds(
                spec,
                records,
                bench,
                targets,
                series["runs"],
                series["metric"],
                out / f"series-{series['metric']}.png",
                bool(series.get("split")),
                series.get("title", ""),
            )
        )
    return written + write_selection_report(spec, records, out)
