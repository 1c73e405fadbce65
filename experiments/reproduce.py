"""`fedsim reproduce PAPER`: a paper's protocol (``experiments/specs/<paper>.yaml``) run as Ray Tune trials.

    fedsim reproduce fada                    # the full grid: every run x target x seed
    fedsim reproduce fada --quick            # the spec's smoke-test grid (few rounds, tiny data)
    fedsim reproduce --spec my-protocol.yaml --address auto --seeds 0,1,2
    fedsim reproduce --resume --out runs/reproduce-fada-...
    fedsim reproduce --spec experiments/specs/results/fada.yaml --out results/fada --tables-only

Each trial is one run x benchmark x target x seed of the spec (:mod:`fedsim.experiments.reproduce_spec`),
placed and run by `fedsim sweep`'s machinery (:func:`fedsim.experiments.sweep.run_grid`), so ``--address auto``
spreads the grid over a cluster and ``--resume`` finishes an interrupted one. The output directory holds
``results.csv`` (one line per table row x target x seed), ``table.md``, ``claims.md``, the plots
(:mod:`fedsim.experiments.reproduce_plots`), Tune's experiment (``tune/``), the trials' run directories
(``runs/``), ``reproduce.json`` and ``sweep.json`` (the grid, for ``--resume``). ``--tables-only`` runs nothing:
it rewrites ``table.md`` and ``claims.md`` (and a ``select:`` spec's ``selection.*``, from the scores results.csv
carries) of a finished directory from its ``results.csv`` and the spec that made it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Optional

from fedsim.errors import UserError
from fedsim.experiments.reproduce_data import parse_data_roots, resolve_data_roots
from fedsim.experiments.reproduce_results import (
    claims_text,
    read_results_csv,
    results_rows,
    table,
    write_results_csv,
    write_selection_of_lines,
)
from fedsim.experiments.reproduce_spec import PaperSpec, available, from_json, load_spec, shrink, to_json, to_sweep
from fedsim.experiments.sweep import SPEC_FILE, TUNE_NAME, report_failures, run_grid
from fedsim.experiments.sweep_grid import SweepSpec, parse_list, prepare

STATE_FILE = "reproduce.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paper", nargs="?", help=f"the paper whose protocol to run: {', '.join(available())}")
    parser.add_argument(
        "--spec", help="your own protocol: a YAML spec file (see experiments/specs/ and docs/cluster.md)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="the spec's smoke-test grid: few rounds, tiny data, one seed"
    )
    parser.add_argument("--seeds", help="comma-separated root seeds replacing the spec's, e.g. 0,1,2")
    parser.add_argument(
        "--backend",
        choices=("ray", "local"),
        help="inside each trial: ray (client actors) or local (clients in the trial's process: no actor start-up, "
        "the same numbers; the grid runs as many trials at once as the machine has CPUs for). Default: local on the "
        "fresh Ray cluster of this machine, ray with --address or when the spec asks for GPUs",
    )
    parser.add_argument(
        "--address", help="join an existing Ray cluster (host:port or auto); default: a fresh local cluster"
    )
    parser.add_argument("--out", help="output directory (default runs/reproduce-<paper>[-quick]-<date>)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="finish the interrupted grid in --out (its grid comes from reproduce.json)",
    )
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="run nothing: rewrite table.md and claims.md (and selection.md, .csv, .png of a select: spec) in --out "
        "from its results.csv, with the spec that made it "
        "(PAPER or --spec, with its --quick / --seeds; without them the directory's reproduce.json)",
    )
    parser.add_argument(
        "--data-dir",
        help="the folder holding the files of the spec's benchmarks that read files (each entry's data_root "
        "is relative to it); default: $FEDSIM_DATA_DIR",
    )
    parser.add_argument(
        "--data-root",
        action="append",
        metavar="BENCHMARK=DIR",
        help="one benchmark entry's folder, e.g. cwru=/data/cwru (repeatable; overrides --data-dir)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no Tune progress, no table")


def _fresh_out(out: Optional[str], spec: PaperSpec, quick: bool) -> Path:
    path = Path(out or f"runs/reproduce-{spec.name}{'-quick' if quick else ''}-{time.strftime('%Y%m%d-%H%M%S')}")
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {out} is a file: give a directory path")
    if (path / STATE_FILE).exists() or (path / TUNE_NAME).exists():
        raise UserError(
            f"--out {path} already holds a reproduction: pass --resume to finish it, or choose another directory"
        )
    return path


#: a flag as the user types it -> its attribute on the parsed arguments
FLAG_ATTRIBUTES = {
    "PAPER": "paper",
    "--spec": "spec",
    "--quick": "quick",
    "--seeds": "seeds",
    "--resume": "resume",
    "--backend": "backend",
    "--address": "address",
    "--data-dir": "data_dir",
    "--data-root": "data_root",
}


def _given(args: argparse.Namespace, *flags: str) -> list[str]:
    """Those of ``flags`` the command line set, in the order named."""
    return [flag for flag in flags if getattr(args, FLAG_ATTRIBUTES[flag])]


def _resumed(args: argparse.Namespace) -> tuple[PaperSpec, SweepSpec, Path]:
    given = _given(args, "PAPER", "--spec", "--quick", "--seeds", "--backend", "--data-dir", "--data-root")
    if given:
        raise UserError(f"--resume takes the grid from the directory's {STATE_FILE}: drop {', '.join(given)}")
    if not args.out:
        raise UserError("--resume needs --out DIR: the directory of the reproduction to finish")
    out = Path(args.out)
    if not (out / STATE_FILE).is_file() or not (out / SPEC_FILE).is_file():
        raise UserError(
            f"--out {args.out} holds no reproduction ({STATE_FILE} missing): "
            "give the directory of an earlier 'fedsim reproduce'"
        )
    return from_json((out / STATE_FILE).read_text()), SweepSpec.from_json((out / SPEC_FILE).read_text()), out


def _spec_from_args(args: argparse.Namespace) -> PaperSpec:
    """PAPER or --spec, shrunk by --quick and --seeds."""
    seeds = parse_list("seeds", args.seeds, int, "0,1,2") if args.seeds else None
    return shrink(load_spec(args.paper, args.spec), args.quick, seeds)


def _print_tables(out: Path, what: str, written: list[Path]) -> None:
    """The table and the claims just written to ``out``, then ``what`` and the files' names."""
    print((out / "table.md").read_text())
    print((out / "claims.md").read_text())
    print(f"{what}: {', '.join(p.name for p in written)}")


