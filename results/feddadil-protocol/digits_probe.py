"""Split FedDaDiL's DiL loss on its first dictionary rounds (docs/feddadil.md, "Rounds of the protocol"): total,
feature part W_2^2(X, X_B), beta, mean ||x||^2 of the data batch and of the barycenter, mean ||atom row||^2, mean top
soft label. Every 10th loss call is printed.

    python results/feddadil-protocol/digits_probe.py digits usps method.encoder_rounds=2
"""
import logging, sys, torch
import fedsim.methods.common.dictionary as dil
from fedsim.api import run_experiment
from probe_config import probe_config

torch.set_num_threads(1)
log = []
orig = dil.dil_loss
def probe(atoms_x, atoms_logits, alpha, x, y, p):
    loss = orig(atoms_x, atoms_logits, alpha, x, y, p)
    if len(log) < 400:
        with torch.no_grad():
            xb, yb = dil.barycenter(atoms_x, atoms_logits, alpha, p)
            feat = float(dil.wasserstein_distance(x, xb, solver=p.solver))
            beta = dil.label_weight(p, x, xb) if y is not None else 0
            log.append((float(loss), feat, beta, float(x.pow(2).sum(1).mean()), float(xb.pow(2).sum(1).mean()),
                        float(atoms_x.pow(2).sum(-1).mean()), float(torch.softmax(atoms_logits, -1).max(-1).values.mean())))
    return loss
dil.dil_loss = probe
bench, target = sys.argv[1], sys.argv[2]
extra = sys.argv[3:]
config = probe_config(bench, target, "feddadil", rounds=6, eval_every=100, extra=["data.max_train_per_domain=400", *extra])
run_experiment(config)
print("loss  featW  beta  |x|^2  |xb|^2  |atom|^2  maxsoft")
for i, row in enumerate(log):
    if i % 10 == 0:
        print(i, " ".join(f"{v:8.2f}" for v in row))
