"""``python -m tools.diagnose feddadil-atoms RUN_DIR``: where a dictionary's atoms sit relative to each source domain.

At the run's last checkpoint, for every source client l (the target is skipped: its labels stay out of diagnosis)
and every atom k:

- ``W2^2 to atom k``: W_2^2(Q_l, P_k), feature-only, exact OT between ``--samples`` test rows of l (default: the
  atom's size) and the atom's rows;
- ``W2^2 to B``: the same against the domain's reconstruction B(alpha_l; P) (DaDiL Eq. 9);
- ``acc of h_k``: the accuracy on l's test data of atom k's classifier, the one DaDiL-E weights by alpha_lk
  (trained as ``predict_ensemble`` trains it, with the seed given by ``--seed``).

A DaDiL-E that fails its own sources while DaDiL-R does not shows here as atoms far from every domain.
"""

from __future__ import annotations

import argparse

import numpy as np

from tools.diagnostics.run_dir import RunDir, alpha_of, atoms, fmt_row, subsample, test_features

NAME = "feddadil-atoms"
HELP = "where a dictionary's atoms sit relative to each source domain (FedDaDiL, DaDiL)"
METHODS = ("feddadil", "dadil")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a FedDaDiL or DaDiL run directory with a checkpoint")
    parser.add_argument("--samples", type=int, default=0, help="test rows of each domain compared (0: atom size)")
    parser.add_argument(
        "--seed", dest="classifier_seed", type=int, default=0, help="seed of the atoms' classifiers h_k"
    )
    parser.add_argument("--no-accuracy", action="store_true", help="distances only (no classifier is trained)")
    parser.add_argument("--plot", help="also write a heatmap of W2^2 (sources x atoms) to this PNG file")


def measure(run: RunDir, samples: int = 0, seed: int = 0, accuracy: bool = True) -> list[dict]:
    """One line per source client: alpha, W2^2 to each atom and to its reconstruction, each h_k's accuracy."""
    import torch

    from fedsim.methods.dictionary.learning import barycenter
    from fedsim.ot.wasserstein import wasserstein_distance

    atoms_x, atoms_logits = atoms(run)
    params = run.config.method.params
    lines = []
    for cid in run.source_ids():
        alpha, x = alpha_of(run, cid), test_features(run, cid)
        q = subsample(x, samples or atoms_x.shape[1])
        reconstruction, _ = barycenter(atoms_x, atoms_logits, alpha, params)
        line = {
            "client": cid,
            "domain": run.domain(cid),
            "alpha": [float(a) for a in alpha],
            "w_atom": [float(wasserstein_distance(q, atoms_x[k])) for k in range(len(atoms_x))],
            "w_rec": float(wasserstein_distance(q, reconstruction.detach())),
        }
        if accuracy:
            y = torch.from_numpy(run.test_labels(cid))
            line["acc_atom"] = [
                atom_accuracy(atoms_x[k], atoms_logits[k], x, y, params, seed + k) for k in range(len(atoms_x))
            ]
        lines.append(line)
    return lines


def atom_accuracy(atom_x, atom_logits, x, y, params, seed: int) -> float:
    import torch

    from fedsim.methods.dictionary.predictors import fit_classifier

    model = fit_classifier(atom_x, torch.softmax(atom_logits, -1), params, seed)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def report(run: RunDir, lines: list[dict]) -> str:
    out = [f"{NAME}: {run.path} ({run.config.method.name}), atoms at round {run.checkpoint_round}"]
    for line in lines:
        out.append(f"source {line['domain']} (client {line['client']}): W2^2 to B {line['w_rec']:.2f}")
        out.append(f"  alpha           {fmt_row(line['alpha'])}")
        out.append(f"  W2^2 to atom k  {fmt_row(line['w_atom'])}")
        if "acc_atom" in line:
            out.append(f"  acc of h_k      {fmt_row(line['acc_atom'], digits=3)}")
    nearest = np.mean([min(line["w_atom"]) for line in lines])
    weighted = np.mean([np.dot(line["alpha"], line["w_atom"]) for line in lines])
    out.append(
        f"mean over sources: W2^2 to B {np.mean([line['w_rec'] for line in lines]):.2f}, "
        f"to the nearest atom {nearest:.2f}, alpha-weighted over atoms {weighted:.2f}"
    )
    return "\n".join(out)


def plot(lines: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    distances = np.array([line["w_atom"] for line in lines])
    fig, ax = plt.subplots(figsize=(1.2 + 0.6 * distances.shape[1], 1.0 + 0.5 * len(lines)))
    image = ax.imshow(distances, cmap="viridis")
    ax.set_xticks(range(distances.shape[1]), [f"atom {k}" for k in range(distances.shape[1])])
    ax.set_yticks(range(len(lines)), [line["domain"] for line in lines])
    fig.colorbar(image, ax=ax, label="W2^2")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    run_dir = RunDir.open(args.run_dir, NAME, METHODS)
    lines = measure(run_dir, args.samples, args.classifier_seed, accuracy=not args.no_accuracy)
    print(report(run_dir, lines))
    if args.plot:
        plot(lines, args.plot)
        print(f"heatmap: {args.plot}")
    return 0
