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

    def start_backend(config, num_cpus):
        events["start"] = (threading.current_thread() is threading.main_thread(), time.perf_counter())
        time.sleep(start_seconds)
        events["started"] = time.perf_counter()

        def undo():
            events["undone"] += 1

        return undo

    def open_server(config, federation, num_cpus):
        from fedsim.runtime import LocalExecutor, Server

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
        time.sleep(0.2)  # a slow build (a simulated benchmark) ...
        built["done"] = time.perf_counter()
        return real(config)

    monkeypatch.setattr(fedsim.api, "checked_federation", build)
    result = fedsim.api.run_experiment(load_config(None, toy_overrides + ["run.backend=ray", "run.rounds=1"]))
    assert events["start"][0] is True and built["thread_is_main"] is False  # ray.init must run in the main thread
    assert events["start"][1] < built["done"] < events["started"]  # ... ends while the backend is still starting
    assert result.summary["rounds"] == 1 and events["undone"] == 0


def test_bad_input_found_at_once_starts_no_backend(monkeypatch, toy_overrides, tmp_path):
    events = fake_backend(monkeypatch)
    config = load_config(None, toy_overrides + ["run.backend=ray", "data.target=nowhere"])
    with pytest.raises(UserError, match="nowhere"):
        fedsim.api.run_experiment(config, tmp_path / "run")
    assert "start" not in events and not (tmp_path / "run").exists()


def test_a_build_that_fails_late_undoes_the_backend_start(monkeypatch, toy_overrides, tmp_path):
    events = fake_backend(monkeypatch, start_seconds=0.05)

    def failing_build(config):
        time.sleep(fedsim.api.HEAD_START_S + 0.1)
        raise UserError("the method's check of the setting failed")

    monkeypatch.setattr(fedsim.api, "checked_federation", failing_build)
    with pytest.raises(UserError, match="check of the setting"):
        fedsim.api.run_experiment(load_config(None, toy_overrides + ["run.backend=ray"]), tmp_path / "run")
    assert "start" in events and events["undone"] == 1 and not (tmp_path / "run").exists()
