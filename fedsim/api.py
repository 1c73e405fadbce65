"""Run an experiment from Python: the same path as ``fedsim run``.

    import fedsim
    result = fedsim.run(method="fedavg", benchmark="digits", target="usps", rounds=5, backend="local")
    result.summary["target_accuracy"], result.history[-1]["source_accuracy"]

Backends are found by name (``BACKENDS``) and imported only when used, so ``import fedsim``
never imports Ray: the Ray backend lives in ``actors/``.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from fedsim.config import ExperimentConfig, load_config
from fedsim.data.scenario import Federation, build_federation
from fedsim.errors import UserError

log = logging.getLogger(__name__)

#: backend name -> "module:function" returning ``(server handle, close)`` for (config, federation, num_cpus)
BACKENDS = {"local": "fedsim.api:open_local", "ray": "actors.backend:open_server"}
#: keyword arguments of :func:`run` -> config keys (the same names as the CLI flags)
SHORT_KEYS = {
    "method": "method.name",
    "benchmark": "data.benchmark",
    "target": "data.target",
    "sources": "data.sources",
    "rounds": "run.rounds",
    "local_epochs": "method.local_epochs",
    "clients_per_domain": "data.clients_per_domain",
    "clients_per_round": "run.clients_per_round",
    "seed": "run.seed",
    "backend": "run.backend",
    "address": "run.address",
    "cpus_per_client": "resources.cpus_per_client",
    "gpus_per_client": "resources.gpus_per_client",
}


@dataclass
class RunResult:
    summary: dict  # what summary.json holds
    history: list[dict]  # one metrics dict per round (what metrics.jsonl holds)
    global_tensors: dict  # the final global model
    federation: Federation


def open_local(
    config: ExperimentConfig, federation: Federation, num_cpus: Optional[int] = None
) -> tuple[Any, Callable[[], None]]:
    """Every client in this process, served one after the other (deterministic, for debugging and tests)."""
    from fedsim.runtime import LocalExecutor, Server

    server = Server(config, federation, LocalExecutor(config, federation))
    return server, server.close


def run_experiment(
    config: ExperimentConfig,
    out_dir: Optional[Path] = None,
    callbacks=None,
    num_cpus: Optional[int] = None,
    resume: Optional[dict] = None,
) -> RunResult:
    """Build the scenario, start the backend, run all rounds, shut the backend down.

    Everything that can fail on bad input (benchmark, target, data files, the method's scenario checks,
    the cluster address) is checked before ``out_dir`` is created. ``resume`` is a checkpoint
    (``fedsim.runtime.checkpoint.load_checkpoint``) to continue from.
    """
    from fedsim.registry import METHODS
    from fedsim.runtime import Simulator

    federation = build_federation(config.data)
    METHODS.get(config.method.name).check_setting(config, federation)
    module, _, function = BACKENDS[config.run.backend].partition(":")
    server, close = getattr(importlib.import_module(module), function)(config, federation, num_cpus)
    try:
        simulator = Simulator(config, server, out_dir, callbacks, resume=resume)
        summary = simulator.run()
        return RunResult(summary, simulator.history, server.global_tensors(), federation)
    finally:
        close()


def run(
    config: ExperimentConfig | str | Path | None = None,
    out: Optional[str | Path] = None,
    set: Optional[Mapping[str, Any]] = None,
    **settings,
) -> RunResult:
    """Run one experiment; ``config`` is an ExperimentConfig or a YAML file, ``settings`` the CLI's names
    (``method``, ``benchmark``, ``target``, ``rounds``, ``local_epochs``, ``seed``, ``backend``, ...),
    ``set`` any dotted key (``{"method.lr": 0.01}``). Without a config: the local backend, no progress bar."""
    unknown = sorted(name for name in settings if name not in SHORT_KEYS)
    if unknown:
        raise UserError(
            f"fedsim.run got unknown argument(s) {unknown}: use {', '.join(SHORT_KEYS)}, or set={{'section.key': value}}"
        )
    overrides = [f"{SHORT_KEYS[k]}={_as_text(v)}" for k, v in settings.items() if v is not None]
    overrides += [f"{k}={_as_text(v)}" for k, v in (set or {}).items()]
    if isinstance(config, ExperimentConfig):
        config = load_config(None, overrides, base=config.to_dict())
    else:
        config = load_config(config, ["run.backend=local", "run.progress=false"] + overrides)
    return run_experiment(config, Path(out) if out is not None else None)


def _as_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)
