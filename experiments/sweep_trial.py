"""One trial of `fedsim sweep`: the actors and resources it reserves (:func:`plan_trial`,
:class:`TrialResources`) and what runs inside it (:func:`run_trial`, Tune's trainable, and the
:class:`TuneReport` callback that sends every round's metrics to Tune)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from fedsim.errors import UserError
from fedsim.experiments.sweep_grid import SweepSpec, point_key
from fedsim.runtime.callbacks import Callback

TRIAL_CPUS = 0.1  # head bundle: the trial coordinator only waits on the ServerActor
RUNS_DIR = "runs"  # the trials' run directories (metrics.jsonl, summary.json, tb/), one per trial id
CACHE_DIR = "cache"  # the stages the grid's trials share (run.cache_dir, unless the grid sets its own)


@dataclass(frozen=True)
class TrialPlan:
    actors: int  # client actors; 0: the local backend, every client in the trial's own process
    cpus: float
    gpus: float
    per_actor: tuple[tuple[float, float], ...] = ()
    """Each client actor's (CPUs, GPUs), in actor order, where ``resources.groups`` gives clients different
    resources (:func:`fedsim.actors.backend.plan_actors`); empty: every actor reserves ``cpus`` and ``gpus``."""

    def bundles(self) -> list[dict[str, float]]:
        """The trial's placement group: the trial coordinator's bundle, then one per client actor with its
        resources (the local backend: one bundle, the trial's process)."""
        if self.actors == 0:
            return [_bundle(self.cpus, self.gpus)]
        each = self.per_actor or ((self.cpus, self.gpus),) * self.actors
        return [{"CPU": TRIAL_CPUS}] + [_bundle(cpus, gpus) for cpus, gpus in each]


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, "GPU": gpus} if gpus > 0 else {"CPU": cpus}


def plan_trial(config, num_clients: int, cluster: dict[str, float], backend: str = "ray") -> TrialPlan:
    """Client actors of one trial: one per client, at most ``ray.max_actors``, and few enough
    that the whole trial fits in the cluster as it is now (so it can always be placed).
    The local backend runs the clients one after the other in the trial's process: one bundle.
    With ``resources.groups``, clients of different resources get actors of their own, planned as the trial's run
    plans them (:func:`fedsim.actors.backend.actor_sequence`), each actor its own bundle."""
    cpus = config.resources.cpus_per_client
    gpus = config.resources.gpus_per_client if cluster.get("GPU", 0) > 0 else 0.0
    total_cpus = cluster.get("CPU", 0.0)
    if backend == "local":
        if cpus > total_cpus + 1e-9:
            raise UserError(
                f"a trial needs {cpus:g} CPUs (resources.cpus_per_client) "
                f"but the Ray cluster has {total_cpus:g}: lower it"
            )
        return TrialPlan(0, cpus, gpus)
    from fedsim.actors.backend import actor_sequence, check_classes_fit

    classes = trial_classes(config, num_clients, cluster)
    demands, sizes = [demand for demand, _ in classes], [size for _, size in classes]
    room, gpu_room = total_cpus - TRIAL_CPUS, cluster.get("GPU", 0.0)
    if len(classes) == 1:
        cpus, gpus = demands[0]
        if cpus + TRIAL_CPUS > total_cpus + 1e-9:
            raise UserError(
                f"a trial needs {cpus + TRIAL_CPUS:g} CPUs (one client actor at resources.cpus_per_client={cpus:g} "
                f"+ {TRIAL_CPUS:g} for the trial) but the Ray cluster has {total_cpus:g} now: "
                "lower --cpus-per-client, or wait for worker nodes (ray status)"
            )
        if gpus > gpu_room + 1e-9:
            raise UserError(
                f"--gpus-per-client {gpus:g} is more than the {gpu_room:g} GPUs of the Ray cluster: lower it"
            )
        return TrialPlan(len(actor_sequence(demands, sizes, room, gpu_room, config.ray.max_actors)), cpus, gpus)
    where = f"the Ray cluster's {total_cpus:g} CPUs ({TRIAL_CPUS:g} of them for the trial) and {gpu_room:g} GPUs now"
    check_classes_fit(demands, room, gpu_room, config.ray.max_actors, where)
    sequence = actor_sequence(demands, sizes, room, gpu_room, config.ray.max_actors)
    return TrialPlan(len(sequence), cpus, gpus, tuple(demands[kind] for kind in sequence))


