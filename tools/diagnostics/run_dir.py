"""What a diagnostic reads from a run directory (``fedsim run --out DIR``): its config, summary, per-round metrics
and last checkpoint, each checked with one clear error when it is missing or belongs to another method."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np

from fedsim.config import ExperimentConfig, load_config
from fedsim.data.scenario import Federation, build_federation, load_client_data
from fedsim.errors import UserError
from fedsim.runtime.checkpoint import CHECKPOINT_FILE

if TYPE_CHECKING:  # torch loads when a diagnostic runs, not when the CLI starts
    import torch


@dataclass
class RunDir:
    """A run directory that ``fedsim run`` wrote: ``config.yaml``, ``metrics.jsonl``, ``summary.json``,
    ``checkpoint.pkl`` (the server's and every client's state at the last checkpointed round)."""

    path: Path
    config: ExperimentConfig
    diagnostic: str = ""

    @classmethod
    def open(cls, path: str | Path, diagnostic: str, methods: Iterable[str] = ()) -> "RunDir":
        """The run in ``path``; a UserError when it is no run directory or ran a method not in ``methods``."""
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"{diagnostic}: {path} is not a directory: give the --out directory of a 'fedsim run'")
        if not (path / "config.yaml").is_file() or not (path / "metrics.jsonl").is_file():
            raise UserError(
                f"{diagnostic}: {path} holds no run (config.yaml and metrics.jsonl): "
                "give the --out directory of a 'fedsim run'"
            )
        config = load_config(str(path / "config.yaml"), [])
        methods = tuple(methods)
        if methods and config.method.name not in methods:
            raise UserError(
                f"{diagnostic}: {path} is a {config.method.name} run; this diagnostic reads {' or '.join(methods)} runs"
            )
        return cls(path, config, diagnostic)

    @cached_property
    def metrics(self) -> list[dict]:
        """One dict per round (metrics.jsonl)."""
        return [json.loads(line) for line in (self.path / "metrics.jsonl").read_text().splitlines() if line.strip()]

    @cached_property
    def summary(self) -> dict:
        path = self.path / "summary.json"
        if not path.is_file():
            raise UserError(f"{self.diagnostic}: {self.path} has no summary.json: the run did not finish")
        return json.loads(path.read_text())

    @cached_property
    def federation(self) -> Federation:
        return build_federation(self.config.data)

    @cached_property
    def checkpoint(self) -> dict:
        """The last checkpoint (round, server state, client states); a UserError when the run wrote none."""
        path = self.path / CHECKPOINT_FILE
        if not path.is_file():
            raise UserError(
                f"{self.diagnostic}: {self.path} has no {CHECKPOINT_FILE}: run it with run.checkpoint_every "
                "below run.rounds (the diagnostic reads the state of the last checkpointed round)"
            )
        with path.open("rb") as fh:
            return pickle.load(fh)

    @property
    def checkpoint_round(self) -> int:
        return int(self.checkpoint["round"])

    @property
    def server_state(self) -> dict:
        return self.checkpoint["server"]["method_state"]

    def client_state(self, client_id: int) -> dict:
        return self.checkpoint["clients"][client_id]

    def source_ids(self) -> list[int]:
        return list(self.federation.source_ids)

    def domain(self, client_id: int) -> str:
        return self.federation.info(client_id).domain

    def test_labels(self, client_id: int) -> np.ndarray:
        """A client's test labels (evaluation data; diagnostics read them for source clients only)."""
        return load_client_data(self.config.data, self.federation, client_id).test.y

    def train_labels(self, client_id: int) -> np.ndarray:
        return load_client_data(self.config.data, self.federation, client_id).train.y


def atoms(run: RunDir) -> tuple[torch.Tensor, torch.Tensor]:
    """The dictionary at the checkpoint: atom features (K, n, d) and label logits (K, n, C)."""
    import torch

    state = run.server_state
    return torch.tensor(np.asarray(state["atoms_x"])), torch.tensor(np.asarray(state["atoms_logits"]))


def alpha_of(run: RunDir, client_id: int) -> torch.Tensor:
    """A client's barycentric coordinates: its private state (FedDaDiL) or the server's (DaDiL)."""
    import torch

    if run.config.method.name == "dadil":
        return torch.tensor(np.asarray(run.server_state["alphas"][client_id]), dtype=torch.float32)
    return torch.as_tensor(run.client_state(client_id)["alpha"]).float()


def test_features(run: RunDir, client_id: int) -> torch.Tensor:
    """A client's test data in the dictionary's feature space (standardized, encoded), as the run held it."""
    import torch

    return torch.as_tensor(run.client_state(client_id)["test_features"]).float()


def subsample(x: torch.Tensor, count: int, seed: int = 0) -> torch.Tensor:
    """``count`` rows of ``x`` drawn without replacement (all of them when it has fewer)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return x[torch.randperm(len(x), generator=generator)[:count]]


def fmt_row(values: Iterable[float], width: int = 7, digits: int = 2) -> str:
    return " ".join(f"{v:{width}.{digits}f}" for v in values)
