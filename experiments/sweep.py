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
:mod:`experiments.report`. Every input is checked (methods, lists, every grid
point's config, the data, the cluster address) before anything is written.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import logging
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from fedsim.errors import UserError
from fedsim.runtime.callbacks import Callback

log = logging.getLogger(__name__)

TRIAL_CPUS = 0.1  # head bundle: the trial coordinator only waits on the ServerActor
TUNE_NAME = "tune"  # Tune's experiment folder inside the sweep directory
RUNS_DIR = "runs"  # the trials' run directories (metrics.jsonl, summary.json, tb/), one per trial id
SPEC_FILE = "sweep.json"

# Grid flags: flag -> (config key, column in results.csv, item type, example)
GRID_FLAGS = {
    "methods": ("method.name", "method", str, "fedavg,fedprox"),
    "local_epochs": ("method.local_epochs", "local_epochs", int, "1,5"),
    "seeds": ("run.seed", "seed", int, "0,1"),
    "cpus_per_client": ("resources.cpus_per_client", "cpus_per_client", float, "0.5"),
    "gpus_per_client": ("resources.gpus_per_client", "gpus_per_client", float, "0,0.25"),
}
ALWAYS_AXES = ("method.name", "method.local_epochs", "run.seed")  # columns every results.csv has
COLUMNS = {key: column for key, column, _, _ in GRID_FLAGS.values()}
FORBIDDEN_SET = {
    "run.address": "pass --address instead",
    "run.out": "pass --out instead",
    "run.backend": "every trial runs on the Ray backend",
}
SPEC_FLAGS = ("config", "benchmark", "target", "rounds", "methods", "local_epochs", "seeds", "cpus_per_client", "gpus_per_client")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", help="comma-separated methods (see 'fedsim list'); default: the config's method")
    parser.add_argument("--local-epochs", help="comma-separated local epochs per round, e.g. 1,5")
    parser.add_argument("--seeds", help="comma-separated root seeds, e.g. 0,1")
    parser.add_argument("--benchmark", help="benchmark name (see 'fedsim list')")
    parser.add_argument("--target", help="target domain (unlabeled); the other domains are sources")
    parser.add_argument("--rounds", help="communication rounds of every trial")
    parser.add_argument("--config", help="YAML config file (sections data, model, method, run, resources)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config key; a comma list (method.lr=0.01,0.1) becomes a grid axis; "
                             "<method>.<key>=VALUE (fedprox.mu=0.1) sets a method's own parameter for its trials only")
    parser.add_argument("--cpus-per-client", help="CPUs each client actor reserves (fractions allowed; a list is an axis)")
    parser.add_argument("--gpus-per-client", help="GPUs each client actor reserves, e.g. 0.25 (a list is an axis)")
    parser.add_argument("--address", help="join an existing Ray cluster (host:port or auto); default: a fresh local cluster")
    parser.add_argument("--out", help="sweep directory (default runs/sweep-<date>-<benchmark>-<target>)")
    parser.add_argument("--resume", action="store_true", help="continue the interrupted sweep in --out (its grid comes from sweep.json)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no Tune progress and no table")


# ----------------------------------------------------------------------------- the grid


@dataclass
class SweepSpec:
    """What a sweep runs: one base config (the YAML file's sections + constant overrides) and the grid axes.

    The YAML is read once, on the machine that starts the sweep, so trials on other nodes need no copy of it.
    """

    config_file: Optional[str]  # where ``base`` came from (for the record)
    base: dict  # the YAML file's sections
    overrides: list[str]
    axes: dict[str, list] = field(default_factory=dict)  # config key -> values, in flag order

    def points(self) -> list[dict[str, Any]]:
        keys = list(self.axes)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.axes[k] for k in keys))]

    def overrides_for(self, point: dict[str, Any]) -> list[str]:
        """Constant overrides + the point's values; ``<method>.<key>`` applies to that method's trials only."""
        from fedsim.config import SECTIONS

        method = point.get("method.name")
        out = []
        for text in self.overrides:
            key, value = text.split("=", 1)
            section, name = key.split(".", 1)
            if section in SECTIONS:
                out.append(text)
            elif section == method:
                out.append(f"method.{name}={value}")
        return out + [f"{key}={render(value)}" for key, value in point.items()]

    def config_for(self, point: dict[str, Any], extra: tuple[str, ...] = ("run.progress=false",)):
        """The point's ExperimentConfig. Method parameters of the YAML file (``method.mu``) are kept
        for trials of the file's own method and left out for the other methods of the sweep."""
        from fedsim.config import MethodConfig, load_config
        from fedsim.registry import METHODS

        raw = {k: dict(v or {}) for k, v in self.base.items()}
        method = point.get("method.name")
        section = raw.get("method")
        if isinstance(section, dict) and method and section.get("name", MethodConfig.name) != method and method in METHODS:
            params = getattr(METHODS.get(method), "Params", None)
            valid = {f.name for f in dataclasses.fields(MethodConfig)} | ({f.name for f in dataclasses.fields(params)} if params else set())
            raw["method"] = {k: v for k, v in section.items() if k in valid}
        try:
            return load_config(None, self.overrides_for(point) + list(extra), base=raw)
        except UserError as exc:
            if "unknown config key 'method." not in str(exc):
                raise
            raise UserError(f"{exc} (in the trials of {method}): set a method's own parameter for its trials only "
                            "with --set <method>.<key>=VALUE") from None

    def to_json(self) -> str:
        return json.dumps({"config_file": self.config_file, "base": self.base, "overrides": self.overrides, "axes": self.axes},
                          indent=2, default=str) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "SweepSpec":
        raw = json.loads(text)
        return cls(raw["config_file"], dict(raw["base"]), list(raw["overrides"]), dict(raw["axes"]))


