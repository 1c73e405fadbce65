"""Bytes per stage: each operation's bytes sent and received in a round, which add up to the round's totals."""

import numpy as np
import pytest
from conftest import run_until

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.messages import Instruction, Reply
from fedsim.runtime.checkpoint import load_checkpoint
from fedsim.runtime.executor import Executor


def _model_bytes(result) -> int:
    return sum(int(np.asarray(t).nbytes) for t in result.global_tensors.values())


def _assert_adds_up(history) -> None:
    for metrics in history:
        assert sum(metrics["bytes_sent_by_stage"].values()) == metrics["bytes_sent"]
        assert sum(metrics["bytes_received_by_stage"].values()) == metrics["bytes_received"]
        assert metrics["bytes_sent_by_stage"].keys() == metrics["bytes_received_by_stage"].keys()


def test_fedavg_stages_with_the_setup_stage_in_the_first_round(toy_overrides):
    config = load_config(None, toy_overrides + ["run.backend=local", "data.normalization=federated"])
    result = run_experiment(config)
    _assert_adds_up(result.history)
    model = _model_bytes(result)
    first, second = result.history
    assert list(first["bytes_sent_by_stage"]) == ["data_standardize", "data_stats", "evaluate", "fit"]
    assert list(second["bytes_sent_by_stage"]) == ["evaluate", "fit"]
    for metrics in result.history:  # two sources fit, all three clients evaluate, each gets the model
        assert metrics["bytes_sent_by_stage"]["fit"] == metrics["bytes_received_by_stage"]["fit"] == 2 * model
        assert (metrics["bytes_sent_by_stage"]["evaluate"], metrics["bytes_received_by_stage"]["evaluate"]) == (
            3 * model,
            0,
        )
    assert first["bytes_received_by_stage"]["data_standardize"] == 0
    assert first["bytes_sent_by_stage"]["data_stats"] == 0 < first["bytes_received_by_stage"]["data_stats"]


def test_feddann_sends_the_target_features_with_the_model(toy_overrides):
    config = load_config(None, toy_overrides + ["run.backend=local", "method.name=feddann"])
    result = run_experiment(config)
    _assert_adds_up(result.history)
    model = _model_bytes(result)
    for metrics in result.history:
        sent, received = metrics["bytes_sent_by_stage"], metrics["bytes_received_by_stage"]
        assert list(sent) == ["evaluate", "features", "fit"]
        features = received["features"]  # the target's encoded training inputs, float32
        assert features > 0 and features % 4 == 0
        assert sent["features"] == model  # one target client gets the model
        assert sent["fit"] == 2 * (model + features)  # each source: the model and the target's features


def test_stages_add_up_after_a_resume(toy_overrides, tmp_path):
    config = load_config(None, toy_overrides + ["run.backend=local", "run.rounds=3", "run.checkpoint_every=1"])
    run_until(config, tmp_path, 3)
    resumed = run_experiment(config, tmp_path, resume=load_checkpoint(tmp_path))
    _assert_adds_up(resumed.history)
    assert [list(m["bytes_sent_by_stage"]) for m in resumed.history] == [["evaluate", "fit"]] * 3


class _Echo(Executor):
    """Every client answers with a reply of ``size`` float32 values (its id), without running anything."""

    def _dispatch(self, instructions, rnd, replay):
        return {cid: Reply(cid, {"x": np.zeros(cid, np.float32)}) for cid in instructions}


def test_the_executor_counts_each_operation_and_only_the_replies_kept():
    executor = _Echo()
    payload = {"w": np.zeros(10, np.float32)}
    fit = {cid: Instruction("fit", payload) for cid in (1, 2, 3)}
    replies = executor.run(fit, keep=lambda got: [cid for cid in got if cid != 3])
    assert sorted(replies) == [1, 2]
    executor.run({5: Instruction("evaluate", payload)})
    executor.count("fit", 40)  # an instruction whose reply was lost
    assert executor.stage_bytes == {"fit": [160, 12, 2], "evaluate": [40, 20, 1]}
    assert (executor.bytes_sent, executor.bytes_received) == (200, 32)


@pytest.mark.parametrize(
    "settings", [["clients.failure_rate=0.5"], ["clients.failure_rate=0.5", "clients.on_failure=wait"]]
)
def test_lost_and_repeated_instructions_count_in_their_stage(toy_overrides, settings):
    config = load_config(
        None, toy_overrides + ["run.backend=local", "data.clients_per_domain=3", "run.seed=2"] + settings
    )
    result = run_experiment(config)
    _assert_adds_up(result.history)
    model = _model_bytes(result)
    for metrics in result.history:
        sent, received = metrics["bytes_sent_by_stage"]["fit"], metrics["bytes_received_by_stage"]["fit"]
        assert sent == (6 + metrics["failed_attempts"]) * model
        assert received == metrics["clients_answered"] * model
