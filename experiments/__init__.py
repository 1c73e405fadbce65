"""Entry points: the ``fedsim`` CLI, run orchestration, configs."""
