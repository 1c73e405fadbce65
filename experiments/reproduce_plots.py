"""The plots of `fedsim reproduce`, per benchmark: final target metric of every row per target
(``accuracy-<benchmark>.png``, bars = mean over seeds, whiskers = sample std), target accuracy per round
of every run (``accuracy_per_round-<benchmark>.png``, one panel per target), on a benchmark where some runs are
differentially private the final target metric against the epsilon they spent (``accuracy_epsilon-<benchmark>.png``,
:func:`epsilon_curves`), and the spec's per-round series (``series-<metric>.png``, e.g. FedDaDiL's atom drift for
several local epochs); with the spec's ``select:``, after them, the selection report beside table.md
(``selection.md``, ``selection.csv``, ``selection.png``:
:func:`fedsim.experiments.reproduce_results.write_selection_report`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.experiments.reproduce_results import cell, value_under, write_selection_report
from fedsim.experiments.reproduce_spec import PaperSpec, to_sweep
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


BUDGET_KEYS = ("epsilon", "noise_multiplier")
"""The ``privacy`` keys that turn differential privacy on (``docs/privacy.md``)."""


@dataclass
class EpsilonCurve:
    """Rows whose runs are the same but for their ``privacy.*`` settings, read with the same target metric: one
    line of accuracy against epsilon."""

    name: str  # the reference row's name, else the first private row's
    private: list[str]  # rows of runs with a privacy budget, in the spec's order
    reference: Optional[str]  # the row of the same run without privacy (a dashed line), None when the spec has none


def _is_private(variant: dict) -> bool:
    """Whether a trial's settings (its config file's sections, then its overrides) give ``privacy.epsilon`` or
    ``privacy.noise_multiplier`` (the last override of a key wins; ``null`` unsets it)."""
    section = (variant.get("base") or {}).get("privacy") or {}
    given = {key: section.get(key) is not None for key in BUDGET_KEYS}
    for override in variant["overrides"]:
        key, _, value = override.partition("=")
        if key.startswith("privacy.") and key[len("privacy.") :] in BUDGET_KEYS:
            given[key[len("privacy.") :]] = value.strip().lower() not in ("null", "none", "~", "")
    return any(given.values())


def epsilon_curves(spec: PaperSpec, bench: str) -> list[EpsilonCurve]:
    """The rows of ``bench`` grouped into curves of accuracy against epsilon: rows whose runs have, on each target
    of the benchmark, the same config file and the same overrides once every ``privacy.*`` one is left out, and the
    same ``target`` metric. A group with at least one private run is a curve; its row without privacy, if any, is
    the reference."""
    sweep = to_sweep(spec)
    variants: dict[str, list[dict]] = {}
    for name, run, where, _ in spec.variants():
        if where == bench:
            variants.setdefault(run, []).append(sweep.variants[name])
    groups: dict[tuple, list[tuple[str, bool]]] = {}
    for row in spec.rows:
        trials = variants.get(row.run)
        if not trials:
            continue
        without_privacy = tuple(
            (v["config_file"], tuple(o for o in v["overrides"] if not o.startswith("privacy."))) for v in trials
        )
        key = (row.metrics.get("target"), without_privacy)
        groups.setdefault(key, []).append((row.name, all(_is_private(v) for v in trials)))
    curves = []
    for members in groups.values():
        private = [name for name, is_private in members if is_private]
        reference = next((name for name, is_private in members if not is_private), None)
        if private:
            curves.append(EpsilonCurve(reference or private[0], private, reference))
    return curves


def epsilon_points(
    curve: EpsilonCurve, records: list[dict], lines: list[dict], bench: str, target: str
) -> list[tuple[float, float, float]]:
    """(epsilon, mean, sample std) of each private row of ``curve`` on one target, by epsilon: the mean over its
    finished seeds of the ``privacy_epsilon`` their summaries report (what the run spent) and of the row's target
    metric (std 0 with one seed); a row with no finished seed is left out."""
    spent = {
        r["trial_id"]: (r.get("summary") or {}).get("privacy_epsilon") for r in records if r.get("status") == "finished"
    }
    points = []
    for row in curve.private:
        pairs = [
            (spent[ln["trial_id"]], ln["target"])
            for ln in lines
            if (ln["row"], ln["benchmark"], ln["target_domain"]) == (row, bench, target)
            and spent.get(ln["trial_id"]) is not None
            and ln.get("target") is not None
        ]
        if pairs:
            epsilons, values = zip(*pairs)
            spread = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            points.append((float(np.mean(epsilons)), float(np.mean(values)), spread))
    return sorted(points)


def plot_epsilon(
    spec: PaperSpec, records: list[dict], lines: list[dict], bench: str, curves: list[EpsilonCurve], path: Path
) -> Path:
    """One panel per target: per curve, the final target metric (mean over seeds, whiskers = sample std) against
    the epsilon spent (log scale), and its run without privacy as a dashed line of the same colour."""
    targets = spec.benchmarks[bench]["targets"]
    fig, axes = _panels(len(targets))
    for ax, target in zip(axes, targets):
        budgets = set()
        for i, curve in enumerate(curves):
            color = f"C{i % 10}"  # a curve keeps its colour in every panel
            points = epsilon_points(curve, records, lines, bench, target)
            if points:
                x, y, spread = zip(*points)
                ax.errorbar(x, y, yerr=spread, color=color, marker="o", ms=4, capsize=2, label=curve.name)
                budgets.update(round(value, 3) for value in x)
            mean = cell(lines, curve.reference, bench, target, "target")[0] if curve.reference else None
            if mean is not None:
                ax.axhline(mean, linestyle="--", linewidth=1, color=color, label=f"{curve.reference} (no privacy)")
        ax.set_xscale("log")
        if budgets:  # a tick at each epsilon spent
            ax.set_xticks(sorted(budgets), [f"{value:g}" for value in sorted(budgets)])
            ax.minorticks_off()
        ax.set_title(f"{bench} -> {target}: final target metric against epsilon")
    return _save(fig, axes, path, "epsilon spent (privacy_epsilon)", "final target metric")


def plot_names(spec: PaperSpec) -> list[str]:
    """The files :func:`write_plots` writes for ``spec``: two plots per benchmark (three where some of its runs are
    private), one per series, then the selection report of a spec with ``select:``."""
    names = [name for bench in spec.benchmarks for name in (f"accuracy-{bench}.png", f"accuracy_per_round-{bench}.png")]
    names += [f"accuracy_epsilon-{bench}.png" for bench in spec.benchmarks if epsilon_curves(spec, bench)]
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
    for bench in spec.benchmarks:
        curves = epsilon_curves(spec, bench)
        if curves:
            written.append(plot_epsilon(spec, records, lines, bench, curves, out / f"accuracy_epsilon-{bench}.png"))
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
