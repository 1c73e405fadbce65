"""The lab beside the product, run from the repository and not installed: performance benchmarks
(:mod:`tools.benchmarks`, each a script that prints figures) and the diagnostics that explain a result
(:mod:`tools.diagnose`)."""
