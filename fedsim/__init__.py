"""fedsim: a simulator for federated domain adaptation. ``fedsim.run(...)`` runs one experiment (see :mod:`fedsim.api`).

``import fedsim`` stays light: the API is imported on first use, and Ray never (the Ray backend lives in ``actors/``).
"""


def __getattr__(name: str):
    if name in ("run", "make_config", "run_experiment", "RunResult"):
        from fedsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedsim' has no attribute {name!r}")
