"""Shared fixtures: a tiny npz federation (fast), one Ray cluster for the whole session."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fedsim.runtime import LocalExecutor

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TQDM_DISABLE", "1")


def write_toy_domains(root, num_domains: int = 3, per_domain: int = 150, dim: int = 8, classes: int = 3, seed: int = 0):
    """Gaussian classes in R^dim; each domain shifts and rotates them (a small, real domain shift)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 2.0, size=(classes, dim))
    for d in range(num_domains):
        rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)) * 0.3 * d + np.eye(dim))
        y = np.arange(per_domain) % classes
        x = centers[y] @ rotation + rng.normal(0, 1.0, size=(per_domain, dim)) + 0.5 * d
        np.savez(os.path.join(root, f"dom{d}.npz"), x=x.astype(np.float32), y=y.astype(np.int64))
    return root


def write_image_domains(root, num_domains=3, per_domain=120, classes=3, seed=0):
    """1 x 8 x 8 images, class c = a bright bar in rows 2c..2c+1; domains differ in contrast and brightness."""
    rng = np.random.default_rng(seed)
    y = np.arange(per_domain) % classes
    for d in range(num_domains):
        x = rng.normal(0, 0.3, size=(per_domain, 1, 8, 8))
        for c in range(classes):
            x[y == c, 0, 2 * c : 2 * c + 2, :] += 1.0
        x = x * (1.0 + d) + 0.7 * d
        np.savez(os.path.join(root, f"img{d}.npz"), x=x.astype(np.float32), y=y.astype(np.int64))
    return root


class LabelGuard:
    """The target's training split, with labels that raise when read at all (even ``y is None``)."""

    def __init__(self, x):
        self.x = x

    @property
    def y(self):
        raise AssertionError("the target client's training labels were read")

    def __len__(self):
        return len(self.x)


class RecordingExecutor(LocalExecutor):
    """A local executor that keeps every exchange, for tests that inspect what crossed the wire.

    ``calls``: one (instructions, replies) pair per ``executor.run``; ``log``: one
    (round, client id, operation, reply) per reply; ``replies``: every reply.
    """

    def __init__(self, *args):
        super().__init__(*args)
        self.calls: list[tuple[dict, dict]] = []
        self.call_rounds: list[int] = []

    def _dispatch(self, instructions, rnd, replay):
        replies = super()._dispatch(instructions, rnd, replay)
        self.calls.append((instructions, replies))
        self.call_rounds.append(rnd)
        return replies

    def operations(self, skip_setup: bool = True) -> list[str]:
        """The operation of each exchange, in order (setup exchanges of data standardization left out)."""
        from fedsim.runtime.client_host import HOST_OPERATIONS

        ops = [next(iter(ins.values())).operation for ins, _ in self.calls]
        return [op for op in ops if not (skip_setup and op in HOST_OPERATIONS)]

    @property
    def log(self) -> list[tuple]:
        return [
            (rnd, cid, ins[cid].operation, reply)
            for rnd, (ins, reps) in zip(self.call_rounds, self.calls)
            for cid, reply in reps.items()
        ]

    @property
    def replies(self) -> list:
        return [reply for _, reps in self.calls for reply in reps.values()]


class Stopped(Exception):
    """Raised by :func:`run_until` to stop a run as a crash would."""


def run_until(config, out_dir, stop_round: int) -> None:
    """Run ``config`` on the local backend into ``out_dir`` and stop it as round ``stop_round`` starts.

    What is left is what a crash leaves: the checkpoints written so far, no summary.
    """
    import pytest

    from fedsim.data.scenario import build_federation
    from fedsim.runtime import Server, Simulator

    federation = build_federation(config.data)
    simulator = Simulator(config, Server(config, federation, LocalExecutor(config, federation)), out_dir)
    original = simulator.server.run_round

    def run_round(rnd, evaluate):
        if rnd == stop_round:
            raise Stopped
        return original(rnd, evaluate)

    simulator.server.run_round = run_round  # the Simulator still runs the setup stage first
    with pytest.raises(Stopped):
        simulator.run()


def batch_sizes_of(monkeypatch, module, name: str) -> list[int]:
    """The number of clients (jobs, the second argument) of each call of ``module.name``, recorded as they happen."""
    calls: list[int] = []
    original = getattr(module, name)

    def spy(model, jobs, *args, **kwargs):
        calls.append(len(jobs))
        return original(model, jobs, *args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def assert_same_results(first, second, summary_keys) -> None:
    """Two RunResults agree on the given summary entries and bit for bit on the global tensors."""
    import numpy as np

    for key in summary_keys:
        assert first.summary[key] == second.summary[key], key
    assert first.global_tensors.keys() == second.global_tensors.keys()
    for name in first.global_tensors:
        np.testing.assert_array_equal(first.global_tensors[name], second.global_tensors[name], err_msg=name)


@pytest.fixture(scope="session")
def toy_root(tmp_path_factory):
    return str(write_toy_domains(tmp_path_factory.mktemp("toy")))


@pytest.fixture(scope="session")
def toy_overrides(toy_root, tmp_path_factory):
    """Dotted overrides for a fast run on the toy npz federation (target dom1)."""
    cache = tmp_path_factory.mktemp("cache")
    return [
        "data.benchmark=npz",
        f"data.root={toy_root}",
        "data.target=dom1",
        f"data.cache_dir={cache}",
        "run.rounds=2",
        "run.progress=false",
        "method.batch_size=16",
        "method.lr=0.05",
    ]


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster shared by every test that needs it."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        from fedsim.actors.backend import RAY_AUTH_LOGGER, quiet_logger

        with quiet_logger(RAY_AUTH_LOGGER):
            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()
