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

Beyond grids: a ``--set`` range (``method.lr=loguniform(1e-4,1e-1)``, ``uniform``, ``randint``, ``choice``) is
sampled by ``--search random|optuna`` (``--num-samples`` configurations, each run at every grid point, seeds
included), and ``--scheduler asha`` stops trials early; both rank trials by a score computed without target labels
(the first ``--select`` score, else ``source_accuracy`` or, without a validation part, ``entropy``):
:mod:`fedsim.experiments.sweep_space` (the settings), :mod:`fedsim.experiments.sweep_search` (Ray Tune's side).
``--select SCORE[,SCORE...]`` has every trial compute those scores (``run.scores``) and writes, after the sweep,
which setting each score picks per method (``selection.md``, ``selection.csv``, ``selection.png``:
:mod:`fedsim.experiments.selection`).

The sweep directory holds Tune's own experiment (``tune/``), the trials' run
directories (``runs/<trial id>/``), ``sweep.json`` (the grid, ranges and search settings, for ``--resume``),
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
from fedsim.experiments.flags import safe_name
from fedsim.experiments.sweep_grid import COLUMNS, SEARCH_FLAGS, SweepSpec, point_key, prepare, spec_from_args
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
    *SEARCH_FLAGS,
)
STRICT_METRIC_ENV = "TUNE_DISABLE_STRICT_METRIC_CHECKING"


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
        help="override a config key; a comma list (method.lr=0.01,0.1) becomes a grid axis; a range "
        "(method.lr=loguniform(1e-4,1e-1), uniform(a,b), randint(a,b) with b excluded, choice(a,b,c)) is sampled "
        "by --search; <method>.<key>=VALUE (fedprox.mu=0.1) sets a method's own parameter for its trials only",
    )
    parser.add_argument(
        "--search",
        choices=("random", "optuna"),
        help="sample the --set ranges: random (Tune's BasicVariantGenerator) or optuna (TPE; "
        "pip install 'fedsim-da[search]'); each sample runs at every grid point",
    )
    parser.add_argument("--num-samples", help="configurations --search samples (default 10)")
    parser.add_argument(
        "--scheduler",
        choices=("asha",),
        help="stop poor trials early: ASHA on the --select score per round (default source_accuracy with a "
        "validation part, else entropy)",
    )
    parser.add_argument("--grace-period", help="rounds every trial runs before ASHA may stop it (default 1)")
    parser.add_argument(
        "--select",
        metavar="SCORE[,SCORE...]",
        help="scores without target labels (entropy, snd, ...): every trial computes them; after the sweep, "
        "selection.md names the setting each one picks per method; the first ranks --search and --scheduler",
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
    names = "-".join(safe_name(name) for name in (base.data.benchmark, base.data.target))
    out = args.out or f"runs/sweep-{time.strftime('%Y%m%d-%H%M%S')}-{names}"
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {out} is a file: give a directory path")
    if (path / SPEC_FILE).exists() or (path / TUNE_NAME).exists():
        raise UserError(f"--out {out} already holds a sweep: pass --resume to continue it, or choose another directory")
    return path


def _fit(tuner, ranked: bool = False):
    """``tuner.fit()``; Tune turns Ctrl-C (SIGINT, also SIGUSR1) into a clean stop and leaves its
    handlers installed, so the previous handlers come back afterwards.

    ``ranked``: a searcher or scheduler reads a score, which a trial reports on evaluated rounds only
    (``run.eval_every``) and in its summary; Tune's check that every result carries it is off meanwhile (ASHA
    and :class:`fedsim.experiments.sweep_search.GridPoints` skip results without it)."""
    import os
    import signal
    import threading

    names = [s for s in (signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None]
    saved = {s: signal.getsignal(s) for s in names} if threading.current_thread() is threading.main_thread() else {}
    strict = os.environ.get(STRICT_METRIC_ENV)
    if ranked:
        os.environ[STRICT_METRIC_ENV] = "1"
    try:
        return tuner.fit()
    finally:
        if ranked:
            if strict is None:
                os.environ.pop(STRICT_METRIC_ENV, None)
            else:
                os.environ[STRICT_METRIC_ENV] = strict
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def _tuner(
    spec: SweepSpec,
    plans: dict,
    out: Path,
    *,
    resume: bool,
    quiet: bool,
    plugins: Optional[dict] = None,
    max_rounds: int = 1,
):
    """The Tuner over the grid's trials (each placed by its plan), or the one restored from ``out`` (with its
    searcher's state); ``plugins``: the plugin folders and entry-point names each trial adopts
    (:func:`fedsim.actors.plugins.plugin_settings`); ``max_rounds``: the longest trial's rounds (ASHA's horizon)."""
    from ray import tune

    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec_json=spec.to_json(), sweep_dir=str(out.resolve()), plugins=plugins),
        TrialResources(plans, keys=list(spec.axes)),
    )
    if resume:
        tune_dir = str(out.resolve() / TUNE_NAME)
        return tune.Tuner.restore(tune_dir, trainable=trainable, resume_unfinished=True, restart_errored=True)
    if not spec.search.empty:
        from fedsim.experiments import sweep_search

        points = spec.points()
        seed = int(spec.axes.get("run.seed", [0])[0])
        param_space = sweep_search.param_space(spec.axes, spec.ranges, spec.search)
        tune_config = tune.TuneConfig(
            reuse_actors=True,
            search_alg=sweep_search.search_algorithm(points, spec.search, seed),
            scheduler=sweep_search.scheduler(spec.search, max_rounds),
            num_samples=sweep_search.num_samples(points, spec.search),
        )
    else:
        param_space = {key: tune.grid_search(values) for key, values in spec.axes.items()}
        tune_config = tune.TuneConfig(reuse_actors=True)
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune_config,
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
        if any(c.resources.asks_gpus for c in configs.values()) and cluster.get("GPU", 0) == 0:
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
        tuner = _tuner(
            spec,
            plans,
            out,
            resume=resume,
            quiet=quiet,
            plugins=plugin_settings(plugins),
            max_rounds=max(c.run.rounds for c in configs.values()),
        )
        log.info("%d grid points in %s", len(configs), out)
        ranked = spec.search.ranked
        grid = _fit(tuner, ranked=ranked)
        return _records(grid, spec, configs)
    finally:
        if started:
            shutdown_own_cluster()