def write_tables(spec: PaperSpec, lines: list[dict], out: Path) -> list[Path]:
    """table.md and claims.md of the results table's ``lines``; returns the paths written."""
    written = []
    for name, text in (("table.md", table(spec, lines)), ("claims.md", claims_text(spec, lines))):
        (out / name).write_text(text)
        written.append(out / name)
    return written


def tables_only(args: argparse.Namespace) -> int:
    """``--tables-only``: table.md, claims.md and the selection report of the finished reproduction in ``--out``,
    from its results.csv."""
    given = _given(args, "--resume", "--backend", "--address", "--data-dir", "--data-root")
    if given:
        raise UserError(f"--tables-only runs nothing: drop {', '.join(given)}")
    if not args.out:
        raise UserError("--tables-only needs --out DIR: the directory whose results.csv to read")
    out = Path(args.out)
    if args.paper or args.spec:
        spec = _spec_from_args(args)
    elif args.quick or args.seeds:
        raise UserError("--quick and --seeds go with PAPER or --spec: give the spec that made --out")
    elif (out / STATE_FILE).is_file():
        spec = from_json((out / STATE_FILE).read_text())
    else:
        raise UserError(f"--out {args.out} holds no {STATE_FILE}: give the spec that made it (PAPER or --spec FILE)")
    lines = read_results_csv(out / "results.csv", spec)
    written = write_tables(spec, lines, out) + write_selection_of_lines(spec, lines, out)
    if not args.quiet:
        _print_tables(out, f"tables of {spec.name} rewritten from {out / 'results.csv'}", written)
    return 0


def output_names(spec: PaperSpec) -> list[str]:
    """What :func:`write_outputs` writes for ``spec``: what a ``results/`` directory holds beside its spec.yaml."""
    from fedsim.experiments.reproduce_plots import plot_names

    return ["results.csv", "table.md", "claims.md", *plot_names(spec)]


def write_outputs(spec: PaperSpec, records: list[dict], out: Path) -> list[Path]:
    """results.csv, table.md, claims.md and the plots; returns the paths written."""
    from fedsim.experiments.reproduce_plots import write_plots

    lines = results_rows(spec, records)
    written = [write_results_csv(out / "results.csv", lines), *write_tables(spec, lines, out)]
    return written + write_plots(spec, records, lines, out)


def default_backend(address, configs) -> str:
    """The trials' backend when ``--backend`` is not given: ray when joining a cluster (its client actors spread
    over the nodes) or when a trial asks for GPUs (the local backend runs on the CPU); otherwise local, so that a
    grid on this machine keeps one trial per CPU running (``resources.cpus_per_client`` each, one torch thread per
    CPU), where a Ray trial's coordinator bundle would leave a CPU idle on a small machine."""
    if address or any(config.resources.gpus_per_client > 0 for config in configs):
        return "ray"
    return "local"


def run(args: argparse.Namespace) -> int:
    """Check the spec and every trial's config, run (or resume) the grid, write the outputs."""
    if args.tables_only:
        return tables_only(args)
    if args.resume:
        spec, sweep_spec, out = _resumed(args)
    else:
        spec = resolve_data_roots(_spec_from_args(args), args.data_dir, parse_data_roots(args.data_root))
        sweep_spec = to_sweep(spec)
        out = None
    configs, clients = prepare(sweep_spec)
    if not args.resume:
        sweep_spec.backend = args.backend or default_backend(args.address, configs.values())
    if out is None:
        out = _fresh_out(args.out, spec, args.quick)
    records = run_grid(
        sweep_spec,
        configs,
        clients,
        out,
        address=args.address,
        resume=args.resume,
        quiet=args.quiet,
        files={STATE_FILE: to_json(spec), SPEC_FILE: sweep_spec.to_json()},
    )
    written = write_outputs(spec, records, out)
    if not args.quiet:
        _print_tables(out, f"reproduction of {spec.name} in {out}", written)
    return report_failures(records, "fedsim reproduce", out)
