"""The results of `fedsim reproduce`: trial records -> the results table (one line per row x target x seed,
``results.csv``), ``table.md`` (mean ± sample std over seeds) and ``claims.md`` (each claim checked).

A row's metric is a reference into its run's results:

* ``target_accuracy``, ``final_detection/wg/A_com``: a number of the run's summary (summary.json, flattened
  with ``/``); a key that holds a mapping (``source_accuracy``) gives the mean of its numbers;
* ``rounds:<key>:<reduce>``: a per-round metric (mean over its sub-keys, e.g. over clients), reduced over
  the rounds that report it with ``mean``, ``last``, ``last3``, ``first_half`` or ``second_half``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.experiments.grouping import format_mean_std, mean_std
from fedsim.experiments.reproduce_spec import Claim, PaperSpec

REDUCERS = {
    "mean": lambda v: v,
    "last": lambda v: v[-1:],
    "last3": lambda v: v[-3:],
    "first_half": lambda v: v[: max(1, len(v) // 2)],
    "second_half": lambda v: v[max(1, len(v) // 2) :],
}


def value_under(numbers: dict, key: str) -> Optional[float]:
    if key in numbers:
        return float(numbers[key])
    inside = [float(v) for k, v in numbers.items() if k.startswith(key + "/")]
    return float(np.mean(inside)) if inside else None


def metric_value(record: dict, ref: str) -> Optional[float]:
    """One metric of a finished trial (None when the run does not report it)."""
    if record.get("status") != "finished":
        return None
    if not ref.startswith("rounds:"):
        return value_under(record.get("summary", {}), ref)
    _, key, how = (ref.split(":") + ["mean"])[:3]
    series = [v for v in (value_under(row, key) for row in record.get("round_metrics", [])) if v is not None]
    picked = REDUCERS[how](series) if how in REDUCERS else []
    return float(np.mean(picked)) if picked else None


def results_rows(spec: PaperSpec, records: list[dict]) -> list[dict]:
    """One line per table row x variant x seed, with every metric of the row (``target``, ``source``, ...)."""
    where = {name: (run, bench, target) for name, run, bench, target in spec.variants()}
    lines = []
    for row in spec.rows:
        for record in records:
            variant, seed = record["params"].get("variant"), record["params"].get("seed")
            run, bench, target = where.get(variant, (None, None, None))
            if run != row.run:
                continue
            line = {
                "row": row.name,
                "label": row.label,
                "run": run,
                "benchmark": bench,
                "target_domain": target,
                "seed": seed,
                "status": record["status"],
                "trial_id": record["trial_id"],
                "wall_seconds": record.get("wall_seconds"),
            }
            line.update({name: metric_value(record, ref) for name, ref in row.metrics.items()})
            if record.get("error"):
                line["error"] = record["error"]
            lines.append(line)
    return lines


def write_results_csv(path: Path, lines: list[dict]) -> Path:
    fields: list[str] = []
    for line in lines:
        fields += [k for k in line if k not in fields]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(lines)
    return path


def cell(
    lines: list[dict], row: str, bench: str, target: str, metric: str
) -> tuple[Optional[float], Optional[float], int]:
    """Mean, sample std and count over seeds of one row's metric on one target."""
    return mean_std(
        [ln.get(metric) for ln in lines if (ln["row"], ln["benchmark"], ln["target_domain"]) == (row, bench, target)]
    )


def _header(column: str, target: str) -> str:
    return {"target": f"-> {target}", "source": f"sources ({target})"}.get(column, f"{column} ({target})")


