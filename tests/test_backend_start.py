"""A backend's slow start (Ray's cluster) overlaps the federation's build, and bad input never leaves it running."""

import threading
import time
import types

import pytest

import fedsim.api
from fedsim.config import load_config
from fedsim.errors import UserError


def fake_backend(monkeypatch, start_seconds: float = 0.0):
    """A backend module whose start records its thread and time span, and whose undo is counted."""
    events = {"undone": 0}

    class Started:
        def stop(self):
            events["undone"] += 1

    def start_backend(config, num_cpus):
        events["start"] = (threading.current_thread() is threading.main_thread(), time.perf_counter())
        time.sleep(start_seconds)
        events["started"] = time.perf_counter()
        return Started()

    def open_server(config, federation, num_cpus, started):
        from fedsim.runtime import LocalExecutor, Server

        events["handed"] = isinstance(started, Started)
        server = Server(config, federation, LocalExecutor(config, federation))
        return server, server.close

    module = types.SimpleNamespace(start_backend=start_backend, open_server=open_server)
    monkeypatch.setitem(fedsim.api.BACKENDS, "ray", "fake_backend_module:open_server")
    monkeypatch.setitem(__import__("sys").modules, "fake_backend_module", module)
    return events


def test_the_federation_builds_in_a_thread_while_the_backend_starts(monkeypatch, toy_overrides):
    events = fake_backend(monkeypatch, start_seconds=0.3)
    built = {}
    real = fedsim.api.checked_federation

    def build(config):
        built["thread_is_main"] = threading.current_thread() is threading.main_thread()
        federation = real(config)
        time.sleep(0.2)  # a slow build (a simulated benchmark) ...
        built["done"] = time.perf_counter()
        return federation

    monkeypatch.setattr(fedsim.api, "checked_federation", build)
    result = fedsim.api.run_experiment(load_config(None, toy_overrides + ["run.backend=ray", "run.rounds=1"]))
    assert events["start"][0] is True and built["thread_is_main"] is False  # ray.init must run in the main thread
    assert events["start"][1] < built["done"] < events["started"]  # ... ends while the backend is still starting
    assert result.summary["rounds"] == 1 and events["undone"] == 0 and events["handed"] is True


def test_bad_input_found_at_once_starts_no_backend(monkeypatch, toy_overrides, tmp_path):
    events = fake_backend(monkeypatch)
    monkeypatch.setattr(fedsim.api, "HEAD_START_S", 30.0)  # "at once": within the head start, however loaded
    config = load_config(None, toy_overrides + ["run.backend=ray", "data.target=nowhere"])
    with pytest.raises(UserError, match="nowhere"):
        fedsim.api.run_experiment(config, tmp_path / "run")
    assert "start" not in events and not (tmp_path / "run").exists()


def test_a_build_that_fails_late_undoes_the_backend_start(monkeypatch, toy_overrides, tmp_path):
    events = fake_backend(monkeypatch, start_seconds=0.05)

    monkeypatch.setattr(fedsim.api, "HEAD_START_S", 0.01)

    def failing_build(config):
        time.sleep(0.3)
        raise UserError("the method's check of the setting failed")

    monkeypatch.setattr(fedsim.api, "checked_federation", failing_build)
    with pytest.raises(UserError, match="check of the setting"):
        fedsim.api.run_experiment(load_config(None, toy_overrides + ["run.backend=ray"]), tmp_path / "run")
    assert "start" in events and events["undone"] == 1 and not (tmp_path / "run").exists()


def test_when_both_fail_the_build_error_comes_first(monkeypatch, toy_overrides):
    fake_backend(monkeypatch)
    monkeypatch.setattr(fedsim.api, "HEAD_START_S", 0.01)

    def unreachable(config, num_cpus):
        raise UserError("cannot reach a Ray cluster at 10.0.0.1:6379")

    def slow_bad_build(config):
        time.sleep(0.2)
        raise UserError("unknown target domain 'nowhere'")

    monkeypatch.setattr(__import__("sys").modules["fake_backend_module"], "start_backend", unreachable)
    monkeypatch.setattr(fedsim.api, "checked_federation", slow_bad_build)
    with pytest.raises(UserError, match="nowhere"):
        fedsim.api.run_experiment(load_config(None, toy_overrides + ["run.backend=ray"]))


class FakeServer:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


def fake_ray(monkeypatch, we_started: bool, start_server):
    """The Ray backend with ``connect`` answering ``we_started``, a counted ``ray.shutdown`` and ``start_server``
    replaced; returns (the backend module, the list that grows by one per shutdown)."""
    backend = pytest.importorskip("fedsim.actors.backend")
    shutdowns = []
    monkeypatch.setattr(backend, "connect", lambda address, num_cpus=None, runtime_env=None: we_started)
    monkeypatch.setattr(backend.ray, "shutdown", lambda: shutdowns.append(1))
    monkeypatch.setattr(backend.ray._private.worker, "_global_node", None)  # no real node's processes touched
    monkeypatch.setattr(backend, "start_server", start_server)
    return backend, shutdowns


@pytest.mark.parametrize("we_started", [True, False])
def test_the_ray_backend_stops_only_a_cluster_its_run_started(monkeypatch, we_started):
    """``connect`` answers False when Ray is already up (a Tune trial, a joined cluster): never shut down then."""
    backend, shutdowns = fake_ray(monkeypatch, we_started, lambda config, federation, runtime_env: FakeServer())
    config = load_config(None, ["run.backend=ray"])
    for started in (None, backend.start_backend(config)):  # opened directly, and after an early start
        server, close = backend.open_server(config, None, None, started)
        close()
        close()  # a second close stops nothing more
        assert server.closed == 2
    assert len(shutdowns) == (2 if we_started else 0)


def test_a_failed_actor_start_stops_the_cluster_its_run_started(monkeypatch):
    def failing(config, federation, runtime_env):
        raise UserError("a client actor kept dying")

    backend, shutdowns = fake_ray(monkeypatch, True, failing)
    with pytest.raises(UserError, match="kept dying"):
        backend.open_server(load_config(None, ["run.backend=ray"]), None)
    assert shutdowns == [1]


class FakeProcess:
    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def kill(self):
        self.log.append(f"kill {self.name}")

    def wait(self, timeout=None):
        self.log.append(f"wait {self.name}")


def test_the_own_cluster_stops_without_waiting_on_its_autoscaler_monitor(monkeypatch):
    """The monitor is killed first (its SIGTERM handler would wait on the GCS that Ray stops before it); the other
    daemons are left to ``ray.shutdown``, which still runs once."""
    backend = pytest.importorskip("fedsim.actors.backend")
    log = []
    node = types.SimpleNamespace(
        all_processes={
            "raylet": [types.SimpleNamespace(process=FakeProcess(log, "raylet"))],
            "monitor": [types.SimpleNamespace(process=FakeProcess(log, "monitor"))],
        }
    )
    monkeypatch.setattr(backend.ray._private.worker, "_global_node", node)
    monkeypatch.setattr(backend.ray, "shutdown", lambda: log.append("shutdown"))
    backend.shutdown_own_cluster()
    assert log == ["kill monitor", "wait monitor", "shutdown"]
    monkeypatch.setattr(backend.ray._private.worker, "_global_node", None)  # no node object (another Ray): plain
    log.clear()
    backend.shutdown_own_cluster()
    assert log == ["shutdown"]
