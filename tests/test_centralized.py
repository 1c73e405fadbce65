"""Centralized source-only reference: who uploads, what the server pools, determinism."""

import pickle

import numpy as np
import torch
from conftest import RecordingExecutor, run_until

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.base import ArraySplit
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.messages import LocalSettings
from fedsim.methods.base import PooledReference
from fedsim.methods.centralized import Centralized
from fedsim.methods.common.classifier import GlobalClassifier
from fedsim.methods.common.training import model_to_numpy
from fedsim.runtime import LocalExecutor, Server
from fedsim.runtime.client_host import torch_threads
from fedsim.runtime.server import SERVER_THREADS
from fedsim.seeding import derive_seed


def _server(overrides, executor_cls=LocalExecutor):
    config = load_config(None, overrides)
    federation = build_federation(config.data)
    executor = executor_cls(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    return config, federation, server


def test_centralized_composes_the_classifier_instead_of_inheriting_fedavg(toy_overrides):
    assert Centralized.__bases__ == (PooledReference,) and Centralized.centralized is True
    assert Centralized.operations == {"upload", "evaluate"}
    assert len(Centralized.description()) > 10


def test_server_trains_the_pool_with_the_fedavg_loop_and_its_own_seed(toy_overrides):
    config, federation, server = _server(toy_overrides + ["method.name=centralized", "data.normalization=none"])
    initial = {k: v.copy() for k, v in server.state["weights"].items()}
    metrics = server.run_round(1, evaluate=False)
    pool = server.state["pool"]
    classifier = GlobalClassifier(config, federation, torch.device("cpu"))
    model = classifier.build()
    seed = derive_seed(config.run.seed, 1, -1, "centralized")
    with torch_threads(SERVER_THREADS):  # as the server runs it
        settings = LocalSettings.from_method(config.method)
        loss = classifier.train(model, initial, ArraySplit(pool["x"], pool["y"]), settings, seed)
    assert metrics["train_loss"] == loss and metrics["pool_size"] == len(pool["y"])
    for name, value in model_to_numpy(model).items():
        np.testing.assert_array_equal(server.state["weights"][name], value, err_msg=name)


def test_only_sources_upload_and_only_once(toy_overrides):
    _, federation, server = _server(toy_overrides + ["method.name=centralized"], RecordingExecutor)
    first = server.run_round(1, evaluate=True)
    second = server.run_round(2, evaluate=True)
    uploads = [(rnd, cid) for rnd, cid, op, _ in server.executor.log if op == "upload"]
    assert uploads == [(1, cid) for cid in sorted(federation.source_ids)]
    assert not set(federation.target_ids) & {cid for _, cid in uploads}
    # the target only evaluates, every round
    target_ops = {op for _, cid, op, _ in server.executor.log if cid in federation.target_ids}
    assert target_ops <= {"evaluate", "data_stats", "data_standardize"} and "evaluate" in target_ops
    # raw source data crossed the wire in round 1 only: round 2 receives only (empty) evaluation replies
    assert first["bytes_received"] > 0 and second["bytes_received"] == 0
    assert first["pool_size"] == second["pool_size"]


def test_centralized_differs_from_fedavg_after_one_round(toy_overrides):
    common = toy_overrides + ["data.clients_per_domain=1", "method.local_epochs=1"]
    results = {}
    for name in ("fedavg", "centralized"):
        _, federation, server = _server(common + [f"method.name={name}"])
        initial = {k: v.copy() for k, v in server.global_tensors().items()}
        metrics = server.run_round(1, evaluate=True)
        results[name] = (initial, server.global_tensors(), metrics)
    assert len(federation.source_ids) >= 2  # FedAvg averages several clients: not one pooled SGD pass
    init_f, final_f, metrics_f = results["fedavg"]
    init_c, final_c, metrics_c = results["centralized"]
    assert init_f.keys() == init_c.keys() and all(np.array_equal(init_f[k], init_c[k]) for k in init_f)  # same start
    assert any(not np.allclose(final_f[k], final_c[k]) for k in final_f)
    assert any(not np.allclose(init_c[k], final_c[k]) for k in init_c)  # the server did train
    for metrics in (metrics_f, metrics_c):
        assert 0.0 <= metrics["target_accuracy"] <= 1.0


def test_local_backend_is_deterministic(toy_overrides, tmp_path):
    config = load_config(None, toy_overrides + ["method.name=centralized", "run.backend=local"])
    a = run_experiment(config, tmp_path / "a")
    b = run_experiment(config, tmp_path / "b")
    sa, sb = dict(a.summary), dict(b.summary)
    sa.pop("wall_seconds"), sb.pop("wall_seconds")
    assert sa == sb
    assert all(np.array_equal(a.global_tensors[k], b.global_tensors[k]) for k in a.global_tensors)
    assert sa["method"] == "centralized" and 0.0 <= sa["target_accuracy"] <= 1.0


def test_server_pool_holds_exactly_the_source_training_samples(toy_overrides):
    config, federation, server = _server(
        toy_overrides + ["method.name=centralized", "data.clients_per_domain=2", "data.normalization=none"]
    )
    assert "pool" not in server.state
    server.run_round(1, evaluate=False)
    pool = server.state["pool"]
    sources = [load_client_data(config.data, federation, cid) for cid in sorted(federation.source_ids)]
    assert len(pool["x"]) == len(pool["y"]) == sum(len(d.train) for d in sources)
    assert pool["x"].shape[1:] == tuple(federation.input_shape)
    np.testing.assert_array_equal(pool["y"], np.concatenate([d.train.y for d in sources]))  # client-id order
    np.testing.assert_array_equal(pool["x"], np.concatenate([d.train.x for d in sources]))
    # the pool survives a checkpoint: plain numpy arrays in a picklable state
    restored = pickle.loads(pickle.dumps(server.state))
    assert isinstance(restored["pool"]["x"], np.ndarray)
    np.testing.assert_array_equal(restored["pool"]["x"], pool["x"])


def test_resume_after_checkpoint_keeps_the_pool(toy_overrides, tmp_path):
    from fedsim.runtime.checkpoint import load_checkpoint

    config = load_config(
        None, toy_overrides + ["method.name=centralized", "run.rounds=4", "run.checkpoint_every=2", "run.backend=local"]
    )
    full = run_experiment(config, tmp_path / "full")
    run_until(config, tmp_path / "partial", 3)
    saved = load_checkpoint(tmp_path / "partial")
    resumed = run_experiment(config, tmp_path / "partial", resume=saved)
    a, b = dict(full.summary), dict(resumed.summary)
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b  # the resumed run did not upload again (same bytes) and trained on the same pool
