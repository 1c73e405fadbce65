"""Where the wall time of a paper's protocol goes, and what its full protocol costs on this machine.

Five modes, each for the papers of ``--papers`` (``feddadil``, ``fada``, ``fedod``; default all) or one ``--spec FILE``:

* (default) runs ``fedsim reproduce PAPER --quick`` and, with ``--full-trial``, one trial of the full protocol (its
  first run on its first target, seed 0), and prints each command's wall time split by what its trials wrote
  (:mod:`tools.benchmarks.protocol_split`): training (OT inside it where reported), evaluation, checkpoints,
  start-up, grid / Tune;
* ``--estimate``: the FULL protocol's wall time on this machine, from a measured cut. It enumerates every trial of
  the full grid as ``fedsim reproduce`` does (its backend too: ``--backend``, else reproduce's default), groups them
  into kinds (same run, benchmark and settings but target and seed; :mod:`tools.benchmarks.protocol_grid`), runs one
  cut trial per kind as a grid (per stage its first round, one steady round, the run's last round; the evaluations
  as the spec has them; after warm-up trials, so that each runs in a warm trial process as a grid's trials do),
  scales it to the full trial (:mod:`tools.benchmarks.protocol_scale`), times the kind's trials (the encoder stage
  the grid's FedDaDiL and DaDiL trials share is paid by those that compute it), divides by the trials the grid runs
  at once (``plan_trial`` against the cluster's CPUs), adds the processes' cold start and the grid's own time
  measured on the ``--quick`` run (its checks replaced by the full grid's, timed here). It prints, per paper, the
  cut's and the --quick run's measured splits, then the estimate: per kind (trials, trials at once, rounds, the cut,
  measured and scaled seconds, the committed runs of the same settings) and per part (training, OT, barycenters,
  evaluation with predictors, checkpoints, start-up, grid / Tune) in trial-hours and wall hours, each marked measured
  or scaled, beside the committed results' trial-hours; then one summary line per paper;
* ``--plan``: runs nothing; the full grid's kinds, their cut, the trials at once and the committed times per kind;
* ``--full``: runs the full protocol for real (hours) and splits its wall time as the default mode does;
* ``--committed``: runs nothing; the ``wall_seconds`` of the committed results.csv files, by paper
  (:mod:`tools.benchmarks.protocol_committed`).

Usage (``--out DIR`` keeps the runs; ``--cpus N`` / ``--gpus N`` assume another cluster for the trials at once):

    python -m tools.benchmarks.protocols [--papers fada,feddadil] [--full-trial] [--out DIR] [--backend local]
    python -m tools.benchmarks.protocols --estimate --papers feddadil [--backend ray] [--cpus 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from tools.benchmarks.protocol_committed import committed_kinds, committed_results, format_committed, of_spec, totals
from tools.benchmarks.protocol_grid import (
    WARM_UP,
    cut_shape,
    cut_sweep,
    full_grid,
    group_kinds,
    local_cluster,
    settings_key,
    trials_at_once,
)
from tools.benchmarks.protocol_report import PaperLine, format_estimate, format_summary
from tools.benchmarks.protocol_scale import GRID, KindEstimate, cold_start, combine, scaled_trial
from tools.benchmarks.protocol_split import format_split, read_jsonl, split_protocol, trial_timings

log = logging.getLogger(__name__)

PAPERS = ("feddadil", "fada", "fedod")
MODES = ("quick", "full-trial", "estimate", "full")  # the output folders' suffixes


@dataclass(frozen=True)
class Target:
    """A protocol to measure: a paper of experiments/specs, or a spec file (``name`` is its stem)."""

    name: str
    paper: Optional[str]
    spec_file: Optional[str]
    data_args: tuple[str, ...] = ()  # --data-dir / --data-root, passed on to fedsim reproduce

    def arguments(self) -> list[str]:
        return [self.paper] if self.paper else ["--spec", str(self.spec_file)]


def first_trial_spec(paper: Optional[str], spec_file: Optional[str] = None) -> dict:
    """The full spec narrowed to one trial: its first run on its first target, seed 0, no claims."""
    from fedsim.experiments.reproduce_spec import load_spec

    spec = load_spec(paper, spec_file)
    _, run, bench, target = spec.variants()[0]
    raw = {k: v for k, v in spec.raw.items() if k not in ("quick", "claims")}
    run_entry = {k: v for k, v in spec.runs[run].items() if k not in ("only", "seeds")}
    config = spec.config_file(run)
    if config is not None:
        run_entry["config"] = str(config)  # absolute: the narrowed spec lives elsewhere
    raw.update(
        seeds=[0],
        runs={run: run_entry},
        benchmarks={bench: {**{k: v for k, v in spec.benchmarks[bench].items() if k != "seeds"}, "targets": [target]}},
        rows=[r for r in spec.raw["rows"] if r.get("run", r["name"]) == run],
        series=[s for s in spec.raw.get("series", []) if s["runs"] == [run]],
    )
    return raw


def run_command(arguments: list[str], out: Path) -> tuple[float, float, int]:
    """``fedsim ARGUMENTS --out OUT -q``, its output in OUT.log; (started, finished, exit code)."""
    command = [sys.executable, "-m", "fedsim.experiments.cli", *arguments, "--out", str(out), "-q"]
    log.info("running fedsim %s", " ".join(arguments))
    with open(f"{out}.log", "w") as output:
        started = time.time()
        code = subprocess.call(command, stdout=output, stderr=subprocess.STDOUT)
        finished = time.time()
    if code != 0:
        log.warning("%s exited with %d (see %s.log); its finished trials are still counted", arguments, code, out)
    return started, finished, code


def timed_split(title: str, arguments: list[str], out: Path):
    """Run ``fedsim ARGUMENTS``, print its split, return it."""
    started, finished, _ = run_command(arguments, out)
    split = split_protocol(trial_timings(out), started, finished)
    print(format_split(title, split), flush=True)
    return split


def measure(target: Target, folder: Path, args: argparse.Namespace) -> None:
    """Print the tables of one protocol: its --quick grid and, with --full-trial, one trial of its full grid;
    with --full, its full grid."""
    backend = ["--backend", args.backend] if args.backend else []
    common = [*backend, *target.data_args]
    if args.full:
        timed_split(
            f"{target.name}: the full protocol",
            ["reproduce", *target.arguments(), *common],
            folder / name_of(target, "full"),
        )
        return
    timed_split(
        f"{target.name} --quick",
        ["reproduce", *target.arguments(), "--quick", *common],
        folder / name_of(target, "quick"),
    )
    if args.full_trial:
        spec_path = folder / f"{name_of(target, 'full-trial')}.yaml"
        spec_path.write_text(yaml.safe_dump(first_trial_spec(target.paper, target.spec_file), sort_keys=False))
        title = f"{target.name}: one trial of the full protocol"
        timed_split(title, ["reproduce", "--spec", str(spec_path), *common], folder / spec_path.stem)


def name_of(target: Target, mode: str) -> str:
    return f"{target.name}-{mode}"


def run_cut(cut, out: Path) -> tuple[float, float, dict[str, str]]:
    """Run the cut sweep as ``fedsim reproduce`` runs a grid (checks, Ray, Tune); (started, finished, trial id ->
    kind). Its results.csv (trial id, wall_seconds) and kinds.json (trial id -> kind) are written in ``out``."""
    from fedsim.experiments.sweep import SPEC_FILE, run_grid
    from fedsim.experiments.sweep_grid import prepare
    from fedsim.experiments.sweep_results import write_results

    log.info("running the cut: %d trials in %s", len(cut.variants), out)
    started = time.time()
    configs, clients = prepare(cut)
    records = run_grid(
        cut, configs, clients, out, address=None, resume=False, quiet=True, files={SPEC_FILE: cut.to_json()}
    )
    finished = time.time()
    write_results(out, records)
    for record in records:
        if record["status"] != "finished":
            log.warning(
                "cut trial %s: %s %s", record["params"].get("variant"), record["status"], record.get("error", "")
            )
    kinds = {r["trial_id"]: r["params"]["variant"] for r in records if r["status"] == "finished"}
    (out / "kinds.json").write_text(json.dumps(kinds, indent=2) + "\n")
    return started, finished, kinds


def quick_grid_seconds(target: Target, folder: Path, backend: str, full_checks: float) -> Optional[tuple[float, str]]:
    """The grid's own time (no trial running) of the --quick run, its checks replaced by the full grid's; None when
    the spec has no quick section. The quick run's split is printed."""
    from fedsim.experiments.reproduce_data import parse_data_roots, resolve_data_roots
    from fedsim.experiments.reproduce_spec import load_spec, shrink, to_sweep
    from fedsim.experiments.sweep_grid import prepare

    spec = load_spec(target.paper, target.spec_file)
    if not spec.raw.get("quick"):
        return None
    data_dir, roots = data_options(target)
    started = time.perf_counter()
    prepare(to_sweep(resolve_data_roots(shrink(spec, True, None), data_dir, parse_data_roots(roots))))
    quick_checks = time.perf_counter() - started
    arguments = ["reproduce", *target.arguments(), "--quick", "--backend", backend, *target.data_args]
    split = timed_split(f"{target.name} --quick (measured)", arguments, folder / name_of(target, "quick"))
    grid = max(0.0, split.wall[GRID] - quick_checks) + full_checks
    how = (
        f"measured: --quick's {split.wall[GRID]:.0f} s, its checks ({quick_checks:.0f} s) "
        f"replaced by the full grid's ({full_checks:.0f} s)"
    )
    return grid, how