def _records(grid, spec: SweepSpec, configs: dict) -> list[dict]:
    """The trials' records (:func:`fedsim.experiments.sweep_results.collect_records`). A sampled trial's config is
    built from its own values; a trial the scheduler stopped early (Tune's last result ``done``, no summary) has the
    status ``stopped``."""
    configs = dict(configs)
    stopped = set()
    for result in grid:
        point = {k: v for k, v in (result.config or {}).items() if "." in k}
        if spec.ranges and point_key(point) not in configs:
            configs[point_key(point)] = spec.config_for(point)
        metrics = result.metrics or {}
        if spec.search.scheduler and metrics.get("done") and not result.error:
            stopped.add(metrics.get("trial_id"))
    records = collect_records(grid, spec, configs)
    for record in records:
        if record["status"] == "interrupted" and record["trial_id"] in stopped:
            record["status"] = "stopped"
    return records


def report_failures(records: list[dict], command: str, out: Path) -> int:
    """Failed and unfinished trials on stderr; 1 when some did not finish (continue with --resume), else 0. A trial
    the scheduler stopped early is done."""
    for r in records:
        if r["status"] == "error":
            print(f"fedsim: trial {r['trial_id']} failed: {r.get('error', '')}", file=sys.stderr)
    unfinished = [r for r in records if r["status"] not in ("finished", "stopped")]
    if unfinished:
        print(
            f"fedsim: {len(unfinished)} of {len(records)} trials did not finish: "
            f"continue with '{command} --resume --out {out}'",
            file=sys.stderr,
        )
        return 1
    return 0


def selection_keys(spec: SweepSpec) -> tuple[list[str], list[str]]:
    """(group_by, candidate_keys) of a sweep's selection, as results.csv names them: a group per method (and per
    swept ``data.*`` key: targets are never candidates of each other); the candidates are the other grid axes and
    the sampled keys, never the seed."""
    keys = [COLUMNS.get(k, k) for k in [*spec.axes, *spec.ranges]]
    group_by = ["method"] + [k for k in keys if k.startswith("data.")]
    return group_by, [k for k in keys if k not in group_by and k != "seed"]


def default_setting(spec: SweepSpec, candidate_keys: list[str]):
    """The default of each group of the selection (:func:`selection_keys`): a function of the group's values (its
    method, its swept ``data.*`` keys) giving each candidate key's value in a plain run of that method on the
    sweep's data (:func:`fedsim.experiments.selection.plain_config`: the method's defaults overlaid by its recipe;
    neither the sweep's config file nor its ``--set`` values: they are not what a user runs untuned). A
    ``<method>.<key>`` column takes that method's value, in its own groups only."""
    from fedsim.config import SECTIONS
    from fedsim.experiments.selection import flat_config, plain_config

    inverse = {column: key for key, column in COLUMNS.items()}

    def default(group: dict) -> dict:
        method = group["method"]
        point = {"method.name": method, **{k: v for k, v in group.items() if k.startswith("data.")}}
        plain = flat_config(plain_config(method, spec.config_for(point).to_dict()["data"]))
        values = {}
        for column in candidate_keys:
            section, name = inverse.get(column, column).split(".", 1)
            if section not in SECTIONS and section != method:
                continue  # another method's own key: not a setting of this group's trials
            key = f"{section if section in SECTIONS else 'method'}.{name}"
            if key in plain:
                values[column] = plain[key]
        return values

    return default


def write_selection_report(spec: SweepSpec, records: list[dict], out: Path) -> list[Path]:
    """``selection.md``, ``selection.csv`` and ``selection.png``: each ``--select`` score's pick per method, among
    the trials Tune has a config of (an interrupted sweep's trials that never started have none)."""
    from fedsim.experiments.selection import select, write_selection
    from fedsim.experiments.sweep_space import reported_name

    scores = [reported_name(name) for name in spec.search.select]
    group_by, candidate_keys = selection_keys(spec)
    keys = [*group_by, *candidate_keys]
    started = [r for r in records if all(k in r["params"] for k in keys)]  # Tune has no config of a trial never run
    rows = select(
        started, scores, group_by=group_by, candidate_keys=candidate_keys, default=default_setting(spec, candidate_keys)
    )
    return write_selection(out, rows, scores)


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
        if spec.search.search == "optuna":  # its saved searcher is an OptunaSearch
            from fedsim.experiments.sweep_space import require_optuna

            require_optuna()
    else:
        spec = spec_from_args(args)
        out = None
    configs, clients = prepare(spec)
    if spec.search.scheduler:
        from fedsim.experiments.sweep_space import check_schedule

        check_schedule(spec.search, max(c.run.rounds for c in configs.values()))
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
    if spec.search.select:
        written += write_selection_report(spec, records, out)
    if not args.quiet:
        print(report_module.markdown_table(records))
        print(
            f"sweep directory: {out}  ({', '.join(p.name for p in written)}, results.csv, rounds.csv; "
            f"Tune: {out / TUNE_NAME})"
        )
    return report_failures(records, "fedsim sweep", out)