def table(spec: PaperSpec, lines: list[dict]) -> str:
    """Per benchmark: one line per row; per target its columns (target, then the sources' mean, ...), then the means."""
    seeds = ", ".join(str(s) for s in spec.seeds)
    out = [
        f"# {spec.paper}",
        "",
        f"Mean ± sample standard deviation over seeds {seeds} (one seed: the value alone); "
        "'sources' = the sources' mean accuracy of the same predictor; n/a = not run or not reported.",
        "",
    ]
    for bench, settings in spec.benchmarks.items():
        targets = settings["targets"]
        headers = [_header(c, t) for t in targets for c in spec.columns]
        if len(targets) > 1:
            headers += [f"{_header(c, 'mean').replace('-> mean', 'mean target')}" for c in spec.columns]
        out += [f"## {bench}", "", "| row | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
        for row in spec.rows:
            cells = [
                format_mean_std(*cell(lines, row.name, bench, t, c)[:2], digits=3)
                for t in targets
                for c in spec.columns
            ]
            if len(targets) > 1:
                for c in spec.columns:
                    means = [cell(lines, row.name, bench, t, c)[0] for t in targets]
                    cells.append("n/a" if None in means else f"{np.mean(means):.3f}")
            out.append(f"| {row.label} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def claim_value(lines: list[dict], bench: str, targets: list[str], row: str, metric: str) -> Optional[float]:
    """A row's metric for a claim: the mean over targets of the mean over seeds (None if a target has none)."""
    means = [cell(lines, row, bench, t, metric)[0] for t in targets]
    return None if not means or None in means else float(np.mean(means))


def _verdict(lines: list[dict], claim: Claim, bench: str, targets: list[str]) -> tuple[str, str]:
    values = [
        [
            (f"{row}" + ("" if metric == "target" else f" {metric}"), claim_value(lines, bench, targets, row, metric))
            for row, metric in group
        ]
        for group in claim.order
    ]
    where = f"{bench}, {'target ' + targets[0] if len(targets) == 1 else 'mean over ' + ', '.join(targets)}"
    figures = f"{where}: " + " vs ".join(
        ", ".join(f"{name} {'n/a' if v is None else f'{v:.3f}'}" for name, v in group) for group in values
    )
    missing = _unfinished(lines, [row for group in claim.order for row, _ in group], bench, targets)
    if missing:
        return "not measurable", f"{figures}; {missing}"
    if any(v is None for group in values for _, v in group):
        return "not measurable", figures
    above = (lambda a, b: a > b) if claim.strict else (lambda a, b: a >= b)
    holds = all(above(a, b) for upper, lower in zip(values, values[1:]) for _, a in upper for _, b in lower)
    return ("holds" if holds else "does not hold"), figures


def _unfinished(lines: list[dict], rows: list[str], bench: str, targets: list[str]) -> str:
    """The trials of ``rows`` on ``bench`` / ``targets`` that did not finish (a figure over the other seeds is not
    the claim's), each named with its error: "needs trial T (row, target, seed s), which failed: ...", or ""."""
    named = []
    for ln in lines:
        if ln["row"] in rows and ln["benchmark"] == bench and ln["target_domain"] in targets:
            if ln["status"] != "finished":
                what = "failed" if ln["status"] == "error" else f"is {ln['status']}"
                what += f": {ln['error']}" if ln.get("error") else ""
                named.append(
                    f"trial {ln['trial_id']} ({ln['row']}, {ln['target_domain']}, seed {ln['seed']}), which {what}"
                )
    return f"needs {'; '.join(dict.fromkeys(named))}" if named else ""


def check_claim(spec: PaperSpec, lines: list[dict], claim: Claim) -> list[tuple[str, str]]:
    """One (verdict, figures) per benchmark (and per target with ``per_target``); verdict: holds, does not hold,
    not measurable (a trial it needs failed or did not finish, named with its error; a row has no value on a
    target it needs; or the benchmark is not in the grid)."""
    results = []
    for bench in [claim.benchmark] if claim.benchmark else list(spec.benchmarks):
        if bench not in spec.benchmarks:
            results.append(("not measurable", f"{bench}: not in this grid"))
            continue
        targets = [claim.target] if claim.target else spec.benchmarks[bench]["targets"]
        for group in [[t] for t in targets] if claim.per_target else [targets]:
            results.append(_verdict(lines, claim, bench, group))
    return results


def claims_text(spec: PaperSpec, lines: list[dict]) -> str:
    out = [
        f"# The claims of {spec.paper}, as measured here",
        "",
        f"Each figure is the mean over seeds ({', '.join(str(s) for s in spec.seeds)}), then over the targets named.",
        "",
    ]
    for claim in spec.claims:
        for verdict, figures in check_claim(spec, lines, claim):
            out.append(f"- {claim.text}: **{verdict}** ({figures})")
    if not spec.claims:
        out.append("(this spec states no claims)")
    return "\n".join(out) + "\n"
