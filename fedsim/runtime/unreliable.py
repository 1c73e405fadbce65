"""Unreliable clients on a simulated clock: availability, failures mid-round, per-client speeds, a deadline.

    unreliable = UnreliableClients(config.clients, federation, config.run.seed)  # one per run, beside the server
    tracker = unreliable.round(rnd)                                             # one per round (RoundContext)
    replies = tracker.call(executor, "fit", instructions)                        # the replies that arrived

Only source clients go missing: the target's clients, the setup stages (standardization) and the evaluation are
never touched. Every draw derives from (run seed, what it is for, round, client), so both backends, any actor
layout and a resumed run see the same clients missing.

The clock: a client's time in a call is (its instruction's bytes + its reply's bytes) / its link speed + its
training samples x the call's local epochs x ``seconds_per_sample`` / its compute speed; a call lasts until its
slowest kept client answered (a failure is noticed when it happens; with a deadline, at most the deadline unless a
target client takes longer), a round as long as its training calls one after another.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply
from fedsim.seeding import numpy_rng

MEGABIT = 1e6 / 8
"""Bytes per second of one megabit per second."""
MAX_ATTEMPTS = 1000
"""At most this many failed attempts are drawn for one call with ``on_failure: wait``."""


class NoClientAnswered(Exception):
    """Every client of a call is missing (unavailable, failed or late): the server skips the round's update."""


@dataclass(frozen=True)
class Speed:
    """A client's resources on the simulated clock."""

    compute: float
    """The compute speed factor: 1 takes ``seconds_per_sample`` per sample and epoch."""
    link_mbps: float
    """The link speed in megabits per second, both directions."""


class UnreliableClients:
    """The run's draws: which source is available in a round, which fails in a call, every client's speed."""

    def __init__(self, settings, federation, root_seed: int):
        """``settings``: the ``clients`` section (:class:`fedsim.config.ClientsConfig`); a trace file that is
        missing or malformed raises UserError."""
        self.settings = settings
        self.root_seed = root_seed
        self.droppable = frozenset(federation.source_ids)
        self.train_sizes = {c.client_id: c.num_train for c in federation.clients}
        trace = settings.availability_trace
        self.trace = None if trace is None else read_availability_trace(trace)
        self.speeds = client_speeds(settings, federation.client_ids, root_seed)

    def round(self, rnd: int) -> RoundClients:
        return RoundClients(self, rnd)

    def available(self, rnd: int, client_id: int) -> bool:
        """Whether source ``client_id`` is available in round ``rnd`` (the trace, then the drawn probability)."""
        if self.trace is not None and rnd in self.trace and client_id not in self.trace[rnd]:
            return False
        availability = self.settings.availability
        return availability >= 1 or numpy_rng(self.root_seed, "availability", rnd, client_id).random() < availability

    def failures(self, rnd: int, client_id: int, operation: str, occurrence: int) -> list[float]:
        """The failed attempts of a call (the ``occurrence``-th call of ``operation`` in the round), each as the
        share of its work done when it failed: at most one with ``on_failure: drop``."""
        rate = self.settings.failure_rate
        if rate <= 0:
            return []
        rng = numpy_rng(self.root_seed, "failure", rnd, client_id, operation, occurrence)
        most = 1 if self.settings.on_failure == "drop" else MAX_ATTEMPTS
        shares: list[float] = []
        while len(shares) < most and rng.random() < rate:
            shares.append(float(rng.random()))
        return shares

    def phases(self, client_id: int, instruction: Instruction) -> tuple[float, float]:
        """Simulated seconds of receiving ``instruction`` and of computing it on ``client_id``."""
        speed = self.speeds[client_id]
        epochs = instruction.local.local_epochs if instruction.local is not None else 1
        work = self.train_sizes[client_id] * epochs * self.settings.seconds_per_sample
        return instruction.nbytes / (speed.link_mbps * MEGABIT), work / speed.compute

    def seconds(self, client_id: int, instruction: Instruction, reply: Reply) -> float:
        """Simulated seconds from sending ``instruction`` until ``reply`` has arrived."""
        down, compute = self.phases(client_id, instruction)
        return down + compute + reply.nbytes / (self.speeds[client_id].link_mbps * MEGABIT)


