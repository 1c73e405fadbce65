"""The TEP windows simulated as Ray tasks: the ``map_chunks`` that ``fedsim data prepare tep --address ADDR`` hands
to :meth:`fedsim.data.benchmarks.tep.TEPBenchmark.class_windows`, one task per chunk of windows
(:func:`fedsim.data.benchmarks.tep_simulation.simulate_classes`)."""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import ray

from fedsim.actors.backend import connect, shutdown_own_cluster


def ray_map(function: Callable, tasks: Sequence) -> Iterator:
    """Each task as a Ray task of one CPU; the results in task order, each as soon as it and those before it are
    done (the progress bar follows them)."""
    remote = ray.remote(num_cpus=1)(function)
    refs = [remote.remote(task) for task in tasks]
    for ref in refs:
        yield ray.get(ref)


def cluster_cpus() -> int:
    """The cluster's CPUs (the chunks are cut so that each has about four)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class RayCluster:
    """Join the cluster at ``address`` (or start a local one when None) for the lifetime of a ``with`` block; a
    cluster this process started is shut down on exit."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.started = False

    def __enter__(self) -> "RayCluster":
        self.started = connect(self.address)
        return self

    def __exit__(self, *exc) -> None:
        if self.started:
            shutdown_own_cluster()