def data_options(target: Target) -> tuple[Optional[str], list[str]]:
    """--data-dir and the --data-root items of the target's data arguments."""
    pairs = list(zip(target.data_args[::2], target.data_args[1::2]))
    data_dir = next((value for flag, value in pairs if flag == "--data-dir"), None)
    return data_dir, [value for flag, value in pairs if flag == "--data-root"]


def kind_estimates(kinds, at_once: dict, cut_dir: Path, trial_kinds: dict, steady: int, committed: dict):
    """One KindEstimate per kind whose cut trial finished, from the cut directory."""
    timings = {t.trial_id: t for t in trial_timings(cut_dir)}
    by_kind = {kind: trial for trial, kind in trial_kinds.items()}
    out = []
    for kind in kinds:
        trial = by_kind.get(kind.name)
        if trial is None or trial not in timings:
            log.warning(
                "kind %s: its cut trial did not finish; its %d trials are left out", kind.name, len(kind.points)
            )
            continue
        cut = cut_shape(kind.shape, steady)
        rows = read_jsonl(cut_dir / "runs" / trial / "metrics.jsonl")
        scaled = scaled_trial(rows, timings[trial], cut, kind.shape)
        estimate = KindEstimate(
            kind.name,
            len(kind.points),
            at_once[kind.name],
            kind.shape,
            cut,
            timings[trial].trial_seconds,
            scaled,
            committed.get(settings_key(kind.config)),
            kind.computes,
            scaled.stages[0] if kind.computes < len(kind.points) else 0.0,
        )
        out.append(estimate)
    return out


