"""Hyperparameter selection without target labels: trial records -> one :class:`SelectionRow` per group
(:func:`select`), and its report, ``selection.md``, ``selection.csv`` and ``selection.png`` (:func:`write_selection`).

In unsupervised domain adaptation the target has no labels, so a setting (a learning rate, a loss weight, a run of
a paper's protocol) must be chosen by a score computed without them. Each run reports its scores in its summary as
``score_<name>``, oriented so that higher is better. In each group (e.g. a method on a target) the candidates are the
grid's settings; each score picks the candidate with the best mean score over seeds. The default (the setting a plain
run of the method on the benchmark uses: its defaults overlaid by its recipe, :func:`plain_config`) and the oracle
(the best mean target accuracy: it reads target labels, an upper bound of any label-free selection) frame the picks;
a score's gap is the oracle's target accuracy minus its pick's. This is the protocol of DomainBed (Gulrajani &
Lopez-Paz, ICLR 2021, Sec. 3) and SKADA-Bench (Lalou et al., 2024).
"""

from __future__ import annotations

import csv
import logging
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from fedsim.errors import UserError
from fedsim.experiments.grouping import format_mean_std, mean_std
from fedsim.experiments.selection_rows import DEFAULT, ORACLE, Candidate, Choice, SelectionRow, setting_label

log = logging.getLogger(__name__)

SCORE_PREFIX = "score_"
SEED_KEY = "seed"
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
FILES = ("selection.md", "selection.csv", "selection.png")
Default = Union[Mapping[str, Any], Callable[[dict], Optional[Mapping[str, Any]]], None]
"""A selection's default: one setting for every group, or a function of the group's values (None: no default)."""


def plain_config(method: str, data: Mapping[str, Any]):
    """The ExperimentConfig of a plain run of ``method`` on the ``data`` section (data key -> value, e.g. a config's
    ``to_dict()["data"]``): the method's defaults overlaid by its recipe (:mod:`fedsim.recipes`), as ``fedsim run
    --method M --benchmark B --target T`` builds it. The default every selection report compares against."""
    from fedsim.config import load_config

    return load_config(None, base={"data": dict(data)}, values={"method.name": method})


def flat_config(config) -> dict[str, Any]:
    """An ExperimentConfig as ``{"section.key": value}`` (a method's and a benchmark's own keys in their section)."""
    return {f"{section}.{key}": value for section, keys in config.to_dict().items() for key, value in keys.items()}


