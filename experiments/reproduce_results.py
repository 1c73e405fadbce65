"""The results of `fedsim reproduce`: trial records -> the results table (one line per row x target x seed,
``results.csv``, read back by :func:`read_results_csv`), ``table.md`` (mean ± sample std over seeds),
``claims.md`` (each claim checked on the seeds' paired differences with a sign test and a paired t-test, see
:func:`check_claim`) and, for a spec with ``select:``, the selection among runs without target labels
(:func:`write_selection_report`).

A row's metric is a reference into its run's results:

* ``target_accuracy``, ``final_detection/wg/A_com``: a number of the run's summary (summary.json, flattened
  with ``/``); a key that holds a mapping (``source_accuracy``) gives the mean of its numbers;
* ``rounds:<key>:<reduce>``: a per-round metric (mean over its sub-keys, e.g. over clients), reduced over
  the rounds that report it with ``mean``, ``last``, ``last3``, ``first_half`` or ``second_half``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.errors import UserError
from fedsim.experiments.grouping import format_mean_std, mean_std
from fedsim.experiments.reproduce_format import DEFAULT_METRICS
from fedsim.experiments.reproduce_spec import Claim, PaperSpec, default_run
from fedsim.experiments.selection import SCORE_PREFIX, SelectionRow, check_scores, mean_over, select, write_selection

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


def trial_of(trials: dict, record: dict) -> tuple[Optional[str], Optional[str], Optional[str], Optional[int]]:
    """(run, benchmark, target, seed) of a trial record, from the spec's ``trials()``: the seed is the sweep's seed
    axis, else the one in the grid point's name; all None for a record of no grid point of the spec."""
    variant, seed = record["params"].get("variant"), record["params"].get("seed")
    run, bench, target, own_seed = trials.get(variant, (None, None, None, None))
    return run, bench, target, own_seed if seed is None else seed


def score_columns(spec: PaperSpec) -> list[str]:
    """The label-free scores results.csv carries for a spec with ``select:`` (``score_entropy``, ...), one column
    each: the numbers :func:`selection_rows` chooses by, so that ``--tables-only`` rewrites the selection too."""
    return [SCORE_PREFIX + name for name in spec.select.scores] if spec.select else []


def results_rows(spec: PaperSpec, records: list[dict]) -> list[dict]:
    """One line per table row x variant x seed, with every metric of the row (``target``, ``source``, ...) and,
    for a spec with ``select:``, the run's scores (:func:`score_columns`)."""
    where = spec.trials()
    scores = score_columns(spec)
    lines = []
    for row in spec.rows:
        for record in records:
            run, bench, target, seed = trial_of(where, record)
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
            line.update({name: metric_value(record, name) for name in scores})
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


FIXED_COLUMNS = ("row", "label", "run", "benchmark", "target_domain", "seed", "status", "trial_id", "wall_seconds")


def _number(text: str, where: str, kind: type = float) -> Optional[float]:
    if text == "":
        return None
    try:
        return kind(text)
    except ValueError:
        raise UserError(f"{where}: {text!r} is not a number") from None


def read_results_csv(path: Path, spec: PaperSpec) -> list[dict]:
    """The lines :func:`results_rows` made for ``spec`` (as :func:`write_results_csv` wrote them), read back: the
    same keys and values (an empty cell: None; ``error`` only where there is one). A file that does not fit the
    spec (another row, run or benchmark, a metric no row has) is one line naming it."""
    if not path.is_file():
        raise UserError(f"{path} does not exist: give the --out directory of a finished 'fedsim reproduce'")
    rows = {row.name: row for row in spec.rows}
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        absent = [c for c in FIXED_COLUMNS if c not in header]
        if absent:
            raise UserError(f"{path} has no column {', '.join(absent)}: it is not a 'fedsim reproduce' results.csv")
        known = {*FIXED_COLUMNS, "error", *(m for row in spec.rows for m in row.metrics), *score_columns(spec)}
        stray = [c for c in header if c not in known]
        if stray:
            raise UserError(
                f"{path} has the column {', '.join(stray)}, a metric no row of spec {spec.name} has: "
                "give the spec that made it"
            )
        lines = []
        for number, text in enumerate(reader, 2):
            where = f"{path}, line {number}"
            row = rows.get(text["row"])
            if row is None or text["run"] != row.run or text["benchmark"] not in spec.benchmarks:
                what = (
                    f"row {text['row']!r}"
                    if row is None
                    else f"run {text['run']!r} for row {row.name}"
                    if text["run"] != row.run
                    else f"benchmark {text['benchmark']!r}"
                )
                raise UserError(
                    f"{where} names {what}, which spec {spec.name} does not have: give the spec that made it"
                )
            line: dict = {k: text[k] for k in ("row", "label", "run", "benchmark", "target_domain")}
            line["seed"] = _number(text["seed"], where, int)
            line.update(status=text["status"], trial_id=text["trial_id"])
            line["wall_seconds"] = _number(text["wall_seconds"], where)
            line.update({name: _number(text.get(name) or "", where) for name in row.metrics})
            line.update({name: _number(text.get(name) or "", where) for name in score_columns(spec)})
            if text.get("error"):
                line["error"] = text["error"]
            lines.append(line)
    return lines


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
    seeds = spec.seeds_text()
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