def trial_classes(config, num_clients: int, cluster: dict[str, float]) -> list[tuple[tuple[float, float], int]]:
    """The trial's resource classes, ``[((CPUs, GPUs), clients)]`` in the order its run places them: one class of
    ``num_clients`` clients without ``resources.groups``; with them, the classes of the trial's federation
    (:func:`fedsim.actors.backend.resource_classes`; its run warns when GPUs are asked for and there are none)."""
    from fedsim.actors.backend import placement_order, resource_classes

    if not config.resources.groups:
        gpus = config.resources.gpus_per_client if cluster.get("GPU", 0) > 0 else 0.0
        return [((config.resources.cpus_per_client, gpus), num_clients)]
    from fedsim.data.scenario import build_federation

    federation = build_federation(config.data)
    classes = resource_classes(config, placement_order(federation), cluster.get("GPU", 0.0), warn=False)
    return [(demand, len(ids)) for demand, ids in classes]


class TrialResources:
    """``tune.with_resources`` callable: a trial's config -> its PlacementGroupFactory. ``keys``: the grid's axes,
    which alone place a trial (a sampled value never changes its federation or resources); None: every config key."""

    def __init__(self, plans: dict[str, TrialPlan], keys: Optional[list[str]] = None):
        self.plans = plans
        self.keys = None if keys is None else set(keys)

    def __call__(self, config: dict):
        from ray import tune

        point = {k: v for k, v in config.items() if "." in k and (self.keys is None or k in self.keys)}
        return tune.PlacementGroupFactory(self.plans[point_key(point)].bundles(), strategy="PACK")


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

    def on_round_end(self, simulator, metrics: dict) -> None:
        self.sent += int(metrics.get("bytes_sent", 0))
        self.received += int(metrics.get("bytes_received", 0))
        if metrics.get("client_nodes"):  # recorded in the first round the server runs
            self.nodes = ",".join(sorted(set(metrics["client_nodes"])))
        row = flatten(metrics)
        row.update(
            bytes_sent_total=self.sent,
            bytes_received_total=self.received,
            elapsed_seconds=round(time.perf_counter() - self.started, 3),
        )
        if self.nodes:
            row["client_nodes"] = self.nodes
        report = self._report
        if report is None:
            from ray import tune

            report = tune.report
        report(row)


def run_trial(params: dict, spec_json: str = "", sweep_dir: str = "", plugins: Optional[dict] = None) -> None:
    """Tune's trainable: one simulation with as many client actors as the trial reserved bundles.

    Its run directory is ``<sweep>/runs/<trial id>`` (written on the node that runs the trial;
    ``tune.get_context().get_trial_dir()`` is a temporary directory under /tmp/ray). ``plugins``: the plugin
    folders (those that exist on this node go on ``sys.path``) and entry-point names of the sweep."""
    from ray import tune

    from fedsim.actors.plugins import adopt_settings
    from fedsim.api import run_experiment
    from fedsim.runtime.simulator import default_callbacks

    adopt_settings(plugins)
    context = tune.get_context()
    request = context.get_trial_resources()
    actors = len(request.bundles) - (0 if request.head_bundle_is_empty else 1)
    point = {k: v for k, v in params.items() if "." in k}
    spec = SweepSpec.from_json(spec_json)
    extra = ("run.progress=false",) + (
        ("run.backend=local",) if spec.backend == "local" else ("run.backend=ray", f"ray.max_actors={max(1, actors)}")
    )
    config = with_grid_cache(spec.config_for(point, extra), sweep_dir)
    out_dir = Path(sweep_dir) / RUNS_DIR / context.get_trial_id()
    reporter = TuneReport()
    result = run_experiment(config, out_dir, callbacks=default_callbacks(config, out_dir) + [reporter])
    tune.report(summary_row(result.summary, reporter.nodes))


def with_grid_cache(config, sweep_dir: str):
    """The trial's config with ``run.cache_dir`` at the grid's ``cache/`` when the grid sets none, so that the stages
    its trials share (FedDaDiL's and DaDiL's encoder) are computed once per grid (per node, unless the sweep
    directory is on a file system every node mounts)."""
    if config.run.cache_dir is not None:
        return config
    return dataclasses.replace(config, run=dataclasses.replace(config.run, cache_dir=str(Path(sweep_dir) / CACHE_DIR)))


def summary_row(summary: dict, nodes: str) -> dict:
    """The last result of a trial: the run's summary under ``summary/`` (its presence marks the trial finished),
    every number of it flattened (``summary/source_accuracy/usps``, ``summary/final_detection/wg/A_com``), and its
    model-selection scores also as they are (``score_entropy``), the metric a searcher reads when a trial ends."""
    sources = list((summary.get("source_accuracy") or {}).values())
    row = {
        f"summary/{key}": value
        for key, value in flatten(summary).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    if sources:
        row["summary/mean_source_accuracy"] = sum(sources) / len(sources)
    for key, value in summary.items():
        if key.startswith("score_") and isinstance(value, (int, float)) and not isinstance(value, bool):
            row[key] = value
    if nodes:
        row["client_nodes"] = nodes
    return row
