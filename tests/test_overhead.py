"""Only the processes that train import torch: a FedAvg or FedProx driver and server stay numpy-only."""

import json
import subprocess
import sys

import pytest

# The driver's whole path (config, federation, the method's checks, Simulator, metrics, TensorBoard, checkpoints) and
# the server's (the method, setup standardization, rounds, aggregation, evaluation summaries) in a fresh interpreter,
# with clients that reply in numpy as the client half would. The initial state comes from outside, as the Ray
# backend hands it over from a client actor.
NUMPY_CLIENTS = """
import json
import sys
import numpy as np
import fedsim.api
from fedsim.config import load_config
from fedsim.data import normalization
from fedsim.messages import Reply
from fedsim.runtime import Executor, Server

class NumpyClients(Executor):
    def _dispatch(self, instructions, rnd, replay):
        replies = {}
        for cid, ins in instructions.items():
            if ins.operation == normalization.DATA_STATS:
                stats = normalization.feature_stats(np.random.default_rng(cid).normal(size=(20, 8)))
                replies[cid] = Reply(cid, stats.to_tensors(), {}, num_examples=20)
            elif ins.operation == "fit":
                tensors = {k: v + cid for k, v in ins.tensors.items()}
                replies[cid] = Reply(cid, tensors, {"train_loss": 0.5}, num_examples=10 * cid + 10)
            else:
                replies[cid] = Reply(cid, {}, {"correct": 3.0, "total": 4.0}, num_examples=4)
        return replies

    def export_client_states(self):  # a checkpoint asks for them
        return {}

def open_numpy_backend(config, federation, num_cpus=None):
    weights = {"w": np.zeros(3, np.float32), "n": np.zeros(1, np.int64)}
    server = Server(config, federation, NumpyClients(), state={"weights": weights})
    return server, server.close

fedsim.api.BACKENDS["ray"] = "__main__:open_numpy_backend"
settings = ["run.backend=ray", f"method.name={sys.argv[1]}", "run.rounds=3", "run.checkpoint_every=1",
            "run.tensorboard=true"]
config = load_config(None, sys.argv[3:] + settings)
result = fedsim.api.run_experiment(config, sys.argv[2])
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(json.dumps({"w": result.global_tensors["w"].tolist(), "n": result.global_tensors["n"].tolist(),
                  "accuracy": result.summary["target_accuracy"], "torch_modules": loaded}))
"""


@pytest.mark.parametrize("method", ["fedavg", "fedprox"])
def test_driver_and_server_of_a_numpy_method_never_import_torch(method, toy_overrides, tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", NUMPY_CLIENTS, method, str(tmp_path / "run"), *toy_overrides],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["torch_modules"] == []
    # sources are clients 0 and 2 (10 and 30 examples); each round w <- 0.25 (w + 0) + 0.75 (w + 2) = w + 1.5
    assert out["w"] == [4.5, 4.5, 4.5] and out["n"] == [6]  # integers: rint(1.5) = 2, rint(3.5) = 4, rint(5.5) = 6
    assert out["accuracy"] == 0.75
    assert (tmp_path / "run" / "summary.json").exists() and any((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


def test_torch_declaration_is_per_method_not_inherited():
    from fedsim.methods.fedavg import FedAvg
    from fedsim.methods.fedprox import FedProx

    class Subclass(FedAvg):  # a subclass that does not declare it may add server-side torch work
        pass

    assert (
        FedAvg.server_needs_torch is False
        and FedProx.server_needs_torch is False
        and Subclass.server_needs_torch is True
    )


def test_ray_server_actor_of_fedavg_never_imports_torch(toy_overrides, ray_cluster):
    """The real server actor: its initial model comes from a client actor, its rounds average numpy."""
    from fedsim.actors.backend import start_server
    from fedsim.config import load_config
    from fedsim.data.scenario import build_federation

    config = load_config(
        None, toy_overrides + ["run.backend=ray", "method.name=fedavg", "ray.max_actors=1", "run.rounds=1"]
    )
    server = start_server(config, build_federation(config.data))
    try:
        server.setup(1)
        metrics = server.run_round(1, True)
        loaded = ray_cluster.get(server.actor.__ray_call__.remote(lambda actor: "torch" in sys.modules))
        client_loaded = ray_cluster.get(
            server.client_actors[0].__ray_call__.remote(lambda actor: "torch" in sys.modules)
        )
    finally:
        server.close()
    assert 0 <= metrics["target_accuracy"] <= 1 and metrics["bytes_received"] > 0
    assert loaded is False and client_loaded is True
