"""DaDiL, centralized: the upper bound that FedDaDiL is compared with (FedDaDiL paper, Fig. 2a).

Montesuma, Mboula, Souloumiac, ECAI 2023, Alg. 1: one process sees every
domain and minimizes sum_l W_c(Q_l, B(alpha_l; P)) over the atoms and all
barycentric coordinates with the same mini-batch steps as FedDaDiL.

To keep the comparison exact, it runs on the same simulator: in the first
dictionary round every client uploads its (standardized, encoded) training
features, and its labels if it is a source, to the server. Raw data crossing
the wire is the point of this baseline (and is counted in ``bytes_received``);
the target's labels are never uploaded. Everything else (atom initialization,
atom mini-batches, encoder stage, DaDiL-R / DaDiL-E evaluation) is FedDaDiL's.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods import _dadil as dil
from fedsim.methods.base import ServerState
from fedsim.methods.feddadil import FedDaDiL
from fedsim.registry import METHODS


@METHODS.register("dadil")
class DaDiL(FedDaDiL):
    centralized = True  # replies carry client data on purpose: the contract tests know this
    operations = ("fit", "evaluate", "feature_stats", "upload")

    def init_server(self) -> ServerState:
        state = super().init_server()
        state["alphas"] = {cid: np.full(self.num_atoms, 1.0 / self.num_atoms, np.float32) for cid in self.federation.client_ids}
        return state

    def run_round(self, rnd: int, state: ServerState, executor) -> tuple[ServerState, dict]:
        if not self.is_dictionary_round(rnd):
            return super().run_round(rnd, state, executor)
        if "pool" not in state:
            payload = self.first_dictionary_payload(rnd, state, executor)
            replies = executor.run({cid: Instruction("upload", payload, {"round": rnd}) for cid in self.federation.client_ids})
            state = {**state, "pool": {cid: (r.tensors["x"], r.tensors.get("y")) for cid, r in replies.items()}}
        p = self.params
        batch = self.config.method.batch_size
        idx = self.atom_batch(rnd)
        atoms_x, atoms_logits = dil.dictionary_step_tensors(state["atoms_x"][:, idx], state["atoms_logits"][:, idx])
        alphas = {cid: torch.tensor(a, requires_grad=True) for cid, a in state["alphas"].items()}
        optimizer = torch.optim.Adam([{"params": [atoms_x, atoms_logits], "lr": p.lr_atoms}, {"params": list(alphas.values()), "lr": p.lr_alpha}])
        data = {}
        for cid, (x, y) in state["pool"].items():
            labels = None if y is None else torch.nn.functional.one_hot(torch.from_numpy(y), self.federation.num_classes).float()
            data[cid] = (torch.from_numpy(x), labels, torch.Generator().manual_seed(self.client_seed(rnd, cid, "dil")))
        losses: dict[int, list[float]] = {}
        for _ in range(self.config.method.local_epochs):
            losses = {cid: [] for cid in data}
            iterators = {cid: list(dil.batches(len(x), batch, g)) for cid, (x, _, g) in data.items()}
            for step in range(max(len(it) for it in iterators.values())):
                total = 0.0
                for cid, (x, labels, _) in data.items():
                    chunk = iterators[cid][step % len(iterators[cid])]
                    loss = dil.dil_loss(atoms_x, atoms_logits, alphas[cid], x[chunk], None if labels is None else labels[chunk], p)
                    total = total + loss
                    losses[cid].append(float(loss.detach()))
                optimizer.zero_grad(set_to_none=True)
                total.backward()
                optimizer.step()
                for alpha in alphas.values():
                    dil.alpha_step(alpha)
        new_x, new_logits = state["atoms_x"].copy(), state["atoms_logits"].copy()
        new_x[:, idx], new_logits[:, idx] = atoms_x.detach().numpy(), atoms_logits.detach().numpy()
        state = {
            **state,
            "atoms_x": new_x,
            "atoms_logits": new_logits,
            "alphas": {cid: a.detach().numpy().copy() for cid, a in alphas.items()},
        }
        return state, {"stage": "dictionary", "dil_loss": {str(c): float(np.mean(v)) for c, v in losses.items()}}

    def evaluate_config(self, rnd: int, cid: int) -> dict:
        config = super().evaluate_config(rnd, cid)
        config["alpha"] = [float(a) for a in self._alphas[cid]]
        return config

    def configure_evaluate(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        self._alphas = state["alphas"]
        return super().configure_evaluate(rnd, state)

    # ---- client half ------------------------------------------------------
    def upload(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Send the training features (and a source's labels) to the server: the centralized setting."""
        train_x, _ = self.features(state, data, instruction)
        tensors = {"x": train_x.numpy()}
        if data.train.y is not None:
            tensors["y"] = data.train.y
        return Reply(data.client_id, tensors, {}, num_examples=len(train_x)), state

    def client_alpha(self, instruction: Instruction, state: Any) -> torch.Tensor:
        return torch.tensor(instruction.config["alpha"], dtype=torch.float32)
