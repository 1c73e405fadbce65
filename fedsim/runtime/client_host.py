"""ClientHost: the clients living in one process (the driver, or one Ray actor).

It builds each hosted client's data itself from (benchmark config, client id),
keeps each client's private state, and runs the method's named operations on its device (``cpu``, or ``cuda``
where the clients asked for GPUs) in the run's precision (``run.precision``).
Only Replies leave it: never inputs, labels, or private state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from fedsim.coercion import read_values
from fedsim.data import normalization
from fedsim.data.base import ClientData
from fedsim.data.scenario import Federation, forget_domain_data, load_client_data
from fedsim.errors import NumericalError
from fedsim.messages import Instruction, Reply
from fedsim.methods.common import precision
from fedsim.models.features import client_features
from fedsim.runtime.numerics import check_tensors

#: operations the host answers itself, for every method: the standardization setup stage
HOST_OPERATIONS = (normalization.DATA_STATS, normalization.DATA_STANDARDIZE)

log = logging.getLogger(__name__)


@contextlib.contextmanager
def torch_threads(count: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def threads_for(cpus: float) -> int:
    """Torch threads for a client that was given ``cpus`` CPUs (fractions round down, at least 1)."""
    return max(1, int(cpus))


@dataclass(frozen=True)
class StandardizeValues:
    """The values of a ``data_standardize`` instruction (:func:`fedsim.data.normalization.standardize_federation`)."""

    own_statistics: bool = False
    """Standardize by the client's own statistics (``data.normalization=per-domain``) instead of the mean and std
    the instruction's tensors carry."""


