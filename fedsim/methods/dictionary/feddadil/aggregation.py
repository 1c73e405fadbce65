"""How a FedDaDiL server merges the clients' versions of the same atom rows (the authors' ``DaDiLServer``).

- ``random``: one client's version, drawn from the seed (the paper: "we propose to randomly select one version");
- ``avg``: the element-wise mean of the versions (features and label logits);
- ``wbary``: per atom, the free-support Wasserstein barycenter of the versions with uniform weights, labels (the
  label logits, as the code stores them) carried along, at most 10 fixed-point iterations (the code's server).
"""

from __future__ import annotations

import numpy as np
import torch

from fedsim.methods.dictionary.learning import DictionaryParams, label_weight, random_support
from fedsim.ot.barycenter import labeled_barycenter

#: fixed-point iterations of the ``wbary`` aggregation at most (DaDiLServer.barycentric_aggregation)
WBARY_ITERATIONS = 10


def aggregate_versions(p: DictionaryParams, versions: list, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The aggregate (features, label logits) of ``versions``, a list of (K, m, d) and (K, m, C) arrays."""
    if len(versions) == 1:
        return versions[0]
    if p.aggregation == "avg":
        return np.mean([v[0] for v in versions], axis=0), np.mean([v[1] for v in versions], axis=0)
    if p.aggregation == "wbary":
        return barycentric_versions(p, versions, seed)
    return versions[int(np.random.default_rng(seed).integers(len(versions)))]


def barycentric_versions(p: DictionaryParams, versions: list, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Atom by atom, the barycenter of the clients' versions (uniform weights, a random starting support)."""
    generator = torch.Generator().manual_seed(seed % (1 << 63))
    xs = torch.as_tensor(np.stack([v[0] for v in versions]))  # (clients, K, m, d)
    ys = torch.as_tensor(np.stack([v[1] for v in versions]))
    weights = torch.full((len(versions),), 1.0 / len(versions), dtype=xs.dtype)
    out_x, out_y = [], []
    for k in range(xs.shape[1]):
        init = random_support(torch.softmax(ys[:, k], -1), weights, xs.shape[-1], generator)
        xb, yb = labeled_barycenter(
            list(xs[:, k]),
            list(ys[:, k]),
            weights,
            n_iter=WBARY_ITERATIONS,
            tol=p.barycenter_tol,
            beta=label_weight(p),
            solver=p.solver,
            reg=p.reg,
            init=init,
        )
        out_x.append(xb.numpy())
        out_y.append(yb.numpy())
    return np.stack(out_x).astype(np.float32), np.stack(out_y).astype(np.float32)
