"""A paper's protocol as data: the spec files of `fedsim reproduce` (``experiments/specs/<paper>.yaml``).

A spec names the runs (a shipped config + overrides), the benchmarks and target domains they run on,
the seeds (the spec's, or a benchmark's or a run's own: a run's win over its benchmark's), the rows of the
table (a run and the metrics read from its summary: several rows may read one run, e.g. FedDaDiL's R and E
predictors), the paper's claims as orderings of rows on a metric,
per-round series to plot, the label-free selection among runs (``select``: the scores that choose among each
group's runs, :mod:`fedsim.experiments.selection`), and a ``quick`` section that shrinks the grid to a smoke test
(its ``benchmarks`` appends settings to one benchmark's ``set`` / ``run_set``, e.g. fewer encoder rounds on images
only).
Every trial is one run x benchmark x target x seed; :func:`to_sweep` turns the grid into the
:class:`fedsim.experiments.sweep_grid.SweepSpec` that `fedsim sweep`'s machinery runs as Ray Tune trials.
The format is documented in ``docs/reproducing.md``; its keys are checked by
:mod:`fedsim.experiments.reproduce_format`.
"""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from fedsim.errors import UserError
from fedsim.experiments.reproduce_format import (
    DEFAULT_METRICS,
    Claim,
    Row,
    SelectGroup,
    Selection,
    check_keys,
    seed_list,
    strings,
)
from fedsim.experiments.selection import NAME, SCORE_PREFIX
from fedsim.experiments.sweep_grid import VARIANT_KEY, SweepSpec

SPECS_DIR = Path(__file__).parent / "specs"
CONFIGS_DIR = Path(__file__).parent / "configs"


def available() -> list[str]:
    return sorted(p.stem for p in SPECS_DIR.glob("*.yaml"))


