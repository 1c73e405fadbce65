"""Simulator: the round loop, callbacks, and the run directory.

Run directory layout: ``config.yaml`` (resolved), ``metrics.jsonl`` (one
object per round), ``tb/`` (TensorBoard), ``summary.json`` (written last and
atomically: its presence means the run finished).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Optional

from fedsim.config import ExperimentConfig, dump_yaml
from fedsim.errors import NumericalError, unwrapped
from fedsim.privacy.protocol import PRIVACY_SUMMARY_KEYS
from fedsim.runtime.callbacks import Callback, EarlyStopping, MetricsFile, ProgressBar, TensorBoard
from fedsim.runtime.checkpoint import restore_rng_states, rng_states, save_checkpoint
from fedsim.runtime.files import atomic_write_text

log = logging.getLogger(__name__)


def default_callbacks(config: ExperimentConfig, out_dir: Optional[Path]) -> list[Callback]:
    callbacks: list[Callback] = []
    if out_dir is not None:
        callbacks.append(MetricsFile(out_dir / "metrics.jsonl"))
        if config.run.tensorboard:
            callbacks.append(TensorBoard(out_dir / "tb"))
    if config.run.progress:
        callbacks.append(ProgressBar(config.run.rounds, f"{config.method.name} -> {config.data.target}"))
    if config.run.early_stop_patience:
        callbacks.append(EarlyStopping(config.run.early_stop_patience))
    return callbacks


class Simulator:
    """Drives ``server.setup`` and ``server.run_round`` for the configured rounds.

    ``server`` is a :class:`fedsim.runtime.server.ServerHandle`: a Server in this
    process, or the Ray backend's forwarding proxy to a Server in an actor.
    """

    def __init__(
        self,
        config: ExperimentConfig,
        server,
        out_dir: Optional[Path] = None,
        callbacks: Optional[list[Callback]] = None,
        resume: Optional[dict] = None,
    ):
        self.config = config
        self.server = server
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.callbacks = default_callbacks(config, self.out_dir) if callbacks is None else callbacks
        self.history: list[dict] = []
        self.resume = resume
        self.last_checkpoint: Optional[int] = None if resume is None else resume["round"]

    def run(self) -> dict:
        started = time.perf_counter()
        first_round = 1 if self.resume is None else self.resume["round"] + 1
        self.server.setup(first_round)  # setup stages (data standardization), redone identically on resume
        if self.resume is not None:
            self._restore(self.resume)
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.out_dir / "config.yaml", dump_yaml(self.config))
        for callback in self.callbacks:
            callback.on_run_start(self)
        rounds = self.config.run.rounds
        every = self.config.run.checkpoint_every
        for rnd in range(first_round, rounds + 1):
            evaluate = rnd % self.config.run.eval_every == 0 or rnd == rounds
            for callback in self.callbacks:
                callback.on_round_start(self, rnd, evaluate)
            try:
                metrics = self.server.run_round(rnd, evaluate)
            except NumericalError as exc:  # one line for the user, the checkpoint left as it was
                raise unwrapped(exc).located(round=rnd, checkpoint=self._checkpoint_note()) from None
            self.history.append(metrics)
            stop = [callback.on_round_end(self, metrics) for callback in self.callbacks]
            if any(stop):  # early stopping acts on evaluated rounds only, so the last round has accuracies
                break
            if self.out_dir is not None and every and rnd % every == 0 and rnd < rounds:
                started_checkpoint = time.perf_counter()
                self.checkpoint(rnd)
                metrics["checkpoint_seconds"] = time.perf_counter() - started_checkpoint
                for callback in self.callbacks:
                    callback.on_checkpoint(self, metrics)
        summary = self.summary(time.perf_counter() - started)
        for callback in self.callbacks:
            callback.on_run_end(self, summary)
        if self.out_dir is not None:
            atomic_write_text(self.out_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
        return summary

    def _checkpoint_note(self) -> str:
        """Where the run can be looked at after it stopped: its last checkpoint, kept in the run directory."""
        if self.out_dir is None:
            return ""
        if self.last_checkpoint is None:
            return f"no checkpoint was written yet; {self.out_dir / 'metrics.jsonl'} holds the rounds before"
        return f"the checkpoint of round {self.last_checkpoint} is kept in {self.out_dir}"

    def checkpoint(self, rnd: int) -> None:
        """Server state, every client's private state, metrics, callbacks and RNG states, atomically."""
        save_checkpoint(
            self.out_dir,
            {
                "round": rnd,
                "server": self.server.export_state(),
                "clients": self.server.export_client_states(),
                "history": self.history,
                "callbacks": [callback.state_dict() for callback in self.callbacks],
                "rng": rng_states(),
            },
        )
        self.last_checkpoint = rnd

    def _restore(self, payload: dict) -> None:
        self.server.restore_state(payload["server"])
        self.server.import_client_states(payload["clients"])
        self.history = list(payload["history"])
        for callback, saved in zip(self.callbacks, payload["callbacks"]):
            callback.load_state_dict(saved)
        restore_rng_states(payload["rng"])
        log.info("resuming after round %d", payload["round"])

    def summary(self, wall_seconds: float) -> dict:
        last_evaluated = next(m for m in reversed(self.history) if m.get("evaluated"))
        extra = {
            k: v
            for k, v in last_evaluated.items()
            if k.startswith(("target_accuracy_", "source_accuracy_", "final_", "score_"))
        }
        last = self.history[-1]
        spent = {k: last[k] for k in PRIVACY_SUMMARY_KEYS if k in last}  # the whole run's, with privacy on
        clock = (
            {"virtual_seconds": math.fsum(m["virtual_seconds"] for m in self.history)}
            if "virtual_seconds" in last
            else {}
        )
        return {
            **extra,
            **spent,
            **clock,  # the clients section's simulated clock: the whole run's simulated time
            "method": self.config.method.name,
            "benchmark": self.config.data.benchmark,
            "target": self.config.data.target,
            "backend": self.config.run.backend,
            "seed": self.config.run.seed,
            "rounds": len(self.history),
            "target_accuracy": last_evaluated.get("target_accuracy"),
            "source_accuracy": last_evaluated.get("source_accuracy", {}),
            "bytes_sent": int(sum(m["bytes_sent"] for m in self.history)),
            "bytes_received": int(sum(m["bytes_received"] for m in self.history)),
            "wall_seconds": round(wall_seconds, 3),
        }
