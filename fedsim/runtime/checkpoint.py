"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds the server state, every client's private state (transient
caches left out), the metrics so far, the callbacks' state and the global RNG
states. It is written atomically (temporary file, fsync, rename), so a run
killed at any moment leaves either the previous or the new checkpoint.
"""

from __future__ import annotations

import pickle
import random
import sys
from pathlib import Path

import numpy as np

from fedsim.errors import UserError
from fedsim.runtime.files import atomic_write_bytes

CHECKPOINT_FILE = "checkpoint.pkl"
FORMAT = 1


def rng_states() -> dict:
    """The global generators; torch's only where torch is loaded (a Ray driver of a numpy server never loads it)."""
    states = {"python": random.getstate(), "numpy": np.random.get_state()}
    if "torch" in sys.modules:
        states["torch"] = sys.modules["torch"].get_rng_state()
    return states


def restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    if "torch" in states:
        import torch

        torch.set_rng_state(states["torch"])


def save_checkpoint(run_dir: Path, payload: dict) -> Path:
    path = Path(run_dir) / CHECKPOINT_FILE
    atomic_write_bytes(path, pickle.dumps({"format": FORMAT, **payload}, protocol=pickle.HIGHEST_PROTOCOL))
    return path


def load_checkpoint(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"--resume {run_dir}: no such run directory")
    if (run_dir / "summary.json").exists():
        raise UserError(f"--resume {run_dir}: this run already finished (summary.json exists)")
    path = run_dir / CHECKPOINT_FILE
    if not path.exists():
        raise UserError(
            f"--resume {run_dir}: no {CHECKPOINT_FILE} (the run stopped before its first checkpoint; start it again)"
        )
    try:
        with path.open("rb") as fh:
            payload = pickle.load(fh)
    except Exception as exc:  # a truncated or foreign file
        raise UserError(
            f"--resume {run_dir}: {CHECKPOINT_FILE} is unreadable ({type(exc).__name__}); start the run again"
        ) from None
    if payload.get("format") != FORMAT:
        raise UserError(
            f"--resume {run_dir}: checkpoint format {payload.get('format')} is not supported by this version"
        )
    return payload
