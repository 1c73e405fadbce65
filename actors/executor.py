"""RayExecutor: the Executor protocol over long-lived ClientActors, surviving actor deaths.

Each round's payloads are ``ray.put`` once (one object per distinct tensor
dict, usually just the global model) and passed by reference to every actor;
each actor gets one call with the batch of its clients; replies are gathered
with ``ray.wait`` and sorted by client id, so aggregation never depends on
arrival order.

Fault tolerance: every call also returns its clients' private states as a
second object, which stays in the object store (its reference is kept here,
the value is never fetched by the server). If an actor dies mid-call, a new
actor is created for the same clients, their setup exchanges (``replay=True``:
data standardization) are replayed,
their last states are passed to it by reference, and the call is redone with
the same instructions and seeds: the result equals an undisturbed run. After
``max_restarts`` failed attempts the call's clients are dropped for this
operation and the event is recorded (``failure_events``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError

from actors.client import ClientActor
from fedsim.messages import Instruction, Reply
from fedsim.runtime.executor import Executor
from fedsim.seeding import numpy_rng

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActorSpec:
    """How to (re)create the client actors of a run."""

    config: object
    federation: object
    hosted: tuple[tuple[int, ...], ...]  # client ids per actor index
    device: str
    num_cpus: float
    num_gpus: float

    def create(self, index: int):
        return (
            ray.remote(ClientActor)
            .options(num_cpus=self.num_cpus, num_gpus=self.num_gpus)
            .remote(self.config, self.federation, list(self.hosted[index]), self.device)
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

    def _dispatch(self, instructions: dict[int, Instruction], rnd: int, replay: bool) -> dict[int, Reply]:
        payload_refs: list = []
        payload_index: dict[int, int] = {}
        batches: dict[int, list] = {}
        for cid, ins in instructions.items():
            key = id(ins.tensors)
            if key not in payload_index:
                payload_index[key] = len(payload_refs)
                payload_refs.append(ray.put(dict(ins.tensors)))
            batches.setdefault(self.assignment[cid], []).append(
                (cid, ins.operation, payload_index[key], dict(ins.config))
            )
        pending = {}
        for index, batch in sorted(batches.items()):
            replies_ref, states_ref = self.actors[index].execute.options(num_returns=2).remote(batch, *payload_refs)
            pending[replies_ref] = (index, states_ref)
        for index in self.fault_plan.pop(rnd, []):
            if index in batches:
                log.warning("injected fault: killing client actor %d in round %d", index, rnd)
                ray.kill(self.actors[index], no_restart=True)
        replies: dict[int, Reply] = {}
        attempts: dict[int, int] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=self.call_timeout or None)
            if not done:  # a call that hangs is treated like a dead actor: kill, recreate, redo
                ref = next(iter(pending))
                log.warning(
                    "client actor %d gave no reply for %.0f s: restarting it", pending[ref][0], self.call_timeout
                )
                ray.kill(self.actors[pending[ref][0]], no_restart=True)
                done = [ref]
            index, states_ref = pending.pop(done[0])
            try:
                batch_replies = ray.get(done[0])
            except RayActorError as exc:
                attempts[index] = attempts.get(index, 0) + 1
                clients = [item[0] for item in batches[index]]
                if attempts[index] > self.max_restarts:
                    self.failure_events.append({"round": rnd, "clients": clients, "error": type(exc).__name__})
                    log.error(
                        "clients %s failed %d times in round %d: continuing without them", clients, attempts[index], rnd
                    )
                    self.actors[index] = self._recreate(index)
                    continue
                log.warning("client actor %d died (%s): recreating it and redoing its work", index, type(exc).__name__)
                self.actors[index] = self._recreate(index)
                replies_ref, states_ref = (
                    self.actors[index].execute.options(num_returns=2).remote(batches[index], *payload_refs)
                )
                pending[replies_ref] = (index, states_ref)
                continue
            for item in batches[index]:
                self.state_refs[item[0]] = states_ref
                if replay:  # recorded once it succeeded: a recreated actor replays it, a redone call does not repeat it
                    self.replay.setdefault(item[0], []).append(instructions[item[0]])
            for reply in batch_replies:
                replies[reply.client_id] = reply
        return dict(sorted(replies.items()))

    def _recreate(self, index: int):
        """A new actor for the same clients: standardization replayed, last private states restored."""
        self.restarts += 1
        actor = self.spec.create(index)
        hosted = self.spec.hosted[index]
        replay = [(cid, ins) for cid in hosted for ins in self.replay.get(cid, [])]
        if replay:
            refs = [ray.put(dict(ins.tensors)) for _, ins in replay]
            ray.get(
                actor.execute.remote(
                    [(cid, ins.operation, i, dict(ins.config)) for i, (cid, ins) in enumerate(replay)], *refs
                )
            )
        state_refs = list(dict.fromkeys(self.state_refs[cid] for cid in hosted if cid in self.state_refs))
        if state_refs:
            ray.get(actor.import_state_objects.remote(list(hosted), *state_refs))
        return actor

    def placement(self) -> dict:
        """The Ray nodes the client actors run on (recorded in the first round's metrics)."""
        return {"client_nodes": sorted(set(ray.get([a.node_id.remote() for a in self.actors])))}

    def take_failure_events(self) -> list[dict]:
        events, self.failure_events = self.failure_events, []
        return events

    def export_client_states(self) -> dict:
        merged: dict = {}
        for states in ray.get([a.export_states.remote() for a in self.actors]):
            merged.update(states)
        return merged

    def import_client_states(self, states: dict) -> None:
        calls = []
        for index, actor in enumerate(self.actors):
            mine = {cid: st for cid, st in states.items() if self.assignment.get(cid) == index}
            calls.append(actor.import_states.remote(mine))
        ray.get(calls)