def render(value: Any) -> str:
    """A grid value back to override text that YAML parses to the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def point_key(point: dict[str, Any]) -> str:
    return json.dumps({k: point[k] for k in sorted(point)}, sort_keys=True, default=str)


def parse_list(flag: str, text: str, kind: type, example: str) -> list:
    """'1,5' -> [1, 5]; empty items, wrong types and repeats are one-line errors."""
    items = [item.strip() for item in str(text).split(",")]
    if any(not item for item in items):
        raise UserError(f"bad list for --{flag} {text!r}: give comma-separated values without blanks, e.g. --{flag} {example}")
    values = []
    for item in items:
        try:
            value = kind(item) if kind is not int else int(item, 10)
        except ValueError:
            raise UserError(f"bad value {item!r} in --{flag} {text!r}: give comma-separated {kind.__name__}s, e.g. --{flag} {example}") from None
        if value in values:
            raise UserError(f"--{flag} {text!r} lists {item!r} twice: give each value once")
        values.append(value)
    return values


def parse_set(items: list[str]) -> tuple[list[str], dict[str, list]]:
    """--set items -> (constant overrides, grid axes); a comma list outside [..] / {..} is an axis."""
    from fedsim.config import SECTIONS, parse_override
    from fedsim.registry import METHODS

    constants: list[str] = []
    axes: dict[str, list] = {}
    seen: set[str] = set()
    for text in items:
        (section, key), _ = parse_override(text)  # checks the section.key=value shape
        name = f"{section}.{key}"
        if section not in SECTIONS:
            if section not in METHODS:
                raise UserError(f"unknown config section or method {section!r} in --set {text}: "
                                f"use one of {', '.join(SECTIONS)}, or a method name for that method's trials only")
            if "," in text.split("=", 1)[1] and not text.split("=", 1)[1].strip().startswith(("[", "{")):
                raise UserError(f"--set {name} takes one value: sweep a method's own parameter with --methods {section} --set method.{key}=...")
        if name in FORBIDDEN_SET:
            raise UserError(f"--set {text} is not allowed in a sweep: {FORBIDDEN_SET[name]}")
        if name in seen:
            raise UserError(f"--set {name} given twice: give it once (a comma list makes it a grid axis)")
        seen.add(name)
        raw = text.split("=", 1)[1].strip()
        if "," in raw and not raw.startswith(("[", "{")):
            values = parse_list(f"set {name}=", raw, str, "0.01,0.1")
            axes[name] = [_yaml_value(name, v) for v in values]
        else:
            constants.append(f"{name}={raw}")
    return constants, axes


def _yaml_value(name: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise UserError(f"bad value {text!r} for --set {name}: give plain values such as 0.1, 5, true or a name") from None


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """The flags -> a SweepSpec; the three main axes always exist (a single value when not given)."""
    from fedsim.config import load_config, read_yaml
    from fedsim.registry import METHODS, unknown_name_message

    constants, set_axes = parse_set(list(args.set or []))
    for flag, key in (("benchmark", "data.benchmark"), ("target", "data.target"), ("rounds", "run.rounds")):
        value = getattr(args, flag, None)
        if value is not None:
            if "," in str(value):
                raise UserError(f"--{flag} takes one value, got {value!r}: sweep it with --set {key}={value}")
            if any(c.startswith(f"{key}=") for c in constants) or key in set_axes:
                raise UserError(f"{key} given twice (--{flag} and --set): keep one")
            constants.append(f"{key}={value}")
    config_file = str(Path(args.config).resolve()) if args.config else None
    base = load_config(config_file)  # checks the file; the overrides are checked with every grid point
    raw = read_yaml(config_file) if config_file else {}
    axes: dict[str, list] = {}
    for flag, (key, _, kind, example) in GRID_FLAGS.items():
        text = getattr(args, flag, None)
        if text is None:
            continue
        if key in set_axes or any(c.startswith(f"{key}=") for c in constants):
            raise UserError(f"{key} given twice (--{flag.replace('_', '-')} and --set): keep one")
        values = parse_list(flag.replace("_", "-"), text, kind, example)
        if len(values) == 1 and key not in ALWAYS_AXES:
            constants.append(f"{key}={render(values[0])}")  # one value: a setting, not a column
        else:
            axes[key] = values
    for name in axes.get("method.name", []):
        if name not in METHODS:
            raise UserError(unknown_name_message("method", name, METHODS.names(), "--methods"))
    for key in ALWAYS_AXES:
        if key not in axes and key not in set_axes:
            section, name = key.split(".")
            given = [c.split("=", 1)[1] for c in constants if c.split("=", 1)[0] == key]
            axes[key] = [_yaml_value(key, given[0])] if given else [getattr(getattr(base, section), name)]
    for key, values in set_axes.items():
        axes[key] = values
    constants = [c for c in constants if c.split("=", 1)[0] not in axes]
    ordered = {key: axes[key] for key in ALWAYS_AXES}
    ordered.update({key: values for key, values in axes.items() if key not in ordered})
    return SweepSpec(config_file, raw, constants, ordered)


# ----------------------------------------------------------------------------- resources


@dataclass(frozen=True)
class TrialPlan:
    actors: int
    cpus: float
    gpus: float

    def bundles(self) -> list[dict[str, float]]:
        client = {"CPU": self.cpus, "GPU": self.gpus} if self.gpus > 0 else {"CPU": self.cpus}
        return [{"CPU": TRIAL_CPUS}] + [dict(client) for _ in range(self.actors)]


def plan_trial(config, num_clients: int, cluster: dict[str, float]) -> TrialPlan:
    """Client actors of one trial: one per client, at most ``resources.max_actors``, and few enough
    that the whole trial fits in the cluster as it is now (so it can always be placed)."""
    cpus = config.resources.cpus_per_client
    gpus = config.resources.gpus_per_client if cluster.get("GPU", 0) > 0 else 0.0
    total_cpus = cluster.get("CPU", 0.0)
    if cpus + TRIAL_CPUS > total_cpus + 1e-9:
        raise UserError(
            f"a trial needs {cpus + TRIAL_CPUS:g} CPUs (one client actor at resources.cpus_per_client={cpus:g} + {TRIAL_CPUS:g} "
            f"for the trial) but the Ray cluster has {total_cpus:g} now: lower --cpus-per-client, or wait for worker nodes (ray status)"
        )
    if gpus > cluster.get("GPU", 0.0) + 1e-9:
        raise UserError(f"--gpus-per-client {gpus:g} is more than the {cluster['GPU']:g} GPUs of the Ray cluster: lower it")
    count = num_clients
    if config.resources.max_actors:
        count = min(count, config.resources.max_actors)
    count = min(count, math.floor((total_cpus - TRIAL_CPUS) / cpus + 1e-9))
    if gpus > 0:
        count = min(count, math.floor(cluster["GPU"] / gpus + 1e-9))
    return TrialPlan(max(1, count), cpus, gpus)


class TrialResources:
    """``tune.with_resources`` callable: a trial's config -> its PlacementGroupFactory."""

    def __init__(self, plans: dict[str, TrialPlan]):
        self.plans = plans

    def __call__(self, config: dict):
        from ray import tune

        point = {k: v for k, v in config.items() if "." in k}
        return tune.PlacementGroupFactory(self.plans[point_key(point)].bundles(), strategy="PACK")


