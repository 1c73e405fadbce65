"""The local backend on a GPU: resources.gpus_per_client puts the clients (and the server half) on cuda, as a Ray
client actor with GPUs runs them; without CUDA one log line says the clients run on the CPU."""

import logging

import torch

from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.runtime import LocalExecutor, Server
from fedsim.runtime import executor as executor_module


def _setting(overrides, *extra):
    config = load_config(None, [*overrides, "run.backend=local", *extra])
    return config, build_federation(config.data)


def test_without_a_gpu_request_everything_runs_on_the_cpu(toy_overrides, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config, federation = _setting(toy_overrides)
    executor = LocalExecutor(config, federation)
    assert list(executor.hosts) == ["cpu"] and executor.host.device == "cpu"
    assert Server(config, federation, executor).method.device.type == "cpu"


def test_a_gpu_request_puts_every_client_and_the_server_half_on_cuda(toy_overrides, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config, federation = _setting(toy_overrides, "resources.gpus_per_client=0.5", "method.name=centralized")
    with caplog.at_level(logging.WARNING, logger=executor_module.__name__):
        executor = LocalExecutor(config, federation)
    assert not caplog.records
    assert list(executor.hosts) == ["cuda"] and executor.host.device == "cuda"
    assert executor.host.method.device.type == "cuda"
    assert executor.host.client_ids == sorted(federation.client_ids)
    server = Server(config, federation, executor)  # the centralized reference trains in the server half
    assert server.method.device.type == "cuda"


def test_a_gpu_request_without_cuda_runs_on_the_cpu_and_says_so_once(toy_overrides, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config, federation = _setting(toy_overrides, "resources.gpus_per_client=1")
    with caplog.at_level(logging.WARNING, logger=executor_module.__name__):
        executor = LocalExecutor(config, federation)
    assert list(executor.hosts) == ["cpu"]
    assert [r.getMessage() for r in caplog.records] == [
        "resources.gpus_per_client asks for a GPU but CUDA is not available here: the local backend runs every "
        "client on the CPU"
    ]
    assert Server(config, federation, executor).method.device.type == "cpu"


def test_groups_place_each_client_as_the_ray_backend_does(toy_overrides, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    groups = "resources.groups={target: {gpus_per_client: 0.5}}"
    config, federation = _setting(toy_overrides, groups)
    devices = executor_module.local_devices(config, federation)
    assert {cid for cid, d in devices.items() if d == "cuda"} == set(federation.target_ids)
    assert {cid for cid, d in devices.items() if d == "cpu"} == set(federation.source_ids)
    executor = LocalExecutor(config, federation)
    assert sorted(executor.hosts) == ["cpu", "cuda"]
    assert executor.hosts["cuda"].client_ids == sorted(federation.target_ids)
    assert executor.server_device == "cpu"  # the section's gpus_per_client is 0: the server half stays on the CPU


def test_the_clients_models_move_to_the_hosts_device(toy_overrides):
    """torch's meta device as the accelerator: a model that stayed on the CPU would show it."""
    config, federation = _setting(toy_overrides)
    executor = LocalExecutor(config, federation, device="meta")
    for cid in federation.client_ids:
        model = executor.host.private_state(cid)["model"]
        assert {p.device.type for p in model.parameters()} == {"meta"}, cid
