"""Start or join a Ray cluster, create the actors of one run, and proxy the server for the Simulator."""
from __future__ import annotations

import logging
import math
import os
import socket
import warnings

import ray

from actors.executor import ActorSpec
from actors.server import ServerActor
from fedsim.errors import UserError

log = logging.getLogger(__name__)


def _check_reachable(address: str) -> None:
    """Fail fast (instead of Ray's long retries) when host:port does not answer."""
    if address in ("auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"bad cluster address {address!r}: use host:port (e.g. 10.0.0.5:6379), 'auto', or omit --address for a local cluster")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as exc:
        raise UserError(
            f"cannot reach a Ray cluster at {address} ({exc.strerror or exc}): start one with 'ray start --head' "
            "or 'ray up cluster.yaml', or omit --address for a local cluster"
        ) from None


def connect(address: str | None, num_cpus: int | None = None) -> bool:
    """Initialize Ray; returns True when this call started it (so the caller shuts it down)."""
    if ray.is_initialized():
        return False
    if address:
        _check_reachable(address)
    kwargs = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=num_cpus or os.cpu_count(), **kwargs)
    except ConnectionError as exc:
        raise UserError(
            f"cannot connect to a Ray cluster at {address!r} ({str(exc).splitlines()[0]}): "
            "start one with 'ray start --head', or omit --address for a local cluster; if the cluster uses token "
            "authentication, set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH"
        ) from None
    return True


def plan_actors(config, federation) -> tuple[int, dict[int, int], float]:
    """How many client actors, which clients each hosts, and the GPUs each gets.

    Sources are spread round-robin first (they do the training), then targets.
    Placement depends only on the config and the cluster size, never on timing.
    """
    resources = ray.cluster_resources()
    cpus = resources.get("CPU", 1.0)
    gpus_per_client = config.resources.gpus_per_client
    if gpus_per_client > 0 and resources.get("GPU", 0) == 0:
        warnings.warn(
            f"--gpus-per-client {gpus_per_client} asked for GPUs but the Ray cluster has none: running on CPU", RuntimeWarning, stacklevel=2
        )
        log.warning("the Ray cluster has no GPUs: client actors run on CPU")
        gpus_per_client = 0.0
    slots = max(1, math.floor(cpus / config.resources.cpus_per_client + 1e-9))
    if gpus_per_client > 0:
        slots = min(slots, max(1, math.floor(resources["GPU"] / gpus_per_client + 1e-9)))
    count = min(len(federation.clients), slots)
    if config.resources.max_actors:
        count = min(count, config.resources.max_actors)
    order = federation.source_ids + federation.target_ids
    assignment = {cid: i % count for i, cid in enumerate(order)}
    return count, assignment, gpus_per_client


class RayServerProxy:
    """What the Simulator sees: ``run_round`` / ``global_tensors`` / ``close`` on the ServerActor."""

    def __init__(self, config, federation):
        count, self.assignment, gpus = plan_actors(config, federation)
        hosted = tuple(tuple(sorted(cid for cid, a in self.assignment.items() if a == index)) for index in range(count))
        spec = ActorSpec(config, federation, hosted, "cuda" if gpus > 0 else "cpu", config.resources.cpus_per_client, gpus)
        # All actors start at once (each imports torch and its method: start-up runs in parallel); an actor whose
        # constructor fails surfaces here, before round 1.
        self.client_actors = [spec.create(index) for index in range(count)]
        self.server = ray.remote(ServerActor).options(num_cpus=0).remote(config, federation, self.client_actors, spec)
        ray.get([a.ready.remote() for a in self.client_actors] + [self.server.ready.remote()])
        log.info("ray backend: %d client actors for %d clients", count, len(federation.clients))

    def run_round(self, rnd: int, evaluate: bool) -> dict:
        metrics = ray.get(self.server.run_round.remote(rnd, evaluate))
        if rnd == 1 or not getattr(self, "_nodes_recorded", False):
            metrics["client_nodes"] = sorted(set(self.client_nodes()))  # where the client actors run
            self._nodes_recorded = True
        return metrics

    def global_tensors(self) -> dict:
        return ray.get(self.server.global_tensors.remote())

    def export_state(self) -> dict:
        return ray.get(self.server.export_state.remote())

    def restore_state(self, saved: dict) -> None:
        ray.get(self.server.restore_state.remote(saved))

    def export_client_states(self) -> dict:
        """Gathered from the client actors for the checkpoint file (the server's method never sees them)."""
        return ray.get(self.server.export_client_states.remote())

    def import_client_states(self, states: dict) -> None:
        ray.get(self.server.import_client_states.remote(states))

    def client_nodes(self) -> list[str]:
        return ray.get(self.server.client_nodes.remote())

    def restarts(self) -> int:
        return ray.get(self.server.restarts.remote())

    def close(self) -> None:
        for actor in self.client_actors + [self.server]:
            ray.kill(actor)
        self.client_actors = []
