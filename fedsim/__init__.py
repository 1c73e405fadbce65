"""fedsim: a simulator for federated domain adaptation. ``fedsim.run(...)`` runs one experiment (see :mod:`fedsim.api`).

    import fedsim
    result = fedsim.run(method="fedavg", benchmark="digits", target="usps", rounds=5, backend="local")

The package's own names are those of :mod:`fedsim.api`, documented there:

* ``fedsim.run`` is :func:`fedsim.api.run`: one experiment, from a config or the ``fedsim run`` flags' names,
  returning a :class:`fedsim.api.RunResult`;
* ``fedsim.make_config`` is :func:`fedsim.api.make_config`: the ExperimentConfig that ``run`` would run;
* ``fedsim.run_experiment`` is :func:`fedsim.api.run_experiment`: an ExperimentConfig run into a run directory;
* ``fedsim.RunResult`` is :class:`fedsim.api.RunResult`.

``import fedsim`` stays light: the API is imported on first use, and Ray never (the Ray backend lives in ``actors/``).
"""


def __getattr__(name: str):
    if name in ("run", "make_config", "run_experiment", "RunResult"):
        from fedsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedsim' has no attribute {name!r}")
