"""RayExecutor: the Executor protocol over long-lived ClientActors, surviving actor deaths.

Each round's payloads are ``ray.put`` once (one object per distinct tensor
dict, usually just the global model) and passed by reference to every actor;
each actor gets one call with the batch of its clients; replies are gathered
with ``ray.wait`` and sorted by client id, so aggregation never depends on
arrival order.

Fault tolerance: every call also returns its clients' private states as a
second object, which stays in the object store (its reference is kept here,
the value is never fetched by the server). Every call on a client actor, from
start-up (constructor, initial-model hand-off, setup stages) through rounds
and checkpoints, goes through :meth:`RayExecutor._collect`: if the actor dies
mid-call, a new actor is created for the same clients, their setup exchanges
(``replay=True``: data standardization) are replayed, their last states are
passed to it by reference, and the call is redone with the same instructions
and seeds: the result equals an undisturbed run. After ``max_restarts`` failed
attempts a round's operation goes on without the call's clients (recorded in
``failure_events``); any other call raises :class:`ActorFailed`, one line
naming the actor and the error.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from typing import Any, Callable

import ray
from ray.exceptions import RayActorError

from fedsim.actors.client import ClientActor
from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply
from fedsim.runtime.executor import Executor
from fedsim.seeding import numpy_rng

log = logging.getLogger(__name__)

#: one call per actor index: ``calls[index](actor) -> ObjectRef``
Calls = dict[int, Callable[[Any], Any]]


class ActorFailed(UserError):
    """A Ray actor died more often than ``ray.max_restarts`` allows, where the run cannot go on without it."""


def reason(exc: BaseException) -> str:
    """One line saying why a Ray call failed: the error's type, its first line, why the actor is dead and its pid
    (where Ray's message says so)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    because = next((line for line in lines[1:] if line.startswith("The actor is dead because")), "")
    pid = next((line.split(":", 1)[1].strip() for line in lines[1:] if line.startswith("pid:")), "")
    text = lines[0] + (f" {because.split('. ')[0].rstrip('.')}." if because else "")
    return f"{type(exc).__name__}: {text}" + (f" (pid {pid})" if pid else "")


@dataclass(frozen=True)
class ActorSpec:
    """How to (re)create the client actors of a run."""

    config: object
    federation: object
    hosted: tuple[tuple[int, ...], ...]  # client ids per actor index
    resources: tuple[tuple[float, float], ...]  # (CPUs, GPUs) per actor index; GPUs above 0: its clients on CUDA
    kill: str = ""  # the FEDSIM_TEST_KILL test hook (fedsim.actors.client), "" when unset
    runtime_env: Any = None  # the actors' Ray runtime environment (None: the job's, or the creating actor's)
    bundles: Any = None  # (placement group, bundle of actor 0): actor i in bundle i + that; None: where Ray puts it

    def device(self, index: int) -> str:
        """Where actor ``index`` runs its clients: "cuda" when it reserves GPUs, else "cpu"."""
        return "cuda" if self.resources[index][1] > 0 else "cpu"

    def ray_options(self, **resources) -> dict[str, Any]:
        """Ray's options for an actor of this run: ``resources``, and the run's runtime environment when it has
        one."""
        return {**resources, **({"runtime_env": self.runtime_env} if self.runtime_env else {})}

    def create(self, index: int):
        cpus, gpus = self.resources[index]
        options = self.ray_options(num_cpus=cpus, num_gpus=gpus)
        if self.bundles is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            group, first = self.bundles
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=first + index, placement_group_capture_child_tasks=True
            )
        return (
            ray.remote(ClientActor)
            .options(**options)
            .remote(self.config, self.federation, list(self.hosted[index]), self.device(index), self.kill)
        )