HOLDS, REVERSED, SPREAD, UNMEASURABLE = "holds", "does not hold", "within the spread", "not measurable"


def _name(row: str, metric: str) -> str:
    return row + ("" if metric == "target" else f" {metric}")


def _values(lines: list[dict], row: str, metric: str, bench: str, target: str) -> dict:
    """seed -> the row's metric on ``bench`` / ``target`` at that seed (seeds without a value left out)."""
    return {
        ln["seed"]: float(ln[metric])
        for ln in lines
        if (ln["row"], ln["benchmark"], ln["target_domain"]) == (row, bench, target) and ln.get(metric) is not None
    }


def paired_differences(
    lines: list[dict], bench: str, targets: list[str], upper: tuple[str, str], lower: tuple[str, str]
) -> tuple[dict, dict]:
    """The paired differences of a claim that ``upper`` (row, metric) is above ``lower``: at each seed at which both
    rows have a value on every target of ``targets``, the mean over those targets of upper - lower on the same target
    and seed ({seed: difference}); and the seeds left out, each with what it lacks ({seed: ["row on target", ...]})."""
    values = {side: {t: _values(lines, *side, bench, t) for t in targets} for side in (upper, lower)}
    seeds = sorted(  # the seeds of the two rows' lines, a line without the metric's value included
        {
            ln["seed"]
            for ln in lines
            if ln["row"] in (upper[0], lower[0]) and ln["benchmark"] == bench and ln["target_domain"] in targets
        },
        key=lambda s: (s is None, s or 0),
    )
    differences, unpaired = {}, {}
    for seed in seeds:
        lacking = [f"{_name(*side)} on {t}" for side in (upper, lower) for t in targets if seed not in values[side][t]]
        if lacking:
            unpaired[seed] = lacking
        else:
            differences[seed] = float(np.mean([values[upper][t][seed] - values[lower][t][seed] for t in targets]))
    return differences, unpaired


#: the one-sided p-value at or under which a pair's seeds separate an order (:func:`strength`)
ALPHA = 0.05
#: a paired difference within this of 0 is a tie (the same accuracy on both rows, up to float rounding)
TIE = 1e-12


def _favours(difference: float, strict: bool) -> bool:
    """Whether one paired difference is in the claim's favour: above 0, or at or above 0 (a tie) for a
    ``strict: false`` claim."""
    return difference > TIE if strict else difference >= -TIE


@dataclass
class Strength:
    """The paired differences of one pair, and how strongly they separate its order (:func:`strength`)."""

    mean: Optional[float]
    std: Optional[float]  # sample std; None below two differences
    n: int
    favour: int  # differences in the claim's favour (:func:`_favours`)
    against: int  # differences below 0: in favour of the reverse order
    p_sign: float  # one-sided p of the exact sign test for the claim's order
    p_t: Optional[float]  # one-sided p of the paired t-test for the claim's order; None: one difference or no spread
    p_sign_reverse: float  # the same two for the reverse order
    p_t_reverse: Optional[float]


def _sign_p(count: int, n: int) -> float:
    """P(at least ``count`` of ``n`` fair coins in favour): the exact one-sided sign test."""
    from scipy.stats import binomtest  # scipy.stats takes most of a second to import: only when judging

    return float(binomtest(count, n, 0.5, alternative="greater").pvalue) if n else 1.0


