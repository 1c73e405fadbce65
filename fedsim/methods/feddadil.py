"""FedDaDiL: federated dataset dictionary learning in Wasserstein space.

Castellon, Montesuma et al., "Federated Dataset Dictionary Learning for
Multi-Source Domain Adaptation", ICASSP 2024 (Alg. 1), on top of DaDiL
(Montesuma et al., ECAI 2023). The server holds K atoms (labeled empirical
distributions). Each round it sends one mini-batch of the atoms to every
client; each client (labeled sources and the unlabeled target) clones it and,
for E local epochs, takes Adam steps on its copy of the atoms and on its
private barycentric coordinates alpha (projected on the simplex) to reduce
W_c(client batch, B(alpha; atoms)). Clients return their atom versions only;
alpha never leaves the client. The server keeps one client's version drawn
at random (the paper's rule) or the average.

On raw-input benchmarks (images) the first ``encoder_rounds`` rounds train an
encoder with FedAvg on the sources; the dictionary is then learned on encoded
features standardized with statistics combined from client sums.

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
from fedsim.methods import _dadil as dil
from fedsim.methods.base import ServerState
from fedsim.methods.fedavg import FedAvg
from fedsim.methods.common.training import load_numpy
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed, numpy_rng


@METHODS.register("feddadil")
class FedDaDiL(FedAvg):
    Params = dil.DictionaryParams
    operations = ("fit", "evaluate", "dil", "feature_stats")

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        dil.validate_params(self.params, config.method.batch_size)
        self.num_atoms = dil.num_atoms(self.params, len(federation.domains))
        self.uses_encoder = len(federation.input_shape) != 1
        rounds = self.params.encoder_rounds
        self.encoder_rounds = rounds if rounds >= 0 else (5 if self.uses_encoder else 0)
        if self.uses_encoder and self.encoder_rounds == 0:
            from fedsim.errors import UserError

            raise UserError("feddadil on image inputs needs an encoder: set method.encoder_rounds to 1 or more")
        self.feature_dim = config.model.hidden if self.uses_encoder else federation.input_shape[0]

    def is_dictionary_round(self, rnd: int) -> bool:
        return rnd > self.encoder_rounds

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        p = self.params
        atoms_x, atoms_logits = dil.init_atoms(
            self.num_atoms, p.samples_per_atom, self.feature_dim, self.federation.num_classes, derive_seed(self.config.run.seed, "atoms")
        )
        state = {"atoms_x": atoms_x, "atoms_logits": atoms_logits}
        if self.uses_encoder:
            state.update(super().init_server())
        return state

    def first_dictionary_payload(self, rnd: int, state: ServerState, executor) -> dict:
        """Encoder weights plus the shared feature standardization (from client sums) for the first dictionary round."""
        if not self.uses_encoder or rnd != self.encoder_rounds + 1:
            return {}
        stats_request = Instruction("feature_stats", state["weights"], {"round": rnd})
        replies = executor.run({cid: stats_request for cid in self.federation.client_ids})
        count = sum(float(r.tensors["count"]) for r in replies.values())
        total = sum(r.tensors["sum"].astype(np.float64) for r in replies.values())
        squares = sum(r.tensors["sum_sq"].astype(np.float64) for r in replies.values())
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - mean**2, 1e-12))
        return {"weights": state["weights"], "feature_mean": mean.astype(np.float32), "feature_std": std.astype(np.float32)}

    def atom_batch(self, rnd: int) -> np.ndarray:
        p = self.params
        return np.sort(numpy_rng(self.config.run.seed, rnd, "atom-batch").choice(p.samples_per_atom, self.config.method.batch_size, replace=False))

    def run_round(self, rnd: int, state: ServerState, executor) -> tuple[ServerState, dict]:
        if not self.is_dictionary_round(rnd):
            state, metrics = super().run_round(rnd, state, executor)
            return state, {**metrics, "stage": "encoder"}
        idx = self.atom_batch(rnd)
        payload = {"atoms_x": state["atoms_x"][:, idx], "atoms_logits": state["atoms_logits"][:, idx]}
        payload.update(self.first_dictionary_payload(rnd, state, executor))
        # the first dictionary round reaches every client (encoder weights, standardization); then a sample
        working = self.federation.client_ids if "weights" in payload else self.sample_clients(rnd, self.federation.client_ids)
        instructions = {cid: Instruction("dil", payload, {"seed": self.client_seed(rnd, cid, "dil"), "round": rnd}) for cid in working}
        replies = executor.run(instructions)
        versions = [(r.tensors["atoms_x"], r.tensors["atoms_logits"]) for r in replies.values()]
        new_x, new_logits = self.aggregate_atoms(rnd, versions)
        atoms_x, atoms_logits = state["atoms_x"].copy(), state["atoms_logits"].copy()
        atoms_x[:, idx], atoms_logits[:, idx] = new_x, new_logits
        metrics = {
            "stage": "dictionary",
            "dil_loss": {str(cid): r.metrics["dil_loss"] for cid, r in replies.items()},
            "atom_drift": dil.atom_drift(versions, self.params),
        }
        return {**state, "atoms_x": atoms_x, "atoms_logits": atoms_logits}, metrics

    def aggregate_atoms(self, rnd: int, versions):
        if self.params.aggregation == "avg":
            return np.mean([v[0] for v in versions], axis=0), np.mean([v[1] for v in versions], axis=0)
        chosen = int(numpy_rng(self.config.run.seed, rnd, "aggregate").integers(len(versions)))
        return versions[chosen]

    def configure_evaluate(self, rnd: int, state: ServerState) -> dict[int, Instruction]:
        if not self.is_dictionary_round(rnd):
            return super().configure_evaluate(rnd, state)
        payload = {"atoms_x": state["atoms_x"], "atoms_logits": state["atoms_logits"]}
        return {cid: Instruction("evaluate", payload, self.evaluate_config(rnd, cid)) for cid in self.federation.client_ids}

    def evaluate_config(self, rnd: int, cid: int) -> dict:
        return {"round": rnd, "seed": self.client_seed(rnd, cid, "evaluate")}

    def global_tensors(self, state: ServerState) -> dict:
        return {"atoms_x": state["atoms_x"], "atoms_logits": state["atoms_logits"], **state.get("weights", {})}

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        state = super().init_client(data) if self.uses_encoder else {}
        state["alpha"] = torch.full((self.num_atoms,), 1.0 / self.num_atoms)  # private: never in a Reply
        return state

    @torch.no_grad()
    def encode(self, state: Any, x: np.ndarray) -> torch.Tensor:
        if not self.uses_encoder:
            return torch.from_numpy(x)
        model = state["model"].eval()
        out = torch.cat([model.features(torch.from_numpy(x[i : i + 512])) for i in range(0, len(x), 512)])
        return (out - state["feature_mean"]) / state["feature_std"]

    def feature_stats(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Sums of encoded training features (count, sum, sum of squares): aggregate statistics only."""
        load_numpy(state["model"], instruction.tensors)
        with torch.no_grad():
            model = state["model"].eval()
            x = data.train.x
            feats = torch.cat([model.features(torch.from_numpy(x[i : i + 512])) for i in range(0, len(x), 512)]).double()
        tensors = {"count": np.array(len(x), np.float64), "sum": feats.sum(0).numpy(), "sum_sq": (feats**2).sum(0).numpy()}
        return Reply(data.client_id, tensors, {}, num_examples=len(x)), state

    def features(self, state: Any, data: ClientData, instruction: Instruction) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's train and test features, computed once after the encoder stage."""
        if "weights" in instruction.tensors:
            load_numpy(state["model"], instruction.tensors["weights"])
            state["feature_mean"] = torch.tensor(np.asarray(instruction.tensors["feature_mean"]))
            state["feature_std"] = torch.tensor(np.asarray(instruction.tensors["feature_std"]))
            state.pop("train_features", None)
        if "train_features" not in state:
            state["train_features"] = self.encode(state, data.train.x).float()
            state["test_features"] = self.encode(state, data.test.x).float()
        return state["train_features"], state["test_features"]

    def dil(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        p = self.params
        train_x, _ = self.features(state, data, instruction)
        atoms_x, atoms_logits = dil.dictionary_step_tensors(instruction.tensors["atoms_x"], instruction.tensors["atoms_logits"])
        alpha = state["alpha"].clone().requires_grad_(True)
        optimizer = torch.optim.Adam([{"params": [atoms_x, atoms_logits], "lr": p.lr_atoms}, {"params": [alpha], "lr": p.lr_alpha}])
        labels = None if data.train.y is None else torch.nn.functional.one_hot(torch.from_numpy(data.train.y), data.num_classes).float()
        generator = torch.Generator().manual_seed(instruction.config["seed"])
        losses: list[float] = []
        for _ in range(self.config.method.local_epochs):
            losses = []
            for idx in dil.batches(len(train_x), self.config.method.batch_size, generator):
                loss = dil.dil_loss(atoms_x, atoms_logits, alpha, train_x[idx], None if labels is None else labels[idx], p)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                dil.alpha_step(alpha)
                losses.append(float(loss.detach()))
        state["alpha"] = alpha.detach().clone()
        tensors = {"atoms_x": atoms_x.detach().numpy(), "atoms_logits": atoms_logits.detach().numpy()}
        return Reply(data.client_id, tensors, {"dil_loss": float(np.mean(losses)) if losses else float("nan")}, len(train_x)), state

    def client_alpha(self, instruction: Instruction, state: Any) -> torch.Tensor:
        return state["alpha"]

    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        if "atoms_x" not in instruction.tensors:
            return super().evaluate(instruction, state, data)
        _, test_x = self.features(state, data, instruction)
        atoms_x = torch.tensor(np.asarray(instruction.tensors["atoms_x"]))
        atoms_logits = torch.tensor(np.asarray(instruction.tensors["atoms_logits"]))
        alpha = self.client_alpha(instruction, state)
        seed = instruction.config["seed"] % (1 << 31)
        y = torch.from_numpy(data.test.y)
        pred_r = dil.predict_reconstruction(atoms_x, atoms_logits, alpha, test_x, self.params, seed)
        pred_e = dil.predict_ensemble(atoms_x, atoms_logits, alpha, test_x, self.params, seed)
        metrics = {"correct": float((pred_r == y).sum()), "total": float(len(y)), "correct_E": float((pred_e == y).sum())}
        return Reply(data.client_id, {}, metrics, num_examples=len(y)), state