# ----------------------------------------------------------------------------- inside a trial


def flatten(metrics: dict, prefix: str = "") -> dict[str, Any]:
    """{'source_accuracy': {'usps': 0.9}} -> {'source_accuracy/usps': 0.9}; None values are dropped."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "/"))
        elif value is not None:
            flat[name] = value
    return flat


class TuneReport(Callback):
    """Sends every round's metrics to Tune, with running byte totals, elapsed time and the
    nodes of the trial's client actors (``client_nodes``, comma-separated node ids)."""

    def __init__(self, report=None):
        self._report = report
        self.nodes = ""

    def on_run_start(self, simulator) -> None:
        self.started = time.perf_counter()
        self.sent = self.received = 0
        client_nodes = getattr(simulator.server, "client_nodes", None)
        if callable(client_nodes):
            self.nodes = ",".join(sorted(set(client_nodes())))

    def on_round_end(self, simulator, metrics: dict) -> None:
        self.sent += int(metrics.get("bytes_sent", 0))
        self.received += int(metrics.get("bytes_received", 0))
        row = flatten(metrics)
        row.update(bytes_sent_total=self.sent, bytes_received_total=self.received,
                   elapsed_seconds=round(time.perf_counter() - self.started, 3))
        if self.nodes:
            row["client_nodes"] = self.nodes
        report = self._report
        if report is None:
            from ray import tune

            report = tune.report
        report(row)


