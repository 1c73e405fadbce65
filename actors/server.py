"""The server on Ray: a :class:`fedsim.runtime.server.Server` in an actor, behind one generic forwarding proxy."""

from __future__ import annotations

import ray
from ray.exceptions import RayActorError, RayTaskError

from actors.executor import ActorFailed, reason
from fedsim.errors import UserError
from fedsim.runtime.server import SERVER_HANDLE_METHODS, Server


def _start(server: Server, handoff: bool) -> list:
    """In the server actor: wait for every client actor (recreating any that dies), take the initial server
    state from client actor 0 when ``handoff``; returns the client actors' handles."""
    state = server.executor.start(handoff)
    if handoff:
        server.state = state
    return list(server.executor.actors)


def get(ref, what: str):
    """``ray.get`` of a server actor call: an error a user can act on (an actor that kept dying, a dead
    server actor) as one line (a UserError), anything else as Ray raises it."""
    try:
        return ray.get(ref)
    except RayTaskError as exc:  # raised inside the server actor
        if isinstance(exc.cause, UserError):
            raise type(exc.cause)(*exc.cause.args) from None
        raise
    except RayActorError as exc:  # the server actor itself died
        raise ActorFailed(
            f"the server actor died during {what} ({reason(exc)}): the run's global state was in it, so the run "
            "stops; 'fedsim run --resume <run dir>' continues from its last checkpoint, if one was written"
        ) from None


class RemoteServer:
    """A ServerHandle whose methods run on a Server in a Ray actor (each call waits for its result)."""

    def __init__(self, config, federation, executor, client_actors: list, assignment: dict, handoff: bool = False):
        """``handoff``: the initial server state comes from client actor 0 (a method whose server half needs no
        torch), not from the method's own ``init_server()``. The actor starts at once either way; its first call
        (``_start``, which Ray runs before any later one) waits for the client actors and takes the state."""
        self.client_actors = client_actors
        self.assignment = assignment  # client id -> index of the actor that hosts it
        self.actor = (
            ray.remote(Server).options(num_cpus=0).remote(config, federation, executor, {} if handoff else None)
        )
        self._started = self.actor.__ray_call__.remote(_start, handoff)

    def __getattr__(self, name: str):
        if name not in SERVER_HANDLE_METHODS:
            raise AttributeError(f"{type(self).__name__} forwards only {SERVER_HANDLE_METHODS}, not {name!r}")
        remote = getattr(self.actor, name)
        return lambda *args, **kwargs: get(remote.remote(*args, **kwargs), name)

    def ready(self) -> None:
        """Wait until the server and every client actor are constructed and the server holds its initial state
        (a client actor that keeps dying, or a failing constructor, raises here)."""
        self.client_actors = get(self._started, "start-up")

    def close(self) -> None:
        for actor in self.client_actors + [self.actor]:
            ray.kill(actor)
        self.client_actors = []
