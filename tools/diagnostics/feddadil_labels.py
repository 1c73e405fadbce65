"""``python -m tools.diagnose feddadil-labels RUN_DIR``: what DaDiL-E's per-atom classifiers are trained on.

At the run's last checkpoint: every atom's hard labels (argmax of its soft labels) counted per class and their mean
top probability, then every client's alpha (the target's too: alpha is learned without labels).
"""

from __future__ import annotations

import argparse

import numpy as np

from tools.diagnostics.run_dir import RunDir, alpha_of, atoms, fmt_row

NAME = "feddadil-labels"
HELP = "each atom's label counts and confidence, and every client's alpha (FedDaDiL, DaDiL)"
METHODS = ("feddadil", "dadil")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a FedDaDiL or DaDiL run directory with a checkpoint")


def measure(run: RunDir) -> dict:
    """``atoms``: per atom, hard-label counts and mean top probability; ``alpha``: per client id."""
    import torch

    _, atoms_logits = atoms(run)
    soft = torch.softmax(atoms_logits, -1)
    classes = soft.shape[-1]
    described = [
        {"counts": np.bincount(s.argmax(-1).numpy(), minlength=classes).tolist(), "top": float(s.max(-1).values.mean())}
        for s in soft
    ]
    alphas = {cid: [float(a) for a in alpha_of(run, cid)] for cid in run.federation.client_ids}
    return {"atoms": described, "alpha": alphas}


def report(run: RunDir, found: dict) -> str:
    out = [f"{NAME}: {run.path} ({run.config.method.name}), atoms at round {run.checkpoint_round}"]
    for k, atom in enumerate(found["atoms"]):
        out.append(f"atom {k}: hard labels per class {atom['counts']}, mean top probability {atom['top']:.2f}")
    for cid, alpha in found["alpha"].items():
        info = run.federation.info(cid)
        out.append(f"client {cid} ({info.domain}, {info.role}): alpha {fmt_row(alpha, width=5)}")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    run_dir = RunDir.open(args.run_dir, NAME, METHODS)
    print(report(run_dir, measure(run_dir)))
    return 0
