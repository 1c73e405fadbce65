"""DaDiL, centralized: the upper bound that FedDaDiL is compared with (FedDaDiL paper, Fig. 2a).

Montesuma, Mboula, Souloumiac, ECAI 2023, Alg. 1: one process sees every
domain and minimizes sum_l W_c(Q_l, B(alpha_l; P)) (Eq. 9) over the atoms and
all barycentric coordinates with the same mini-batch steps as FedDaDiL.

To keep the comparison exact, it runs on the same simulator: in the first
dictionary round every client uploads its (standardized, encoded) training
features, and its labels if it is a source, to the server. Raw data crossing
the wire is the point of this baseline (and is counted in ``bytes_received``);
the target's labels are never uploaded. The barycentric coordinates of every
domain live in the server state and travel to each client with the evaluation.
Everything else (atom initialization, atom mini-batches, encoder stage,
DaDiL-R / DaDiL-E evaluation) is FedDaDiL's, through the same common pieces.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import ServerState, client_operation
from fedsim.methods.common import dictionary as dil
from fedsim.methods.common.encoder_stage import DictionaryMethod, EncoderStage
from fedsim.methods.common.training import minibatches
from fedsim.registry import METHODS


@METHODS.register("dadil")
class DaDiL(DictionaryMethod):
    """DaDiL centralized (Montesuma et al. 2023): the server learns the dictionary on every domain's uploaded features."""

    Params = dil.DictionaryParams
    centralized = True  # replies carry client data on purpose: the contract tests know this

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.num_atoms = dil.num_atoms(self.params, len(federation.domains))
        self.encoder = EncoderStage(config, federation, self.device, self.params.encoder_rounds)

    @classmethod
    def check_setting(cls, config, federation) -> None:
        dil.check_batch_size(config.method.params, config.method.batch_size)
        EncoderStage.check_setting(config.method.params.encoder_rounds, federation)

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        atoms = dil.initial_dictionary(self.params, self.num_atoms, self.encoder.feature_dim, self.federation.num_classes, self.config.run.seed)
        alphas = {cid: np.full(self.num_atoms, 1.0 / self.num_atoms, np.float32) for cid in self.federation.client_ids}
        return {**atoms, **self.encoder.init_server(), "alphas": alphas}

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        if self.encoder.is_encoder_round(ctx.round):
            return self.encoder.run_round(ctx, state)
        if "pool" not in state:
            replies = ctx.call("upload", self.encoder.feature_payload(ctx, state), self.federation.client_ids)
            state = {**state, "pool": {cid: (r.tensors["x"], r.tensors.get("y")) for cid, r in replies.items()}}
        idx = dil.atom_batch(self.config.run.seed, ctx.round, self.params, self.config.method.batch_size)
        atoms_x, atoms_logits = dil.trainable_atoms(state["atoms_x"][:, idx], state["atoms_logits"][:, idx])
        alphas = {cid: torch.tensor(a, requires_grad=True) for cid, a in state["alphas"].items()}
        losses = self.train_dictionary(ctx, state["pool"], atoms_x, atoms_logits, alphas)
        state = dil.with_atom_batch(state, idx, atoms_x.detach().numpy(), atoms_logits.detach().numpy())
        state["alphas"] = {cid: a.detach().numpy().copy() for cid, a in alphas.items()}
        return state, {"stage": "dictionary", "dil_loss": {str(c): float(np.mean(v)) for c, v in losses.items()}}

    def train_dictionary(self, ctx, pool: dict, atoms_x, atoms_logits, alphas: dict) -> dict[int, list[float]]:
        """E epochs of Adam on the atom batch and every alpha_l, one step per mini-batch of every domain
        (summed losses); a domain with fewer batches starts over. Returns the last epoch's losses."""
        p = self.params
        optimizer = torch.optim.Adam(
            [{"params": [atoms_x, atoms_logits], "lr": p.lr_atoms}, {"params": list(alphas.values()), "lr": p.lr_alpha}]
        )
        data = {}
        for cid, (x, y) in pool.items():
            generator = torch.Generator().manual_seed(ctx.seed(cid, "dil"))
            data[cid] = (torch.tensor(x), dil.one_hot_labels(y, self.federation.num_classes), generator)
        losses: dict[int, list[float]] = {}
        for _ in range(self.config.method.local_epochs):
            losses = {cid: [] for cid in data}
            iterators = {cid: list(minibatches(len(x), self.config.method.batch_size, g)) for cid, (x, _, g) in data.items()}
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
                    dil.project_alpha(alpha)
        return losses

    def evaluate_round(self, ctx, state: ServerState) -> dict:
        if self.encoder.is_encoder_round(ctx.round):
            return self.encoder.evaluate_round(ctx, state)
        alphas = state["alphas"]
        replies = ctx.call(
            "evaluate", dil.atom_tensors(state), self.federation.client_ids, lambda cid: {"alpha": [float(a) for a in alphas[cid]]}
        )
        return self.summarize_evaluation(ctx.round, replies)

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        return self.encoder.init_client(data)

    @client_operation
    def upload(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Send the training features (and a source's labels) to the server: the centralized setting."""
        self.encoder.prepare(state, data, instruction.tensors)
        train_x = state.pop("train_features")  # the server holds them now: the client keeps no copy
        tensors = {"x": train_x.numpy()}
        if data.train.y is not None:
            tensors["y"] = data.train.y
        return Reply(data.client_id, tensors, {}, num_examples=len(train_x)), state

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """DaDiL-R and DaDiL-E with the alpha the server learned for this client's domain."""
        if "atoms_x" not in instruction.tensors:
            return self.encoder.evaluate(instruction, state, data)
        self.encoder.prepare(state, data, instruction.tensors)
        alpha, seed = torch.tensor(instruction.config["alpha"], dtype=torch.float32), instruction.config["seed"]
        metrics = dil.evaluate_predictors(instruction.tensors, alpha, state["test_features"], data.test.y, self.params, seed)
        return Reply(data.client_id, {}, metrics, num_examples=len(data.test)), state
