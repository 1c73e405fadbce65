"""FedMMD's batched fit (``resources.vectorize: auto``) gives each source client the loop's weights and metrics."""

import numpy as np
import pytest
import torch
from conftest import batch_sizes_of

from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.losses.mmd import gaussian_mmd2
from fedsim.messages import Instruction, LocalSettings
from fedsim.methods.alignment import vectorized as vectorized_alignment
from fedsim.methods.common.target_features import TARGET_FEATURES
from fedsim.runtime.client_host import ClientHost
from fedsim.seeding import derive_seed

ATOL = 1e-5
SETTINGS = ["method.local_epochs=3", "method.weight_decay=0.001", "method.momentum=0.9", "method.batch_size=16"]


@pytest.mark.parametrize("kernels", [((), (0.5, 1.0, 2.0)), ((1.5, 3.0), ())])
def test_the_masked_mmd_is_each_clients_own_mmd(kernels):
    """Per client, MK-MMD^2 over its real rows only (median heuristic or fixed bandwidths), padding ignored."""
    torch.manual_seed(0)
    half, real_rows = 6, [6, 4, 2]
    pooled = torch.randn(3, 2 * half, 5)
    real = torch.zeros(3, 2 * half, dtype=torch.bool)
    for k, m in enumerate(real_rows):
        real[k, :m] = real[k, half : half + m] = True
    batched = vectorized_alignment.masked_mmd2(pooled, real, half, *kernels)
    for k, m in enumerate(real_rows):
        alone = gaussian_mmd2(pooled[k, :m], pooled[k, half : half + m], kernels[0] or None, kernels[1])
        assert float(batched[k]) == pytest.approx(float(alone), abs=1e-6)


def _config(toy_overrides, mode):
    overrides = (
        toy_overrides
        + SETTINGS
        + ["data.clients_per_domain=5", "data.partition=dirichlet", "data.dirichlet_alpha=1.0", "run.rounds=4"]
    )
    return load_config(
        None, overrides + ["method.name=fedmmd", "method.target_batch=40", f"resources.vectorize={mode}"]
    )


def _fit(config, groups=None):
    """Every source's round-2 fit reply against the target's features, sent in calls of ``groups`` clients."""
    federation = build_federation(config.data)
    host = ClientHost(config, federation, federation.client_ids)
    weights = host.method.init_server()["weights"]
    target = federation.target_ids[0]
    settings = LocalSettings.from_method(config.method)
    features = host.execute(target, Instruction("features", weights, seed=7, local=settings)).tensors["features"]
    payload = {**weights, TARGET_FEATURES: features}
    items = [
        (cid, Instruction("fit", payload, round=2, seed=derive_seed(0, 2, cid, "fit"), local=settings))
        for cid in federation.source_ids
    ]
    size = groups or len(items)
    replies = [r for i in range(0, len(items), size) for r in host.execute_batch(items[i : i + size])]
    return {r.client_id: r for r in replies}


def _spy(monkeypatch) -> list[int]:
    return batch_sizes_of(monkeypatch, vectorized_alignment, "train_alignment_clients")


def test_batched_fedmmd_fit_gives_each_source_the_loops_weights_and_metrics(toy_overrides, monkeypatch):
    calls = _spy(monkeypatch)
    loop = _fit(_config(toy_overrides, "off"))
    batched = _fit(_config(toy_overrides, "auto"))
    assert calls == [10] and len({r.num_examples for r in loop.values()}) > 2  # uneven clients, one computation
    assert sorted(batched) == sorted(loop)
    for cid, reply in loop.items():
        assert set(batched[cid].metrics) == set(reply.metrics) == {"train_loss", "domain_loss", "lr"}
        for key, value in reply.metrics.items():
            assert batched[cid].metrics[key] == pytest.approx(value, abs=ATOL), (cid, key)
        for name, value in reply.tensors.items():
            np.testing.assert_allclose(batched[cid].tensors[name], value, rtol=0, atol=ATOL, err_msg=f"{cid} {name}")
    assert any(r.metrics["domain_loss"] != 0 for r in loop.values())  # the MMD term took part


def test_batched_fedmmd_does_not_depend_on_the_grouping(toy_overrides, monkeypatch):
    calls = _spy(monkeypatch)
    config = _config(toy_overrides, "auto")
    whole = _fit(config, 10)
    for groups in (1, 2, 5):
        replies = _fit(config, groups)
        gap = max(
            float(np.abs(replies[c].tensors[n] - whole[c].tensors[n]).max()) for c in whole for n in whole[c].tensors
        )
        assert gap <= ATOL
    assert calls == [10, 2, 2, 2, 2, 2, 5, 5]  # groups of 1 run the loop


def test_feddann_keeps_the_loop(toy_overrides):
    """FedDANN inherits the alignment fit but not its batched counterpart: its discriminators stay in the loop."""
    from fedsim.methods.common.vectorized import use_vectorized
    from fedsim.registry import METHODS

    config = load_config(None, toy_overrides + ["method.name=feddann", "resources.vectorize=auto"])
    method = METHODS.get("feddann")(config, build_federation(config.data))
    assert not use_vectorized("auto", method, "fit", 10)


def test_a_whole_fedmmd_run_batched_is_the_loops_run(toy_overrides, tmp_path):
    """The round's two stages (the target's features, then the sources' fit) with ``auto``: the loop's global
    weights within the tolerance, and the same accuracies."""
    from fedsim.api import run_experiment

    overrides = toy_overrides + SETTINGS + ["method.name=fedmmd", "data.clients_per_domain=3"]
    runs = {
        mode: run_experiment(load_config(None, overrides + [f"resources.vectorize={mode}"]), tmp_path / mode)
        for mode in ("off", "auto")
    }
    for name, value in runs["off"].global_tensors.items():
        np.testing.assert_allclose(runs["auto"].global_tensors[name], value, rtol=0, atol=ATOL, err_msg=name)
    assert runs["auto"].summary["target_accuracy"] == pytest.approx(runs["off"].summary["target_accuracy"], abs=1e-9)


def test_fewer_target_features_than_a_batch_keep_the_loop(toy_overrides, monkeypatch):
    """The loop's MMD takes as many target rows as there are (here 8 for batches of 16): the batched form, which
    pairs each source row with a target row, leaves such a round to the loop."""
    calls = _spy(monkeypatch)
    overrides = toy_overrides + SETTINGS + ["method.name=fedmmd", "method.target_batch=8", "data.clients_per_domain=3"]
    replies = {mode: _fit(load_config(None, overrides + [f"resources.vectorize={mode}"])) for mode in ("off", "auto")}
    assert calls == []
    for cid, reply in replies["off"].items():
        for name, value in reply.tensors.items():
            assert np.array_equal(replies["auto"][cid].tensors[name], value)