def committed_of(target: Target, entries: list) -> list:
    """The committed results of the target: its paper's, or those its spec file made."""
    from fedsim.experiments.reproduce_spec import available

    if target.paper:
        return [e for e in entries if e.paper == target.paper]
    return of_spec(entries, Path(target.spec_file), available())


def grid_plan(target: Target, args: argparse.Namespace):
    """The full grid's kinds and how many of each run at once; (spec, sweep, kinds, at_once, cluster, checks s)."""
    data_dir, roots = data_options(target)
    started = time.perf_counter()
    spec, sweep, configs, clients = full_grid(target.paper, target.spec_file, args.backend, data_dir, roots)
    checks = time.perf_counter() - started
    kinds = group_kinds(spec, sweep, configs, clients)
    cluster = local_cluster(args.cpus, args.gpus)
    at_once = {k.name: trials_at_once(k, cluster, sweep.backend) for k in kinds}
    log.info(
        "%s: %d trials in %d kinds; the full grid's checks took %.1f s", target.name, len(configs), len(kinds), checks
    )
    return spec, sweep, kinds, at_once, cluster, checks


def estimate(target: Target, folder: Path, args: argparse.Namespace, entries: list) -> PaperLine:
    """Measure the cut and the --quick run of one protocol, print its estimate, return its summary line."""
    _, sweep, kinds, at_once, cluster, checks = grid_plan(target, args)
    measuring = time.time()
    cut_dir = folder / name_of(target, "estimate")
    processes = max(at_once.values())
    cut = cut_sweep(sweep, kinds, args.steady_rounds, cut_dir.resolve() / "own-cache", warmups=processes)
    started, finished, trial_kinds = run_cut(cut, cut_dir)
    cut_split = split_protocol(trial_timings(cut_dir), started, finished)
    print(format_split(f"{target.name}: the cut, one trial per kind (measured)", cut_split), flush=True)
    backend = sweep.backend
    grid = quick_grid_seconds(target, folder, backend, checks) or (
        cut_split.wall[GRID],
        "measured: the cut run's own (the spec has no quick section)",
    )
    measured = time.time() - measuring
    mine = committed_of(target, entries)
    by_kind = committed_kinds(mine, {settings_key(k.config) for k in kinds})
    estimates = kind_estimates(kinds, at_once, cut_dir, trial_kinds, args.steady_rounds, by_kind)
    timings = {t.trial_id: t.trial_seconds for t in trial_timings(cut_dir)}
    cold = {name: timings[trial] for trial, name in trial_kinds.items() if WARM_UP in name and trial in timings}
    cold_seconds = cold_start(cold, {k.name: k.cut_seconds for k in estimates})
    result = combine(estimates, grid[0], cold_seconds, processes)
    notes = estimate_notes(kinds, cluster, backend, result, mine, measured)
    title = f"{target.name}: the full protocol, estimated"
    print(format_estimate(title, estimates, result, grid[1], notes), flush=True)
    return PaperLine(target.name, len(estimates), result, totals(mine), measured)


