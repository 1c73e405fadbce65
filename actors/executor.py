"""RayExecutor: the Executor protocol over long-lived ClientActors.

Each round's payloads are ``ray.put`` once (one object per distinct tensor
dict, usually just the global model) and passed by reference to every actor;
each actor gets one call with the batch of its clients; replies are gathered
with ``ray.wait`` and sorted by client id, so aggregation never depends on
arrival order.
"""
from __future__ import annotations

from typing import Sequence

import ray

from fedsim.messages import Instruction, Reply
from fedsim.runtime.executor import Executor


class RayExecutor(Executor):
    def __init__(self, actors: Sequence, assignment: dict[int, int]):
        super().__init__()
        self.actors = list(actors)
        self.assignment = dict(assignment)  # client id -> actor index

    def _dispatch(self, instructions: dict[int, Instruction]) -> dict[int, Reply]:
        payload_refs: list = []
        payload_index: dict[int, int] = {}
        batches: dict[int, list] = {}
        for cid, ins in instructions.items():
            key = id(ins.tensors)
            if key not in payload_index:
                payload_index[key] = len(payload_refs)
                payload_refs.append(ray.put(dict(ins.tensors)))
            batches.setdefault(self.assignment[cid], []).append((cid, ins.operation, payload_index[key], dict(ins.config)))
        pending = [self.actors[a].execute.remote(batch, *payload_refs) for a, batch in sorted(batches.items())]
        replies: dict[int, Reply] = {}
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for reply in ray.get(done[0]):
                replies[reply.client_id] = reply
        return dict(sorted(replies.items()))
