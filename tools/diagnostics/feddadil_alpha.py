"""``python -m tools.diagnose feddadil-alpha RUN_DIR``: does a source's gap to DaDiL sit in its alpha or in the atoms?

At the run's last checkpoint, every source client's DaDiL-R and DaDiL-E test accuracy two ways: with its own alpha
(what FedDaDiL reports), and with alpha re-fitted on the same atoms (atoms frozen; ``--steps`` projected SGD steps
on the client's DiL loss over its own training data, at the run's lr_alpha, momentum and batch size, on the
class-balanced batches of FedDaDiL's round). When the
re-fitted alpha scores no better, the gap lies in the atoms themselves. Source labels only.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import numpy as np

from tools.diagnostics.run_dir import RunDir, alpha_of, atoms, fmt_row, test_features

if TYPE_CHECKING:  # torch loads when a diagnostic runs, not when the CLI starts
    import torch

NAME = "feddadil-alpha"
HELP = "each source's DaDiL-R / -E accuracy with its own alpha and with alpha re-fitted on the atoms (FedDaDiL)"
METHODS = ("feddadil",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a FedDaDiL run directory with a checkpoint")
    parser.add_argument("--steps", type=int, default=50, help="projected SGD steps of the re-fit (default 50)")
    parser.add_argument(
        "--seed", dest="refit_seed", type=int, default=0, help="seed of the re-fit's mini-batches and the classifiers"
    )


def refit_alpha(run: RunDir, client_id: int, steps: int, seed: int) -> torch.Tensor:
    """Alpha re-fitted on the frozen atoms: projected SGD on the DiL loss over the client's training data."""
    import torch

    from fedsim.methods.dictionary import learning as dil
    from fedsim.methods.dictionary import sampling

    params, method = run.config.method.params, run.config.method
    atoms_x, atoms_logits = atoms(run)
    x = torch.as_tensor(run.client_state(client_id)["train_features"]).float()
    labels = dil.one_hot_labels(run.train_labels(client_id), run.federation.num_classes)
    classes = run.federation.num_classes
    y = torch.as_tensor(run.train_labels(client_id))
    alpha = alpha_of(run, client_id).clone().requires_grad_(True)
    optimizer = torch.optim.SGD([alpha], lr=params.lr_alpha, momentum=method.momentum)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):  # the round's batches: class-balanced atom rows (with replacement) and data rows
        idx = sampling.balanced_atom_rows(atoms_logits, method.batch_size, generator, replace=True)
        rows = sampling.domain_rows(y, len(x), classes, method.batch_size, generator)
        rows_x, rows_logits = dil.gather_atoms(atoms_x, atoms_logits, idx)
        loss = dil.dil_loss(rows_x, rows_logits, alpha, x[rows], labels[rows], params, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        dil.project_alpha(alpha)
    return alpha.detach()


def accuracies(run: RunDir, client_id: int, alpha: torch.Tensor, seed: int) -> tuple[float, float]:
    """DaDiL-R and DaDiL-E test accuracy of one client with ``alpha`` (the library's predictors)."""
    from fedsim.methods.dictionary.predictors import evaluate_predictors

    counts = evaluate_predictors(
        run.server_state,
        alpha,
        test_features(run, client_id),
        run.test_labels(client_id),
        run.config.method.params,
        seed,
    )
    return counts["correct"] / counts["total"], counts["correct_E"] / counts["total"]


def measure(run: RunDir, steps: int = 50, seed: int = 0) -> list[dict]:
    lines = []
    for cid in run.source_ids():
        own = alpha_of(run, cid)
        refit = refit_alpha(run, cid, steps, seed)
        lines.append(
            {
                "client": cid,
                "domain": run.domain(cid),
                "alpha": [float(a) for a in own],
                "alpha_refit": [float(a) for a in refit],
                "own": accuracies(run, cid, own, seed),
                "refit": accuracies(run, cid, refit, seed),
            }
        )
    return lines


def report(run: RunDir, lines: list[dict]) -> str:
    out = [
        f"{NAME}: {run.path}, atoms at round {run.checkpoint_round}",
        f"{'source':16s} {'R own':>6s} {'E own':>6s} {'R refit':>8s} {'E refit':>8s}  alpha -> re-fitted alpha",
    ]
    for line in lines:
        (r, e), (rr, er) = line["own"], line["refit"]
        out.append(
            f"{line['domain']:16s} {r:6.3f} {e:6.3f} {rr:8.3f} {er:8.3f}  "
            f"{fmt_row(line['alpha'], 5)} -> {fmt_row(line['alpha_refit'], 5)}"
        )
    means = np.mean([[*line["own"], *line["refit"]] for line in lines], axis=0)
    out.append(f"{'mean':16s} {means[0]:6.3f} {means[1]:6.3f} {means[2]:8.3f} {means[3]:8.3f}")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    run_dir = RunDir.open(args.run_dir, NAME, METHODS)
    print(report(run_dir, measure(run_dir, args.steps, args.refit_seed)))
    return 0
