"""Diagnostic only: FedDANN whose target features are re-encoded by the source's *current* local encoder every K
steps (no gradient through them: one-sided, as a mid-round feature exchange would give)."""
import os
import sys

import torch

from fedsim.methods.common import alignment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from target_inputs import run_with  # noqa: E402
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


run_with(Refresh)