def run_trial(params: dict, spec_json: str = "", sweep_dir: str = "") -> None:
    """Tune's trainable: one simulation with as many client actors as the trial reserved bundles.

    Its run directory is ``<sweep>/runs/<trial id>`` (written on the node that runs the trial;
    ``tune.get_context().get_trial_dir()`` is a scratch directory of the Ray session)."""
    from ray import tune

    from experiments.run import run_experiment
    from fedsim.runtime.simulator import default_callbacks

    context = tune.get_context()
    request = context.get_trial_resources()
    actors = len(request.bundles) - (0 if request.head_bundle_is_empty else 1)
    point = {k: v for k, v in params.items() if "." in k}
    spec = SweepSpec.from_json(spec_json)
    config = spec.config_for(point, ("run.backend=ray", "run.progress=false", f"resources.max_actors={max(1, actors)}"))
    out_dir = Path(sweep_dir) / RUNS_DIR / context.get_trial_id()
    reporter = TuneReport()
    result = run_experiment(config, out_dir, callbacks=default_callbacks(config, out_dir) + [reporter])
    tune.report(summary_row(result.summary, reporter.nodes))


def summary_row(summary: dict, nodes: str) -> dict:
    """The last result of a trial: the run's summary under ``summary/`` (its presence marks the trial finished)."""
    sources = list((summary.get("source_accuracy") or {}).values())
    row = {f"summary/{key}": summary[key] for key in ("rounds", "target_accuracy", "bytes_sent", "bytes_received", "wall_seconds")
           if summary.get(key) is not None}
    if sources:
        row["summary/mean_source_accuracy"] = sum(sources) / len(sources)
    if nodes:
        row["client_nodes"] = nodes
    return row


# ----------------------------------------------------------------------------- results


def _cell(value: Any) -> Any:
    if value is None:
        return None
    try:
        if isinstance(value, float) and math.isnan(value):
            return None
    except TypeError:
        pass
    if hasattr(value, "item"):  # numpy / pandas scalars
        return value.item()
    return value


def _int(value: Any) -> Optional[int]:
    value = _cell(value)
    return None if value is None else int(value)


def _history(rows: list[dict]) -> list[dict]:
    """Per-round rows of one trial; a trial restarted by --resume starts its rounds again, keep the last attempt."""
    history: list[dict] = []
    for row in rows:
        rnd = _cell(row.get("round"))
        if rnd is None:
            continue
        if history and int(rnd) <= history[-1]["round"]:
            history = []
        history.append({
            "round": int(rnd),
            "target_accuracy": _cell(row.get("target_accuracy")),
            "mean_source_accuracy": _cell(row.get("mean_source_accuracy")),
            "bytes_total": (_int(row.get("bytes_sent_total")) or 0) + (_int(row.get("bytes_received_total")) or 0),
        })
    return history


