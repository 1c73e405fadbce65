"""Start or join a Ray cluster and create the actors of one run (the server behind a forwarding proxy).

The run's plugins reach the workers through Ray's runtime environment (:mod:`fedsim.actors.plugins`): set for the
whole job where this run starts or joins the cluster, or for each actor of the run where the caller initialized Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass

import ray

from fedsim.actors.client import KILL_ENV, KILL_PHASES
from fedsim.actors.executor import ActorSpec, RayExecutor
from fedsim.actors.plugins import actor_runtime_env, job_runtime_env, plugins_of
from fedsim.actors.reaper import Watchdog
from fedsim.actors.server import RemoteServer
from fedsim.errors import UserError, first_line
from fedsim.registry import METHODS

log = logging.getLogger(__name__)

#: the logger of Ray's notice that a fresh local cluster uses token authentication (Ray's default, kept); the
#: cluster lives and dies with the run on this machine, so the notice asks nothing of the user
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
#: wall-clock stamps (time.time()) of the last run's start-up and shutdown phases, read by the overhead benchmark
TIMINGS: dict[str, float] = {}
#: the watchdog of the cluster this process started (:mod:`fedsim.actors.reaper`), None while it has none
_WATCHDOG: Watchdog | None = None


def check_reachable(address: str) -> None:
    """Fail fast (instead of Ray's long retries) when host:port does not answer."""
    if address in ("auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(
            f"bad cluster address {address!r}: use host:port (e.g. 10.0.0.5:6379), 'auto', "
            "or omit --address for a local cluster"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as exc:
        raise UserError(
            f"cannot reach a Ray cluster at {address} ({exc.strerror or exc}): start one with 'ray start --head' "
            "or 'ray up cluster.yaml', or omit --address for a local cluster"
        ) from None


@contextlib.contextmanager
def quiet_logger(name: str):
    """Only errors from the logger ``name`` while the block runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def connect(address: str | None, num_cpus: int | None = None, runtime_env: dict | None = None) -> bool:
    """Initialize Ray (its job's workers in ``runtime_env``); returns True when this call started it (so the caller
    shuts it down)."""
    if ray.is_initialized():
        return False
    if address:
        check_reachable(address)
    kwargs = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:  # "local": a fresh cluster even when a 'ray start' one is running (joining it takes --address auto)
            _watch_own_cluster()
            with quiet_logger(RAY_AUTH_LOGGER):
                ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kwargs)
    except ConnectionError as exc:
        _stop_watchdog()
        raise _connection_error(address, exc) from None
    except (TypeError, ValueError) as exc:  # Ray's checks of the runtime environment
        _stop_watchdog()
        if not runtime_env:
            raise
        raise UserError(
            f"Ray refused the runtime environment {runtime_env!r} ({first_line(exc)}): fix ray.runtime_env"
        ) from None
    except BaseException:
        _stop_watchdog()
        raise
    return True


def _connection_error(address: str | None, exc: ConnectionError) -> UserError:
    return UserError(
        f"cannot connect to a Ray cluster at {address!r} ({str(exc).splitlines()[0]}): "
        "start one with 'ray start --head', or omit --address for a local cluster; if the cluster uses token "
        "authentication, set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH"
    )


def _watch_own_cluster() -> None:
    """Mark this process's environment and start the watchdog that kills the cluster's processes if this process
    is killed before it shuts them down (:mod:`fedsim.actors.reaper`)."""
    global _WATCHDOG
    _stop_watchdog()
    _WATCHDOG = Watchdog()
    _WATCHDOG.start()


def _stop_watchdog() -> None:
    global _WATCHDOG
    if _WATCHDOG is not None:
        _WATCHDOG.stop()
        _WATCHDOG = None


def gpus_or_cpu(gpus_per_client: float, cluster_gpus: float) -> float:
    """The GPUs each client actor asks for: 0 (with one warning) when the cluster has none."""
    if gpus_per_client > 0 and cluster_gpus == 0:
        log.warning("--gpus-per-client %g asked for GPUs but the Ray cluster has none: running on CPU", gpus_per_client)
        return 0.0
    return gpus_per_client


Resources = tuple[float, float]
"""What one client, or one client actor, reserves: (CPUs, GPUs)."""


@dataclass(frozen=True)
class ActorPlan:
    """The client actors of a run: what each reserves and which clients each hosts."""

    resources: tuple[Resources, ...]
    """(CPUs, GPUs) of each actor, by index; GPUs above 0 run its clients on CUDA."""
    assignment: dict[int, int]
    """Client id -> the index of the actor that hosts it."""

    @property
    def count(self) -> int:
        """The number of client actors."""
        return len(self.resources)

    def hosted(self) -> tuple[tuple[int, ...], ...]:
        """The client ids of each actor, by index, sorted."""
        return tuple(
            tuple(sorted(cid for cid, a in self.assignment.items() if a == index)) for index in range(self.count)
        )


def resource_classes(config, clients, cluster_gpus: float, warn: bool = True) -> list[tuple[Resources, list[int]]]:
    """The clients grouped by what they reserve (``resources.groups``): ``[((CPUs, GPUs), client ids)]``, each class
    in the order of its first client and its clients in the given order (``clients``: (id, domain, role) in placement
    order). A cluster without GPUs runs every client on the CPU (with one warning, unless ``warn`` is False)."""
    wanted = {cid: config.resources.of_client(domain, role) for cid, domain, role in clients}
    asking = {(domain, wanted[cid][1]) for cid, domain, _ in clients if wanted[cid][1] > 0}
    if asking and cluster_gpus == 0 and warn:
        if not config.resources.groups:
            gpus_or_cpu(config.resources.gpus_per_client, cluster_gpus)  # warns
        else:
            named = ", ".join(f"{domain} ({gpus:g} each)" for domain, gpus in sorted(asking))
            log.warning("the clients of %s asked for GPUs but the Ray cluster has none: running on CPU", named)
    if cluster_gpus == 0:
        wanted = {cid: (cpus, 0.0) for cid, (cpus, _) in wanted.items()}
    classes: dict[Resources, list[int]] = {}
    for cid, _, _ in clients:
        classes.setdefault(wanted[cid], []).append(cid)
    return list(classes.items())


def actor_sequence(
    demands: list[Resources], sizes: list[int], cpus: float, gpus: float, max_actors: int | None
) -> list[int]:
    """The class of each client actor, in actor order: one actor of every class first (whether or not they fit:
    the caller checks), then one more actor per class in turn, for each class that has more clients than actors,
    until ``max_actors`` or the first actor that does not fit in ``cpus`` and ``gpus`` besides those before it.

    The order of the turns does not depend on the cluster, so a cluster with more room plans the same actors
    first: a sweep trial's bundles (:func:`fedsim.experiments.sweep_trial.plan_trial`) are the first actors of
    the plan its run makes with ``ray.max_actors`` set to their number. With one class this is
    ``min(clients, cpus // its CPUs, gpus // its GPUs, max_actors)`` actors, at least 1."""
    sequence = list(range(len(demands)))
    counts = [1] * len(demands)
    while max_actors is None or len(sequence) < max_actors:
        growing = [c for c in range(len(demands)) if counts[c] < sizes[c]]
        if not growing:
            break
        for c in growing:
            used_cpus = sum(n * d[0] for n, d in zip(counts, demands)) + demands[c][0]
            used_gpus = sum(n * d[1] for n, d in zip(counts, demands)) + demands[c][1]
            if used_cpus > cpus + 1e-9 or (demands[c][1] > 0 and used_gpus > gpus + 1e-9):
                return sequence
            sequence.append(c)
            counts[c] += 1
            if max_actors is not None and len(sequence) >= max_actors:
                break
    return sequence


def check_classes_fit(demands: list[Resources], cpus: float, gpus: float, max_actors: int | None, where: str) -> None:
    """Clients of different resources never share an actor, so a run with two or more resource classes needs one
    actor of each at once: a one-line UserError where ``ray.max_actors`` or the cluster (``where``: what it is and
    the CPUs and GPUs it has) cannot hold them."""
    if len(demands) < 2:
        return
    listed = ", ".join(f"{c:g} CPUs" + (f" + {g:g} GPUs" if g else "") for c, g in demands)
    if max_actors is not None and max_actors < len(demands):
        raise UserError(
            f"resources.groups gives the clients {len(demands)} different resources ({listed}), one actor each at "
            f"least, but ray.max_actors={max_actors}: raise it to {len(demands)} or set fewer groups"
        )
    need_cpus, need_gpus = sum(c for c, _ in demands), sum(g for _, g in demands)
    if need_cpus > cpus + 1e-9 or need_gpus > gpus + 1e-9:
        raise UserError(
            f"resources.groups gives the clients {len(demands)} different resources ({listed}), one actor each at "
            f"least: {need_cpus:g} CPUs and {need_gpus:g} GPUs together, more than {where}: lower the groups' "
            "cpus_per_client or gpus_per_client, or wait for worker nodes (ray status)"
        )


def placement_order(federation) -> list[tuple[int, str, str]]:
    """The clients as (id, domain, role) in the order actors take them: sources first (they do the training),
    then targets."""
    return [
        (cid, federation.info(cid).domain, federation.info(cid).role)
        for cid in federation.source_ids + federation.target_ids
    ]


def plan_actors(config, federation) -> ActorPlan:
    """How many client actors, which clients each hosts, and what each reserves.

    The clients of one resource class (:func:`resource_classes`: the same CPUs and GPUs, ``resources.groups``) are
    spread round-robin over that class's actors, sources first, then targets; clients of different classes never
    share an actor. The classes' actors come in the turns of :func:`actor_sequence` within the cluster's CPUs and
    GPUs (and ``ray.max_actors``). With two or more classes, a cluster that cannot hold one actor of each is a
    UserError; a single class gets one actor even where it does not fit (Ray starts it once there is room).
    Placement depends only on the config and the cluster size, never on timing.
    """
    cluster = ray.cluster_resources()
    cpus, gpus = cluster.get("CPU", 1.0), cluster.get("GPU", 0.0)
    classes = resource_classes(config, placement_order(federation), gpus)
    demands = [demand for demand, _ in classes]
    where = f"the Ray cluster's {cpus:g} CPUs and {gpus:g} GPUs"
    check_classes_fit(demands, cpus, gpus, config.ray.max_actors, where)
    sequence = actor_sequence(demands, [len(ids) for _, ids in classes], cpus, gpus, config.ray.max_actors)
    assignment: dict[int, int] = {}
    for c, (_, ids) in enumerate(classes):
        actors = [index for index, kind in enumerate(sequence) if kind == c]
        assignment.update({cid: actors[i % len(actors)] for i, cid in enumerate(ids)})
    return ActorPlan(tuple(demands[kind] for kind in sequence), dict(sorted(assignment.items())))


def own_bundles(resources: tuple[Resources, ...]) -> tuple | None:
    """Where actors of different resources run inside a placement group whose bundles match them one for one, in
    order (a sweep trial's, :meth:`fedsim.experiments.sweep_trial.TrialPlan.bundles`): (the group, the bundle index
    of actor 0), so that each actor takes its own bundle and a small actor never takes the room a larger one was
    reserved. None otherwise: Ray places the actors (inside the group, if the caller runs in one)."""
    from ray.util import get_current_placement_group

    group = get_current_placement_group() if len(set(resources)) > 1 else None
    if group is None:
        return None
    wanted = [{"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {})} for cpus, gpus in resources]
    specs = [{k: float(v) for k, v in spec.items() if k in ("CPU", "GPU") and v} for spec in group.bundle_specs]
    for first in range(len(specs) - len(wanted) + 1):
        if all(_same(specs[first + i], bundle) for i, bundle in enumerate(wanted)):
            return group, first
    return None


def _same(bundle: dict[str, float], wanted: dict[str, float]) -> bool:
    return bundle.keys() == wanted.keys() and all(abs(bundle[k] - wanted[k]) < 1e-9 for k in wanted)


def kill_hook() -> str:
    """The ``FEDSIM_TEST_KILL`` test hook (see :mod:`fedsim.actors.client`), checked; "" when unset."""
    kill = os.environ.get(KILL_ENV, "")
    phases, _, marker_dir = kill.partition("@")
    if kill and (not set(phases.split(",")) <= set(KILL_PHASES) or not os.path.isdir(marker_dir)):
        raise ValueError(f"{KILL_ENV}={kill!r}: expected <phase>[,<phase>...]@<directory>, phases {KILL_PHASES}")
    return kill


def start_server(config, federation, runtime_env: dict | None = None) -> RemoteServer:
    """Create the run's client actors and its server actor (all at once: start-up runs in parallel, each actor in
    ``runtime_env`` when given) and wait until they are ready and the server holds its initial state. A client
    actor that dies meanwhile is recreated (up to ``ray.max_restarts`` times); one that keeps dying, or whose
    constructor raises, surfaces here, before round 1."""
    plan = plan_actors(config, federation)
    count, assignment = plan.count, plan.assignment
    settings = config.ray
    spec = ActorSpec(
        config, federation, plan.hosted(), plan.resources, kill_hook(), runtime_env, own_bundles(plan.resources)
    )
    client_actors = [spec.create(index) for index in range(count)]
    executor = RayExecutor(
        client_actors,
        spec,
        max_restarts=settings.max_restarts,
        inject_faults=settings.inject_faults,
        seed=config.run.seed,
        rounds=config.run.rounds,
        call_timeout=settings.call_timeout_s,
    )
    handoff = not METHODS.get(config.method.name).server_needs_torch  # the server actor stays free of torch
    server = RemoteServer(config, federation, executor, client_actors, assignment, handoff)
    try:
        server.ready()
    except BaseException:
        server.close()  # nothing of a failed start-up stays on a cluster the run joined
        raise
    log.info("ray backend: %d client actors for %d clients", count, len(federation.clients))
    return server


def shutdown_own_cluster() -> None:
    """``ray.shutdown()`` of the cluster this process started, its autoscaler monitor killed first.

    Ray stops the GCS before the monitor, whose SIGTERM handler then keeps reporting its end to the stopped GCS
    until Ray's one-second grace runs out and kills it. A local cluster has nothing to scale, so the monitor
    processes (found in the node object of ``ray._private.worker``) are killed and waited for, then Ray stops the
    rest; where that node object holds no such processes, the plain shutdown runs."""
    node = getattr(getattr(ray, "_private", None), "worker", None)
    processes = getattr(getattr(node, "_global_node", None), "all_processes", None) or {}
    for info in processes.get("monitor", []):
        with contextlib.suppress(Exception):  # already gone, or not a process handle: the shutdown stops it
            info.process.kill()
            info.process.wait(timeout=1)
    ray.shutdown()
    _stop_watchdog()


class ClusterStart:
    """The run's connection to Ray: ``started`` when this run started the cluster, so that :meth:`stop` (once)
    shuts it down; a joined cluster, or one a Tune trial runs in, is left as it is. ``actor_env``: the runtime
    environment each actor of the run needs (where the job's own does not carry the run's plugins)."""

    def __init__(self, started: bool, actor_env: dict | None = None):
        self.started = started
        self.actor_env = actor_env

    def stop(self) -> None:
        if self.started:
            self.started = False
            shutdown_own_cluster()


def start_backend(config, num_cpus: int | None = None) -> ClusterStart:
    """Join or start the run's Ray cluster (``fedsim.api`` calls it before the federation is built, which builds
    in a thread meanwhile: ``ray.init`` must run in the main thread)."""
    TIMINGS.clear()
    TIMINGS["connecting"] = time.time()
    plugins = plugins_of([config])
    job_env = job_runtime_env(plugins, config.ray.runtime_env, joins=bool(config.run.address))
    initialized = connect(config.run.address, num_cpus=num_cpus, runtime_env=job_env)
    if not initialized and config.ray.runtime_env and ray.get_runtime_context().get_actor_id() is None:
        log.warning("ray.runtime_env is left out: Ray was initialized in this process before the run (pass it there)")
    started = ClusterStart(initialized, None if initialized else actor_runtime_env(plugins))
    TIMINGS["connected"] = time.time()
    return started


def open_server(config, federation, num_cpus: int | None = None, started: ClusterStart | None = None):
    """The Ray backend for :func:`fedsim.api.run_experiment`: join or start a cluster (unless ``started``, the
    handle :func:`start_backend` returned, says it is done), start the run's actors.

    Returns the server handle and a function that kills the actors and shuts Ray down if this run started it.
    """
    from fedsim.data.scenario import forget_domain_data

    started = started or start_backend(config, num_cpus)
    try:
        forget_domain_data(config.data)  # the actors build their own data; the driver needs only the description
        server = start_server(config, federation, started.actor_env)
    except BaseException:
        started.stop()
        raise
    TIMINGS["actors ready"] = time.time()

    def close() -> None:
        TIMINGS["closing"] = time.time()
        try:
            server.close()
        finally:
            started.stop()
        TIMINGS["closed"] = time.time()

    return server, close