def strength(differences: list[float], strict: bool = True) -> Strength:
    """Mean, std, n of the paired differences and two one-sided p-values for each order. The exact sign test: the
    chance that at least as many of the n seeds favour the order if each were a fair coin (a tie is kept in n: in
    favour of a ``strict: false`` claim, whose order includes it, and against a strict claim and the reverse order,
    which it does not meet; the usual sign test drops ties, which would let a strict claim win on the seeds it does
    not tie). The paired t-test: the mean over its standard error against Student's t with n - 1 degrees of freedom
    (none with one difference or differences without spread)."""
    mean, std, n = mean_std(differences)
    favour = sum(_favours(d, strict) for d in differences)
    against = sum(d < -TIE for d in differences)
    p_t = p_t_reverse = None
    if std is not None and std > TIE:
        from scipy.stats import t as student_t

        statistic = mean / (std / np.sqrt(n))
        p_t, p_t_reverse = float(student_t.sf(statistic, n - 1)), float(student_t.cdf(statistic, n - 1))
    return Strength(mean, std, n, favour, against, _sign_p(favour, n), p_t, _sign_p(against, n), p_t_reverse)


def _reaches(p_sign: float, p_t: Optional[float]) -> bool:
    return p_sign <= ALPHA or (p_t is not None and p_t <= ALPHA)


def judge(differences: list[float], strict: bool = True) -> str:
    """The verdict on one pair's paired differences (in the claim's favour when positive), from :func:`strength`:
    **holds** when the sign test or the paired t-test gives the claim's order a one-sided p of at most 0.05
    (:data:`ALPHA`); **does not hold** when one of them does so for the reverse order; otherwise, or when both
    orders reach it (the two tests disagree), **within the spread**. Every seed in favour is the sign test's
    p = 2^-n: 0.031 from 5 seeds on, 0.125 at 3, so "every seed in favour from 5 seeds" is inside this rule and
    fewer seeds need the t-test's strength. One difference can reach neither (sign p 0.5, no t). No difference:
    not measurable."""
    if not differences:
        return UNMEASURABLE
    s = strength(differences, strict)
    holds, reversed_ = _reaches(s.p_sign, s.p_t), _reaches(s.p_sign_reverse, s.p_t_reverse)
    if holds != reversed_:
        return HOLDS if holds else REVERSED
    return SPREAD


def _seeds(seeds: list) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(str(s) for s in seeds)}"


def _p(p_sign: float, p_t: Optional[float]) -> str:
    return f"sign {p_sign:.3g}, t {'n/a' if p_t is None else f'{p_t:.3g}'}"


def pair_text(differences: dict, unpaired: dict, strict: bool = True) -> str:
    """``+0.012 ± 0.004 (n = 3, 3/3 in favour; one-sided p: sign 0.125, t 0.0328)``: mean ± sample std, count,
    how many favour the claim and :func:`strength`'s p-values for the claim's order; those of the reverse order
    after them when the mean is below 0 (``; reverse: sign 0.0312, t 0.002``); one pair has no std and no t;
    seeds left out named after them (``; seeds 3, 4 unpaired: no fada-III on mnistm``)."""
    d = list(differences.values())
    if d:
        s = strength(d, strict)
        spread = "" if s.std is None else f" ± {s.std:.3f}"
        text = f"{s.mean:+.3f}{spread} (n = {s.n}, {s.favour}/{s.n} in favour; one-sided p: {_p(s.p_sign, s.p_t)}"
        if s.mean < -TIE:
            text += f"; reverse: {_p(s.p_sign_reverse, s.p_t_reverse)}"
    else:
        text = "(no seed with both rows"
    by_lack: dict[tuple, list] = {}
    for seed, lacking in unpaired.items():
        by_lack.setdefault(tuple(lacking), []).append(seed)
    for lacking, seeds in by_lack.items():
        text += f"; {_seeds(seeds)} unpaired: no {', '.join(lacking)}"
    return text + ")"