class ClientHost:
    def __init__(self, config, federation: Federation, client_ids: Iterable[int], device: str = "cpu"):
        from fedsim.registry import METHODS

        self.config = config
        self.federation = federation
        self.client_ids = sorted(client_ids)
        self.device = device
        self.method = METHODS.get(config.method.name)(config, federation, device=device)
        self.threads = threads_for(config.resources.cpus_per_client)
        self.vectorize = config.resources.vectorize
        self.precision = config.run.precision
        self._data: dict[int, Any] = {}
        self._state: dict[int, Any] = {}
        self._unbuilt: dict[str, int] = {}  # domain -> hosted clients whose data is not built yet
        for cid in self.client_ids:
            domain = federation.info(cid).domain
            self._unbuilt[domain] = self._unbuilt.get(domain, 0) + 1

    def _client(self, client_id: int):
        if client_id not in self.client_ids:
            raise KeyError(f"client {client_id} is not hosted here (hosts {self.client_ids})")
        if client_id not in self._data:  # lazily: only clients that are asked to work build their data
            data = load_client_data(self.config.data, self.federation, client_id)
            with torch_threads(self.threads):  # a frozen backbone's features: the same threads on every backend
                self._data[client_id] = client_features(self.config, data, self.device)
            self._state[client_id] = self.method.init_client(self._data[client_id])
            domain = self.federation.info(client_id).domain
            self._unbuilt[domain] -= 1
            if self._unbuilt[domain] == 0:  # every hosted client of the domain holds its own copy: free the full arrays
                forget_domain_data(self.config.data, domain)
        return self._data[client_id]

    def execute(self, client_id: int, instruction: Instruction) -> Reply:
        data = self._client(client_id)
        if instruction.operation in HOST_OPERATIONS:
            return self._standardization(client_id, data, instruction)
        operation = self.method.operation(instruction.operation)
        try:
            with torch_threads(self.threads), precision.using(self.precision):
                reply, self._state[client_id] = operation(instruction, self._state[client_id], data)
        except NumericalError as exc:  # raised where the value was found: add where in the run that was
            raise exc.located(**self._where(client_id, instruction))
        return self._checked(client_id, instruction, reply)

    def execute_batch(self, items: Sequence[tuple[int, Instruction]]) -> list[Reply]:
        """Replies to ``(client id, instruction)`` pairs, in their order. With ``resources.vectorize: auto`` the
        clients of one operation that the method runs batched go through it together
        (:func:`fedsim.methods.common.vectorized.use_vectorized`); every other pair runs alone, in order."""
        done: dict[int, Reply] = {}
        if self.vectorize != "off":
            from fedsim.methods.common.vectorized import use_vectorized

            by_operation: dict[str, list[tuple[int, Instruction]]] = {}
            for client_id, instruction in items:
                by_operation.setdefault(instruction.operation, []).append((client_id, instruction))
            for operation, group in by_operation.items():
                if use_vectorized(self.vectorize, self.method, operation, len(group)):
                    done.update(self._execute_vectorized(operation, group))
        return [done[cid] if cid in done else self.execute(cid, instruction) for cid, instruction in items]

    def _execute_vectorized(self, operation: str, items: list[tuple[int, Instruction]]) -> dict[int, Reply]:
        """One call of the method's batched counterpart of ``operation`` for every client of ``items``."""
        from fedsim.methods.common.vectorized import vectorized_operations

        batched = getattr(self.method, vectorized_operations(self.method)[operation])
        work = [(instruction, self._state[cid], data) for cid, instruction, data in self._with_data(items)]
        with torch_threads(self.threads), precision.using(self.precision):
            results = batched(work)
        replies = {}
        for (client_id, instruction), (reply, state) in zip(items, results):
            self._state[client_id] = state
            replies[client_id] = self._checked(client_id, instruction, reply)
        return replies

    def _with_data(self, items: list[tuple[int, Instruction]]) -> list[tuple[int, Instruction, ClientData]]:
        return [(client_id, instruction, self._client(client_id)) for client_id, instruction in items]

    def _where(self, client_id: int, instruction: Instruction) -> dict:
        return {"method": self.config.method.name, "round": instruction.round, "client": client_id}

    def _checked(self, client_id: int, instruction: Instruction, reply: Reply) -> Reply:
        """``reply`` after the checks every reply passes: its client id, and finite tensors."""
        if not isinstance(reply, Reply) or reply.client_id != client_id:
            raise TypeError(
                f"{type(self.method).__name__}.{instruction.operation} must return Reply(client_id={client_id}, ...)"
            )
        where = self._where(client_id, instruction)
        check_tensors(reply.tensors, "tensor {name} of its " + f"{instruction.operation} reply", **where)
        return reply

    def _standardization(self, client_id: int, data: ClientData, instruction: Instruction) -> Reply:
        """Shared standardization from sums (no raw rows leave), or each client by its own statistics."""
        if instruction.operation == normalization.DATA_STATS:
            stats = normalization.feature_stats(data.train.x)
            return Reply(client_id, stats.to_tensors(), {}, num_examples=len(data.train))
        if read_values(StandardizeValues, instruction.values, instruction.operation).own_statistics:
            mean, std = normalization.mean_std(normalization.feature_stats(data.train.x))
        else:
            mean, std = instruction.tensors["mean"], instruction.tensors["std"]
        train = dataclasses.replace(data.train, x=normalization.standardize(data.train.x, mean, std))
        test = dataclasses.replace(data.test, x=normalization.standardize(data.test.x, mean, std))
        validation = data.validation  # held out of the training part: scaled by its statistics, never in them
        if validation is not None:
            validation = dataclasses.replace(validation, x=normalization.standardize(validation.x, mean, std))
        self._data[client_id] = dataclasses.replace(data, train=train, test=test, validation=validation)
        return Reply(client_id, {}, {}, num_examples=len(data.train))

    def export_states(self) -> dict[int, Any]:
        """Private state of every resident client, transient caches left out (for checkpoints and recovery)."""
        transient = set(self.method.transient_state_keys)
        out = {}
        for cid, state in self._state.items():
            out[cid] = {k: v for k, v in state.items() if k not in transient} if isinstance(state, dict) else state
        return out

    def import_states(self, states: dict[int, Any]) -> None:
        """Restore private states exported by :meth:`export_states` (caches are rebuilt by ``init_client``)."""
        for cid, saved in states.items():
            if cid not in self.client_ids:
                continue
            self._client(cid)
            current = self._state[cid]
            if isinstance(current, dict) and isinstance(saved, dict):
                current.update(saved)
            else:
                self._state[cid] = saved

    def private_state(self, client_id: int) -> Any:
        """For tests and checkpoints: the client's private state (never sent to the server)."""
        self._client(client_id)
        return self._state[client_id]
