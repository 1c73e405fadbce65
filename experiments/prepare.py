"""``fedsim data prepare BENCHMARK``: build a benchmark's cached domains ahead of a grid.

The TEP windows are simulated in chunks over this machine's cores (``--workers``, default every core) or, with
``--address``, as Ray tasks on a cluster's, and cached class by class under ``data.cache_dir``, where every run, sweep
trial and cluster node that names the same settings finds them::

    fedsim data prepare tep --set data.windows_per_class=100
    fedsim data prepare tep --set data.windows_per_class=100 --address auto

Any other benchmark is built domain by domain (``Benchmark.load``), which caches what it caches.
"""

from __future__ import annotations

import argparse
import logging
import time

from fedsim.errors import UserError

log = logging.getLogger("fedsim")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """The ``data`` command and its ``prepare`` subcommand."""
    data = subparsers.add_parser("data", help="build a benchmark's cached data ahead of a run or a grid")
    actions = data.add_subparsers(dest="data_command", parser_class=type(data))
    prepare = actions.add_parser("prepare", help="simulate or build a benchmark's domains into data.cache_dir")
    prepare.add_argument("benchmark", help="benchmark name (see 'fedsim list'), e.g. tep")
    prepare.add_argument("--domains", help="comma-separated domains (default: every domain of the benchmark)")
    prepare.add_argument("--workers", help="processes on this machine (default: one per core)")
    prepare.add_argument("--address", help="run the simulation as Ray tasks on the cluster at this address (or auto)")
    prepare.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="data.KEY=VALUE",
        help="a data setting of the runs to prepare for, e.g. data.windows_per_class=100 (the cache key uses them)",
    )
    prepare.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return data


def _workers(text) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"--workers must be a positive integer (processes), got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Build the cache; prints one line per domain and the time taken."""
    from fedsim.config import load_config
    from fedsim.data.scenario import get_benchmark

    if getattr(args, "data_command", None) != "prepare":
        raise UserError("fedsim data takes a subcommand: fedsim data prepare BENCHMARK [--set data.KEY=VALUE]")
    for text in args.set:
        if not text.startswith("data."):
            raise UserError(f"fedsim data prepare takes data settings only (--set data.KEY=VALUE), got {text!r}")
    config = load_config(None, args.set, values={"data.benchmark": args.benchmark})
    workers = _workers(args.workers)
    benchmark = get_benchmark(config.data)
    domains = [d.strip() for d in args.domains.split(",") if d.strip()] if args.domains else benchmark.domains()
    start = time.perf_counter()
    if hasattr(benchmark, "class_windows") and getattr(benchmark, "windows", False):
        if args.address:
            from fedsim.actors.tep_tasks import RayCluster, cluster_cpus, ray_map

            with RayCluster(args.address):
                benchmark.class_windows(
                    domains, map_chunks=ray_map, workers=cluster_cpus(), keep=False, progress=not args.quiet
                )
        else:
            benchmark.class_windows(domains, workers=workers, keep=False, progress=not args.quiet)
    else:
        if args.address:
            raise UserError(f"--address applies to the tep windows only; {args.benchmark} is built on this machine")
        for domain in domains:
            benchmark.load(domain)
    print(
        f"{args.benchmark}: {len(domains)} domains ready in {config.data.cache_dir} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    return 0
