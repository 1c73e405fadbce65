"""The ``fedsim`` command line: ``fedsim run``, ``fedsim sweep``, ``fedsim reproduce``, ``fedsim report`` and
``fedsim list``.

Bad input ends with one line naming the problem and the fix, exit code 2, before anything is written
(numeric flags are range-checked by :mod:`fedsim.experiments.flags`, the same rule for every command). A value the run
computed that is no longer finite (:class:`fedsim.errors.NumericalError`) ends it the same way, its line naming the
method, round, client and quantity; the run directory keeps its last checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from fedsim.errors import UserError, unwrapped
from fedsim.experiments.flags import check_numeric_flags, safe_name

log = logging.getLogger("fedsim")
#: loggers whose INFO lines say nothing a user can act on (the embedded digits domains build in seconds)
QUIET_LOGGERS = ("fedsim.data.benchmarks.digits",)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit code 2 (argparse's default prints the whole usage)
        self.exit(2, f"fedsim: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedsim", description="Federated domain adaptation simulator")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    run = sub.add_parser(
        "run", help="run one experiment (default: FedAvg on embedded digits, target mnistm, Ray backend)"
    )
    run.add_argument("--config", help="YAML config file (sections data, model, method, run, resources)")
    run.add_argument("--method", help="method name (see 'fedsim list') or a plugin's module.path:Class")
    run.add_argument("--benchmark", help="benchmark name (see 'fedsim list') or a plugin's module.path:Class")
    run.add_argument("--target", help="target domain (unlabeled); the other domains are sources")
    run.add_argument("--rounds", help="communication rounds")
    run.add_argument("--local-epochs", help="local epochs per round")
    run.add_argument("--clients-per-domain", help="split each domain across K clients")
    run.add_argument("--seed", help="root seed of the run")
    run.add_argument("--backend", help="ray (default) or local (serial, for debugging)")
    run.add_argument(
        "--address", help="join an existing Ray cluster (host:port or auto); default: a fresh local cluster"
    )
    run.add_argument("--cpus-per-client", help="CPUs each client actor requests (fractions allowed)")
    run.add_argument("--gpus-per-client", help="GPUs each client actor requests (fractions allowed)")
    run.add_argument("--clients-per-round", help="clients sampled per round: a count, or a fraction in (0, 1)")
    run.add_argument("--sources", help="comma-separated source domains (default: every domain but the target)")
    run.add_argument(
        "--inject-faults", help="Ray backend: kill this many client actors at seeded rounds (recovery demo)"
    )
    run.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    run.add_argument("--out", help="run directory (default runs/<date>-<method>-<benchmark>-<target>)")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config key, e.g. method.lr=0.01",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no table")
    sub.add_parser("list", help="list methods (with their task), benchmarks and their domains")
    # light imports: Ray and matplotlib load only when a command runs
    from fedsim.experiments import prepare, report, reproduce, sweep

    sweep.add_arguments(
        sub.add_parser("sweep", help="Ray Tune grid over methods x local epochs x seeds (x any --set list)")
    )
    reproduce.add_arguments(
        sub.add_parser("reproduce", help="run a paper's protocol (a spec: grid + claims) as Ray Tune trials")
    )
    report.add_arguments(sub.add_parser("report", help="plots and a markdown table for a run or a sweep directory"))
    prepare.add_parser(sub)
    return parser


def config_from_args(args: argparse.Namespace):
    """The ExperimentConfig of ``fedsim run``: the YAML file, then ``--set`` (YAML scalars), then the named flags
    (one map, ``fedsim.config.KEYWORDS``, shared with ``fedsim.run``)."""
    from fedsim.config import KEYWORDS, keyword_values, load_config

    values = keyword_values({flag: getattr(args, flag, None) for flag in KEYWORDS})
    if getattr(args, "quiet", False):
        values["run.progress"] = False
    return load_config(args.config, args.set, values=values)


def resolve_out_dir(config, out: Optional[str]) -> Path:
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        names = (config.method.name, config.data.benchmark, config.data.target)
        out = f"runs/{stamp}-" + "-".join(safe_name(name) for name in names)
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {out} is a file: give a directory path")
    if path.is_dir() and any((path / name).exists() for name in ("summary.json", "metrics.jsonl")):
        raise UserError(f"--out {out} already holds a run: choose another directory or delete it")
    return path


def format_table(summary: dict, out_dir: Path) -> str:
    rows = [("domain", "role", "accuracy")]
    target = summary["target_accuracy"]
    rows.append((summary["target"], "target", "n/a" if target is None else f"{target:.4f}"))
    for domain, acc in sorted(summary["source_accuracy"].items()):
        rows.append((domain, "source", f"{acc:.4f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [
        f"{summary['method']} on {summary['benchmark']}, {summary['rounds']} rounds, "
        f"{summary['backend']} backend, seed {summary['seed']}"
    ]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append(
        f"bytes sent {summary['bytes_sent']:,}  received {summary['bytes_received']:,}  "
        f"wall {summary['wall_seconds']:.1f} s"
    )
    lines.append(f"run directory: {out_dir}  (tensorboard --logdir {out_dir / 'tb'})")
    return "\n".join(lines)


RESUME_COMPATIBLE = {"resume", "backend", "address", "quiet", "command"}


def cmd_run(args) -> int:
    from fedsim.api import run_experiment

    if args.resume:
        from fedsim.config import keyword_values, load_config
        from fedsim.runtime.checkpoint import load_checkpoint

        given = [k for k, v in vars(args).items() if k not in RESUME_COMPATIBLE and v not in (None, [], False)]
        if given:
            raise UserError(
                f"--resume continues a run with its saved config: drop --{given[0].replace('_', '-')} "
                "(only --backend and --address may change)"
            )
        out_dir = Path(args.resume)
        payload = load_checkpoint(out_dir)
        values = keyword_values({"backend": args.backend, "address": args.address})
        if args.quiet:
            values["run.progress"] = False
        config = load_config(out_dir / "config.yaml", values=values)
        result = run_experiment(config, out_dir, resume=payload)
        if not args.quiet:
            print(format_table(result.summary, out_dir))
        return 0
    config = config_from_args(args)
    log_recipe(config)
    out_dir = resolve_out_dir(config, args.out)
    result = run_experiment(config, out_dir)
    if not args.quiet:
        print(format_table(result.summary, out_dir))
    return 0


def log_recipe(config) -> None:
    """One line naming the recipe a run took its unset keys from (:mod:`fedsim.recipes`), and how to leave it."""
    from fedsim.recipes import applied

    recipe = applied(config)
    if recipe is not None:
        values = ", ".join(f"{key}={value}" for key, value in recipe.values.items())
        log.info(
            "recipe %s (%s) under the config and flags: %s; --set run.recipe=none runs the bare defaults",
            recipe.name,
            recipe.protocol,
            values,
        )


def print_recipes() -> None:
    """``fedsim list``'s recipes: each (method, benchmark) pair's settings and their sources."""
    from fedsim.recipes import recipes

    print("recipes (what a plain run of the pair sets; a flag or --set overrides, --set run.recipe=none drops it):")
    for recipe in recipes():
        print(f"  {recipe.name}: the protocol of {recipe.protocol}")
        for s in recipe.settings:
            print(f"    {s.key}={s.value}  ({s.source})")


def _first_doc_line(obj) -> str:
    """The first line of a model function's docstring, or of its module's."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    doc = (getattr(obj, "__doc__", None) or getattr(module, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def _model_options(model, width: int) -> str:
    """A line naming a model's own ``model.<option>`` keys (its ``Options``), after a newline; "" without."""
    import dataclasses

    from fedsim.coercion import NoOptions

    options = [f"model.{f.name}" for f in dataclasses.fields(getattr(model, "Options", NoOptions))]
    return f"\n  {'':{width}s} options: {', '.join(options)}" if options else ""


