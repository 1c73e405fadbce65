"""Diagnostic only (not a method): FedDANN whose sources receive target *inputs* and encode them with their current
local encoder at every step (no staleness, two-sided gradient) -- isolates the constant-target-features hypothesis."""
import os
import sys

from fedsim.methods.common import alignment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from target_inputs import run_with  # noqa: E402

class Live(alignment.AlignmentObjective):
    def __init__(self, *a, **k):
        k["encode_target"] = True
        super().__init__(*a, **k)


run_with(Live)
