"""The local and the Ray backend give the same numbers for the same seed."""

import logging

import numpy as np
import pytest
from conftest import assert_same_results, write_image_domains

from fedsim.api import run_experiment
from fedsim.config import load_config


@pytest.mark.parametrize("method_name", ["fedavg", "fedprox", "fedbn", "centralized"])
def test_local_and_ray_agree(method_name, toy_overrides, ray_cluster, tmp_path):
    """Bit-identical. Centralized trains a CNN on the server (its sums depend on torch's thread count), so it
    checks that the server half runs with the same threads on both backends."""
    overrides = list(toy_overrides)
    if method_name == "centralized":
        (tmp_path / "images").mkdir()
        root = write_image_domains(str(tmp_path / "images"))
        overrides += [
            f"data.root={root}",
            "data.target=img2",
            "data.normalization=none",
            "model.name=cnn",
            "model.hidden=16",
        ]
    results = {}
    for backend in ("local", "ray"):
        config = load_config(None, overrides + [f"method.name={method_name}", f"run.backend={backend}", "run.seed=3"])
        results[backend] = run_experiment(config, tmp_path / backend)
    assert_same_results(results["local"], results["ray"], ("target_accuracy", "source_accuracy", "bytes_sent"))


def test_seed_changes_results(toy_overrides):
    runs = [run_experiment(load_config(None, toy_overrides + ["run.backend=local", f"run.seed={s}"])) for s in (0, 1)]
    a, b = (r.global_tensors for r in runs)
    assert any(not np.allclose(a[k], b[k]) for k in a)


def test_ray_backend_spreads_clients_over_actors(toy_overrides, ray_cluster):
    from fedsim.actors.backend import start_server
    from fedsim.data.scenario import build_federation

    config = load_config(None, toy_overrides + ["resources.cpus_per_client=1"])
    federation = build_federation(config.data)
    proxy = start_server(config, federation)
    try:
        assert len(proxy.client_actors) == 2  # 3 clients, 2 CPUs, 1 CPU each
        assert sorted(proxy.assignment) == federation.client_ids
        # sources first, round-robin: the two sources land on different actors
        assert proxy.assignment[federation.source_ids[0]] != proxy.assignment[federation.source_ids[1]]
    finally:
        proxy.close()


def test_gpu_request_without_gpus_warns_and_runs_on_cpu(toy_overrides, ray_cluster, tmp_path, caplog):
    config = load_config(None, toy_overrides + ["resources.gpus_per_client=0.25", "run.rounds=1"])
    with caplog.at_level(logging.WARNING, logger="fedsim.actors.backend"):
        result = run_experiment(config, tmp_path / "gpu")
    assert [r.getMessage() for r in caplog.records if "GPU" in r.getMessage()] == [
        "--gpus-per-client 0.25 asked for GPUs but the Ray cluster has none: running on CPU"
    ]
    assert result.summary["rounds"] == 1 and 0.0 <= result.summary["target_accuracy"] <= 1.0
    assert set(result.summary["source_accuracy"]) == {"dom0", "dom2"}