def cmd_list() -> int:
    """Methods (with their task), benchmarks (with their domains) and models, built-in and plugins (with where
    each plugin comes from), then the recipes with their sources; what cannot be loaded is listed with the
    reason."""
    from fedsim.config import DataConfig
    from fedsim.data.scenario import get_benchmark
    from fedsim.registry import BENCHMARKS, MECHANISMS, METHODS, MODELS, SCORES

    registries = (METHODS, BENCHMARKS, MODELS, SCORES, MECHANISMS)
    names = {registry.kind: registry.names() for registry in registries}
    width = max(len(n) for registry in registries for n in names[registry.kind] + list(registry.unavailable))

    def footer(registry, name: str) -> None:
        if name in registry.plugins():
            print(f"  {'':{width}s} plugin: {registry.plugins()[name]}")

    def unavailable(registry) -> None:
        for module, reason in sorted(registry.unavailable.items()):
            print(f"  {module:{width}s} (not available: {reason})")

    print("methods:")
    for name in names["method"]:
        cls = METHODS.get(name)
        print(f"  {name:{width}s} {cls.task:14s} {cls.description()}")
        footer(METHODS, name)
    unavailable(METHODS)
    print("benchmarks:")
    for name in names["benchmark"]:
        benchmark = get_benchmark(DataConfig(benchmark=name))
        try:
            domains = ", ".join(benchmark.domains())
        except UserError as exc:
            domains = f"(user files: {exc})"
        print(
            f"  {name:{width}s} {type(benchmark).task:14s} {type(benchmark).description()}\n"
            f"  {'':{width}s} domains: {domains}"
        )
        footer(BENCHMARKS, name)
    unavailable(BENCHMARKS)
    print("models (--set model.name=...):")
    for name in names["model"]:
        print(f"  {name:{width}s} {_first_doc_line(MODELS.get(name))}{_model_options(MODELS.get(name), width)}")
        footer(MODELS, name)
    unavailable(MODELS)
    for registry, title in (
        (SCORES, "selection scores (--set run.scores=...)"),
        (MECHANISMS, "privacy mechanisms (--set privacy.mode=...)"),
    ):
        print(f"{title}:")
        for name in registry.names():
            print(f"  {name:{width}s} {registry.get(name).description}")
            footer(registry, name)
        unavailable(registry)
    print_recipes()
    return 0


