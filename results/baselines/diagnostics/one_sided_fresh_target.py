"""Diagnostic only: FedDANN whose target features are re-encoded by the source's *current* local encoder every K
steps (no gradient through them: one-sided, as a mid-round feature exchange would give)."""
import sys, os
import numpy as np, torch
import fedsim
from fedsim.methods.common import alignment
from fedsim.seeding import numpy_rng
K = int(os.environ.get("K", "1"))

class Refresh(alignment.AlignmentObjective):
    def __call__(self, model, xb, yb):
        if not hasattr(self, "inputs"):
            self.inputs, self.k = self.target, 0
        if self.k % K == 0:
            with torch.no_grad():
                self.target = torch.cat([model.features(self.inputs[i:i+32].to(xb.device)) for i in range(0, len(self.inputs), 32)])
        self.k += 1
        return super().__call__(model, xb, yb)

def inputs_subset(model, x, count, seed, device, chunk=512, batch_statistics=False):
    count = min(int(count), len(x))
    index = np.sort(numpy_rng(seed).choice(len(x), size=count, replace=False))
    return np.asarray(x[index], dtype=np.float32)

alignment.AlignmentObjective = Refresh
alignment.encode_subset = inputs_subset
name, method, *sets = sys.argv[1:]
overrides = {"data.target": "usps", "run.rounds": 10, "run.eval_every": 10, "data.max_train_per_domain": 1000, "method.name": method, "method.lambda_domain": 1}  # the papers' lambda, as measured
for s in sets:
    k, v = s.split("="); overrides[k] = v
res = fedsim.run(config=f"experiments/configs/digits-{method}.yaml", out=f"/tmp/h15-diag/{name}", set=overrides, backend="local")
last = [h for h in res.history if "target_accuracy" in h][-1]
print(name, "target", round(last["target_accuracy"]*100,1), {k: round(v*100,1) for k, v in last["source_accuracy"].items()})