def group_text(group: Sequence[tuple[str, Any]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in group) or "all trials"


def _value(record: dict, key: str) -> Any:
    """A grid value of a record: its params' first, then the record's own (``benchmark``, ``target``)."""
    params = record.get("params", {})
    return params[key] if key in params else record.get(key)


def _number(record: dict, key: str) -> Optional[float]:
    """A number of a record: its own field, else its summary's (None when absent or not finite)."""
    value = record.get(key)
    if value is None:
        value = (record.get("summary") or {}).get(key)
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _finished(record: dict) -> bool:
    return record.get("status", "finished") == "finished"


def scores_present(records: list[dict]) -> list[str]:
    """The scores (names without ``score_``) some record's summary carries, sorted."""
    return sorted(
        {k[len(SCORE_PREFIX) :] for r in records for k in (r.get("summary") or {}) if k.startswith(SCORE_PREFIX)}
    )


def check_scores(records: list[dict], scores: Sequence[str]) -> None:
    """One line naming a score that no record carries, with the scores present and where a run asks for scores."""
    if not scores:
        raise UserError("give at least one score to select by, e.g. entropy or source_accuracy")
    present = scores_present(records)
    for name in scores:
        if not isinstance(name, str) or not NAME.match(name):
            raise UserError(f"score name {name!r} must be lower-case letters, digits and _ (e.g. entropy, snd)")
        if name not in present:
            hint = (
                f" (name it {name[len(SCORE_PREFIX) :]!r}, without the score_ prefix)"
                if name.startswith("score_")
                else ""
            )
            raise UserError(
                f"no run reports the score {name!r}{hint}: the runs report {', '.join(present) or 'no score'}; "
                "a run computes the scores named in its config's run.scores (source_accuracy, source_loss, iwv and "
                "dev need data.validation_fraction above 0)"
            )


def _check_grid(records: list[dict], group_by: Sequence[str], candidate_keys: Sequence[str]) -> None:
    keys = [*group_by, *candidate_keys]
    for key in keys:
        if any(_value(r, key) is None for r in records):
            known = sorted({k for r in records for k in r.get("params", {})} | {"benchmark", "target"})
            raise UserError(f"the trials have no value for {key!r}: group and compare by {', '.join(known)}")
    if set(group_by) & set(candidate_keys) or SEED_KEY in keys:
        raise UserError(f"group_by {list(group_by)} and candidate_keys {list(candidate_keys)} overlap or name the seed")
    # a grid value that is neither a group, a candidate nor the seed must not differ inside a candidate: its mean
    # over seeds would mix settings
    values: dict[tuple, dict[str, set]] = {}
    seen: dict[tuple, str] = {}
    for r in records:
        cell = tuple(repr(_value(r, k)) for k in keys)
        for key, value in r.get("params", {}).items():
            if key not in keys and key != SEED_KEY:
                values.setdefault(cell, {}).setdefault(key, set()).add(repr(value))
        if _finished(r):
            trial = (*cell, repr(_value(r, SEED_KEY)))
            if trial in seen:
                raise UserError(
                    f"trials {seen[trial]} and {r.get('trial_id')} are the same setting and seed: "
                    "give each grid point once"
                )
            seen[trial] = str(r.get("trial_id"))
    for by_key in values.values():
        for key, found in by_key.items():
            if len(found) > 1:
                raise UserError(
                    f"the trials of one candidate differ in {key!r} ({', '.join(sorted(found))}): "
                    "add it to the group or candidate keys"
                )


def _candidate(params: tuple, members: list[dict], seeds: tuple, scores: Sequence[str], accuracy_key: str) -> Candidate:
    done = sorted((r for r in members if _finished(r)), key=lambda r: _seed_order(_value(r, SEED_KEY)))
    own = tuple(_value(r, SEED_KEY) for r in done)

    def mean_of(key: str) -> Optional[float]:
        values = [_number(r, key) for r in done]
        return None if not values or None in values else float(sum(values) / len(values))

    accuracy = mean_of(accuracy_key)
    return Candidate(
        params=params,
        seeds=own,
        missing_seeds=tuple(s for s in seeds if s not in own),
        accuracy=accuracy,
        accuracy_std=mean_std([_number(r, accuracy_key) for r in done])[1] if accuracy is not None else None,
        source_accuracy=mean_of("mean_source_accuracy"),
        scores={name: mean_of(SCORE_PREFIX + name) for name in scores},
    )


def _seed_order(seed: Any) -> tuple:
    return (seed is None, str(type(seed)), seed if seed is not None else 0)


def _choice(rule: str, c: Candidate, oracle: Optional[Candidate], score: Optional[float] = None) -> Choice:
    gap = None
    if oracle is not None and c.complete and c.accuracy is not None:
        gap = oracle.accuracy - c.accuracy
    note = "" if c.complete else f"not compared: no finished trial at seed {_seeds_text(c.missing_seeds)}"
    return Choice(
        rule, c.label, dict(c.params), c.accuracy, c.accuracy_std, c.source_accuracy, score, gap, len(c.seeds), note
    )


def _seeds_text(seeds: Sequence) -> str:
    return ", ".join(str(s) for s in seeds)


def _best(candidates: list[Candidate], value) -> Optional[Candidate]:
    """The candidate with the highest value; a tie goes to the one first in grid order (strictly greater wins)."""
    best = None
    for c in candidates:
        v = value(c)
        if v is not None and (best is None or v > value(best)):
            best = c
    return best


def select(
    records: list[dict],
    scores: Sequence[str],
    group_by: Sequence[str],
    candidate_keys: Sequence[str],
    default: Default = None,
    accuracy_key: str = "target_accuracy",
) -> list[SelectionRow]:
    """One :class:`SelectionRow` per group (the distinct values of ``group_by``, in first-seen order).

    A group's candidates are the distinct values of ``candidate_keys``, in the records' (the grid's) order. Each
    candidate's scores and target accuracy are means over the seeds of its finished trials. A candidate lacking a
    seed that another candidate of the group finished is flagged and left out of every comparison. Per score, the
    pick is the compared candidate with the highest mean score; a tie goes to the candidate first in grid order,
    never to the more accurate one. The oracle is the compared candidate with the highest mean target accuracy
    (it reads target labels: it serves the gap only). The default is the candidate whose values match ``default``
    (a mapping, or a function of the group's values returning one; None when the grid does not hold it). A record's
    values are read from its ``params``, else from the record (``benchmark``, ``target``); its numbers from the
    record, else from its ``summary`` (``score_<name>``).
    """
    scores = list(scores)
    if any(_finished(r) for r in records):  # a grid where nothing finished has no score to check, only n/a
        check_scores(records, scores)
    _check_grid(records, group_by, candidate_keys)
    stray = sorted(set({} if callable(default) else default or {}) - set(candidate_keys))
    if stray:
        raise UserError(
            f"the default names {', '.join(stray)}, which are not candidate keys ({', '.join(candidate_keys)})"
        )
    grouped: dict[tuple, dict[tuple, list[dict]]] = {}
    for r in records:
        group = tuple((k, _value(r, k)) for k in group_by)
        params = tuple((k, _value(r, k)) for k in candidate_keys)
        grouped.setdefault(group, {}).setdefault(params, []).append(r)
    return [_select_group(g, by_setting, scores, default, accuracy_key) for g, by_setting in grouped.items()]


def _select_group(
    group: tuple, by_setting: dict[tuple, list[dict]], scores: list[str], default, accuracy_key: str
) -> SelectionRow:
    """One group of :func:`select`: its candidates, the complete ones compared, the default, picks and oracle."""
    seeds = tuple(
        sorted(
            {_value(r, SEED_KEY) for members in by_setting.values() for r in members if _finished(r)}, key=_seed_order
        )
    )
    candidates = [_candidate(p, m, seeds, scores, accuracy_key) for p, m in by_setting.items()]
    compared = [c for c in candidates if c.complete]
    notes = [
        f"{c.label}: not compared, no finished trial at seed {_seeds_text(c.missing_seeds)}"
        for c in candidates
        if not c.complete
    ]
    oracle = _best([c for c in compared if c.accuracy is not None], lambda c: c.accuracy)
    picks: dict[str, Optional[Choice]] = {}
    for name in scores:
        pick = _best(compared, lambda c, name=name: c.scores[name])
        picks[name] = pick and _choice(name, pick, oracle, pick.scores[name])
        if pick is None:
            notes.append(f"{name}: no compared candidate reports it at every seed")
    chosen = None
    if callable(default):
        default = default(dict(group))
    if default is not None:
        chosen = next((c for c in candidates if all(dict(c.params).get(k) == v for k, v in default.items())), None)
        if chosen is None:
            notes.append(f"the default ({setting_label(tuple(default.items()))}) is not in the grid")
    return SelectionRow(
        group=group,
        scores=scores,
        default=chosen and _choice(DEFAULT, chosen, oracle),
        picks=picks,
        oracle=oracle and _choice(ORACLE, oracle, oracle),
        candidates=candidates,
        seeds=seeds,
        notes=notes,
    )


def _mean_choice(rule: str, choices: list[Optional[Choice]], places: list[str]) -> Optional[Choice]:
    """A rule's choices on several targets as one: the mean of their accuracies and gaps, and what was chosen
    where (``fedavg ×2, fedavg-lr0.1 ×1``); None when no target has a choice."""
    if all(c is None for c in choices):
        return None
    counts = Counter(c.label for c in choices if c is not None)
    label = ", ".join(f"{name} ×{n}" for name, n in counts.most_common())
    lacking = [p for p, c in zip(places, choices) if c is None]

    def mean(attr: str) -> Optional[float]:
        values = [getattr(c, attr) if c else None for c in choices]
        return None if None in values else float(sum(values) / len(values))

    note = f"none on {', '.join(lacking)}" if lacking else ""
    return Choice(rule, label, None, mean("accuracy"), None, mean("source_accuracy"), None, mean("gap"), 0, note)


def mean_over(rows: list[SelectionRow], key: str = "target") -> list[SelectionRow]:
    """Per group without ``key`` (e.g. per method and benchmark), the mean over ``key``'s values (the targets) of
    each rule's target accuracy and gap, each target with its own pick (DomainBed's per-domain selection, then the
    average). A rule without a choice on some target has no mean. Groups with one value of ``key`` are left out."""
    buckets: dict[tuple, list[SelectionRow]] = {}
    for row in rows:
        rest = tuple((k, v) for k, v in row.group if k != key)
        buckets.setdefault(rest, []).append(row)
    out = []
    for rest, members in buckets.items():
        if len(members) < 2:
            continue
        places = [str(dict(m.group).get(key)) for m in members]
        scores = members[0].scores
        group = tuple((k, v) for k, v in members[0].group if k != key) + ((key, "mean of " + ", ".join(places)),)
        out.append(
            SelectionRow(
                group=group,
                scores=scores,
                default=_mean_choice(DEFAULT, [m.default for m in members], places),
                picks={s: _mean_choice(s, [m.picks.get(s) for m in members], places) for s in scores},
                oracle=_mean_choice(ORACLE, [m.oracle for m in members], places),
                seeds=tuple(sorted({s for m in members for s in m.seeds}, key=_seed_order)),
            )
        )
    return out


# ----------------------------------------------------------------------------- report

HEADER = (
    "Hyperparameters chosen without target labels. In each group, each score picks the setting with the highest "
    "mean score over seeds (every score is oriented so that higher is better; a tie goes to the setting listed "
    "first in the grid). The **default** is the setting run untuned. The **oracle** is the setting with the highest "
    "mean target accuracy: it reads the target's labels, which no selection may, so it is an upper bound of any "
    "label-free selection, shown for the gap only (the protocol of DomainBed, Gulrajani & Lopez-Paz, ICLR 2021, and "
    "SKADA-Bench, Lalou et al., 2024). **Gap** = the oracle's target accuracy minus the choice's. Target accuracy is "
    "the mean ± sample standard deviation over seeds; a setting that lacks a seed another setting of its group "
    "finished is not compared. A mean over targets averages each target's own choice."
)
CSV_FIELDS = (
    "rule",
    "setting",
    "target_accuracy",
    "target_accuracy_std",
    "mean_source_accuracy",
    "score",
    "gap",
    "seeds",
    "note",
)


def _cell(value: Optional[float], digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _rule_name(rule: str) -> str:
    return {DEFAULT: "default", ORACLE: "oracle (target labels)"}.get(rule, f"{rule} (score)")


def markdown(rows: list[SelectionRow], scores: Sequence[str], title: str = "Selection without target labels") -> str:
    """``selection.md``: a summary line per group (target accuracy of the default, each score's pick and the
    oracle, the gaps in brackets), then each group's choices with their settings."""
    scores = list(scores)
    out = [f"# {title}", "", HEADER, ""]
    if not rows:
        return "\n".join(out + ["(no trials to select among)", ""])
    heads = ["group", "default", *scores, "oracle"]
    out += ["| " + " | ".join(heads) + " |", "|---|" + "---:|" * (len(heads) - 1)]
    for row in rows:
        cells = []
        for rule, choice in row.choices():
            if choice is None or choice.accuracy is None:
                cells.append("n/a")
            elif rule == ORACLE:
                cells.append(_cell(choice.accuracy))
            else:
                cells.append(f"{_cell(choice.accuracy)} (gap {_cell(choice.gap)})")
        out.append(f"| {group_text(row.group)} | " + " | ".join(cells) + " |")
    out.append("")
    for row in rows:
        seeds = f"seeds {_seeds_text(row.seeds)}" if row.seeds else "no finished trial"
        if row.candidates:
            what = f"Candidates in grid order: {', '.join(c.label for c in row.candidates)}; {seeds}."
        else:
            what = f"Each target's own choices, averaged over the targets; {seeds}."
        out += [f"## {group_text(row.group)}", "", what, ""]
        out += [
            "| rule | setting | target accuracy | mean source accuracy | score | gap |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for rule, choice in row.choices():
            if choice is None:
                what = "not in the grid" if rule == DEFAULT else "no candidate to compare"
                out.append(f"| {_rule_name(rule)} | {what} | n/a | n/a | n/a | n/a |")
                continue
            setting = choice.label + (f" ({choice.note})" if choice.note else "")
            out.append(
                f"| {_rule_name(rule)} | {setting} | {format_mean_std(choice.accuracy, choice.accuracy_std, 3)} | "
                f"{_cell(choice.source_accuracy)} | {_cell(choice.score, 4)} | {_cell(choice.gap)} |"
            )
        out += [""] + [f"- {note}" for note in row.notes] + ([""] if row.notes else [])
        if row.candidates:
            out += _candidates_table(row)
    return "\n".join(out)


def _candidates_table(row: SelectionRow) -> list[str]:
    """Every candidate of a group with its mean scores: why each score picked what it picked."""
    heads = ["candidate", "seeds", "target accuracy", "mean source accuracy", *row.scores]
    out = ["| " + " | ".join(heads) + " |", "|---|---|" + "---:|" * (len(heads) - 2)]
    for c in row.candidates:
        seeds = _seeds_text(c.seeds) + (f" (lacks {_seeds_text(c.missing_seeds)})" if c.missing_seeds else "")
        cells = [c.label, seeds or "none", format_mean_std(c.accuracy, c.accuracy_std, 3), _cell(c.source_accuracy)]
        out.append("| " + " | ".join(cells + [_cell(c.scores[s], 4) for s in row.scores]) + " |")
    return out + [""]


def write_csv(path: Path, rows: list[SelectionRow]) -> Path:
    """``selection.csv``: one line per group and rule (group keys first; empty cell = no value)."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k, _ in row.group if k not in keys]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*keys, *CSV_FIELDS])
        writer.writeheader()
        for row in rows:
            for rule, c in row.choices():
                line = {**dict(row.group), "rule": rule}
                if c is None:
                    line["note"] = "not in the grid" if rule == DEFAULT else "no candidate to compare"
                else:
                    line.update(
                        setting=c.label,
                        target_accuracy=c.accuracy,
                        target_accuracy_std=c.accuracy_std,
                        mean_source_accuracy=c.source_accuracy,
                        score=c.score,
                        gap=c.gap,
                        seeds=c.seeds or None,
                        note=c.note,
                    )
                writer.writerow(line)
    return path


def write_selection(
    out: Path, rows: list[SelectionRow], scores: Sequence[str], title: Optional[str] = None
) -> list[Path]:
    """``selection.md``, ``selection.csv`` and ``selection.png`` in ``out``; returns the paths written."""
    from fedsim.experiments.selection_plots import plot_selection

    out = Path(out)
    md = out / "selection.md"
    md.write_text(markdown(rows, scores, title or "Selection without target labels"))
    written = [md, write_csv(out / "selection.csv", rows), plot_selection(rows, scores, out / "selection.png")]
    log.info("selection report: %s", ", ".join(p.name for p in written))
    return written