class RayExecutor(Executor):
    def __init__(
        self,
        actors: list,
        spec: ActorSpec,
        max_restarts: int = 3,
        inject_faults: int = 0,
        seed: int = 0,
        rounds: int = 1,
        call_timeout: float = 0.0,
    ):
        super().__init__()
        self.call_timeout = (
            call_timeout  # seconds without any reply before the slowest call counts as failed (0: never)
        )
        self.actors = list(actors)
        self.spec = spec
        self.assignment = {cid: index for index, ids in enumerate(spec.hosted) for cid in ids}
        self.max_restarts = max_restarts
        self.state_refs: dict[int, ray.ObjectRef] = {}  # client id -> latest object holding its private state
        self.replay: dict[int, list[Instruction]] = {}  # setup instructions to redo, in order, on a new actor
        self.failure_events: list[dict] = []
        self.fault_plan = self._plan_faults(inject_faults, seed, rounds)

    def _plan_faults(self, count: int, seed: int, rounds: int) -> dict[int, list[int]]:
        """Which actor to kill in which round (drawn from the seed; for tests and demos)."""
        plan: dict[int, list[int]] = {}
        rng = numpy_rng(seed, "inject-faults")
        for _ in range(count):
            plan.setdefault(int(rng.integers(1, rounds + 1)), []).append(int(rng.integers(len(self.actors))))
        return plan

    def start(self, handoff: bool) -> Any:
        """Wait until every client actor is constructed; with ``handoff``, return the initial server state that
        client actor 0 builds (``ClientActor.initial_server_state``), else None."""
        self._each("ready", "start-up")
        if not handoff:
            return None
        return self._gather({0: lambda actor: actor.initial_server_state.remote()}, "the initial-model hand-off")[0]

    def _each(self, method: str, phase: str) -> dict[int, Any]:
        """``method()`` on every client actor, surviving their deaths."""
        calls = {index: (lambda actor: getattr(actor, method).remote()) for index in range(len(self.actors))}
        return self._gather(calls, phase)

    def _gather(self, calls: Calls, phase: str) -> dict[int, Any]:
        """The result of each call (index -> value); an actor that keeps dying raises ActorFailed."""
        return self._collect(self._submit(calls), calls, phase, rnd=None)

    def _submit(self, calls: Calls) -> dict:
        return {calls[index](self.actors[index]): index for index in sorted(calls)}

    def _collect(self, pending: dict, calls: Calls, phase: str, rnd: int | None, timeout: float = 0) -> dict:
        """Wait for every pending call (ObjectRef -> actor index); a dead actor, or one silent for ``timeout``
        seconds (0: no limit), is recreated and its call redone. Past ``max_restarts``: ActorFailed, or, in a
        round (``rnd`` given), the index left out."""
        results: dict[int, Any] = {}
        attempts: dict[int, int] = {}
        while pending:
            ref = self._next_done(pending, timeout)
            index = pending.pop(ref)
            try:
                results[index] = ray.get(ref)
            except RayActorError as exc:
                if exc.actor_init_failed:  # its constructor raised: no death, nothing to recover
                    raise
                if self._revive(index, attempts, exc, phase, rnd):
                    pending[calls[index](self.actors[index])] = index
        return results

    def _next_done(self, pending: dict, timeout: float):
        """The next finished call; a call that hangs past ``timeout`` is treated like a dead actor."""
        done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout or None)
        if done:
            return done[0]
        ref = next(iter(pending))
        log.warning("client actor %d gave no reply for %.0f s: restarting it", pending[ref], timeout)
        ray.kill(self.actors[pending[ref]], no_restart=True)
        return ref

    def _revive(self, index: int, attempts: dict, exc: Exception, phase: str, rnd: int | None) -> bool:
        """Recreate actor ``index`` after ``exc``: True to redo its call, False once it failed too often."""
        clients = list(self.spec.hosted[index])
        while True:
            attempts[index] = attempts.get(index, 0) + 1
            if attempts[index] > self.max_restarts:
                break
            log.warning(
                "client actor %d died during %s (%s): recreating it and redoing its work", index, phase, reason(exc)
            )
            try:
                self.actors[index] = self._recreate(index)
                return True
            except RayActorError as again:  # the new actor died too (in its constructor, replay or restore)
                if again.actor_init_failed:
                    raise
                exc = again
        if rnd is None:
            times = "once" if attempts[index] == 1 else f"{attempts[index]} times"
            raise ActorFailed(
                f"client actor {index} (clients {clients}) died {times} during {phase}, past "
                f"ray.max_restarts={self.max_restarts} ({reason(exc)})"
            )
        self.failure_events.append({"round": rnd, "clients": clients, "error": type(exc).__name__})
        log.error("clients %s failed %d times in round %d: continuing without them", clients, attempts[index], rnd)
        with contextlib.suppress(RayActorError):  # a live actor for the next operation, if it comes up
            self.actors[index] = self._recreate(index)
        return False

    def _dispatch(self, instructions: dict[int, Instruction], rnd: int, replay: bool) -> dict[int, Reply]:
        payload_refs, batches = self._batches(instructions)
        states: dict[int, ray.ObjectRef] = {}  # actor index -> private states of its latest call

        def call(index: int):
            def submit(actor):
                replies_ref, states[index] = actor.execute.options(num_returns=2).remote(batches[index], *payload_refs)
                return replies_ref

            return submit

        calls = {index: call(index) for index in batches}
        pending = self._submit(calls)
        for index in self.fault_plan.pop(rnd, []):
            if index in batches:
                log.warning("injected fault: killing client actor %d in round %d", index, rnd)
                ray.kill(self.actors[index], no_restart=True)
        phase = "a setup stage" if replay else f"round {rnd}"
        # a setup stage never goes on without a client; call_timeout applies to operations, not to start-up
        results = self._collect(pending, calls, phase, None if replay else rnd, self.call_timeout)
        replies: dict[int, Reply] = {}
        for index, batch_replies in results.items():
            for item in batches[index]:
                self.state_refs[item[0]] = states[index]
                if replay:  # recorded once it succeeded: a recreated actor replays it, a redone call does not repeat it
                    self.replay.setdefault(item[0], []).append(instructions[item[0]])
            for reply in batch_replies:
                replies[reply.client_id] = reply
        return dict(sorted(replies.items()))

    def _batches(self, instructions: dict[int, Instruction]) -> tuple[list, dict[int, list]]:
        """One ``ray.put`` per distinct tensor dict, and each actor's batch of (client, payload index, instruction
        without its tensors)."""
        payload_refs: list = []
        payload_index: dict[int, int] = {}
        batches: dict[int, list] = {}
        for cid, ins in instructions.items():
            key = id(ins.tensors)
            if key not in payload_index:
                payload_index[key] = len(payload_refs)
                payload_refs.append(ray.put(dict(ins.tensors)))
            batches.setdefault(self.assignment[cid], []).append((cid, payload_index[key], replace(ins, tensors={})))
        return payload_refs, batches

    def _recreate(self, index: int):
        """A new actor for the same clients: standardization replayed, last private states restored."""
        self.restarts += 1
        actor = self.spec.create(index)
        hosted = self.spec.hosted[index]
        replay = [(cid, ins) for cid in hosted for ins in self.replay.get(cid, [])]
        if replay:
            refs = [ray.put(dict(ins.tensors)) for _, ins in replay]
            ray.get(
                actor.execute.remote([(cid, i, replace(ins, tensors={})) for i, (cid, ins) in enumerate(replay)], *refs)
            )
        state_refs = list(dict.fromkeys(self.state_refs[cid] for cid in hosted if cid in self.state_refs))
        if state_refs:
            ray.get(actor.import_state_objects.remote(list(hosted), *state_refs))
        return actor

    def placement(self) -> dict:
        """The Ray nodes the client actors run on (recorded in the first round's metrics)."""
        return {"client_nodes": sorted(set(self._each("node_id", "the placement query").values()))}

    def take_failure_events(self) -> list[dict]:
        events, self.failure_events = self.failure_events, []
        return events

    def export_client_states(self) -> dict:
        merged: dict = {}
        for _, states in sorted(self._each("export_states", "a checkpoint").items()):
            merged.update(states)
        return merged

    def import_client_states(self, states: dict) -> None:
        """Restore checkpointed states; kept as state objects, so an actor recreated later restores them too."""
        calls: Calls = {}
        for index, hosted in enumerate(self.spec.hosted):
            ref = ray.put({cid: st for cid, st in states.items() if cid in hosted})
            self.state_refs.update({cid: ref for cid in hosted if cid in states})
            calls[index] = lambda actor, ids=list(hosted), ref=ref: actor.import_state_objects.remote(ids, ref)
        self._gather(calls, "the restore from a checkpoint")
