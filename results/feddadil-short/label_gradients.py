"""The gradient scale of the atoms' features, label logits and alpha on the first TEP mini-batch (docs/feddadil.md,
"The label logits' step"): client mode1 (standardized by its own statistics), initial atoms, n_b = 200.
Run: python results/feddadil-short/label_gradients.py"""
import torch

import fedsim.methods.common.dictionary as dil
from fedsim.config import load_config
from fedsim.data.normalization import per_domain_standardize
from fedsim.data.scenario import build_federation, load_client_data

torch.set_num_threads(1)
config = load_config(None, ["method.name=feddadil", "data.benchmark=tep", "data.target=mode2", "method.batch_size=200"])
federation = build_federation(config.data)
client = load_client_data(config.data, federation, federation.source_ids[0])
params, atoms, n, batch = dil.DictionaryParams(), len(federation.client_ids), 500, 200
atoms_x, atoms_logits = dil.trainable_atoms(*dil.init_atoms(atoms, n, client.train.x.shape[1], federation.num_classes, 0))
alpha = torch.full((atoms,), 1 / atoms, requires_grad=True)
x = torch.tensor(per_domain_standardize(client.train.x)[0], dtype=torch.float32)
y = dil.one_hot_labels(client.train.y, federation.num_classes)
generator = torch.Generator().manual_seed(0)
idx = next(iter(dil.atom_minibatches(atoms, n, batch, generator)))
rows = dil.data_minibatch(len(x), batch, generator)
loss = dil.dil_loss(*dil.gather_atoms(atoms_x, atoms_logits, idx), alpha, x[rows], y[rows], params)
loss.backward()
print(f"{client.domain}: loss {float(loss):.2f}")
for name, tensor in (("features", atoms_x), ("label logits", atoms_logits), ("alpha", alpha)):
    grad = tensor.grad
    print(f"{name}: mean |g| over touched entries {float(grad[grad != 0].abs().mean()):.3g}, max {float(grad.abs().max()):.3g}")