def _verdict(lines: list[dict], claim: Claim, bench: str, targets: list[str]) -> tuple[str, str]:
    values = [
        [(_name(row, metric), claim_value(lines, bench, targets, row, metric)) for row, metric in group]
        for group in claim.order
    ]
    where = f"{bench}, {'target ' + targets[0] if len(targets) == 1 else 'mean over ' + ', '.join(targets)}"
    figures = f"{where}: " + " vs ".join(
        ", ".join(f"{name} {'n/a' if v is None else f'{v:.3f}'}" for name, v in group) for group in values
    )
    missing = _unfinished(lines, [row for group in claim.order for row, _ in group], bench, targets)
    if missing:
        return UNMEASURABLE, f"{figures}; {missing}"
    if any(v is None for group in values for _, v in group):
        return UNMEASURABLE, figures
    verdicts, texts = [], []
    for upper_group, lower_group in zip(claim.order, claim.order[1:]):
        for upper in upper_group:
            for lower in lower_group:
                differences, unpaired = paired_differences(lines, bench, targets, upper, lower)
                verdicts.append(judge(list(differences.values()), claim.strict))
                texts.append(f"{_name(*upper)} over {_name(*lower)} {pair_text(differences, unpaired, claim.strict)}")
    figures += "; paired by seed: " + ", ".join(texts)
    if UNMEASURABLE in verdicts:
        return UNMEASURABLE, figures
    if REVERSED in verdicts:
        return REVERSED, figures
    return (HOLDS if all(v == HOLDS for v in verdicts) else SPREAD), figures


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
    """One (verdict, figures) per benchmark (and per target with ``per_target``). A claim orders groups of rows;
    every row of a group and every row of the next group make a pair, judged on its paired differences by seed
    (:func:`paired_differences`, :func:`judge`). The verdict: **holds** when every pair holds, **does not hold**
    when some pair's seeds separate the reverse order, **within the spread** otherwise; **not measurable** when a
    trial it needs failed or did not finish (named with its error), a row has no value on a target it needs, no seed
    has both rows of a pair, or the benchmark is not in the grid. The figures: each row's mean over seeds (then over
    the targets), then each pair's paired differences (:func:`pair_text`: mean ± sample std over the seeds, n, how
    many favour the claim, the one-sided p-values of :func:`strength`, the seeds left out for want of a pair)."""
    results = []
    for bench in [claim.benchmark] if claim.benchmark else list(spec.benchmarks):
        if bench not in spec.benchmarks:
            results.append((UNMEASURABLE, f"{bench}: not in this grid"))
            continue
        targets = [claim.target] if claim.target else spec.benchmarks[bench]["targets"]
        for group in [[t] for t in targets] if claim.per_target else [targets]:
            results.append(_verdict(lines, claim, bench, group))
    return results


CLAIMS_RULE = (
    "Beside the figures, each pair of a row and a row it is claimed above: the paired differences, at each seed the "
    "upper row minus the lower on the same target and seed (averaged over the targets named), as mean ± sample std, "
    "their number n, how many favour the claim (above 0; for an 'at or above' claim, strict: false, a tie too) and "
    "two one-sided p-values for the claim's order: the exact sign test (the chance of at least that many in favour "
    "if each seed were a fair coin; a tie stays in n, against a strict claim's order and the reverse order, for an "
    "'at or above' claim) and the paired t-test (n - 1 degrees of freedom; n/a with one seed or no spread); those "
    "of the reverse order follow where the mean is below 0. A pair's order is separated when either p is at most "
    "0.05: every seed in favour reaches that by the sign test from 5 seeds on (p = 0.031), not at 3 (0.125) or 4 "
    "(0.062), where the t-test must. A claim **holds** when every pair's order is separated; it **does not hold** "
    "when some pair's reverse order is; otherwise (the two tests separating opposite orders included) it is "
    "**within the spread**. A seed without both rows is left out and named."
)


def claims_text(spec: PaperSpec, lines: list[dict]) -> str:
    out = [
        f"# The claims of {spec.paper}, as measured here",
        "",
        f"Each figure is the mean over seeds ({spec.seeds_text()}), then over the targets named. {CLAIMS_RULE}",
        "",
    ]
    for claim in spec.claims:
        for verdict, figures in check_claim(spec, lines, claim):
            out.append(f"- {claim.text}: **{verdict}** ({figures})")
    if not spec.claims:
        out.append("(this spec states no claims)")
    return "\n".join(out) + "\n"


