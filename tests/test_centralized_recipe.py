"""The centralized reference's Adam (the TEP authors' source-only recipe): torch's Adam over the pool, its state
carried from round to round; a bad optimizer in one line."""

import numpy as np
import pytest
import torch

from fedsim.config import load_config
from fedsim.data.base import ArraySplit
from fedsim.data.scenario import build_federation
from fedsim.errors import UserError
from fedsim.methods.common.classifier import GlobalClassifier
from fedsim.methods.common.training import train_epochs
from fedsim.recipes import recipe_for
from fedsim.runtime import LocalExecutor, Server
from fedsim.runtime.client_host import torch_threads
from fedsim.runtime.server import SERVER_THREADS
from fedsim.seeding import derive_seed

ADAM = ["method.name=centralized", "method.optimizer=adam", "method.lr=0.001", "data.normalization=none"]


def test_adam_rounds_continue_one_adam_run(toy_overrides):
    config = load_config(None, toy_overrides + ADAM)
    federation = build_federation(config.data)
    server = Server(config, federation, LocalExecutor(config, federation))
    server.setup(1)
    initial = {k: v.copy() for k, v in server.state["weights"].items()}
    losses = [server.run_round(rnd, evaluate=False)["train_loss"] for rnd in (1, 2)]
    pool = server.state["pool"]
    # the same two epochs by hand: one torch Adam, the batches of each round's seed
    classifier = GlobalClassifier(config, federation, torch.device("cpu"))
    model = classifier.build()
    model.load_state_dict({k: torch.tensor(v) for k, v in initial.items()})
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, weight_decay=0.0)
    expected = []
    with torch_threads(SERVER_THREADS):
        for rnd in (1, 2):
            seed = derive_seed(config.run.seed, rnd, -1, "centralized")
            split = ArraySplit(pool["x"], pool["y"])
            expected.append(train_epochs(model, split, 1, config.method.batch_size, optimizer, seed, "cpu"))
    assert losses == expected
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(server.state["weights"][name], value.numpy(), err_msg=name)
    steps = {int(s["step"]) for s in server.state["optimizer"]["state"].values()}
    batches = -(-len(pool["y"]) // config.method.batch_size)
    assert steps == {2 * batches}  # the moments and the step count went on from round 1


def test_sgd_stays_the_default_and_keeps_no_optimizer_state(toy_overrides):
    config = load_config(None, toy_overrides + ["method.name=centralized"])
    assert config.method.params.optimizer == "sgd"
    federation = build_federation(config.data)
    server = Server(config, federation, LocalExecutor(config, federation))
    server.setup(1)
    server.run_round(1, evaluate=False)
    assert "optimizer" not in server.state


def test_the_tep_recipe_is_a_valid_setting_of_the_method():
    recipe = recipe_for("centralized", "tep", {}).values
    config = load_config(None, ["method.name=centralized", *(f"{k}={v}" for k, v in recipe.items())])
    assert (config.method.params.optimizer, config.method.lr, config.method.batch_size) == ("adam", 1e-4, 256)
    assert config.run.rounds * config.method.local_epochs == 70 and config.method.weight_decay == 0.0


def test_an_unknown_optimizer_is_one_line():
    with pytest.raises(UserError, match="method.optimizer must be one of sgd, adam, got 'rmsprop'"):
        load_config(None, ["method.name=centralized", "method.optimizer=rmsprop"])
