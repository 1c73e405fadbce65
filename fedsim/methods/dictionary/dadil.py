"""DaDiL, centralized: the upper bound that FedDaDiL is compared with (FedDaDiL paper, Fig. 2a).

Montesuma, Mboula, Souloumiac, ECAI 2023, Alg. 2, with the authors' centralized recipe (PyDiL's
``LabeledEmpiricalDictionary.fit`` and ``parse_args_dadil``): one process sees every domain and minimizes
sum_l W_c(Q_l, B(alpha_l; P)) (Eq. 9) over the atoms and all barycentric coordinates. The atoms are one trainable
tensor (K, n, d) (and their label logits another); at each step every domain l draws its own mini-batch of its
data (class-balanced for a source) and its own class-balanced mini-batch of every atom's rows, computes its loss,
the losses are summed and one Adam step (lr 0.1 on features, label logits and alpha) moves every row the optimizer
moves (Adam's moments move rows no domain sampled in this step, as in the code). A round is E epochs of n // n_b
steps; the code's 40 iterations are the default's 40 rounds of one epoch (``config_defaults``). The optimizer
state persists across rounds in the server state (the code keeps one optimizer for the whole fit).

To keep the comparison exact, it runs on the same simulator: in the first
dictionary round every client uploads its (standardized, encoded) training
features, and its labels if it is a source, to the server. Raw data crossing
the wire is the point of this baseline (and is counted in ``bytes_received``);
the target's labels are never uploaded. The barycentric coordinates of every
domain live in the server state and travel to each client with the evaluation.
Everything else (atom initialization, encoder stage, DaDiL-R / DaDiL-E evaluation and their selection scores) is
FedDaDiL's, through the same family pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import ServerState, client_operation
from fedsim.methods.dictionary import learning as dil
from fedsim.methods.dictionary import sampling
from fedsim.methods.dictionary.base import DictionaryMethod
from fedsim.methods.dictionary.predictors import EVAL_EVERY, with_client_seconds
from fedsim.privacy.exchanges import pooled_refusal
from fedsim.registry import METHODS


@dataclass(frozen=True)
class EvaluationValues:
    """The values of a dictionary round's ``evaluate``: the barycentric coordinates alpha_l the server learned for
    the client's domain (Eq. 9), K floats. The encoder stage's evaluation (FedAvg's) sends none."""

    alpha: Optional[tuple[float, ...]] = None

    @classmethod
    def read(cls, values: Mapping[str, Any]) -> "EvaluationValues":
        alpha = values.get("alpha")
        return cls(None if alpha is None else tuple(float(a) for a in alpha))

    def sent(self) -> dict[str, list[float]]:
        """As ``ctx.call`` sends them."""
        return {} if self.alpha is None else {"alpha": list(self.alpha)}

    def alpha_tensor(self) -> Optional[torch.Tensor]:
        return None if self.alpha is None else torch.tensor(self.alpha, dtype=torch.float32)


@METHODS.register("dadil")
class DaDiL(DictionaryMethod):
    """DaDiL centralized (Montesuma et al. 2023): the server learns the dictionary on every domain's features."""

    Params = dil.CentralizedDictionaryParams
    centralized = True  # replies carry client data on purpose: the contract tests know this
    privacy_refusal = pooled_refusal("'upload' stage", "training rows (or their encoded features)")
    # parse_args_dadil: n_iter 40 (one epoch of n // n_b steps each), n_b = 200, K = 5 (DictionaryParams)
    config_defaults = {
        "run": {"rounds": 40, "eval_every": EVAL_EVERY},
        "method": {"batch_size": 200, "local_epochs": 1},
    }

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        atoms = dil.initial_dictionary(
            self.params, self.num_atoms, self.encoder.feature_dim, self.federation.num_classes, self.config.run.seed
        )
        alphas = {cid: np.full(self.num_atoms, 1.0 / self.num_atoms, np.float32) for cid in self.federation.client_ids}
        return {**atoms, **self.encoder.init_server(), "alphas": alphas}

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        if self.encoder.is_encoder_round(ctx.round):
            return self.encoder.run_round(ctx, state)
        if "pool" not in state:
            replies = ctx.call("upload", self.encoder.feature_payload(ctx, state), self.federation.client_ids)
            state = {**state, "pool": {cid: (r.tensors["x"], r.tensors.get("y")) for cid, r in replies.items()}}
        atoms_x = torch.tensor(state["atoms_x"], requires_grad=True)
        atoms_logits = torch.tensor(state["atoms_logits"], requires_grad=True)
        alphas = {cid: torch.tensor(a, requires_grad=True) for cid, a in state["alphas"].items()}
        momentum = self.client_settings(ctx.round).momentum
        optimizer = dil.make_optimizer(self.params, momentum, [atoms_x, atoms_logits], list(alphas.values()))
        if "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
        losses = self.train_dictionary(ctx, state["pool"], atoms_x, atoms_logits, alphas, optimizer)
        state = {
            **state,
            "atoms_x": atoms_x.detach().numpy(),
            "atoms_logits": atoms_logits.detach().numpy(),
            "alphas": {cid: a.detach().numpy().copy() for cid, a in alphas.items()},
            "optimizer": optimizer.state_dict(),
        }
        return state, {"stage": "dictionary", "dil_loss": {str(c): float(np.mean(v)) for c, v in losses.items()}}

    def train_dictionary(
        self, ctx, pool: dict, atoms_x, atoms_logits, alphas: dict, optimizer
    ) -> dict[int, list[float]]:
        """E epochs of n // n_b steps (Alg. 2). Each step, every domain draws its own data mini-batch and its
        own class-balanced atom mini-batch; one step on the summed loss, every alpha_l projected on the simplex.
        Returns the last epoch's losses."""
        p, settings = self.params, self.client_settings(ctx.round)
        batch_size, classes = settings.batch_size, self.federation.num_classes
        data = {}
        for cid, (x, y) in pool.items():
            generator = torch.Generator().manual_seed(ctx.seed(cid, "dil"))
            labels = None if y is None else torch.tensor(np.asarray(y))
            data[cid] = (torch.tensor(np.asarray(x)), labels, dil.one_hot_labels(y, classes), generator)
        losses: dict[int, list[float]] = {}
        steps = max(p.samples_per_atom // batch_size, 1)
        for _ in range(settings.local_epochs):
            losses = {cid: [] for cid in data}
            for _ in range(steps):
                total = 0.0
                for cid, (x, labels, onehot, generator) in data.items():
                    idx = sampling.balanced_atom_rows(atoms_logits.detach(), batch_size, generator, replace=False)
                    rows = sampling.domain_rows(labels, len(x), classes, batch_size, generator)
                    loss = dil.dil_loss(
                        *dil.gather_atoms(atoms_x, atoms_logits, idx),
                        alphas[cid],
                        x[rows],
                        None if onehot is None else onehot[rows],
                        p,
                        generator,
                    )
                    total = total + loss
                    losses[cid].append(float(loss.detach()))
                dil.dil_step(optimizer, total, [atoms_x, atoms_logits], list(alphas.values()))
        return losses

    def evaluate_round(self, ctx, state: ServerState) -> dict:
        if self.encoder.is_encoder_round(ctx.round):
            return self.encoder.evaluate_round(ctx, state)
        alphas = state["alphas"]

        def values(cid: int) -> dict:
            return EvaluationValues(tuple(float(a) for a in alphas[cid])).sent()

        tensors = self.selection_payload(ctx, dil.atom_tensors(state), values)
        replies = ctx.call("evaluate", tensors, self.federation.client_ids, values)
        return with_client_seconds(self.summarize_evaluation(ctx.round, replies), replies, "predictor_seconds")

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
        """DaDiL-R and DaDiL-E with the alpha the server learned for this client's domain
        (:meth:`DictionaryMethod.evaluate_dictionary`)."""
        alpha = EvaluationValues.read(instruction.values).alpha_tensor()
        return self.evaluate_dictionary(instruction, state, data, alpha)
