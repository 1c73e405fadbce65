"""The gradient scale of the atoms' features, label logits and alpha on the first TEP mini-batch (docs/feddadil.md,
"The label logits' step"). Run: python results/feddadil-short/label_gradients.py"""
import numpy as np, torch
from fedsim.config import load_config
from fedsim.data.scenario import build_federation
import fedsim.methods.common.dictionary as dil
torch.set_num_threads(1)
cfg = load_config(None, ["method.name=feddadil", "data.benchmark=tep", "data.target=mode2", "method.batch_size=200"])
fed = build_federation(cfg.data)
p = dil.DictionaryParams()
from fedsim.data.scenario import load_client_data
c = load_client_data(cfg.data, fed, fed.source_ids[0])
print(c.domain, c.train.x.shape, fed.num_classes)
ax, al = dil.init_atoms(6, 500, c.train.x.shape[1], fed.num_classes, 0)
atoms_x, atoms_logits = dil.trainable_atoms(ax, al)
alpha = torch.full((6,), 1/6, requires_grad=True)
g = torch.Generator().manual_seed(0)
xs = (c.train.x - c.train.x.mean(0)) / (c.train.x.std(0) + 1e-8); x = torch.tensor(xs, dtype=torch.float32); y = dil.one_hot_labels(c.train.y, fed.num_classes)
idx = next(iter(dil.atom_minibatches(6, 500, 200, g)))
rows = dil.data_minibatch(len(x), 200, g)
loss = dil.dil_loss(*dil.gather_atoms(atoms_x, atoms_logits, idx), alpha, x[rows], y[rows], p)
loss.backward()
for name, t in (("x", atoms_x), ("logits", atoms_logits), ("alpha", alpha)):
    gr = t.grad; nz = gr[gr != 0]
    print(name, "loss", float(loss), "mean|g| (touched)", float(nz.abs().mean()), "max", float(gr.abs().max()))
print("beta", dil.label_weight(p, x[rows], atoms_x[0][:200]))
