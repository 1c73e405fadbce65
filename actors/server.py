"""The server on Ray: a :class:`fedsim.runtime.server.Server` in an actor, behind one generic forwarding proxy."""
from __future__ import annotations

import ray

from fedsim.runtime.server import SERVER_HANDLE_METHODS, Server


class RemoteServer:
    """A ServerHandle whose methods run on a Server in a Ray actor (each call waits for its result)."""

    def __init__(self, config, federation, executor, client_actors: list, assignment: dict):
        self.client_actors = client_actors
        self.assignment = assignment  # client id -> index of the actor that hosts it
        self.actor = ray.remote(Server).options(num_cpus=0).remote(config, federation, executor)

    def __getattr__(self, name: str):
        if name not in SERVER_HANDLE_METHODS:
            raise AttributeError(f"{type(self).__name__} forwards only {SERVER_HANDLE_METHODS}, not {name!r}")
        remote = getattr(self.actor, name)
        return lambda *args, **kwargs: ray.get(remote.remote(*args, **kwargs))

    def ready(self) -> None:
        """Wait until the server and every client actor are constructed (a failing constructor raises here)."""
        ray.get([a.ready.remote() for a in self.client_actors] + [self.actor.__ray_ready__.remote()])

    def close(self) -> None:
        for actor in self.client_actors + [self.actor]:
            ray.kill(actor)
        self.client_actors = []