def estimate_notes(kinds, cluster: dict, backend: str, result, committed: list, measured: float) -> list[str]:
    """What the estimate assumes and what it stands beside, one line each."""
    from fedsim.experiments.sweep_grid import VARIANT_KEY

    seconds, trials = totals(committed)
    firsts = ", ".join(f"{k.name}: {k.point[VARIANT_KEY]}" for k in kinds[:3]) + (", ..." if len(kinds) > 3 else "")
    return [
        f"- trials at once: plan_trial's bundles on a cluster of {cluster['CPU']:g} CPUs and {cluster['GPU']:g} GPUs "
        f"(backend {backend}); a part's wall hours are its trial-hours / the kind's trials at once",
        f"- each kind measured on the cut of its first trial ({firsts}) in a warm trial process (the cut's first "
        "trials warm them up: Tune reuses a grid's processes); its other targets and seeds assumed to cost the same",
        "- the stage the grid's trials share (FedDaDiL's and DaDiL's encoder, run.cache_dir): paid by the trials that "
        "compute it (the first of each key, in grid order), replayed by the others at no time (a trial waiting on "
        "another's computing of it is not counted); each cut trial computes its own",
        f"- the wall is at least the longest trial ({result.longest / 3600:.2f} h); a kind's last wave of trials, "
        "fewer at once, may add up to one trial more",
        f"- committed (before): {seconds / 3600:.2f} trial-hours over {trials} trials in "
        f"{', '.join(e.folder for e in committed) or 'none'}: their wall_seconds (the runs' own time, start-up "
        "outside the run not in it), other code and their specs' own cuts",
        f"- measuring took {measured / 60:.1f} min (the cut and the --quick run)",
    ]


