"""The server on Ray: a :class:`fedsim.runtime.server.Server` in an actor, behind one generic forwarding proxy.

Before round 1 the server actor's state is a function of its start-up and the calls made on it so far (setup
stages, a checkpoint's restore): a server actor that dies then is replaced, with fresh client actors, and those
calls are redone (up to ``ray.max_restarts`` times). From round 1 on its global state lives only in it, so its
death ends the run with one line (:class:`ServerDied`); ``fedsim run --resume`` continues from a checkpoint.
"""

from __future__ import annotations

import contextlib
import logging

import ray
from ray.exceptions import RayActorError, RayTaskError

from fedsim.actors.executor import ActorFailed, reason
from fedsim.errors import UserError, unwrapped
from fedsim.runtime.server import SERVER_HANDLE_METHODS, Server

log = logging.getLogger(__name__)


class ServerDied(ActorFailed):
    """The server actor died (a UserError: one line, exit code 2)."""


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
        cause = unwrapped(exc)  # a client actor's error arrives wrapped once more by the server actor
        if isinstance(cause, UserError):
            raise cause from None
        raise
    except RayActorError as exc:  # the server actor itself died
        raise ServerDied(
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
        self._launch_args = (config, federation, executor, handoff)
        self._restarts_left = config.ray.max_restarts
        self._calls: list | None = []  # the calls made before round 1, redone on a replacement; None from round 1
        self._redo: list = []
        self._launch()

    def _launch(self) -> None:
        config, federation, executor, handoff = self._launch_args
        state = {} if handoff else None
        options = executor.spec.ray_options(num_cpus=0)  # the run's plugins, where the job's environment lacks them
        self.actor = ray.remote(Server).options(**options).remote(config, federation, executor, state)
        self._started = self.actor.__ray_call__.remote(_start, handoff)

    def __getattr__(self, name: str):
        if name not in SERVER_HANDLE_METHODS:
            raise AttributeError(f"{type(self).__name__} forwards only {SERVER_HANDLE_METHODS}, not {name!r}")
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    def _call(self, name: str, args: tuple, kwargs: dict):
        while True:
            try:
                self.ready()
                while self._redo:  # the calls a replacement server actor has to redo, oldest first
                    redo_name, redo_args, redo_kwargs = self._redo[0]
                    get(getattr(self.actor, redo_name).remote(*redo_args, **redo_kwargs), redo_name)
                    self._redo.pop(0)
                result = get(getattr(self.actor, name).remote(*args, **kwargs), name)
                break
            except ServerDied as exc:
                self._replace(exc)
        if self._calls is not None:
            self._calls = None if name == "run_round" else self._calls + [(name, args, kwargs)]
        return result

    def ready(self) -> None:
        """Wait until the server and every client actor are constructed and the server holds its initial state
        (a client actor that keeps dying, or a failing constructor, raises here)."""
        while self._started is not None:
            try:
                self.client_actors = get(self._started, "start-up")
                self._started = None
            except ServerDied as exc:
                self._replace(exc)

    def _replace(self, exc: ServerDied) -> None:
        """A new server actor and fresh client actors, to redo the calls made before round 1; re-raises ``exc``
        from round 1 on or past ``ray.max_restarts``."""
        if self._calls is None or self._restarts_left <= 0:
            raise exc
        self._restarts_left -= 1
        log.warning(
            "the server actor died before round 1: replacing it and its client actors, redoing %d calls",
            len(self._calls),
        )
        executor = self._launch_args[2]
        for actor in self.client_actors + executor.actors:
            with contextlib.suppress(Exception):  # already dead, or gone with the server actor that owned it
                ray.kill(actor)
        executor.actors = [executor.spec.create(index) for index in range(len(executor.actors))]
        self.client_actors = list(executor.actors)
        self._launch()
        self._redo = list(self._calls)

    def close(self) -> None:
        for actor in self.client_actors + [self.actor]:
            ray.kill(actor)
        self.client_actors = []
