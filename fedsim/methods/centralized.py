"""Centralized source-only training: the pooled-data reference that FedAvg source-only approximates.

The "source-only" row of domain adaptation tables (e.g. Ganin et al., JMLR
2016; Peng et al., ICCV 2019): one model trained in one place on the pooled
labeled source domains, then tested on the target without adaptation. FedAvg
source-only optimizes the same objective without sharing data; the gap between
the two is the price of federation (usually read as an upper bound for
FedAvg; on the embedded digits it is not: see the README).

It runs on the same simulator so the numbers are comparable: same model and
initialization as FedAvg, same standardization, same evaluation. In round 1
every source client uploads its training inputs and labels once; the server
keeps the pool (numpy arrays, so checkpoints carry it) in client-id order,
which makes the local and Ray backends identical for a seed. Raw source data
crossing the wire is the point of this baseline and is counted in
``bytes_received``. The target's data is never uploaded: the target client
only evaluates the broadcast weights, as in FedAvg.

Every round the server runs ``method.local_epochs`` epochs of mini-batch SGD
over the pool (``method.batch_size``, a fresh optimizer per round as in
FedAvg), on its own device. ``run.clients_per_round`` does not apply: the pool
always holds every source client.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedsim.data.base import ArraySplit, ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import ServerState
from fedsim.methods.fedavg import FedAvg
from fedsim.methods.common.training import load_numpy, make_optimizer, model_to_numpy, train_epochs
from fedsim.registry import METHODS


@METHODS.register("centralized")
class Centralized(FedAvg):
    centralized = True  # replies carry client data on purpose: the contract tests know this
    operations = ("upload", "evaluate")

    # ---- server half ------------------------------------------------------
    def gather_pool(self, rnd: int, executor) -> dict[str, np.ndarray]:
        """Round 1: each source client sends its training split; concatenated in client-id order."""
        sources = sorted(self.federation.source_ids)
        replies = executor.run({cid: Instruction("upload", {}, {"round": rnd}) for cid in sources})
        missing = [cid for cid in sources if cid not in replies]
        if missing:
            raise RuntimeError(f"centralized: source clients {missing} did not upload their data")
        x = np.concatenate([np.asarray(replies[cid].tensors["x"]) for cid in sources])
        y = np.concatenate([np.asarray(replies[cid].tensors["y"]) for cid in sources])
        return {"x": x, "y": y}

    def server_model(self):
        """The server's model, built once per process (weights are reloaded from the state every round)."""
        if getattr(self, "_server_model", None) is None:
            with torch.random.fork_rng(devices=[]):  # build_model seeds torch: leave the global RNG as it was
                self._server_model = self.build_model().to(self.device)
        return self._server_model

    def run_round(self, rnd: int, state: ServerState, executor) -> tuple[ServerState, dict]:
        if "pool" not in state:
            state = {**state, "pool": self.gather_pool(rnd, executor)}
        pool = state["pool"]
        model = self.server_model()
        load_numpy(model, state["weights"])
        optimizer = make_optimizer(model, self.config.method)  # fresh each round, as FedAvg's clients do
        loss = train_epochs(
            model,
            ArraySplit(pool["x"], pool["y"]),
            self.config.method.local_epochs,
            self.config.method.batch_size,
            optimizer,
            seed=self.client_seed(rnd, -1, "centralized"),
            device=self.device,
        )
        return {**state, "weights": model_to_numpy(model)}, {"train_loss": loss, "pool_size": int(len(pool["y"]))}

    def configure_round(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        raise NotImplementedError("centralized trains on the server: see run_round")

    def aggregate(self, rnd: int, state: ServerState, replies) -> tuple[ServerState, dict]:
        raise NotImplementedError("centralized trains on the server: see run_round")

    # ---- client half ------------------------------------------------------
    def upload(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Send the (standardized) training inputs and labels to the server: the centralized setting."""
        if data.train.y is None:
            raise ValueError(f"client {data.client_id} is unlabeled (the target): it never uploads")
        tensors = {"x": np.asarray(data.train.x), "y": np.asarray(data.train.y)}
        return Reply(data.client_id, tensors, {}, num_examples=len(data.train)), state