def collect_records(result_grid, spec: SweepSpec, configs: dict[str, Any]) -> list[dict]:
    """Tune's ResultGrid -> the records of :mod:`experiments.report` (one per trial, with its rounds)."""
    records = []
    for result in result_grid:
        point = {k: v for k, v in (result.config or {}).items() if "." in k}
        config = configs.get(point_key(point))
        frame = result.metrics_dataframe
        rows = [] if frame is None else frame.to_dict("records")
        history = _history(rows)
        final = rows[-1] if rows and _cell(rows[-1].get("summary/rounds")) is not None else {}
        if result.error:
            status = "error"
        elif final:
            status = "finished"
        else:
            status = "interrupted" if history else "pending"
        last = next((row for row in reversed(rows) if _cell(row.get("client_nodes"))), {})
        trial_id = (result.metrics or {}).get("trial_id") or Path(str(result.path)).name
        record = {
            "trial_id": trial_id,
            "status": status,
            "params": {COLUMNS.get(k, k): v for k, v in point.items()},
            "benchmark": config.data.benchmark if config else None,
            "target": config.data.target if config else None,
            "rounds": _int(final.get("summary/rounds")) or (history[-1]["round"] if history else 0),
            "target_accuracy": _cell(final.get("summary/target_accuracy")),
            "mean_source_accuracy": _cell(final.get("summary/mean_source_accuracy")),
            "bytes_sent": _int(final.get("summary/bytes_sent")),
            "bytes_received": _int(final.get("summary/bytes_received")),
            "wall_seconds": _cell(final.get("summary/wall_seconds")),
            "client_nodes": _cell(last.get("client_nodes")) or "",
            "history": history,
        }
        if result.error:
            text = str(result.error).strip()
            record["error"] = text.splitlines()[-1][:300] if text else type(result.error).__name__
        records.append(record)
    order = {point_key(p): i for i, p in enumerate(spec.points())}
    inverse = {v: k for k, v in COLUMNS.items()}
    records.sort(key=lambda r: order.get(point_key({inverse.get(k, k): v for k, v in r["params"].items()}), len(order)))
    return records


# ----------------------------------------------------------------------------- the command


def _resolve_out(args, spec: Optional[SweepSpec], base) -> Path:
    if args.resume:
        if not args.out:
            raise UserError("--resume needs --out DIR: the directory of the sweep to continue")
        path = Path(args.out)
        if not (path / SPEC_FILE).is_file():
            raise UserError(f"--out {args.out} holds no sweep ({SPEC_FILE} missing): give the directory of an earlier 'fedsim sweep'")
        return path
    out = args.out or f"runs/sweep-{time.strftime('%Y%m%d-%H%M%S')}-{base.data.benchmark}-{base.data.target}"
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {out} is a file: give a directory path")
    if (path / SPEC_FILE).exists() or (path / TUNE_NAME).exists():
        raise UserError(f"--out {out} already holds a sweep: pass --resume to continue it, or choose another directory")
    return path


def _absolute_paths(spec: SweepSpec, config) -> None:
    """Trials run in Tune's trial directories: make relative data paths absolute up front."""
    for key, value in (("data.root", config.data.root), ("data.cache_dir", config.data.cache_dir)):
        if value and not Path(value).is_absolute() and key not in spec.axes:
            spec.overrides = [o for o in spec.overrides if not o.startswith(f"{key}=")] + [f"{key}={Path(value).resolve()}"]


def prepare(spec: SweepSpec) -> tuple[dict[str, Any], dict[str, int]]:
    """Every grid point's config and client count: all bad input fails here, before Ray starts."""
    from fedsim.data.scenario import build_federation

    points = spec.points()
    first = spec.config_for(points[0])
    _absolute_paths(spec, first)
    configs = {}
    for point in points:
        config = spec.config_for(point)
        if config.data.root and not Path(config.data.root).is_absolute():
            raise UserError(f"data.root {config.data.root!r} is relative: give an absolute path when sweeping it")
        configs[point_key(point)] = config
    clients: dict[str, int] = {}
    federations: dict[Any, int] = {}
    for key, config in configs.items():
        if config.data not in federations:
            federations[config.data] = len(build_federation(config.data).clients)
        clients[key] = federations[config.data]
    return configs, clients


