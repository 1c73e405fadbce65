"""The server on Ray: a :class:`fedsim.runtime.server.Server` in an actor, behind one generic forwarding proxy."""

from __future__ import annotations

import ray

from fedsim.runtime.server import SERVER_HANDLE_METHODS, Server


def _set_state(server: Server, state: dict) -> None:
    server.state = state


class RemoteServer:
    """A ServerHandle whose methods run on a Server in a Ray actor (each call waits for its result)."""

    def __init__(self, config, federation, executor, client_actors: list, assignment: dict, state=None):
        """``state``: an ObjectRef to the initial server state made elsewhere (a client actor), or None for the
        method's own ``init_server()``. The actor starts at once either way; the state is handed to it by the
        first call, which Ray runs before any later one (the actor's calls from this process run in order)."""
        self.client_actors = client_actors
        self.assignment = assignment  # client id -> index of the actor that hosts it
        self.actor = (
            ray.remote(Server).options(num_cpus=0).remote(config, federation, executor, None if state is None else {})
        )
        self._handed = [] if state is None else [self.actor.__ray_call__.remote(_set_state, state)]

    def __getattr__(self, name: str):
        if name not in SERVER_HANDLE_METHODS:
            raise AttributeError(f"{type(self).__name__} forwards only {SERVER_HANDLE_METHODS}, not {name!r}")
        remote = getattr(self.actor, name)
        return lambda *args, **kwargs: ray.get(remote.remote(*args, **kwargs))

    def ready(self) -> None:
        """Wait until the server and every client actor are constructed (a failing constructor raises here)."""
        ray.get([a.ready.remote() for a in self.client_actors] + [self.actor.__ray_ready__.remote()] + self._handed)

    def close(self) -> None:
        for actor in self.client_actors + [self.actor]:
            ray.kill(actor)
        self.client_actors = []
