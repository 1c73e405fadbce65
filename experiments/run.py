"""Run one experiment on the local or the Ray backend."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fedsim.config import ExperimentConfig
from fedsim.data.scenario import Federation, build_federation, forget_domain_data
from fedsim.runtime import LocalExecutor, Server, Simulator

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    summary: dict
    history: list[dict]
    global_tensors: dict
    federation: Federation


def run_experiment(
    config: ExperimentConfig,
    out_dir: Optional[Path] = None,
    callbacks=None,
    num_cpus: Optional[int] = None,
    resume: Optional[dict] = None,
) -> RunResult:
    """Build the scenario, start the backend, run all rounds, shut the backend down.

    Everything that can fail on bad input (benchmark, target, data files, the
    cluster address) is checked before ``out_dir`` is created. ``resume`` is a
    checkpoint (``fedsim.runtime.checkpoint.load_checkpoint``) to continue from.
    """
    federation = build_federation(config.data)
    started_ray = False
    if config.run.backend == "local":
        server = Server(config, federation, LocalExecutor(config, federation))
    else:
        import ray

        from actors.backend import connect, start_server

        started_ray = connect(config.run.address, num_cpus=num_cpus)
        forget_domain_data(config.data)  # the actors build their own data; the driver needs only the description
        server = None
    try:
        if server is None:
            server = start_server(config, federation)
        simulator = Simulator(config, server, out_dir, callbacks, resume=resume)
        summary = simulator.run()
        tensors = server.global_tensors()
        return RunResult(summary, simulator.history, tensors, federation)
    finally:
        if server is not None:
            server.close()
        if started_ray:
            ray.shutdown()