def plan(target: Target, args: argparse.Namespace, entries: list) -> None:
    """Print the full grid's kinds, their cut and how many run at once, without running anything."""
    from tools.benchmarks.protocol_report import plan_table

    _, _, kinds, at_once, cluster, checks = grid_plan(target, args)
    by_kind = committed_kinds(committed_of(target, entries), {settings_key(k.config) for k in kinds})
    cuts = {k.name: cut_shape(k.shape, args.steady_rounds) for k in kinds}
    print(f"## {target.name}: the full grid ({sum(len(k.points) for k in kinds)} trials, {len(kinds)} kinds)\n")
    print(plan_table(kinds, at_once, cuts, {k.name: by_kind.get(settings_key(k.config)) for k in kinds}))
    print(f"cluster {cluster['CPU']:g} CPUs, {cluster['GPU']:g} GPUs; the full grid's checks took {checks:.1f} s\n")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmarks.protocols",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.splitlines()[0],
        epilog=__doc__.strip().splitlines()[-1].strip(),
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--papers", help=f"comma-separated, from {', '.join(PAPERS)} (default: all)")
    which.add_argument("--spec", help="a spec file instead of the papers (as fedsim reproduce --spec)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--full-trial", action="store_true", help="also one trial of each full protocol")
    mode.add_argument(
        "--estimate", action="store_true", help="the full protocol's wall time, scaled from a measured cut"
    )
    mode.add_argument("--plan", action="store_true", help="the full grid's kinds and cut, without running anything")
    mode.add_argument("--full", action="store_true", help="run the full protocol for real (hours) and split it")
    mode.add_argument("--committed", action="store_true", help="only the committed results' wall_seconds")
    parser.add_argument("--out", help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--backend", choices=("ray", "local"), help="passed to fedsim reproduce (default: its own)")
    parser.add_argument("--cpus", type=float, help="--estimate: the cluster's CPUs (default: this machine's)")
    parser.add_argument("--gpus", type=float, help="--estimate: the cluster's GPUs (default: this machine's)")
    parser.add_argument(
        "--steady-rounds", type=int, default=1, help="--estimate: rounds measured per stage after its first"
    )
    parser.add_argument("--data-dir", help="passed to fedsim reproduce")
    parser.add_argument("--data-root", action="append", default=[], metavar="BENCHMARK=DIR", help="the same")
    args = parser.parse_args(argv)
    args.papers = [p.strip() for p in (args.papers or ",".join(PAPERS)).split(",") if p.strip()]
    unknown = [p for p in args.papers if p not in PAPERS]
    if unknown:
        parser.error(f"unknown paper {', '.join(unknown)}: choose from {', '.join(PAPERS)}")
    if args.steady_rounds < 1:
        parser.error("--steady-rounds must be 1 or more")
    return args


def targets_of(args: argparse.Namespace) -> list[Target]:
    data = tuple(a for item in args.data_root for a in ("--data-root", item))
    data = (("--data-dir", args.data_dir) if args.data_dir else ()) + data
    if args.spec:
        return [Target(Path(args.spec).stem, None, args.spec, data)]
    return [Target(paper, paper, None, data) for paper in args.papers]


def run_modes(args: argparse.Namespace, folder: Path) -> None:
    """The chosen mode for every target, in ``folder``."""
    from fedsim.experiments.reproduce_spec import available

    entries = committed_results(available())
    lines = []
    for target in targets_of(args):
        if args.plan:
            plan(target, args, entries)
        elif args.estimate:
            lines.append(estimate(target, folder, args, entries))
        else:
            measure(target, folder, args)
    if lines:
        print(format_summary(lines), flush=True)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from fedsim.experiments.reproduce_spec import available
    from tools.benchmarks.measure import machine

    if args.committed:
        print(format_committed(committed_results(available())))
        return
    with tempfile.TemporaryDirectory(prefix="fedsim-protocols-") as scratch:
        folder = Path(args.out or scratch)
        taken = [p.name for t in targets_of(args) for mode in MODES if (p := folder / name_of(t, mode)).exists()]
        if taken:
            raise SystemExit(f"{folder} already holds {', '.join(sorted(taken))}: give another --out")
        folder.mkdir(parents=True, exist_ok=True)
        print(f"# Where the protocols' wall time goes ({machine()})\n")
        run_modes(args, folder)


if __name__ == "__main__":
    main()
