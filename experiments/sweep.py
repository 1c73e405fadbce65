"""`fedsim sweep`: a Ray Tune grid over methods x local epochs x seeds (x any ``--set`` list).

    fedsim sweep --methods fedavg,fedprox --local-epochs 1,5 --seeds 0,1 --target usps

Each trial is one simulation on the Ray backend. A trial reserves its actors
with one ``tune.PlacementGroupFactory``: a small head bundle for the trial
coordinator (the Simulator loop; the ServerActor asks for no CPU) and one
bundle per client actor (``resources.cpus_per_client`` CPUs and
``resources.gpus_per_client`` GPUs), so concurrent trials never oversubscribe
the cluster. Every round's metrics go to ``tune.report`` (nested dicts
flattened to ``source_accuracy/usps`` and so on), and the run's summary is the
trial's last result (``summary/...``).

The grid is methods x local epochs x seeds x every ``--set`` key given a comma
list; ``--set <method>.<key>=v`` (``fedprox.mu=0.1``) applies to that method's
trials only, so adding a method to a sweep is one word in ``--methods``.

The sweep directory holds Tune's own experiment (``tune/``), the trials' run
directories (``runs/<trial id>/``), ``sweep.json`` (the grid, for ``--resume``),
``results.csv`` (one row per trial),
``rounds.csv`` (one row per trial and round), ``report.md`` and the plots of
:mod:`fedsim.experiments.report`. Every input is checked (methods, lists, every grid
point's config, the data, the cluster address) before anything is written.

This module is the command (flags, the sweep directory, Ray and the Tuner); the grid is built in
:mod:`fedsim.experiments.sweep_grid`, a trial is planned and run by :mod:`fedsim.experiments.sweep_trial`, and
the results are collected and written by :mod:`fedsim.experiments.sweep_results`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Optional

from fedsim.errors import UserError
from fedsim.experiments.sweep_grid import SweepSpec, prepare, spec_from_args
from fedsim.experiments.sweep_results import collect_records, write_results
from fedsim.experiments.sweep_trial import TrialResources, plan_trial, run_trial

log = logging.getLogger(__name__)

TUNE_NAME = "tune"  # Tune's experiment folder inside the sweep directory
SPEC_FILE = "sweep.json"
SPEC_FLAGS = (
    "config",
    "benchmark",
    "target",
    "rounds",
    "methods",
    "local_epochs",
    "seeds",
    "cpus_per_client",
    "gpus_per_client",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", help="comma-separated methods (see 'fedsim list'); default: the config's method")
    parser.add_argument("--local-epochs", help="comma-separated local epochs per round, e.g. 1,5")
    parser.add_argument("--seeds", help="comma-separated root seeds, e.g. 0,1")
    parser.add_argument("--benchmark", help="benchmark name (see 'fedsim list')")
    parser.add_argument("--target", help="target domain (unlabeled); the other domains are sources")
    parser.add_argument("--rounds", help="communication rounds of every trial")
    parser.add_argument("--config", help="YAML config file (sections data, model, method, run, resources)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key; a comma list (method.lr=0.01,0.1) becomes a grid axis; "
        "<method>.<key>=VALUE (fedprox.mu=0.1) sets a method's own parameter for its trials only",
    )
    parser.add_argument(
        "--cpus-per-client", help="CPUs each client actor reserves (fractions allowed; a list is an axis)"
    )
    parser.add_argument("--gpus-per-client", help="GPUs each client actor reserves, e.g. 0.25 (a list is an axis)")
    parser.add_argument(
        "--address", help="join an existing Ray cluster (host:port or auto); default: a fresh local cluster"
    )
    parser.add_argument("--out", help="sweep directory (default runs/sweep-<date>-<benchmark>-<target>)")
    parser.add_argument(
        "--resume", action="store_true", help="continue the interrupted sweep in --out (its grid comes from sweep.json)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no Tune progress and no table")


def _resolve_out(args, spec: Optional[SweepSpec], base) -> Path:
    if args.resume:
        if not args.out:
            raise UserError("--resume needs --out DIR: the directory of the sweep to continue")
        path = Path(args.out)
        if not (path / SPEC_FILE).is_file():
            raise UserError(
                f"--out {args.out} holds no sweep ({SPEC_FILE} missing): "
                "give the directory of an earlier 'fedsim sweep'"
            )
        return path
    from fedsim.experiments.cli import safe_name

    names = "-".join(safe_name(name) for name in (base.data.benchmark, base.data.target))
    out = args.out or f"runs/sweep-{time.strftime('%Y%m%d-%H%M%S')}-{names}"
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {out} is a file: give a directory path")
    if (path / SPEC_FILE).exists() or (path / TUNE_NAME).exists():
        raise UserError(f"--out {out} already holds a sweep: pass --resume to continue it, or choose another directory")
    return path


def _fit(tuner):
    """``tuner.fit()``; Tune turns Ctrl-C (SIGINT, also SIGUSR1) into a clean stop and leaves its
    handlers installed, so the previous handlers come back afterwards."""
    import signal
    import threading

    names = [s for s in (signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None]
    saved = {s: signal.getsignal(s) for s in names} if threading.current_thread() is threading.main_thread() else {}
    try:
        return tuner.fit()
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def _tuner(spec: SweepSpec, plans: dict, out: Path, *, resume: bool, quiet: bool, plugins: Optional[dict] = None):
    """The Tuner over the grid's trials (each placed by its plan), or the one restored from ``out``; ``plugins``:
    the plugin folders and entry-point names each trial adopts (:func:`fedsim.actors.plugins.plugin_settings`)."""
    from ray import tune

    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec_json=spec.to_json(), sweep_dir=str(out.resolve()), plugins=plugins),
        TrialResources(plans),
    )
    if resume:
        tune_dir = str(out.resolve() / TUNE_NAME)
        return tune.Tuner.restore(tune_dir, trainable=trainable, resume_unfinished=True, restart_errored=True)
    return tune.Tuner(
        trainable,
        param_space={key: tune.grid_search(values) for key, values in spec.axes.items()},
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(
            name=TUNE_NAME,
            storage_path=str(out.resolve()),
            verbose=0 if quiet else 1,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )


def run_grid(
    spec: SweepSpec,
    configs: dict,
    clients: dict,
    out: Path,
    *,
    address: Optional[str],
    resume: bool,
    quiet: bool,
    files: Optional[dict[str, str]] = None,
) -> list[dict]:
    """Start or join Ray, place every trial, run (or resume) the Tuner in ``out``; one record per trial.

    ``files`` (name -> text) are written into ``out`` once every check has passed, just before the
    first trial starts (not on ``resume``): nothing is written when a check fails."""
    import ray
    from ray import tune

    from fedsim.actors.backend import check_reachable, connect, shutdown_own_cluster
    from fedsim.actors.plugins import check_user_env, job_runtime_env, plugin_settings, plugins_of

    if address:
        check_reachable(address)  # also when this process already runs Ray
    plugins = plugins_of(configs.values())
    started = connect(address, runtime_env=job_runtime_env(plugins, check_user_env(configs.values()), bool(address)))
    try:
        cluster = ray.cluster_resources()
        if any(c.resources.gpus_per_client > 0 for c in configs.values()) and cluster.get("GPU", 0) == 0:
            log.warning("--gpus-per-client asked for GPUs but the Ray cluster has none: client actors run on CPU")
        plans = {key: plan_trial(config, clients[key], cluster, spec.backend) for key, config in configs.items()}
        tune_dir = out.resolve() / TUNE_NAME
        if resume and not tune.Tuner.can_restore(str(tune_dir)):
            raise UserError(
                f"--out {out} has no Tune state to resume ({tune_dir} is missing or empty): "
                "start anew in another directory"
            )
        out.mkdir(parents=True, exist_ok=True)
        for name, text in ({} if resume else (files or {})).items():
            (out / name).write_text(text)
        tuner = _tuner(spec, plans, out, resume=resume, quiet=quiet, plugins=plugin_settings(plugins))
        log.info("%d trials in %s", len(configs), out)
        return collect_records(_fit(tuner), spec, configs)
    finally:
        if started:
            shutdown_own_cluster()


def report_failures(records: list[dict], command: str, out: Path) -> int:
    """Failed and unfinished trials on stderr; 1 when some did not finish (continue with --resume), else 0."""
    for r in records:
        if r["status"] == "error":
            print(f"fedsim: trial {r['trial_id']} failed: {r.get('error', '')}", file=sys.stderr)
    unfinished = [r for r in records if r["status"] != "finished"]
    if unfinished:
        print(
            f"fedsim: {len(unfinished)} of {len(records)} trials did not finish: "
            f"continue with '{command} --resume --out {out}'",
            file=sys.stderr,
        )
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    """``fedsim sweep``: check everything, start or join Ray, run (or resume) the Tuner, write the report."""
    from fedsim.experiments import report as report_module

    if args.resume:
        given = [f"--{f.replace('_', '-')}" for f in SPEC_FLAGS if getattr(args, f, None) is not None] + (
            ["--set"] if args.set else []
        )
        if given:
            raise UserError(f"--resume takes the grid from the sweep's {SPEC_FILE}: drop {', '.join(given)}")
        out = _resolve_out(args, None, None)
        spec = SweepSpec.from_json((out / SPEC_FILE).read_text())
    else:
        spec = spec_from_args(args)
        out = None
    configs, clients = prepare(spec)
    if out is None:
        out = _resolve_out(args, spec, next(iter(configs.values())))
    records = run_grid(
        spec,
        configs,
        clients,
        out,
        address=args.address,
        resume=args.resume,
        quiet=args.quiet,
        files={SPEC_FILE: spec.to_json()},
    )
    write_results(out, records)
    written = report_module.write_report(out, records)
    if not args.quiet:
        print(report_module.markdown_table(records))
        print(
            f"sweep directory: {out}  ({', '.join(p.name for p in written)}, results.csv, rounds.csv; "
            f"Tune: {out / TUNE_NAME})"
        )
    return report_failures(records, "fedsim sweep", out)