def selection_records(spec: PaperSpec, records: list[dict]) -> list[dict]:
    """The trial records in the shape :func:`fedsim.experiments.selection.select` reads: params ``run`` and
    ``seed``, the spec's benchmark and target, the run's target accuracy and its sources' mean accuracy (the table's
    ``target`` and ``source``), the summary (its ``score_<name>`` numbers)."""
    where = spec.trials()
    out = []
    for record in records:
        run, bench, target, seed = trial_of(where, record)
        if run is not None:
            out.append(
                {
                    "trial_id": record.get("trial_id"),
                    "status": record.get("status"),
                    "params": {"run": run, "seed": seed},
                    "benchmark": bench,
                    "target": target,
                    "target_accuracy": metric_value(record, DEFAULT_METRICS["target"]),
                    "mean_source_accuracy": metric_value(record, DEFAULT_METRICS["source"]),
                    "summary": record.get("summary") or {},
                }
            )
    return out


def selection_records_of_lines(spec: PaperSpec, lines: list[dict]) -> list[dict]:
    """:func:`selection_records` from results.csv's lines (:func:`read_results_csv`): one per trial, its target and
    sources' accuracy from a row that reads the run's default metrics (the ones :func:`selection_records` takes),
    its scores from the :func:`score_columns`."""
    rows = {row.name: row for row in spec.rows}
    plain = {name for name, row in rows.items() if all(row.metrics.get(k) == v for k, v in DEFAULT_METRICS.items())}
    out: dict[str, dict] = {}
    for line in lines:
        if line["row"] not in plain or line["trial_id"] in out:
            continue
        out[line["trial_id"]] = {
            "trial_id": line["trial_id"],
            "status": line["status"],
            "params": {"run": line["run"], "seed": line["seed"]},
            "benchmark": line["benchmark"],
            "target": line["target_domain"],
            "target_accuracy": line.get("target"),
            "mean_source_accuracy": line.get("source"),
            "summary": {name: line[name] for name in score_columns(spec) if line.get(name) is not None},
        }
    return list(out.values())


def selection_rows(spec: PaperSpec, records: list[dict]) -> list[SelectionRow]:
    """The spec's ``select:`` on the trial records: per group, benchmark and target the default, each score's pick
    among the group's runs and the oracle; then, per group and benchmark with several targets, their mean over the
    targets. No ``select:``: no rows."""
    return choose_runs(spec, selection_records(spec, records))


def choose_runs(spec: PaperSpec, trials: list[dict]) -> list[SelectionRow]:
    """:func:`selection_rows` on trials already in :func:`selection_records`' shape."""
    if spec.select is None:
        return []
    if any(t["status"] == "finished" for t in trials):
        check_scores(trials, spec.select.scores)  # one line before any group is chosen
    rows = []
    for group in spec.select.groups.values():
        order = {run: i for i, run in enumerate(group.runs)}  # a tie goes to the run the group lists first
        members = sorted(
            ({**t, "params": {"group": group.name, **t["params"]}} for t in trials if t["params"]["run"] in order),
            key=lambda t: order[t["params"]["run"]],
        )
        default = default_run(spec, group)  # the run a plain run of the method matches, per benchmark and target
        per_target = select(members, spec.select.scores, ["group", "benchmark", "target"], ["run"], default)
        for bench, settings in spec.benchmarks.items():
            on_bench = [r for r in per_target if dict(r.group)["benchmark"] == bench]
            rank = {t: i for i, t in enumerate(settings["targets"])}
            on_bench.sort(key=lambda r: rank.get(dict(r.group)["target"], len(rank)))
            rows += on_bench + mean_over(on_bench, "target")
    return rows


def write_selection_report(spec: PaperSpec, records: list[dict], out: Path) -> list[Path]:
    """``selection.md``, ``selection.csv`` and ``selection.png`` of the spec's ``select:`` (nothing without one)."""
    return _write_selection(spec, selection_records(spec, records), out)


def write_selection_of_lines(spec: PaperSpec, lines: list[dict], out: Path) -> list[Path]:
    """:func:`write_selection_report` from results.csv's lines (``--tables-only``): the same files."""
    return _write_selection(spec, selection_records_of_lines(spec, lines), out)


def _write_selection(spec: PaperSpec, trials: list[dict], out: Path) -> list[Path]:
    if spec.select is None:
        return []
    rows = choose_runs(spec, trials)
    return write_selection(out, rows, spec.select.scores, f"{spec.paper}: selection without target labels")
