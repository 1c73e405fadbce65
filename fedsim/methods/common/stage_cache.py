"""A training stage that many runs share, computed once: its rounds kept on disk under a key of all it depends on.

A grid's trials often begin with the same stage: every FedDaDiL and DaDiL trial of one (benchmark, target, seed)
first trains the same FedAvg encoder on the sources. :class:`StageCache` keeps such a stage's server state after
each of its rounds, and each round's metrics, in ``<run.cache_dir>/<stage>-<key>.npz``, where the key is the
SHA-256 of everything the stage's result depends on (the caller lists it: data, model, seed, the rounds' local
settings, the clients' device and threads; this module adds fedsim's source and the library versions). A run that
finds the file replays the rounds from it, with no client work, and continues with the same state it would have
computed; each replayed round counts the bytes its exchange cost when it was computed, so its numbers, bytes
included, are the same either way. A run that does not find it computes the rounds and writes the file after the
stage's last round.

Runs that start the same stage at once take turns: the first holds a lock file (``fcntl.flock``) from the stage's
first round to its last, and the others wait on it, then read what it wrote. A directory that cannot be written
or locked only costs the saving (logged); the run goes on without the cache. On a cluster, a directory on a
file system every node mounts is shared by every trial; a node-local one by the trials of that node.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np

from fedsim.data.cache import load_arrays, save_arrays

logger = logging.getLogger(__name__)

#: bumped when the stored layout changes, so that older files are not read
FORMAT = 1
_METRICS = "metrics_json"


def stage_key(parts: dict[str, Any]) -> str:
    """A short hex digest of ``parts`` (plain values: dicts, lists, strings, numbers), independent of key order."""
    text = json.dumps({"format": FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


class StoredRound(NamedTuple):
    """One round of a stage: the server state's tensors after it, its metrics, and the bytes its exchange cost."""

    tensors: dict
    metrics: dict
    operation: str
    sent: int
    received: int


class StageCache:
    """The rounds ``1..rounds`` of one stage: each round's tensors (a dict of arrays) and metrics (plain values)."""

    def __init__(self, directory: str, stage: str, parts: dict[str, Any], rounds: int):
        self.name = f"{stage}-{stage_key({**parts, 'source': source_digest(), 'versions': library_versions()})}"
        self.directory = Path(directory).expanduser()
        self.rounds = rounds
        self.stored: Optional[dict[int, StoredRound]] = None  # what was read, by round
        self.computed: Optional[dict[int, StoredRound]] = None  # what this run computes from the first round
        self._lock = None

    def begin(self) -> bool:
        """At the stage's first round: wait for a run that computes it, then read it; True when it was found.
        Otherwise this run computes it (``record`` each round) and holds the lock until it is saved."""
        self._lock = self._locked()
        arrays = load_arrays(self.directory, self.name)
        if arrays is not None:
            self.stored = self._rounds_of(arrays)
            self.release()
            if self.stored is not None:
                logger.info("stage %s read from %s (%d rounds)", self.name, self.directory, self.rounds)
                return True
        self.computed = {}
        return False

    def replay(self, rnd: int) -> Optional[StoredRound]:
        """Round ``rnd`` as stored, or None when this run computes the stage."""
        return None if self.stored is None else self.stored[rnd]

    def record(self, rnd: int, stored: StoredRound) -> None:
        """Keep a computed round; after the stage's last round, write the file and let waiting runs go on."""
        if self.computed is None:  # resumed in the middle of the stage: its first rounds are not here
            return
        tensors = {k: np.array(v, copy=True) for k, v in stored.tensors.items()}
        self.computed[rnd] = stored._replace(tensors=tensors, metrics=json.loads(json.dumps(stored.metrics)))
        if rnd == self.rounds:
            arrays = {
                f"r{r}/{name}": value for r, kept in self.computed.items() for name, value in kept.tensors.items()
            }
            rounds = {
                str(r): [kept.metrics, kept.operation, kept.sent, kept.received] for r, kept in self.computed.items()
            }
            arrays[_METRICS] = np.frombuffer(json.dumps(rounds).encode("utf-8"), dtype=np.uint8)
            save_arrays(self.directory, self.name, arrays)
            self.computed = None
            self.release()

    def release(self) -> None:
        """Let other runs at this stage go on (also when this run stops before the stage's last round)."""
        if self._lock is not None:
            self._lock.close()  # closing the file releases its flock
            self._lock = None

    def _rounds_of(self, arrays: dict[str, np.ndarray]) -> Optional[dict[int, StoredRound]]:
        if _METRICS not in arrays:
            return None
        rounds = json.loads(bytes(arrays.pop(_METRICS)).decode("utf-8"))
        tensors: dict[int, dict] = {int(r): {} for r in rounds}
        for key, value in arrays.items():
            rnd, name = key.split("/", 1)
            tensors[int(rnd[1:])][name] = value
        stored = {int(r): StoredRound(tensors[int(r)], m, op, sent, got) for r, (m, op, sent, got) in rounds.items()}
        return stored if sorted(stored) == list(range(1, self.rounds + 1)) else None

    def _locked(self):
        """An open lock file holding an exclusive flock (waiting for it), or None where that is not possible."""
        try:
            import fcntl

            self.directory.mkdir(parents=True, exist_ok=True)
            handle = open(self.directory / f"{self.name}.lock", "a")  # noqa: SIM115 (held across rounds)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            return handle
        except (OSError, ImportError) as exc:
            logger.warning("stage cache %s cannot be locked (%s); runs may compute it more than once", self.name, exc)
            return None


def library_versions() -> dict[str, str]:
    """The versions a stored stage's numbers depend on beyond its settings."""
    import torch

    return {"torch": torch.__version__, "cuda": str(torch.version.cuda), "numpy": np.__version__}


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 of fedsim's own Python source (every ``.py`` file of the package, by relative path): a changed line
    of code is another key, whatever the package's version says."""
    root = Path(__file__).resolve().parents[2]  # the fedsim package
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode("utf-8") + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
