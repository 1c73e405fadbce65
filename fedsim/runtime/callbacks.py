"""Run callbacks: metrics file, TensorBoard, progress bar, early stopping.

A callback sees every round's metrics; ``on_round_end`` returning True stops the run.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)


class Callback:
    def on_run_start(self, simulator) -> None:
        pass

    def on_round_start(self, simulator, rnd: int, evaluate: bool) -> None:
        """Before round ``rnd`` runs; ``evaluate``: the round ends with an evaluation."""

    def on_round_end(self, simulator, metrics: dict) -> Optional[bool]:
        return None

    def on_checkpoint(self, simulator, metrics: dict) -> None:
        """After the checkpoint that follows a round: ``metrics`` (that round's) now holds ``checkpoint_seconds``."""

    def on_run_end(self, simulator, summary: dict) -> None:
        pass

    def state_dict(self) -> dict:
        """What a checkpoint keeps of this callback (most keep nothing)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _flatten(metrics: dict, prefix: str = "") -> dict[str, float]:
    flat = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat


class MetricsFile(Callback):
    """One JSON object per round in ``metrics.jsonl``, flushed as it goes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.last_line_at = 0  # byte offset of the last round's line

    def on_run_start(self, simulator) -> None:
        # a resumed run rewrites the rounds kept in its checkpoint (later lines of the killed run are dropped)
        self.path.write_text("".join(json.dumps(m, sort_keys=True) + "\n" for m in simulator.history))

    def on_round_end(self, simulator, metrics: dict) -> None:
        with self.path.open("a") as fh:
            self.last_line_at = fh.tell()
            fh.write(json.dumps(metrics, sort_keys=True) + "\n")

    def on_checkpoint(self, simulator, metrics: dict) -> None:
        """The round's line again, with the seconds its checkpoint took."""
        with self.path.open("r+") as fh:
            fh.seek(self.last_line_at)
            fh.truncate()
            fh.write(json.dumps(metrics, sort_keys=True) + "\n")


class TensorBoard(Callback):
    """Scalars under ``tb/`` (nested metrics become ``source_accuracy/usps`` and so on).

    Written with TensorBoard's own event writer (the one ``torch.utils.tensorboard`` wraps), so the driver
    of a Ray run, which trains nothing, never loads torch for it.
    """

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.writer = None

    def on_run_start(self, simulator) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(self.log_dir))

    def on_round_end(self, simulator, metrics: dict) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        step = int(metrics["round"])
        for name, value in _flatten(metrics).items():
            if name != "round":
                summary = Summary(value=[Summary.Value(tag=name, simple_value=value)])
                self.writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
        self.writer.flush()

    def on_run_end(self, simulator, summary: dict) -> None:
        if self.writer is not None:
            self.writer.close()


class ProgressBar(Callback):
    """A bar over the rounds; its text says when a round ends with an evaluation (which, for methods whose
    evaluation trains predictors, can outlast many rounds) and how long the last evaluation took."""

    def __init__(self, total: int, description: str):
        self.total = total
        self.description = description
        self.bar = None
        self.shown: dict[str, str] = {}

    def on_run_start(self, simulator) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=self.total, desc=self.description, unit="round", dynamic_ncols=True, initial=len(simulator.history)
        )

    def on_round_start(self, simulator, rnd: int, evaluate: bool) -> None:
        if evaluate:
            self.bar.set_postfix({**self.shown, "now": f"round {rnd}, then its evaluation"})

    def on_round_end(self, simulator, metrics: dict) -> None:
        shown = {}
        if "target_accuracy" in metrics:
            shown["target"] = f"{metrics['target_accuracy']:.3f}"
        if "mean_source_accuracy" in metrics:
            shown["sources"] = f"{metrics['mean_source_accuracy']:.3f}"
        if "eval_seconds" in metrics:
            shown["last evaluation"] = f"{metrics['eval_seconds']:.1f}s"
        self.shown = {**self.shown, **shown}
        self.bar.set_postfix(self.shown)
        self.bar.update(1)

    def on_run_end(self, simulator, summary: dict) -> None:
        if self.bar is not None:
            self.bar.close()


class EarlyStopping(Callback):
    """Stop after ``patience`` evaluated rounds without a gain of the monitored metric.

    The default monitor is the mean *source* test accuracy: target labels are
    for evaluation only and never steer training.
    """

    def __init__(self, patience: int, monitor: str = "mean_source_accuracy", min_delta: float = 1e-4):
        if monitor.startswith("target"):
            raise ValueError("early stopping on target metrics would use target labels for training decisions")
        self.patience = patience
        self.monitor = monitor
        self.min_delta = min_delta
        self.best = float("-inf")
        self.waited = 0

    def state_dict(self) -> dict:
        return {"best": self.best, "waited": self.waited}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.waited = state["best"], state["waited"]

    def on_round_end(self, simulator, metrics: dict) -> Optional[bool]:
        if self.monitor not in metrics:
            return None
        if metrics[self.monitor] > self.best + self.min_delta:
            self.best, self.waited = metrics[self.monitor], 0
            return None
        self.waited += 1
        if self.waited >= self.patience:
            log.info(
                "early stop at round %s: %s did not improve for %d rounds",
                metrics["round"],
                self.monitor,
                self.patience,
            )
            return True
        return None
