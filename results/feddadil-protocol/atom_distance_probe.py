"""Why DaDiL-E fails its own sources (docs/feddadil.md, "DaDiL-E"): how far each atom lies from each domain, and
how each atom's classifier scores there. At the final evaluation of a run, for every source domain l (the target is
skipped: its labels stay out of diagnosis) and every atom k:

- W_2^2(Q_l, P_k), feature-only, 500 test samples of l against the atom's 500 rows, exact OT;
- W_2^2(Q_l, B_l), the same against the domain's reconstruction B(alpha_l; P);
- acc(h_k on Q_l): the accuracy on l's test data of atom k's classifier, the one DaDiL-E weights by alpha_lk
  (same seed as the library's predict_ensemble, so the numbers are its components).

    python results/feddadil-protocol/atom_distance_probe.py dadil tep mode2 [seed] [--rounds R] [--epochs E] [--set K=V]
"""
import sys

import numpy as np
import torch

import fedsim.methods.common.dictionary as dil
from fedsim.api import run_experiment
from fedsim.ot.wasserstein import wasserstein_distance
from probe_config import probe_config

torch.set_num_threads(1)
original = dil.evaluate_predictors
rows = []


def subsample(x: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return x[torch.randperm(len(x), generator=generator)[:n]]


def evaluate_and_measure(tensors, alpha, test_x, test_y, p, seed):
    metrics = original(tensors, alpha, test_x, test_y, p, seed)
    data = sys._getframe(1).f_locals["data"]
    if data.train.y is None:  # the target: evaluation only, not diagnosed
        return metrics
    atoms_x = torch.tensor(np.asarray(tensors["atoms_x"]))
    atoms_logits = torch.tensor(np.asarray(tensors["atoms_logits"]))
    seed = seed % (1 << 31)
    q = subsample(test_x, atoms_x.shape[1], 0)
    xb, _ = dil.barycenter(atoms_x, atoms_logits, alpha, p)
    w_rec = float(wasserstein_distance(q, xb.detach()))
    y = torch.from_numpy(test_y)
    line = {"client": data.client_id, "alpha": [round(float(a), 2) for a in alpha], "w_rec": w_rec,
            "R": metrics["correct"] / metrics["total"], "E": metrics["correct_E"] / metrics["total"], "w_atom": [], "acc_atom": []}
    for k in range(atoms_x.shape[0]):
        model = dil.fit_classifier(atoms_x[k], torch.softmax(atoms_logits[k], -1), p, seed + k)
        with torch.no_grad():
            line["acc_atom"].append(float((model(test_x).argmax(1) == y).float().mean()))
        line["w_atom"].append(float(wasserstein_distance(q, atoms_x[k])))
    rows.append(line)
    print(f"source {line['client']}: R {line['R']:.3f} E {line['E']:.3f} | W2^2 to its reconstruction {w_rec:.1f}")
    print(f"  alpha            {' '.join(f'{a:6.2f}' for a in line['alpha'])}")
    print(f"  W2^2 to atom k   {' '.join(f'{w:6.1f}' for w in line['w_atom'])}")
    print(f"  acc of h_k       {' '.join(f'{a:6.3f}' for a in line['acc_atom'])}", flush=True)
    return metrics


def summary() -> None:
    nearest = [min(r["w_atom"]) for r in rows]
    weighted_w = [float(np.dot(r["alpha"], r["w_atom"])) for r in rows]
    weighted_acc = [float(np.dot(r["alpha"], r["acc_atom"])) for r in rows]
    pairs = [(w, a) for r in rows for w, a in zip(r["w_atom"], r["acc_atom"])]
    ws, accs = np.array(pairs).T
    print(f"mean over sources: R {np.mean([r['R'] for r in rows]):.3f}, E {np.mean([r['E'] for r in rows]):.3f}; "
          f"W2^2 to reconstruction {np.mean([r['w_rec'] for r in rows]):.1f}, to the nearest atom {np.mean(nearest):.1f}, "
          f"alpha-weighted over atoms {np.mean(weighted_w):.1f}; alpha-weighted acc of the h_k {np.mean(weighted_acc):.3f}")
    print(f"Spearman rank correlation over (source, atom) pairs of W2^2 and acc(h_k): "
          f"{np.corrcoef(np.argsort(np.argsort(ws)), np.argsort(np.argsort(accs)))[0, 1]:.2f}")


dil.evaluate_predictors = evaluate_and_measure
args = sys.argv[1:]
rounds = args[args.index("--rounds") + 1] if "--rounds" in args else "20"
epochs = args[args.index("--epochs") + 1] if "--epochs" in args else "5"
method, bench, target = args[:3]
seed = args[3] if len(args) > 3 and not args[3].startswith("--") else "0"
extra = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
config = probe_config(bench, target, method, rounds=int(rounds), epochs=int(epochs), seed=seed, extra=extra)
run_experiment(config)
summary()
