"""Run one experiment on the local or the Ray backend (the implementation lives in fedsim.api)."""
from fedsim.api import RunResult, run_experiment  # noqa: F401  (temporary: importers move to fedsim.api)
