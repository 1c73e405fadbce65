"""Scenario: sources selection, partitions, and the federated standardization protocol."""

import numpy as np
import pytest

from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.errors import UserError
from fedsim.runtime import LocalExecutor, Server


def test_sources_option_restricts_the_federation(toy_overrides):
    config = load_config(None, toy_overrides + ["data.sources=dom0"])
    federation = build_federation(config.data)
    assert federation.domains == ("dom0", "dom1")
    assert federation.source_domains == ["dom0"]
    with pytest.raises(UserError, match="unknown source domain"):
        build_federation(load_config(None, toy_overrides + ["data.sources=dom9"]).data)
    with pytest.raises(UserError, match="must not contain the target"):
        load_config(None, toy_overrides + ["data.sources=dom0,dom1"])


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_clients_partition_each_domain(toy_overrides, partition):
    config = load_config(None, toy_overrides + ["data.clients_per_domain=3", f"data.partition={partition}"])
    federation = build_federation(config.data)
    assert len(federation.clients) == 9
    for domain in federation.domains:
        members = [c for c in federation.clients if c.domain == domain]
        parts = [load_client_data(config.data, federation, c.client_id) for c in members]
        xs = np.concatenate([p.train.x for p in parts])
        assert len(xs) == len(np.unique(xs, axis=0)) == sum(c.num_train for c in members)  # disjoint and complete


def _standardized_clients(overrides):
    config = load_config(None, overrides)
    federation = build_federation(config.data)
    executor = LocalExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    return federation, {cid: executor.host._client(cid) for cid in federation.client_ids}, executor


def test_federated_standardization_equals_pooled_statistics(toy_overrides):
    federation, data, executor = _standardized_clients(toy_overrides + ["data.normalization=federated"])
    pooled = np.concatenate([d.train.x for d in data.values()])
    np.testing.assert_allclose(pooled.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(pooled.std(0), 1, atol=1e-4)
    assert executor.bytes_received > 0  # the statistics travelled as messages
    assert any(abs(d.train.x.mean()) > 0.05 for d in data.values()), "domains keep their relative shift"


def test_per_domain_standardization(toy_overrides):
    _, data, executor = _standardized_clients(toy_overrides + ["data.normalization=per-domain"])
    for d in data.values():
        np.testing.assert_allclose(d.train.x.mean(0), 0, atol=1e-4)
    assert executor.bytes_received == 0


def test_bad_normalization_name(toy_overrides):
    with pytest.raises(UserError, match="data.normalization"):
        load_config(None, toy_overrides + ["data.normalization=zscore"])


def test_client_host_frees_a_domain_once_its_clients_hold_their_data(toy_overrides):
    """A host keeps one copy of each client's data, not the full domain arrays beside them (memory at 1,000 clients)."""
    from fedsim.data.normalization import DATA_STATS
    from fedsim.data.scenario import get_benchmark
    from fedsim.messages import Instruction
    from fedsim.runtime.client_host import ClientHost

    config = load_config(None, toy_overrides + ["data.clients_per_domain=2", "data.normalization=federated"])
    federation = build_federation(config.data)
    benchmark = get_benchmark(config.data)
    dom0 = [c.client_id for c in federation.clients if c.domain == "dom0"]
    expected = load_client_data(config.data, federation, dom0[0]).train.x.copy()
    host = ClientHost(config, federation, dom0)
    host.execute(dom0[0], Instruction(DATA_STATS))
    assert "dom0" in benchmark._loaded  # one client of the domain still to build
    host.execute(dom0[1], Instruction(DATA_STATS))
    assert "dom0" not in benchmark._loaded
    # a later request rebuilds the domain, bit-identical
    np.testing.assert_array_equal(load_client_data(config.data, federation, dom0[0]).train.x, expected)
