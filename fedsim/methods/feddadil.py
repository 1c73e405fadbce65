"""FedDaDiL: federated dataset dictionary learning in Wasserstein space.

Castellon, Montesuma et al., "Federated Dataset Dictionary Learning for
Multi-Source Domain Adaptation", ICASSP 2024 (Alg. 1), on top of DaDiL
(Montesuma et al., ECAI 2023). The server holds K atoms (labeled empirical
distributions of n rows) and sends the whole dictionary to every sampled client;
each client (labeled sources and the unlabeled target) clones it and makes E
local iterations, each one pass over the atoms in n // n_b mini-batches (every
atom's rows from its own permutation), with one optimizer step per mini-batch on
its copy of the atoms and on its private barycentric coordinates alpha (projected
on the simplex) to reduce W_c(client batch, B(alpha; atoms)) (DaDiL Eq. 9). The
client's optimizer state persists across rounds, as in the authors' PyDiL client.
Clients return their atom versions only; alpha never leaves the client. The
server keeps one client's version drawn at random (``aggregation=random``) or
their mean (``avg``); docs/feddadil.md gives the default and its measured reason.

On raw-input benchmarks (images) the first ``encoder_rounds`` rounds train an
encoder with FedAvg on the sources (:class:`~fedsim.methods.families.dictionary.EncoderStage`);
the dictionary is then learned on encoded features standardized with
statistics combined from client sums.

Evaluation: DaDiL-R (a classifier trained on the reconstruction
B(alpha; atoms)) is ``target_accuracy``; DaDiL-E (per-atom classifiers weighted
by alpha) is ``target_accuracy_E``. Each client evaluates with its own alpha.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import ServerState, client_operation
from fedsim.methods.common import dictionary as dil
from fedsim.methods.common.settings import LocalSettings
from fedsim.methods.families.dictionary import DictionaryMethod
from fedsim.registry import METHODS
from fedsim.seeding import numpy_rng


@METHODS.register("feddadil")
class FedDaDiL(DictionaryMethod):
    """FedDaDiL (Castellon, Montesuma et al. 2024): a shared dictionary of labeled atoms, alpha stays private."""

    Params = dil.DictionaryParams

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        atoms = dil.initial_dictionary(
            self.params, self.num_atoms, self.encoder.feature_dim, self.federation.num_classes, self.config.run.seed
        )
        return {**atoms, **self.encoder.init_server()}

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        if self.encoder.is_encoder_round(ctx.round):
            return self.encoder.run_round(ctx, state)
        payload = {**dil.atom_tensors(state), **self.encoder.feature_payload(ctx, state)}
        # the first dictionary round reaches every client (encoder weights, standardization); then a sample
        working = (
            self.federation.client_ids
            if "weights" in payload
            else self.sample_clients(ctx.round, self.federation.client_ids)
        )
        replies = ctx.call("dil", payload, working, self.client_settings(ctx.round))
        versions = [(r.tensors["atoms_x"], r.tensors["atoms_logits"]) for r in replies.values()]
        metrics = {
            "stage": "dictionary",
            "dil_loss": {str(cid): r.metrics["dil_loss"] for cid, r in replies.items()},
            "atom_drift": dil.atom_drift(versions, (state["atoms_x"], state["atoms_logits"]), self.params),
            "atom_dispersion": dil.atom_dispersion(versions, self.params),
        }
        atoms_x, atoms_logits = self.aggregate_atoms(ctx.round, versions)
        return {**state, "atoms_x": np.asarray(atoms_x), "atoms_logits": np.asarray(atoms_logits)}, metrics

    def aggregate_atoms(self, rnd: int, versions):
        """The paper's rule: one client's version drawn at random; or the mean of the versions."""
        if self.params.aggregation == "avg":
            return np.mean([v[0] for v in versions], axis=0), np.mean([v[1] for v in versions], axis=0)
        chosen = int(numpy_rng(self.config.run.seed, rnd, "aggregate").integers(len(versions)))
        return versions[chosen]

    def evaluate_round(self, ctx, state: ServerState) -> dict:
        if self.encoder.is_encoder_round(ctx.round):
            return self.encoder.evaluate_round(ctx, state)
        replies = ctx.call("evaluate", dil.atom_tensors(state), self.federation.client_ids)
        return self.summarize_evaluation(ctx.round, replies)

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        state = self.encoder.init_client(data)
        state["alpha"] = torch.full((self.num_atoms,), 1.0 / self.num_atoms)  # private: never in a Reply
        return state

    @client_operation
    def dil(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """E local iterations on the client's copy of the atoms and on its alpha (Alg. 1, ClientUpdate)."""
        p, settings = self.params, LocalSettings.from_config(instruction.config, self.config.method)
        batch_size = settings.batch_size
        self.encoder.prepare(state, data, instruction.tensors)
        train_x = state["train_features"]
        atoms_x, atoms_logits = dil.trainable_atoms(instruction.tensors["atoms_x"], instruction.tensors["atoms_logits"])
        alpha = state["alpha"].clone().requires_grad_(True)
        optimizer = dil.make_optimizer(p, settings.momentum, [atoms_x, atoms_logits], [alpha])
        if "optimizer" in state:  # PyDiL's client keeps one optimizer (and its momentum) across rounds
            optimizer.load_state_dict(state["optimizer"])
        labels = dil.one_hot_labels(data.train.y, data.num_classes)
        generator = torch.Generator().manual_seed(instruction.config["seed"])
        losses: list[float] = []
        for _ in range(settings.local_epochs):
            losses = []
            for idx in dil.atom_minibatches(self.num_atoms, p.samples_per_atom, batch_size, generator):
                rows = dil.data_minibatch(len(train_x), batch_size, generator)
                loss = dil.dil_loss(
                    *dil.gather_atoms(atoms_x, atoms_logits, idx),
                    alpha,
                    train_x[rows],
                    None if labels is None else labels[rows],
                    p,
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                dil.project_alpha(alpha)
                losses.append(float(loss.detach()))
        state["alpha"], state["optimizer"] = alpha.detach().clone(), optimizer.state_dict()
        tensors = {"atoms_x": atoms_x.detach().numpy(), "atoms_logits": atoms_logits.detach().numpy()}
        return Reply(
            data.client_id, tensors, {"dil_loss": float(np.mean(losses)) if losses else float("nan")}, len(train_x)
        ), state

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """DaDiL-R and DaDiL-E with the client's own alpha (FedAvg's evaluation during the encoder stage)."""
        if "atoms_x" not in instruction.tensors:
            return self.encoder.evaluate(instruction, state, data)
        self.encoder.prepare(state, data, instruction.tensors)
        alpha, seed = state["alpha"], instruction.config["seed"]
        metrics = dil.evaluate_predictors(
            instruction.tensors, alpha, state["test_features"], data.test.y, self.params, seed
        )
        return Reply(data.client_id, {}, metrics, num_examples=len(data.test)), state
