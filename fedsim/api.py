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

from fedsim.config import ExperimentConfig, keyword_values, load_config
from fedsim.data.scenario import Federation, build_federation
from fedsim.errors import UserError, unwrapped

log = logging.getLogger(__name__)

BACKENDS = {"local": "fedsim.api:open_local", "ray": "fedsim.actors.backend:open_server"}
"""Backend name (``run.backend``) -> "module:function" returning ``(server handle, close)`` for (config,
federation, num_cpus), the module imported only when the backend is used. A module may also have
``start_backend(config, num_cpus)``, whose handle (with ``stop()``) the function then takes as a fourth argument
(:func:`checked_federation_during`)."""
HEAD_START_S = 0.1
"""Seconds the federation's build runs alone before a backend's start overlaps it
(:func:`checked_federation_during`)."""


@dataclass
class RunResult:
    """What :func:`run` and :func:`run_experiment` return: the run's summary, its rounds, its final model and its
    clients."""

    summary: dict
    """What ``summary.json`` holds: the method, benchmark, target, backend and seed, the rounds run, the last
    evaluated round's ``target_accuracy`` and ``source_accuracy`` (per source domain) with its other
    ``target_accuracy_*``, ``source_accuracy_*`` and ``final_*`` metrics, the bytes sent and received over the run
    and its ``wall_seconds``."""
    history: list[dict]
    """One metrics dict per round run, in order (what ``metrics.jsonl`` holds)."""
    global_tensors: dict
    """The final global model: tensor name -> numpy array (:meth:`fedsim.methods.base.Method.global_tensors`)."""
    federation: Federation
    """The run's clients: which domain each holds, its role and sizes (:class:`fedsim.data.scenario.Federation`)."""


def open_local(
    config: ExperimentConfig, federation: Federation, num_cpus: Optional[int] = None
) -> tuple[Any, Callable[[], None]]:
    """Every client in this process, served one after the other (deterministic, for debugging and tests)."""
    from fedsim.runtime import LocalExecutor, Server

    server = Server(config, federation, LocalExecutor(config, federation))
    return server, server.close


def checked_federation(config: ExperimentConfig) -> Federation:
    """The run's federation, after the model's and the method's checks of the setting (both raise UserError on bad
    input); its input shape is the one the model declares (a frozen backbone's features, :mod:`fedsim.models`)."""
    from fedsim.registry import METHODS

    federation = build_federation(config.data)
    if config.model.name != "auto":  # "auto" picks a small net that declares no inputs: torch stays unloaded
        from fedsim.models.features import model_federation

        federation = model_federation(config, federation)
    METHODS.get(config.method.name).check_setting(config, federation)
    return federation


def checked_federation_during(start_backend, config: ExperimentConfig, num_cpus: Optional[int]):
    """(federation, backend start): :func:`checked_federation`, built in a thread while ``start_backend(config,
    num_cpus)`` runs (a backend's slow start, such as a Ray cluster's, which must run in the main thread); without
    one, just built, and the start is None. The build gets ``HEAD_START_S`` first, in which the usual bad inputs (an
    unknown target, a missing file) fail before anything starts. A build that fails later stops the backend's start
    (the handle it returned, with ``stop()``); when both fail, the build's error is the one raised."""
    if start_backend is None:
        return checked_federation(config), None
    from concurrent.futures import ThreadPoolExecutor, wait

    with ThreadPoolExecutor(1, thread_name_prefix="federation") as pool:
        building = pool.submit(checked_federation, config)
        wait([building], timeout=HEAD_START_S)
        if building.done() and building.exception() is not None:
            raise building.exception()  # bad input found in the head start: no backend was started for it
        try:
            started = start_backend(config, num_cpus)
        except BaseException:
            if building.exception() is not None:  # waits for the build: bad input comes first, as without a thread
                raise building.exception() from None
            raise
        try:
            return building.result(), started
        except BaseException:
            stop_quietly(started)
            raise


def stop_quietly(started) -> None:
    """``started.stop()`` while another error is on its way out: a failure to stop is logged, not raised over it."""
    try:
        started.stop()
    except Exception:  # noqa: BLE001 (the error being raised is the one the user must see)
        log.exception("could not stop the backend after an earlier error")


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
    (``fedsim.runtime.checkpoint.load_checkpoint``) to continue from. A UserError raised in a backend's process
    (a NumericalError in a client actor) comes out as itself, without the backend's wrapper.
    """
    from fedsim.runtime import Simulator

    module_name, _, function = BACKENDS[config.run.backend].partition(":")
    module = importlib.import_module(module_name)
    federation, started = checked_federation_during(getattr(module, "start_backend", None), config, num_cpus)
    try:
        try:  # a backend with a start of its own takes its handle, and stops it from then on
            server, close = getattr(module, function)(config, federation, num_cpus, *([started] if started else []))
        except BaseException:
            if started is not None:
                stop_quietly(started)  # idempotent: the opener may have stopped it already
            raise
        try:
            simulator = Simulator(config, server, out_dir, callbacks, resume=resume)
            summary = simulator.run()
            return RunResult(summary, simulator.history, server.global_tensors(), federation)
        finally:
            close()
    except UserError as exc:
        cause = unwrapped(exc)
        if cause is exc:
            raise
        raise cause from None


def make_config(
    config: ExperimentConfig | str | Path | None = None, set: Optional[Mapping[str, Any]] = None, **settings
) -> ExperimentConfig:
    """The ExperimentConfig that :func:`run` runs, built from typed values (nothing is written or started).

    ``config`` is used as it is when nothing else is given; ``settings`` take the names of the ``fedsim run`` flags
    (``KEYWORDS`` in :mod:`fedsim.config`), ``set`` any dotted key (``{"method.lr": 0.01}``). Without a config
    object: the local backend and no progress bar, unless the settings say otherwise."""
    values = {**keyword_values(settings), **(set or {})}
    if isinstance(config, ExperimentConfig):
        return load_config(None, base=config.to_dict(), values=values) if values else config
    return load_config(config, values={"run.backend": "local", "run.progress": False, **values})


def run(
    config: ExperimentConfig | str | Path | None = None,
    out: Optional[str | Path] = None,
    set: Optional[Mapping[str, Any]] = None,
    **settings,
) -> RunResult:
    """Run one experiment; ``config`` is an ExperimentConfig or a YAML file, ``settings`` the CLI's names
    (``method``, ``benchmark``, ``target``, ``rounds``, ``local_epochs``, ``seed``, ``backend``, ...),
    ``set`` any dotted key (``{"method.lr": 0.01}``). Without a config: the local backend, no progress bar."""
    return run_experiment(make_config(config, set, **settings), Path(out) if out is not None else None)