def write_results(out: Path, records: list[dict]) -> tuple[Path, Path]:
    """``results.csv`` (one row per trial) and ``rounds.csv`` (one row per trial and round)."""
    param_names: list[str] = []
    for record in records:
        param_names += [k for k in record["params"] if k not in param_names]
    results_path, rounds_path = out / "results.csv", out / "rounds.csv"
    fields = ["trial_id", "status"] + param_names + ["benchmark", "target", "rounds", "target_accuracy", "mean_source_accuracy",
                                                     "bytes_sent", "bytes_received", "wall_seconds", "client_nodes"]
    if any(r.get("error") for r in records):
        fields.append("error")
    with results_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in records:
            writer.writerow({**{k: r.get(k) for k in fields if k not in param_names}, **r["params"]})
    with rounds_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["trial_id", "round", "target_accuracy", "mean_source_accuracy", "bytes_total"])
        writer.writeheader()
        for r in records:
            for h in r["history"]:
                writer.writerow({"trial_id": r["trial_id"], **h})
    return results_path, rounds_path


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


def run(args: argparse.Namespace) -> int:
    """``fedsim sweep``: check everything, start or join Ray, run (or resume) the Tuner, write the report."""
    from experiments import report as report_module

    if args.resume:
        given = [f"--{f.replace('_', '-')}" for f in SPEC_FLAGS if getattr(args, f, None) is not None] + (["--set"] if args.set else [])
        if given:
            raise UserError(f"--resume takes the grid from the sweep's {SPEC_FILE}: drop {', '.join(given)}")
        out = _resolve_out(args, None, None)
        spec = SweepSpec.from_json((out / SPEC_FILE).read_text())
    else:
        spec = spec_from_args(args)
        out = None
    configs, clients = prepare(spec)
    base = next(iter(configs.values()))
    if out is None:
        out = _resolve_out(args, spec, base)

    import ray
    from ray import tune

    from actors.backend import _check_reachable, connect

    if args.address:
        _check_reachable(args.address)  # also when this process already runs Ray
    started = connect(args.address)
    try:
        cluster = ray.cluster_resources()
        if any(c.resources.gpus_per_client > 0 for c in configs.values()) and cluster.get("GPU", 0) == 0:
            warnings.warn("--gpus-per-client asked for GPUs but the Ray cluster has none: client actors run on CPU", RuntimeWarning, stacklevel=2)
        plans = {key: plan_trial(config, clients[key], cluster) for key, config in configs.items()}
        tune_dir = out.resolve() / TUNE_NAME
        if args.resume and not tune.Tuner.can_restore(str(tune_dir)):
            raise UserError(f"--out {out} has no Tune state to resume ({tune_dir} is missing or empty): start a new sweep")
        out.mkdir(parents=True, exist_ok=True)
        if not args.resume:
            (out / SPEC_FILE).write_text(spec.to_json())
        trainable = tune.with_resources(tune.with_parameters(run_trial, spec_json=spec.to_json(), sweep_dir=str(out.resolve())),
                                        TrialResources(plans))
        if args.resume:
            tuner = tune.Tuner.restore(str(tune_dir), trainable=trainable, resume_unfinished=True, restart_errored=True)
        else:
            param_space = {key: tune.grid_search(values) for key, values in spec.axes.items()}
            tuner = tune.Tuner(
                trainable,
                param_space=param_space,
                tune_config=tune.TuneConfig(reuse_actors=True),
                run_config=tune.RunConfig(name=TUNE_NAME, storage_path=str(out.resolve()), verbose=0 if args.quiet else 1,
                                          failure_config=tune.FailureConfig(max_failures=0)),
            )
        log.info("sweep of %d trials in %s", len(configs), out)
        grid = _fit(tuner)
        records = collect_records(grid, spec, configs)
    finally:
        if started:
            ray.shutdown()
    write_results(out, records)
    written = report_module.write_report(out, records)
    unfinished = [r for r in records if r["status"] != "finished"]
    if not args.quiet:
        print(report_module.markdown_table(records))
        print(f"sweep directory: {out}  ({', '.join(p.name for p in written)}, results.csv, rounds.csv; Tune: {out / TUNE_NAME})")
    for r in records:
        if r["status"] == "error":
            print(f"fedsim: trial {r['trial_id']} failed: {r.get('error', '')}", file=sys.stderr)
    if unfinished:
        print(f"fedsim: {len(unfinished)} of {len(records)} trials did not finish: continue with 'fedsim sweep --resume --out {out}'", file=sys.stderr)
        return 1
    return 0
