"""The ``fedavg-lenet-10`` job in pfl-research (apple/pfl-research), for :mod:`tools.benchmarks.vs_peers`.

Runs under any interpreter that has ``pfl[pytorch]`` (of fedsim it imports only the model and the seeding, which
need nothing but numpy and torch; no Ray): one process, or
``torchrun --nproc_per_node 2`` for pfl's multi-worker simulation. Reads the clients' arrays that vs_peers
wrote (``clients.npz``: the same 10 clients fedsim builds), trains fedsim's LeNet-5 from fedsim's initial weights
with pfl's ``FederatedAveraging``:
every client in every round (``MinimizeReuseUserSampler`` over 10 users, cohort 10), one local epoch of SGD
(lr 0.05, momentum 0.9, batch 32, a fresh optimizer each round), the average weighted by data points and applied
with a central SGD at lr 1 (plain FedAvg), one torch thread per worker. Evaluation once, after training and
outside the timed rounds. Rank 0 prints one ``PEER-RESULT {json}`` line: the seconds of each round and the
target accuracy. A second argument ``channels-last`` holds the LeNet's convolution weights channels-last, the
layout fedsim's ``build_model`` gives models of images; without it the model keeps torch's default layout, as a
pfl user's model does.

    python experiments/benchmarks/peers_pfl.py clients.npz [channels-last]
    python -m torch.distributed.run --standalone --nproc_per_node 2 experiments/benchmarks/peers_pfl.py clients.npz
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn

ROUNDS, LOCAL_LR, BATCH = 5, 0.05, 32
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PflLeNet(nn.Module):
    """fedsim's own ``lenet5`` (fedsim/models/lenet5.py, which needs only torch), from the initial weights fedsim's
    FedAvg starts from (``torch.manual_seed(derive_seed(seed, "model-init"))``), with the ``loss`` and ``metrics``
    that pfl asks of a model."""

    def __init__(self, num_classes: int = 10, seed: int = 0, channels_last: bool = False):
        super().__init__()
        sys.path.insert(0, REPO)  # fedsim's models and seeding import nothing but numpy and torch
        from fedsim.models.lenet5 import lenet5
        from fedsim.seeding import derive_seed

        torch.manual_seed(derive_seed(seed, "model-init"))
        self.net = lenet5((1, 28, 28), num_classes)
        if channels_last:
            self.net.to(memory_format=torch.channels_last)

    def forward(self, x):
        return self.net(x)

    def loss(self, x, y, eval=False):  # noqa: A002 (pfl's keyword)
        self.eval() if eval else self.train()
        return nn.functional.cross_entropy(self(x), y)

    def metrics(self, x, y, eval=False):  # noqa: A002
        from pfl.metrics import Weighted

        self.eval() if eval else self.train()
        logits = self(x)
        correct = float((logits.argmax(1) == y).sum())
        loss = float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        return {"loss": Weighted(loss, len(y)), "accuracy": Weighted(correct, len(y))}


def run(path: str, channels_last: bool = False) -> dict:
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import MinimizeReuseUserSampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    torch.set_num_threads(1)
    arrays = np.load(path)
    users = sorted(int(k[len("x_") :]) for k in arrays.files if k.startswith("x_"))
    data = {u: [torch.from_numpy(arrays[f"x_{u}"]), torch.from_numpy(arrays[f"y_{u}"])] for u in users}
    federated = FederatedDataset(
        lambda u: Dataset(data[u], user_id=u), MinimizeReuseUserSampler(users), {u: len(data[u][1]) for u in users}
    )
    np.random.seed(0)  # pfl's samplers draw from numpy's global generator
    module = PflLeNet(channels_last=channels_last)
    model = PyTorchModel(
        model=module,
        local_optimizer_create=functools.partial(torch.optim.SGD, momentum=0.9),
        central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0),
    )
    stamps: list[float] = []

    class RoundClock(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            stamps.append(time.perf_counter())
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            stamps.append(time.perf_counter())
            return False, Metrics()

    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=ROUNDS,
            evaluation_frequency=ROUNDS + 1,
            train_cohort_size=len(users),
            val_cohort_size=0,
        ),
        backend=SimulatedBackend(training_data=federated, val_data=federated, postprocessors=[WeightByDatapoints()]),
        model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=LOCAL_LR, local_num_epochs=1, local_batch_size=BATCH),
        model_eval_params=NNEvalHyperParams(local_batch_size=1024),
        callbacks=[RoundClock()],
    )
    module.eval()
    with torch.no_grad():
        x, y = torch.from_numpy(arrays["target_x"]), torch.from_numpy(arrays["target_y"])
        accuracy = float((module(x).argmax(1) == y).float().mean())
    return {"round_seconds": np.diff(stamps).tolist(), "accuracy": accuracy}


if __name__ == "__main__":
    result = run(sys.argv[1], channels_last=sys.argv[2:] == ["channels-last"])
    if int(os.environ.get("RANK", "0")) == 0:
        print("PEER-RESULT " + json.dumps(result), flush=True)
