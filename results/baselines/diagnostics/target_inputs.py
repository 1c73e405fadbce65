"""Shared by the two diagnostics: the target sends a subset of its *inputs* (not features), and one short FedDANN
run at the papers' lambda (usps target, 10 rounds, 1000 images per domain) prints target and source accuracy."""
import sys

import numpy as np

import fedsim
from fedsim.methods.common import alignment
from fedsim.seeding import numpy_rng


def inputs_subset(model, x, count, seed, device, chunk=512, batch_statistics=False):
    count = min(int(count), len(x))
    index = np.sort(numpy_rng(seed).choice(len(x), size=count, replace=False))
    return np.asarray(x[index], dtype=np.float32)


def run_with(objective_class) -> None:
    """Patch the alignment objective and the target's encoding, run ``NAME METHOD [key=value ...]`` from argv."""
    alignment.AlignmentObjective = objective_class
    alignment.encode_subset = inputs_subset
    name, method, *sets = sys.argv[1:]
    overrides = {"data.target": "usps", "run.rounds": 10, "run.eval_every": 10, "data.max_train_per_domain": 1000,
                 "method.name": method, "method.lambda_domain": 1}  # the papers' lambda, as measured
    for s in sets:
        k, v = s.split("=")
        overrides[k] = v
    res = fedsim.run(config=f"experiments/configs/digits-{method}.yaml", out=f"/tmp/h15-diag/{name}", set=overrides, backend="local")
    last = [h for h in res.history if "target_accuracy" in h][-1]
    print(name, "target", round(last["target_accuracy"] * 100, 1), {k: round(v * 100, 1) for k, v in last["source_accuracy"].items()})
