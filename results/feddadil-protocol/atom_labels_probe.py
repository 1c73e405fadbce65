"""What DaDiL-E's per-atom classifiers are trained on (docs/feddadil.md, "DaDiL-E"): at the final evaluation of a
run, every atom's hard labels (argmax of its soft labels) counted per class, their mean top probability, and each
client's DaDiL-R and -E accuracy next to its alpha (clients in id order; the target's line is evaluation
only, as in the tables).

    python results/feddadil-protocol/atom_labels_probe.py dadil tep mode2 [seed] [--sgd-alpha]

--sgd-alpha (a probe of the suspected cause, no library change): the atoms keep the method's optimizer, the
barycentric coordinates take SGD (method.momentum, lr_alpha) as FedDaDiL's clients do.
"""
import sys

import numpy as np
import torch

import fedsim.methods.common.dictionary as dil
from fedsim.api import run_experiment
from probe_config import probe_config

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


class AtomsAndAlphaOptimizers:
    """Two optimizers behind one optimizer's interface: the method's for the atoms, SGD for alpha."""

    def __init__(self, atoms_optimizer, alpha_optimizer):
        self.parts = (atoms_optimizer, alpha_optimizer)

    def zero_grad(self, set_to_none=True):
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def step(self):
        for part in self.parts:
            part.step()

    def state_dict(self):
        return [part.state_dict() for part in self.parts]

    def load_state_dict(self, states):
        for part, state in zip(self.parts, states):
            part.load_state_dict(state)


def optimizer_with_sgd_alpha(p, momentum, atoms, alphas):
    atoms_x, atoms_logits = atoms
    groups = [{"params": [atoms_x], "lr": p.lr_atoms}, {"params": [atoms_logits], "lr": p.lr_labels or p.lr_atoms}]
    atoms_optimizer = torch.optim.Adam(groups) if p.optimizer == "adam" else torch.optim.SGD(groups, momentum=momentum)
    return AtomsAndAlphaOptimizers(atoms_optimizer, torch.optim.SGD(alphas, lr=p.lr_alpha, momentum=momentum))


dil.evaluate_predictors = evaluate_and_describe
if "--sgd-alpha" in sys.argv:
    sys.argv.remove("--sgd-alpha")
    dil.make_optimizer = optimizer_with_sgd_alpha
method, bench, target = sys.argv[1:4]
seed = sys.argv[4] if len(sys.argv) > 4 else "0"
config = probe_config(bench, target, method, seed=seed)
run_experiment(config)
