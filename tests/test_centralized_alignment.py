"""Centralized DANN / MMD references: flagged centralized, the target uploads inputs only, the schedule is FedDANN's."""

import numpy as np
import pytest
from conftest import RecordingExecutor

from fedsim.config import load_config
from fedsim.data.scenario import build_federation
from fedsim.losses import DANNLoss, MMDLoss
from fedsim.methods.alignment.dann import DANN
from fedsim.methods.alignment.feddann import FedDANN
from fedsim.methods.alignment.mmd import MMD
from fedsim.methods.alignment.pooled import CentralizedAlignment
from fedsim.runtime import Server


def test_references_are_flagged_centralized_and_share_the_federated_losses():
    for cls in (DANN, MMD):
        assert cls.centralized is True and issubclass(cls, CentralizedAlignment)
        assert cls.operations == {"upload", "upload_inputs", "evaluate"}
    assert DANN.Params is FedDANN.Params


@pytest.mark.parametrize("name,loss", [("dann", DANNLoss), ("mmd", MMDLoss)])
def test_pool_moves_once_target_sends_no_labels_and_training_follows_the_ramp(name, loss, toy_overrides):
    config = load_config(None, toy_overrides + [f"method.name={name}", "run.rounds=4"])
    federation = build_federation(config.data)
    executor = RecordingExecutor(config, federation)
    server = Server(config, federation, executor)
    server.setup(1)
    server.run_round(1, evaluate=False)
    before = {k: v.copy() for k, v in server.state["weights"].items()}
    later = server.run_round(2, evaluate=False)
    assert executor.operations() == ["upload", "upload_inputs"]  # round 2 pools nothing new
    for _, cid, operation, reply in executor.log:
        if operation == "upload_inputs":
            assert cid in federation.target_ids and set(reply.tensors) == {"x"}
    assert isinstance(METHOD := server.method, (DANN, MMD)) and isinstance(METHOD.make_domain_loss(8), loss)
    assert later["domain_weight"] == pytest.approx(2 / (1 + np.exp(-10 * 0.5)) - 1)
    assert later["target_pool_size"] == sum(federation.info(c).num_train for c in federation.target_ids)
    assert any(not np.array_equal(before[k], v) for k, v in server.state["weights"].items())
    if name == "dann":
        assert server.state["domain_loss"] and 0.0 <= later["discriminator_accuracy"] <= 1.0