class RoundClients:
    """One round: filters each call's sources, keeps the round's clock and says who answered."""

    def __init__(self, clients: UnreliableClients, rnd: int):
        self.clients = clients
        self.round = rnd
        self.missing: dict[int, str] = {}  # source -> why it is gone for the rest of the round
        self.called: set[int] = set()  # the sources the round's training calls asked
        self.seconds = 0.0
        self.retries = 0  # failed attempts redone (on_failure: wait)
        self.occurrences: Counter = Counter()

    def call(self, executor, operation: str, instructions: dict[int, Instruction]) -> dict[int, Reply]:
        """Run ``instructions`` less the missing sources; the replies that arrive in time. Every client missing:
        :class:`NoClientAnswered`."""
        occurrence = self.occurrences[operation]
        self.occurrences[operation] += 1
        self._mark_unavailable(instructions)
        extra, notices = self._draw_failures(executor, operation, instructions, occurrence)
        sent = {cid: ins for cid, ins in instructions.items() if cid not in self.missing}
        timing: dict[int, float] = {}

        def keep(replies: Mapping[int, Reply]) -> list[int]:
            for cid, reply in replies.items():
                timing[cid] = extra.get(cid, 0.0) + self.clients.seconds(cid, sent[cid], reply)
            return [cid for cid in replies if not self._late(cid, timing[cid])]

        replies = executor.run(sent, self.round, keep=keep) if sent else {}
        self._advance_clock(timing, replies, notices)
        gone = {cid: self.missing[cid] for cid in instructions if cid in self.missing}
        if gone and not replies:
            raise NoClientAnswered(f"no client answered {operation!r} ({_listed(gone)})")
        return replies

    def _mark_unavailable(self, instructions: Mapping[int, Instruction]) -> None:
        for cid in instructions:
            if cid in self.clients.droppable:
                self.called.add(cid)
                if cid not in self.missing and not self.clients.available(self.round, cid):
                    self.missing[cid] = "unavailable"

    def _draw_failures(self, executor, operation: str, instructions, occurrence: int) -> tuple[dict, dict]:
        """Each present source's failed attempts: their lost instructions are counted as sent; returns the seconds
        a waited-for client lost (``extra``) and when a dropped failure is noticed (``notices``)."""
        extra: dict[int, float] = {}
        notices: dict[int, float] = {}
        for cid, ins in instructions.items():
            if cid not in self.clients.droppable or cid in self.missing:
                continue
            shares = self.clients.failures(self.round, cid, operation, occurrence)
            if not shares:
                continue
            executor.count(operation, ins.nbytes * len(shares))
            down, compute = self.clients.phases(cid, ins)
            lost = sum(down + share * compute for share in shares)
            if self.clients.settings.on_failure == "drop":
                self.missing[cid] = "failed"
                notices[cid] = lost
            else:
                extra[cid] = lost
                self.retries += len(shares)
        return extra, notices

    def _late(self, client_id: int, seconds: float) -> bool:
        deadline = self.clients.settings.deadline_seconds
        if deadline is None or seconds <= deadline or client_id not in self.clients.droppable:
            return False
        self.missing[client_id] = "late"
        return True

    def _advance_clock(self, timing: dict, replies: Mapping[int, Reply], notices: dict) -> None:
        """The call lasts until its last kept reply, its last noticed failure, or the deadline that cut it."""
        deadline = self.clients.settings.deadline_seconds
        ends = [timing[cid] for cid in replies]
        ends += [seconds if deadline is None else min(seconds, deadline) for seconds in notices.values()]
        if any(self.missing.get(cid) == "late" for cid in timing):
            ends.append(deadline)
        self.seconds += max(ends, default=0.0)

    def metrics(self) -> dict:
        """The round's simulated seconds and who answered: recorded in metrics.jsonl."""
        reasons = Counter(self.missing.values())
        return {
            "virtual_seconds": self.seconds,
            "clients_answered": len(self.called - set(self.missing)),
            "clients_unavailable": reasons["unavailable"],
            "clients_failed": reasons["failed"],
            "stragglers_dropped": reasons["late"],
            "clients_missing": {str(cid): why for cid, why in sorted(self.missing.items())},
            "failed_attempts": self.retries,
        }


