"""What DaDiL-E's per-atom classifiers are trained on (docs/feddadil.md, "DaDiL-E"): at the final evaluation of a
run, every atom's hard labels (argmax of its soft labels) counted per class, their mean top probability, and each
client's DaDiL-R and -E accuracy next to its alpha (clients in id order; the target's line is evaluation
only, as in the tables).

    python results/feddadil-protocol/atom_labels_probe.py dadil tep mode2 [seed]
"""
import sys

import numpy as np
import torch

import fedsim.methods.common.dictionary as dil
from fedsim.api import run_experiment
from fedsim.config import load_config

torch.set_num_threads(1)
original = dil.evaluate_predictors
printed = []


def evaluate_and_describe(tensors, alpha, test_x, test_y, p, seed):
    metrics = original(tensors, alpha, test_x, test_y, p, seed)
    if not printed:
        soft = torch.softmax(torch.tensor(np.asarray(tensors["atoms_logits"])), -1)
        for k in range(soft.shape[0]):
            counts = np.bincount(soft[k].argmax(-1).numpy(), minlength=soft.shape[-1])
            print(f"atom {k}: hard-label counts {counts.tolist()}, mean top probability {float(soft[k].max(-1).values.mean()):.2f}")
        printed.append(True)
    print(f"client alpha {[round(float(a), 2) for a in alpha]}: R {metrics['correct'] / metrics['total']:.3f}, "
          f"E {metrics['correct_E'] / metrics['total']:.3f}")
    return metrics


dil.evaluate_predictors = evaluate_and_describe
method, bench, target = sys.argv[1:4]
seed = sys.argv[4] if len(sys.argv) > 4 else "0"
config = load_config(None, [f"data.benchmark={bench}", f"data.target={target}", f"method.name={method}", "run.rounds=20",
    "method.batch_size=200", "method.local_epochs=5", "run.eval_every=20", "run.backend=local", "run.progress=false",
    "run.tensorboard=false", "run.checkpoint_every=0", f"run.seed={seed}"])
run_experiment(config)
