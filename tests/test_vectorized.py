"""Batched local training (``resources.vectorize: auto``) gives each client the loop's result.

Tolerance: weights within ``ATOL`` of the loop's after 3 epochs of SGD with momentum and weight decay (measured
on CPU: at most 1.5e-7; batched matrix products sum in another order), whatever the grouping of clients.
"""

import numpy as np
import pytest
from conftest import assert_same_results, batch_sizes_of

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.errors import UserError
from fedsim.messages import Instruction, LocalSettings
from fedsim.methods.common import vectorized
from fedsim.methods.fedprox import FedProx
from fedsim.models import build_model
from fedsim.runtime.client_host import ClientHost
from fedsim.seeding import derive_seed

ATOL = 1e-5
SETTINGS = ["method.local_epochs=3", "method.weight_decay=0.001", "method.momentum=0.9", "method.batch_size=16"]


def _config(toy_overrides, method, mode, extra=()):
    """10 source clients of uneven sizes (label skew), 3 local epochs."""
    overrides = toy_overrides + SETTINGS + ["data.clients_per_domain=5", "data.partition=dirichlet"]
    return load_config(None, overrides + [f"method.name={method}", f"resources.vectorize={mode}", *extra])


def _fit_items(config, federation, host):
    weights = host.method.init_server()["weights"]
    settings = LocalSettings.from_method(config.method)
    return [
        (cid, Instruction("fit", weights, round=1, seed=derive_seed(0, 1, cid, "fit"), local=settings))
        for cid in federation.source_ids
    ]


def _fit(config, groups=None):
    """Every source client's fit reply, the clients sent to one host in calls of ``groups`` clients each."""
    federation = build_federation(config.data)
    host = ClientHost(config, federation, federation.client_ids)
    items = _fit_items(config, federation, host)
    size = groups or len(items)
    replies = [r for i in range(0, len(items), size) for r in host.execute_batch(items[i : i + size])]
    return {r.client_id: r for r in replies}, federation


def _count_batched(monkeypatch) -> list[int]:
    """The number of clients of each batched training call, recorded as they happen."""
    return batch_sizes_of(monkeypatch, vectorized, "train_clients")


def _max_gap(first, second) -> float:
    return max(float(np.abs(first[c].tensors[n] - second[c].tensors[n]).max()) for c in first for n in first[c].tensors)


@pytest.mark.parametrize("method", ["fedavg", "fedprox"])
def test_batched_fit_gives_each_client_the_loops_weights(method, toy_overrides, monkeypatch):
    calls = _count_batched(monkeypatch)
    extra = ["method.mu=0.1"] if method == "fedprox" else []
    loop, federation = _fit(_config(toy_overrides, method, "off", extra))
    batched, _ = _fit(_config(toy_overrides, method, "auto", extra))
    sizes = {r.num_examples for r in loop.values()}
    assert len(federation.source_ids) == 10 and len(sizes) > 2  # uneven clients: steps grouped by batch length
    assert calls == [10]  # the 10 clients trained in one batched computation
    assert sorted(batched) == sorted(loop)
    for cid in loop:
        assert batched[cid].num_examples == loop[cid].num_examples
        assert batched[cid].metrics["train_loss"] == pytest.approx(loop[cid].metrics["train_loss"], abs=ATOL)
        for name, value in loop[cid].tensors.items():
            np.testing.assert_allclose(batched[cid].tensors[name], value, rtol=0, atol=ATOL, err_msg=f"{cid} {name}")


def test_results_do_not_depend_on_the_grouping(toy_overrides, monkeypatch):
    calls = _count_batched(monkeypatch)
    config = _config(toy_overrides, "fedprox", "auto", ["method.mu=0.1"])
    whole, _ = _fit(config, 10)
    for groups in (1, 2, 5):
        replies, _ = _fit(config, groups)
        assert sorted(replies) == sorted(whole)
        assert _max_gap(replies, whole) <= ATOL
    assert calls == [10, 2, 2, 2, 2, 2, 5, 5]  # groups of 1 run the loop


def test_local_and_ray_agree_when_grouped_the_same_way(toy_overrides, ray_cluster, tmp_path):
    """Bit-identical when one Ray actor hosts every client, as the local backend's one host does; the whole
    run within the tolerance of the loop's."""
    overrides = toy_overrides + SETTINGS + ["method.name=fedprox", "data.clients_per_domain=2", "ray.max_actors=1"]
    results = {}
    for backend, mode in (("local", "auto"), ("ray", "auto"), ("local", "off")):
        config = load_config(None, overrides + [f"run.backend={backend}", f"resources.vectorize={mode}"])
        results[backend, mode] = run_experiment(config, tmp_path / f"{backend}-{mode}")
    batched = results["local", "auto"]
    assert_same_results(batched, results["ray", "auto"], ("target_accuracy", "source_accuracy", "bytes_sent"))
    for name, value in results["local", "off"].global_tensors.items():
        np.testing.assert_allclose(batched.global_tensors[name], value, rtol=0, atol=ATOL, err_msg=name)


def test_the_rule_of_auto(toy_overrides):
    config = _config(toy_overrides, "fedprox", "auto")
    federation = build_federation(config.data)
    method = FedProx(config, federation)
    assert vectorized.use_vectorized("auto", method, "fit", 2)
    assert not vectorized.use_vectorized("auto", method, "fit", 1)  # one client: the loop
    assert not vectorized.use_vectorized("off", method, "fit", 10)
    assert not vectorized.use_vectorized("auto", method, "evaluate", 10)

    class Undeclared(FedProx):
        """A subclass that does not declare ``vectorized_operations`` keeps the loop."""

    assert not vectorized.use_vectorized("auto", Undeclared(config, federation), "fit", 10)
    mlp = build_model(config.model, (8,), 3)
    assert vectorized.vectorizable_model(mlp, "cpu") and not vectorized.vectorizable_model(mlp, "cuda")
    conv = load_config(None, ["model.name=cnn", "model.hidden=8"]).model
    assert not vectorized.vectorizable_model(build_model(conv, (1, 8, 8), 3), "cpu")


def test_vectorize_is_off_by_default_and_checked(toy_overrides):
    assert load_config(None, toy_overrides).resources.vectorize == "off"
    with pytest.raises(UserError, match=r"^resources.vectorize must be 'off' or 'auto', got 'fast'"):
        load_config(None, toy_overrides + ["resources.vectorize=fast"])