#: command -> its function, or the module whose ``run(args)`` it is (imported only when it runs)
COMMANDS = {
    "run": cmd_run,
    "sweep": "fedsim.experiments.sweep",
    "reproduce": "fedsim.experiments.reproduce",
    "report": "fedsim.experiments.report",
    "data": "fedsim.experiments.prepare",
}
#: numeric flags that take comma lists, per command
LIST_FLAGS = {"sweep": ("local_epochs", "seeds", "cpus_per_client", "gpus_per_client"), "reproduce": ("seeds",)}


def dispatch(args) -> int:
    """Range-check the numeric flags, then run the command."""
    import importlib

    check_numeric_flags(args, lists=LIST_FLAGS.get(args.command, ()))
    if args.command == "list":
        return cmd_list()
    command = COMMANDS[args.command]
    return command(args) if callable(command) else importlib.import_module(command).run(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("fedsim").setLevel(logging.INFO)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # name the subcommand whose --help lists the right flags
        prog = f"fedsim {args.command}" if args.command else "fedsim"
        parser.exit(2, f"fedsim: error: unrecognized arguments: {' '.join(unknown)} (see '{prog} --help')\n")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return dispatch(args)
    except UserError as exc:  # unwrapped: one raised in a Ray actor arrives inside the backend's error
        print(f"fedsim: error: {unwrapped(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedsim: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
