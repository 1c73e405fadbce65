"""FedDaDiL: federated dataset dictionary learning in Wasserstein space.

Castellon, Montesuma et al., "Federated Dataset Dictionary Learning for
Multi-Source Domain Adaptation", ICASSP 2024 (Alg. 1), on top of DaDiL
(Montesuma et al., ECAI 2023); the round follows the authors' federated code (``DaDiLServer.federated_fit``,
``DaDiLClient.update_joint``). The server holds K atoms (labeled empirical distributions of n rows). Each round:

1. the server draws one class-balanced mini-batch of n_b rows from each atom (n_b // C rows of each class by
   the atoms' hard labels, with replacement) and sends those rows (features and label logits) to every sampled
   client ("the server communicates a mini-batch from atoms to each client");
2. each client (labeled sources and the unlabeled target) clones them, builds a fresh optimizer (SGD with
   momentum over the rows and its private barycentric coordinates alpha) and makes E x (n // n_b) steps, each on a
   fresh mini-batch of its own data (class-balanced for a source), reducing W_c(client batch, B(alpha; rows))
   (DaDiL Eq. 9) and projecting alpha on the simplex; it returns its version of the rows, never alpha;
3. the server aggregates the versions (one drawn at random by default: the paper's rule) and writes the result
   back into those rows only.

``method.exchange=full`` sends the whole dictionary instead (the code's ``federated_full_fit``);
``method.aggregation`` picks ``random``, ``avg`` or ``wbary`` (``DictionaryParams``). Per round the metrics hold
``dil_loss`` and ``client_drift`` per client, and their summaries ``atom_drift`` (mean drift of the versions from
the round's starting rows) and ``atom_dispersion`` (mean pairwise distance between the versions).

On raw-input benchmarks (images), and on vectors when ``encoder_rounds`` is positive, the first ``encoder_rounds``
rounds train an encoder with FedAvg on the sources, frozen afterwards
(:class:`~fedsim.methods.dictionary.base.EncoderStage`). Evaluation: DaDiL-R (a net trained on the
reconstruction B(alpha; atoms)) is ``target_accuracy``; DaDiL-E (per-atom nets weighted by alpha) is
``target_accuracy_E``. Each client evaluates with its own alpha; the selection scores of the two predictors are
``score_<name>`` and ``score_<name>_E`` (their features, for iwv/dev: their logits).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.messages import Instruction, Reply
from fedsim.methods.base import ServerState, client_operation
from fedsim.methods.dictionary import learning as dil
from fedsim.methods.dictionary import sampling
from fedsim.methods.dictionary.base import DictionaryMethod
from fedsim.methods.dictionary.feddadil.aggregation import aggregate_versions
from fedsim.methods.dictionary.feddadil.exchanges import feddadil_exchanges
from fedsim.methods.dictionary.predictors import EVAL_EVERY, with_client_seconds
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed


@METHODS.register("feddadil")
class FedDaDiL(DictionaryMethod):
    """FedDaDiL (Castellon, Montesuma et al. 2024): a shared dictionary of labeled atoms, alpha stays private."""

    Params = dil.DictionaryParams
    privacy_exchanges = staticmethod(feddadil_exchanges)  # the encoder stage's fits, then the atoms' rows
    # the authors' parse_args_fed_dadil: 50 rounds (n_iter), n_b = 200 (batch_size), E = 5 (n_client_it), momentum 0.9;
    # an evaluation every EVAL_EVERY rounds (and after the last): fedsim's cadence, see dictionary_predictors
    config_defaults = {
        "run": {"rounds": 50, "eval_every": EVAL_EVERY},
        "method": {"batch_size": 200, "local_epochs": 5, "momentum": 0.9},
    }

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        atoms = dil.initial_dictionary(
            self.params, self.num_atoms, self.encoder.feature_dim, self.federation.num_classes, self.config.run.seed
        )
        return {**atoms, **self.encoder.init_server()}

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        if self.encoder.is_encoder_round(ctx.round):
            return self.encoder.run_round(ctx, state)
        start, rows = self.atom_batch(ctx.round, state)
        payload = {**start, **self.encoder.feature_payload(ctx, state)}
        # the first dictionary round reaches every client (encoder weights, standardization); then a sample
        working = (
            self.federation.client_ids
            if "weights" in payload
            else self.sample_clients(ctx.round, self.federation.client_ids)
        )
        replies = ctx.call("dil", payload, working)
        versions = {cid: (r.tensors["atoms_x"], r.tensors["atoms_logits"]) for cid, r in replies.items()}
        origin = (start["atoms_x"], start["atoms_logits"])
        metrics = {
            "stage": "dictionary",
            "dil_loss": {str(cid): r.metrics["dil_loss"] for cid, r in replies.items()},
            "ot_seconds": {str(cid): r.metrics["ot_seconds"] for cid, r in replies.items()},
            "client_drift": dil.client_drift(versions, origin, self.params),
            "atom_drift": dil.atom_drift(list(versions.values()), origin, self.params),
            "atom_dispersion": dil.atom_dispersion(list(versions.values()), self.params),
        }
        seed = derive_seed(self.config.run.seed, ctx.round, "aggregate")
        new_x, new_logits = aggregate_versions(self.params, list(versions.values()), seed)
        atoms_x, atoms_logits = state["atoms_x"].copy(), state["atoms_logits"].copy()
        where = slice(None) if rows is None else (np.arange(len(atoms_x))[:, None], rows)
        atoms_x[where], atoms_logits[where] = new_x, new_logits  # written back into the batch rows only
        return {**state, "atoms_x": atoms_x, "atoms_logits": atoms_logits}, metrics

    def atom_batch(self, rnd: int, state: ServerState):
        """The rows this round exchanges and their indices (K, C * (n_b // C)); the whole dictionary and None with
        the ``full`` exchange."""
        if self.params.exchange == "full":
            return dil.atom_tensors(state), None
        generator = torch.Generator().manual_seed(derive_seed(self.config.run.seed, rnd, "atom-batch"))
        batch_size = self.client_settings(rnd).batch_size  # n_b, as the round's instructions carry it
        rows = sampling.balanced_atom_rows(state["atoms_logits"], batch_size, generator, True)
        rows = rows.numpy()
        where = (np.arange(len(rows))[:, None], rows)
        return {"atoms_x": state["atoms_x"][where], "atoms_logits": state["atoms_logits"][where]}, rows

    def evaluate_round(self, ctx, state: ServerState) -> dict:
        if self.encoder.is_encoder_round(ctx.round):
            return self.encoder.evaluate_round(ctx, state)
        tensors = self.selection_payload(ctx, dil.atom_tensors(state))
        replies = ctx.call("evaluate", tensors, self.federation.client_ids)
        return with_client_seconds(self.summarize_evaluation(ctx.round, replies), replies, "predictor_seconds")

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        state = self.encoder.init_client(data)
        state["alpha"] = torch.full((self.num_atoms,), 1.0 / self.num_atoms)  # private: never in a Reply
        return state

    @client_operation
    def dil(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """E x (n // n_b) steps on the client's clone of the rows it received and on its alpha (Alg. 2)."""
        p, settings = self.params, instruction.local
        self.encoder.prepare(state, data, instruction.tensors)
        atoms_x, atoms_logits = dil.trainable_atoms(instruction.tensors["atoms_x"], instruction.tensors["atoms_logits"])
        alpha = state["alpha"].clone().requires_grad_(True)
        # a fresh optimizer every round, as DaDiLClient.update_joint builds one per call
        optimizer = dil.make_optimizer(p, settings.momentum, [atoms_x, atoms_logits], [alpha])
        generator = torch.Generator().manual_seed(instruction.seed)
        atoms = (atoms_x, atoms_logits)
        losses, ot_seconds = self.local_steps(
            settings, state["train_features"], data, atoms, alpha, optimizer, generator
        )
        state["alpha"] = alpha.detach().clone()
        tensors = {"atoms_x": atoms_x.detach().numpy(), "atoms_logits": atoms_logits.detach().numpy()}
        loss = float(np.mean(losses)) if losses else float("nan")
        metrics = {"dil_loss": loss, "ot_seconds": ot_seconds}
        return Reply(data.client_id, tensors, metrics, len(state["train_features"])), state

    def local_steps(
        self, settings, train_x, data: ClientData, atoms, alpha, optimizer, generator
    ) -> tuple[list, float]:
        """E epochs of n // n_b steps; returns the last epoch's losses and the seconds spent computing the losses
        (``ot_seconds``: the barycenters' fixed-point iterations and the transport to the client's batch, the
        costs included; the backward pass and the step left out). ``minibatch``: every step uses all the rows
        received; ``full``: each epoch sweeps the atoms in n // n_b mini-batches (every atom its own permutation)."""
        p, (atoms_x, atoms_logits) = self.params, atoms
        batch_size, classes = settings.batch_size, data.num_classes
        labels = None if data.train.y is None else torch.from_numpy(data.train.y)
        onehot = dil.one_hot_labels(data.train.y, classes)
        steps = max(p.samples_per_atom // batch_size, 1)
        losses: list[float] = []
        ot_seconds = 0.0
        for _ in range(settings.local_epochs):
            losses = []
            full = p.exchange == "full"
            batches = dil.atom_minibatches(self.num_atoms, p.samples_per_atom, batch_size, generator) if full else None
            for step in range(steps):
                rows_x, rows_logits = (
                    dil.gather_atoms(atoms_x, atoms_logits, batches[step]) if full else (atoms_x, atoms_logits)
                )
                rows = sampling.domain_rows(labels, len(train_x), classes, batch_size, generator)
                y = None if onehot is None else onehot[rows]
                started = time.perf_counter()
                loss = dil.dil_loss(rows_x, rows_logits, alpha, train_x[rows], y, p, generator)
                ot_seconds += time.perf_counter() - started
                dil.dil_step(optimizer, loss, [atoms_x, atoms_logits], [alpha])
                losses.append(float(loss.detach()))
        return losses, ot_seconds

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """DaDiL-R and DaDiL-E with the client's own alpha (:meth:`DictionaryMethod.evaluate_dictionary`)."""
        return self.evaluate_dictionary(instruction, state, data, state.get("alpha"))