@dataclass
class PaperSpec:
    name: str
    raw: dict  # the spec as read (after --quick and --seeds): what reproduce.json keeps for --resume
    origin: Path  # folder that relative config paths start from

    def __post_init__(self):
        raw = check_keys("spec", self.raw, f"spec {self.name}")
        for key, kind in (("benchmarks", dict), ("runs", dict), ("rows", list), ("claims", list), ("series", list)):
            if not isinstance(raw.get(key, kind()), kind):
                raise UserError(
                    f"spec {self.name}: {key} must be a {'mapping' if kind is dict else 'list'}, got {raw[key]!r}"
                )
        self.paper = str(raw["paper"])
        self.seeds = seed_list(raw.get("seeds", [0]), f"spec {self.name}: seeds")
        self.settings = strings(raw.get("set", []), f"spec {self.name}: set")
        self.last_settings = strings(raw.get("set_last", []), f"spec {self.name}: set_last")  # after the runs' own
        self.benchmarks = {
            name: check_keys("benchmark", dict(b or {}), f"benchmark {name}") for name, b in raw["benchmarks"].items()
        }
        for name, bench in self.benchmarks.items():
            strings(bench.setdefault("targets", []), f"benchmark {name}: targets")
            if not bench["targets"]:
                raise UserError(f"benchmark {name} lists no targets: give targets: [domain, ...]")
            if "seeds" in bench:
                seed_list(bench["seeds"], f"benchmark {name}: seeds")
        self.runs = {name: check_keys("run", run, f"run {name}") for name, run in raw["runs"].items()}
        for name, run in self.runs.items():
            if "seeds" in run:
                seed_list(run["seeds"], f"run {name}: seeds")
        metrics = {**DEFAULT_METRICS, **(raw.get("metrics") or {})}
        self.rows = [self._row(r, metrics) for r in raw["rows"]]
        self.columns = strings(raw.get("columns", list(DEFAULT_METRICS)), f"spec {self.name}: columns")
        self.claims = [self._claim(c) for c in raw.get("claims", [])]
        self.series = [
            check_keys("series", s, f"series {s.get('metric') if isinstance(s, dict) else s}")
            for s in raw.get("series", [])
        ]
        for s in self.series:
            self._known("run", s["runs"], self.runs, f"series {s['metric']}")
        self.select = self._select(raw["select"]) if "select" in raw else None

    def _known(self, kind: str, names: list[str], valid: dict, where: str) -> None:
        for name in names:
            if name not in valid:
                close = difflib.get_close_matches(str(name), list(valid), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"the spec's {kind}s: {', '.join(valid)}"
                raise UserError(f"{where} names an unknown {kind} {name!r}: {hint}")

    def _row(self, raw: dict, metrics: dict) -> Row:
        raw = check_keys("row", raw, f"row {raw.get('name') if isinstance(raw, dict) else raw}")
        run = raw.get("run", raw["name"])
        self._known("run", [run], self.runs, f"row {raw['name']}")
        values = {"row": raw["name"], "run": run, **{k: str(v) for k, v in (raw.get("vars") or {}).items()}}
        merged = {**metrics, **(raw.get("metrics") or {})}
        try:
            resolved = {name: str(ref).format(**values) for name, ref in merged.items()}
        except KeyError as exc:
            raise UserError(
                f"row {raw['name']}: a metric template uses {{{exc.args[0]}}}: give it under vars:"
            ) from None
        return Row(raw["name"], str(raw.get("label", raw["name"])), run, resolved)

    def _claim(self, raw: dict) -> Claim:
        raw = check_keys("claim", raw, f"claim {raw.get('claim') if isinstance(raw, dict) else raw!r}")
        metric = raw.get("metric", "target")
        rows = {r.name: r for r in self.rows}
        order = []
        for group in raw["order"]:
            items = []
            for item in group if isinstance(group, list) else [group]:
                name, _, own = str(item).partition(":")
                self._known("row", [name], rows, f"claim {raw['claim']!r}")
                if (own or metric) not in rows[name].metrics:
                    raise UserError(
                        f"claim {raw['claim']!r}: row {name} has no metric {own or metric!r} "
                        f"(it has {', '.join(rows[name].metrics)})"
                    )
                items.append((name, own or metric))
            order.append(items)
        if len(order) < 2:
            raise UserError(f"claim {raw['claim']!r}: order needs two or more rows to compare")
        return Claim(
            str(raw["claim"]),
            order,
            bool(raw.get("strict", True)),
            raw.get("benchmark"),
            raw.get("target"),
            bool(raw.get("per_target", False)),
        )

    def _select(self, raw: Any) -> Selection:
        """``select:``: scores (names of :data:`fedsim.selection.SCORES`, without ``score_``) and groups of two or
        more runs that run the same seeds; a group's default is found, not given (:func:`default_run`)."""
        from fedsim.selection import SCORES

        where = f"spec {self.name}: select"
        raw = check_keys("select", raw, where)
        scores = strings(raw["scores"], f"{where}.scores")
        if not scores:
            raise UserError(f"{where}.scores lists no score: give e.g. [source_accuracy, entropy, snd]")
        for name in scores:
            if name.startswith(SCORE_PREFIX):
                raise UserError(
                    f"{where}.scores names {name!r}: give it without the prefix, {name[len(SCORE_PREFIX) :]!r}"
                )
            if not NAME.match(name):
                raise UserError(
                    f"{where}.scores names {name!r}: a score's name is lower-case letters, digits and _, e.g. snd"
                )
            self._known("score", [name], SCORES, f"{where}.scores")
        if len(set(scores)) != len(scores):
            raise UserError(f"{where}.scores lists a score twice: {scores!r}")
        if not isinstance(raw["groups"], dict) or not raw["groups"]:
            raise UserError(f"{where}.groups must map a group's name to its runs, e.g. fedavg: {{runs: [a, b]}}")
        groups = {}
        for name, group in raw["groups"].items():
            at = f"{where}.groups.{name}"
            group = check_keys("select group", group, at)
            runs = strings(group["runs"], f"{at}.runs")
            self._known("run", runs, self.runs, at)
            self._rowed(runs, at)
            if len(runs) < 2 or len(set(runs)) != len(runs):
                raise UserError(f"{at}.runs must list two or more runs, each once, to choose among: got {runs!r}")
            if "default" in group:
                raise UserError(
                    f"{at}: drop default: a group's default is the run whose settings a plain run of its method "
                    "uses (the method's defaults and its recipe, fedsim.recipes), found on each benchmark and target"
                )
            for bench in self.benchmarks:
                seeds = {
                    run: self.seeds_of(run, bench) for _, run, b, _ in self.variants() if b == bench and run in runs
                }
                if len({tuple(v) for v in seeds.values()}) > 1:
                    listed = "; ".join(f"{run}: {', '.join(map(str, v))}" for run, v in seeds.items())
                    raise UserError(
                        f"{at}: its runs run different seeds on {bench} ({listed}): give them the same seeds, "
                        "a selection compares means over the same seeds"
                    )
            groups[str(name)] = SelectGroup(str(name), runs, None)
        return Selection(scores, groups)

    def _rowed(self, runs: list[str], at: str) -> None:
        """Each run a selection chooses among needs a row reading the default target and source metrics: its line
        of results.csv carries the accuracies and scores the selection is rewritten from (``--tables-only``)."""
        plain = {row.run for row in self.rows if all(row.metrics.get(k) == v for k, v in DEFAULT_METRICS.items())}
        missing = [run for run in runs if run not in plain]
        if missing:
            raise UserError(
                f"{at}: run {missing[0]!r} has no row reading the default target and source metrics: "
                f"add one to rows: (- {{name: {missing[0]}}}), whose results.csv lines carry its scores"
            )

    # ---- the grid -----------------------------------------------------------
    def variants(self) -> list[tuple[str, str, str, str]]:
        """(variant name, run, benchmark, target) of every trial but the seed, in spec order."""
        out = []
        for run_name, run in self.runs.items():
            only = run.get("only") or {}
            for bench_name, bench in self.benchmarks.items():
                if only and bench_name not in only:
                    continue
                for target in bench["targets"]:
                    if only and target not in only[bench_name]:
                        continue
                    out.append((f"{run_name}@{bench_name}.{target}", run_name, bench_name, target))
        return out

    def seeds_of(self, run: str, bench: str) -> list[int]:
        """The seeds of ``run``'s trials on ``bench``: the run's own, else the benchmark's, else the spec's."""
        return list(self.runs[run].get("seeds") or self.benchmarks[bench].get("seeds") or self.seeds)

    def uniform_seeds(self) -> bool:
        """Whether every trial runs the spec's seeds (no benchmark or run names its own)."""
        return all(self.seeds_of(run, bench) == self.seeds for _, run, bench, _ in self.variants())

    def trials(self) -> dict[str, tuple[str, str, str, Optional[int]]]:
        """Grid point name (the value of the sweep's variant axis) -> (run, benchmark, target, seed). With the
        spec's seeds everywhere a point is a variant (its seed is the sweep's seed axis, None here); otherwise
        one point per variant and seed, named ``<variant>#<seed>``."""
        if self.uniform_seeds():
            return {name: (run, bench, target, None) for name, run, bench, target in self.variants()}
        return {
            f"{name}#{seed}": (run, bench, target, seed)
            for name, run, bench, target in self.variants()
            for seed in self.seeds_of(run, bench)
        }

    def seeds_text(self) -> str:
        """The seeds for the outputs' headers: "0, 1, 2", or with the benchmarks' and runs' own seeds
        "0, 1, 2 (benchmark tep: 0, 1, 2, 3, 4; run fedavg: 0, 1, 2, 3, 4)"."""

        def listed(seeds: list[int]) -> str:
            return ", ".join(str(s) for s in seeds)

        own = [
            f"{kind} {name}: {listed(entry['seeds'])}"
            for kind, entries in (("benchmark", self.benchmarks), ("run", self.runs))
            for name, entry in entries.items()
            if entry.get("seeds") and list(entry["seeds"]) != self.seeds
        ]
        return listed(self.seeds) + (f" ({'; '.join(own)})" if own else "")

    def config_file(self, run: str) -> Optional[Path]:
        """The run's YAML file (next to the spec, else in experiments/configs); None: the library's defaults."""
        name = self.runs[run].get("config")
        if name is None:
            return None
        for folder in (self.origin, CONFIGS_DIR):
            if (folder / name).is_file():
                return (folder / name).resolve()
        raise UserError(f"run {run}: config file {name!r} is neither in {self.origin} nor in {CONFIGS_DIR}")


def load_spec(paper: Optional[str], spec_file: Optional[str]) -> PaperSpec:
    """``fedsim reproduce PAPER`` or ``--spec FILE`` -> the checked spec."""
    from fedsim.config import read_yaml

    if (paper is None) == (spec_file is None):
        raise UserError(f"give a paper ({', '.join(available())}) or --spec FILE, not {'both' if paper else 'neither'}")
    if paper is not None:
        if paper not in available():
            close = difflib.get_close_matches(paper, available(), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserError(
                f"unknown paper {paper!r}: {hint}choose one of {', '.join(available())}, "
                "or give your own with --spec FILE"
            )
        path = SPECS_DIR / f"{paper}.yaml"
    else:
        path = Path(spec_file)
        if not path.is_file():
            raise UserError(
                f"spec file {spec_file} does not exist: give the path of a YAML spec (see experiments/specs/)"
            )
    raw = read_yaml(str(path)) or {}
    return PaperSpec(path.stem, raw, path.resolve().parent)


def _quick_benchmark(spec: PaperSpec, bench: str, extra: Any, old: Optional[dict]) -> dict:
    """``quick.benchmarks.<bench>``: its ``set`` and ``run_set`` lists appended after the benchmark's own
    (later settings win), its ``targets`` replacing the benchmark's; the other benchmarks are untouched."""
    where = f"spec {spec.name}: quick.benchmarks.{bench}"
    spec._known("benchmark", [bench], spec.benchmarks, f"spec {spec.name}: quick.benchmarks")
    extra, old = check_keys("benchmark", dict(extra or {}), where), dict(old or {})
    if "seeds" in extra:
        raise UserError(f"{where}: give the quick grid's seeds as quick.seeds, not per benchmark")
    spec._known("run", list(extra.get("run_set") or {}), spec.runs, f"{where}.run_set")
    run_set = {run: list(items) for run, items in (old.get("run_set") or {}).items()}
    for run, items in (extra.get("run_set") or {}).items():
        run_set[run] = run_set.get(run, []) + strings(items, f"{where}.run_set.{run}")
    merged = {
        **old,
        "set": list(old.get("set", [])) + strings(extra.get("set", []), f"{where}.set"),
        "run_set": run_set,
    }
    if "targets" in extra:
        merged["targets"] = strings(extra["targets"], f"{where}.targets")
    return merged


def shrink(spec: PaperSpec, quick: bool, seeds: Optional[list[int]]) -> PaperSpec:
    """The grid that runs: ``--quick`` applies the spec's quick section (``quick.targets`` with an empty list leaves
    that benchmark out, so a spec that also reads files has a smoke test without them), ``--seeds`` replaces the seeds
    (seeds given by ``--seeds`` or ``quick.seeds`` replace the benchmarks' and runs' own as well)."""
    raw = copy.deepcopy(spec.raw)
    if quick:
        small = check_keys("quick", dict(raw.pop("quick", None) or {}), f"spec {spec.name}: quick")
        raw["seeds"] = small.get("seeds", raw.get("seeds", [0]))[:]
        raw["set_last"] = list(raw.get("set_last", [])) + strings(small.get("set", []), f"spec {spec.name}: quick.set")
        for bench, targets in (small.get("targets") or {}).items():
            spec._known("benchmark", [bench], spec.benchmarks, f"spec {spec.name}: quick.targets")
            if targets == []:  # the quick grid leaves the benchmark out, e.g. one that reads files
                del raw["benchmarks"][bench]
                raw["series"] = [s for s in raw.get("series", []) if s.get("benchmark") != bench]
                continue
            raw["benchmarks"][bench] = {**(raw["benchmarks"][bench] or {}), "targets": list(targets)}
        if not raw["benchmarks"]:
            raise UserError(f"spec {spec.name}: quick.targets leaves out every benchmark: give one its targets")
        for bench, extra in (small.get("benchmarks") or {}).items():
            if bench in spec.benchmarks and bench not in raw["benchmarks"]:
                continue  # left out of the quick grid by quick.targets
            raw["benchmarks"][bench] = _quick_benchmark(spec, bench, extra, raw["benchmarks"][bench])
        for run, extra in (small.get("run_set") or {}).items():
            spec._known("run", [run], spec.runs, f"spec {spec.name}: quick.run_set")
            raw["runs"][run] = {
                **raw["runs"][run],
                "set": list(raw["runs"][run].get("set", [])) + strings(extra, f"quick.run_set.{run}"),
            }
        if "runs" in small:
            spec._known("run", small["runs"], spec.runs, f"spec {spec.name}: quick.runs")
            _keep_runs(raw, small["runs"])
    if seeds is not None:
        raw["seeds"] = list(seeds)
    if seeds is not None or (quick and "seeds" in (spec.raw.get("quick") or {})):
        # the seeds given (--seeds, quick.seeds) replace the benchmarks' and runs' own
        for entries in (raw["benchmarks"], raw["runs"]):
            for name, entry in entries.items():
                entries[name] = {k: v for k, v in (entry or {}).items() if k != "seeds"}
    return PaperSpec(spec.name, raw, spec.origin)


def _keep_runs(raw: dict, runs: list[str]) -> None:
    """The quick grid's ``quick.runs``: the rows, series, selection groups and claims that read only those runs."""
    raw["runs"] = {k: v for k, v in raw["runs"].items() if k in runs}
    raw["rows"] = [r for r in raw["rows"] if r.get("run", r["name"]) in raw["runs"]]
    raw["series"] = [s for s in raw.get("series", []) if set(s["runs"]) <= set(raw["runs"])]
    if "select" in raw:  # each group keeps its runs of the quick grid; one left has nothing to choose
        groups = {}
        for name, group in raw["select"]["groups"].items():
            kept_runs = [r for r in group["runs"] if r in raw["runs"]]
            if len(kept_runs) >= 2:
                groups[name] = {
                    "runs": kept_runs,
                    **({"default": group["default"]} if group.get("default") in kept_runs else {}),
                }
        if groups:
            raw["select"] = {**raw["select"], "groups": groups}
        else:
            del raw["select"]
    kept = {r["name"] for r in raw["rows"]}
    raw["claims"] = [
        c
        for c in raw.get("claims", [])
        if all(str(i).partition(":")[0] in kept for g in c["order"] for i in (g if isinstance(g, list) else [g]))
    ]


def to_sweep(spec: PaperSpec) -> SweepSpec:
    """One variant per run x benchmark x target (its config file's sections + the overrides), times the seeds: the
    spec's as the seed axis, or, where a benchmark or run has its own, one point per variant and seed (the variants
    stay in ``variants`` under their own names, the points beside them as ``<variant>#<seed>``)."""
    from fedsim.config import read_yaml

    variants = {}
    for name, run, bench_name, target in spec.variants():
        bench = spec.benchmarks[bench_name]
        path = spec.config_file(run)
        overrides = (
            spec.settings
            + list(bench.get("set", []))
            + list((bench.get("run_set") or {}).get(run, []))
            + list(spec.runs[run].get("set", []))
            + spec.last_settings
            + [f"data.benchmark={bench.get('benchmark') or bench_name}", f"data.target={target}"]
        )
        variants[name] = {
            "config_file": path and str(path),
            "base": (read_yaml(str(path)) or {}) if path else {},
            "overrides": overrides,
        }
    if spec.uniform_seeds():
        return SweepSpec(None, {}, [], {VARIANT_KEY: list(variants), "run.seed": list(spec.seeds)}, variants)
    points = {}  # seeds that differ by benchmark or run: one point per variant and seed, the seed in its overrides
    for point, (run, bench, target, seed) in spec.trials().items():
        variant = variants[point.rpartition("#")[0]]
        points[point] = {**variant, "overrides": [*variant["overrides"], f"run.seed={seed}"]}
    return SweepSpec(None, {}, [], {VARIANT_KEY: list(points)}, {**variants, **points})


def default_run(spec: PaperSpec, group: SelectGroup) -> Callable[[dict], dict]:
    """A selection group's default on each benchmark and target (a function of the row's ``benchmark`` and
    ``target``, as :func:`fedsim.experiments.selection.select` takes it): the first of its runs whose config agrees
    with a plain run of its method there (:func:`fedsim.experiments.selection.plain_config`: the method's defaults
    and its recipe) on every key in which the group's runs differ. The same rule as a sweep's default. Where no run
    agrees, a setting that names the plain run's values and matches no run: the report says the grid lacks it."""
    from fedsim.experiments.selection import flat_config, plain_config

    sweep = to_sweep(spec)
    missing = object()

    def default(row: dict) -> dict:
        names = {run: f"{run}@{row['benchmark']}.{row['target']}" for run in group.runs}
        configs = {run: sweep.config_for({VARIANT_KEY: name}) for run, name in names.items() if name in sweep.variants}
        if not configs:
            return {}
        flat = {run: flat_config(config) for run, config in configs.items()}
        keys = sorted({k for f in flat.values() for k in f})
        differ = [k for k in keys if len({repr(f.get(k, missing)) for f in flat.values()}) > 1]
        plains = {}
        for run, config in configs.items():
            plain = plains.setdefault(
                config.method.name, flat_config(plain_config(config.method.name, config.to_dict()["data"]))
            )
            if all(flat[run].get(k, missing) == plain.get(k, missing) for k in differ):
                return {"run": run}
        first = plains[next(iter(configs.values())).method.name]
        values = ", ".join(f"{k}={first[k]}" for k in differ if k in first)
        return {"run": f"a plain run ({values or 'its defaults'})"}

    return default


def to_json(spec: PaperSpec) -> str:
    return json.dumps({"name": spec.name, "origin": str(spec.origin), "spec": spec.raw}, indent=2, default=str) + "\n"


def from_json(text: str) -> PaperSpec:
    raw = json.loads(text)
    return PaperSpec(raw["name"], raw["spec"], Path(raw["origin"]))