def _listed(gone: Mapping[int, str]) -> str:
    return ", ".join(f"client {cid} {why}" for cid, why in sorted(gone.items()))


def client_speeds(settings, client_ids, root_seed: int) -> dict[int, Speed]:
    """Every client's speed: lognormal factors (median 1, sigma ``speed_spread``) drawn per client from the seed,
    replaced by ``speed_trace`` where it lists the client."""
    traced = read_speed_trace(settings.speed_trace) if settings.speed_trace is not None else {}
    speeds = {}
    for cid in client_ids:
        compute, link = 1.0, 1.0
        if settings.speed_spread > 0:
            compute, link = np.exp(numpy_rng(root_seed, "client-speed", cid).normal(0.0, settings.speed_spread, 2))
        own = traced.get(cid, {})
        speeds[cid] = Speed(
            float(own.get("speed", compute)), float(own.get("link_mbps", settings.link_mbps * float(link)))
        )
    return speeds


def read_availability_trace(path: str) -> dict[int, frozenset[int]]:
    """Round -> the clients available in it, from a CSV (``round,client`` rows) or JSON (``{"round": [ids]}``)."""
    key = "clients.availability_trace"
    if str(path).lower().endswith(".json"):
        raw = _read_json(path, key)
        if not isinstance(raw, dict) or not all(isinstance(ids, list) for ids in raw.values()):
            raise UserError(f"{key} {path!r} must hold a mapping of rounds to lists of client ids")
        return {_integer(r, key, path): frozenset(_integer(c, key, path) for c in ids) for r, ids in raw.items()}
    trace: dict[int, set[int]] = {}
    for row in _read_csv(path, key, ("round", "client")):
        trace.setdefault(_integer(row["round"], key, path), set()).add(_integer(row["client"], key, path))
    return {rnd: frozenset(ids) for rnd, ids in trace.items()}


def read_speed_trace(path: str) -> dict[int, dict[str, float]]:
    """Client -> its ``speed`` and ``link_mbps``, from a CSV (``client,speed,link_mbps`` rows) or JSON
    (``{"client": {"speed": s, "link_mbps": m}}``, either field optional)."""
    key = "clients.speed_trace"
    if str(path).lower().endswith(".json"):
        raw = _read_json(path, key)
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise UserError(f"{key} {path!r} must hold a mapping of client ids to {{speed, link_mbps}}")
        rows = [{"client": cid, **fields} for cid, fields in raw.items()]
    else:
        rows = _read_csv(path, key, ("client", "speed", "link_mbps"))
    trace = {}
    for row in rows:
        unknown = sorted(set(row) - {"client", "speed", "link_mbps"})
        if unknown:
            raise UserError(f"{key} {path!r} has unknown fields {unknown}: use speed and link_mbps")
        fields = {name: _positive(row[name], key, path) for name in ("speed", "link_mbps") if name in row}
        trace[_integer(row["client"], key, path)] = fields
    return trace


def _read_json(path: str, key: str):
    try:
        return json.loads(_text(path, key))
    except json.JSONDecodeError as exc:
        raise UserError(f"{key} {path!r} is not valid JSON ({exc.msg}, line {exc.lineno}): fix it") from None


def _read_csv(path: str, key: str, columns: tuple[str, ...]) -> list[dict]:
    reader = csv.DictReader(_text(path, key).splitlines())
    if tuple(reader.fieldnames or ()) != columns:
        raise UserError(f"{key} {path!r} must have the header {','.join(columns)}, got {reader.fieldnames}")
    return list(reader)


def _text(path: str, key: str) -> str:
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"{key} {path!r} does not exist: name an existing .csv or .json file")
    return file.read_text()


def _integer(value, key: str, path: str) -> int:
    try:
        number = float(value)
        if number != int(number) or number < 0:
            raise ValueError
        return int(number)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"{key} {path!r}: {value!r} is not a round or client id (an integer >= 0)") from None


def _positive(value, key: str, path: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = 0.0
    if not (number > 0 and math.isfinite(number)):
        raise UserError(f"{key} {path!r}: {value!r} is not a positive finite number")
    return number
