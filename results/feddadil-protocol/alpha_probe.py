"""Sources' DaDiL-R / -E accuracy of a FedDaDiL run at evaluation, three ways (docs/feddadil.md, "The sources' gap"):
own alpha on the global atoms (what FedDaDiL reports), own alpha on the client's own last local version of the atoms,
and alpha re-fitted on the global atoms (atoms frozen, the client's own training data, 50 projected SGD steps on the
DiL loss). Source labels only; the target client is skipped.

    python results/feddadil-protocol/alpha_probe.py tep mode2 [seed] [--set ...]
"""
import sys

import numpy as np
import torch

import fedsim.methods.common.dictionary as dil
import fedsim.methods.feddadil as fd
from fedsim.api import run_experiment
from probe_config import probe_config

torch.set_num_threads(1)
results = {}
original_dil = fd.FedDaDiL.dil.__wrapped__ if hasattr(fd.FedDaDiL.dil, "__wrapped__") else fd.FedDaDiL.dil


def dil_keeping_local_atoms(self, instruction, state, data):
    reply, state = original_dil(self, instruction, state, data)
    state["probe_local_atoms"] = {k: np.array(v) for k, v in reply.tensors.items()}
    return reply, state


def refit_alpha(self, tensors, alpha, state, data, steps=50):
    p, batch = self.params, self.config.method.batch_size
    atoms_x, atoms_logits = (torch.tensor(np.asarray(tensors[k])) for k in ("atoms_x", "atoms_logits"))
    alpha = alpha.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([alpha], lr=p.lr_alpha, momentum=self.config.method.momentum)
    labels = dil.one_hot_labels(data.train.y, data.num_classes)
    generator = torch.Generator().manual_seed(123)
    x = state["train_features"]
    for _ in range(steps):
        idx = dil.atom_minibatches(self.num_atoms, p.samples_per_atom, batch, generator)[0]
        rows = dil.data_minibatch(len(x), batch, generator)
        loss = dil.dil_loss(*dil.gather_atoms(atoms_x, atoms_logits, idx), alpha, x[rows], labels[rows], p)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        dil.project_alpha(alpha)
    return alpha.detach()


def evaluate_three_ways(self, instruction, state, data):
    reply, state = original_evaluate(self, instruction, state, data)
    if data.train.y is not None and "atoms_x" in instruction.tensors:
        seed, alpha = instruction.config["seed"], state["alpha"]
        test_x, test_y = state["test_features"], data.test.y
        own = dil.evaluate_predictors(state["probe_local_atoms"], alpha, test_x, test_y, self.params, seed)
        refit = refit_alpha(self, instruction.tensors, alpha, state, data)
        again = dil.evaluate_predictors(instruction.tensors, refit, test_x, test_y, self.params, seed)
        results[data.client_id] = {
            "global": (reply.metrics["correct"] / reply.metrics["total"], reply.metrics["correct_E"] / reply.metrics["total"]),
            "own atoms": (own["correct"] / own["total"], own["correct_E"] / own["total"]),
            "alpha refit": (again["correct"] / again["total"], again["correct_E"] / again["total"]),
            "alpha": [round(float(a), 2) for a in alpha], "alpha refit values": [round(float(a), 2) for a in refit]}
    return reply, state


original_evaluate = fd.FedDaDiL.evaluate
dil_keeping_local_atoms.is_client_operation = True
evaluate_three_ways.is_client_operation = True
fd.FedDaDiL.dil = dil_keeping_local_atoms
fd.FedDaDiL.evaluate = evaluate_three_ways
bench, target = sys.argv[1], sys.argv[2]
seed = sys.argv[3] if len(sys.argv) > 3 and not sys.argv[3].startswith("--") else "0"
extra = [a for a in sys.argv[3:] if "=" in a]
config = probe_config(bench, target, "feddadil", seed=seed, extra=extra)
run_experiment(config)
for way in ("global", "own atoms", "alpha refit"):
    r = np.mean([v[way][0] for v in results.values()])
    e = np.mean([v[way][1] for v in results.values()])
    print(f"{way:12s} sources' mean R {r:.3f}  E {e:.3f}   per client R: " + " ".join(f"{v[way][0]:.2f}" for v in results.values()))
for cid, v in results.items():
    print(cid, "alpha", v["alpha"], "refit", v["alpha refit values"])
