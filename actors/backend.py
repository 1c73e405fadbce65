"""Start or join a Ray cluster and create the actors of one run (the server behind a forwarding proxy).

The run's plugins reach the workers through Ray's runtime environment (:mod:`fedsim.actors.plugins`): set for the
whole job where this run starts or joins the cluster, or for each actor of the run where the caller initialized Ray.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time

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


def plan_actors(config, federation) -> tuple[int, dict[int, int], float]:
    """How many client actors, which clients each hosts, and the GPUs each gets.

    Sources are spread round-robin first (they do the training), then targets.
    Placement depends only on the config and the cluster size, never on timing.
    """
    resources = ray.cluster_resources()
    cpus = resources.get("CPU", 1.0)
    gpus_per_client = gpus_or_cpu(config.resources.gpus_per_client, resources.get("GPU", 0))
    slots = max(1, math.floor(cpus / config.resources.cpus_per_client + 1e-9))
    if gpus_per_client > 0:
        slots = min(slots, max(1, math.floor(resources["GPU"] / gpus_per_client + 1e-9)))
    count = min(len(federation.clients), slots)
    if config.ray.max_actors:
        count = min(count, config.ray.max_actors)
    order = federation.source_ids + federation.target_ids
    assignment = {cid: i % count for i, cid in enumerate(order)}
    return count, assignment, gpus_per_client


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
    count, assignment, gpus = plan_actors(config, federation)
    hosted = tuple(tuple(sorted(cid for cid, a in assignment.items() if a == index)) for index in range(count))
    settings = config.ray
    device = "cuda" if gpus > 0 else "cpu"
    cpus = config.resources.cpus_per_client
    spec = ActorSpec(config, federation, hosted, device, cpus, gpus, kill_hook(), runtime_env)
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
