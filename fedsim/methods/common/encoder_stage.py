"""The feature space a dataset dictionary is learned in (FedDaDiL, DaDiL): the inputs, or a FedAvg encoder.

On vector benchmarks (TEP, Office-Caltech features) the dictionary lives on the inputs themselves. On
raw-input benchmarks (images) the first ``encoder_rounds`` rounds are FedAvg rounds (McMahan et al. 2017,
Alg. 1; a :class:`~fedsim.methods.fedavg.FedAvg` object does them) that train an encoder on the
sources. In the first dictionary round every client sends the sums of its encoded training features
(count, sum, sum of squares: no rows), the server combines them into one mean and standard deviation
(:mod:`fedsim.data.normalization`), and every client encodes and standardizes its data once.

The server half lives in :class:`EncoderStage`; the hosting method declares the client operations
(``fit``, ``evaluate``, ``feature_stats``) and passes them on.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.data.normalization import FeatureStats, combine_stats, feature_stats, mean_std
from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply, Tensors
from fedsim.methods.base import Method, ServerState, client_operation
from fedsim.methods.common.dictionary import atom_tensors, check_batch_size, num_atoms
from fedsim.methods.common.training import encode_in_chunks, load_numpy
from fedsim.methods.fedavg import FedAvg

logger = logging.getLogger(__name__)

#: encoder rounds when ``method.encoder_rounds`` is -1 (automatic) and the inputs are images
DEFAULT_IMAGE_ENCODER_ROUNDS = 5


def uses_encoder(federation) -> bool:
    return len(federation.input_shape) != 1


def encoder_rounds(requested: int, federation) -> int:
    """``requested`` rounds, or the default when it is -1: none for vectors, 5 for images."""
    if requested >= 0:
        return requested
    return DEFAULT_IMAGE_ENCODER_ROUNDS if uses_encoder(federation) else 0


class EncoderStage:
    """The encoder rounds and the standardized encoded features of every client."""

    def __init__(self, config, federation, device: torch.device, requested_rounds: int):
        self.federation = federation
        self.device = device
        self.uses_encoder = uses_encoder(federation)
        self.rounds = encoder_rounds(requested_rounds, federation)
        self.feature_dim = config.model.hidden if self.uses_encoder else federation.input_shape[0]
        self.fedavg = FedAvg(config, federation, str(device)) if self.uses_encoder else None

    @staticmethod
    def check_setting(requested_rounds: int, federation, total_rounds: int) -> None:
        """Images need at least one encoder round; vectors have no encoder; a run whose rounds are all encoder
        rounds never learns a dictionary (warned: its accuracy is FedAvg's)."""
        if not uses_encoder(federation):
            if requested_rounds > 0:
                raise UserError(
                    f"method.encoder_rounds={requested_rounds}, but vector inputs have no encoder: leave it at -1 or 0"
                )
            return
        rounds = encoder_rounds(requested_rounds, federation)
        if rounds == 0:
            raise UserError(
                "a dataset dictionary on image inputs needs an encoder: set method.encoder_rounds to 1 or more"
            )
        if rounds >= total_rounds:
            logger.warning(
                "method.encoder_rounds (%d) >= run.rounds (%d): every round trains the encoder, no dictionary "
                "is learned and the reported accuracy is FedAvg's",
                rounds,
                total_rounds,
            )

    def is_encoder_round(self, rnd: int) -> bool:
        return rnd <= self.rounds

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        return self.fedavg.init_server() if self.uses_encoder else {}

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """One FedAvg round on the sources (clients ``fit``)."""
        state, metrics = self.fedavg.run_round(ctx, state)
        return state, {**metrics, "stage": "encoder"}

    def evaluate_round(self, ctx, state: ServerState) -> dict:
        """FedAvg's evaluation of the encoder-and-head classifier (clients ``evaluate`` the weights)."""
        return self.fedavg.evaluate_round(ctx, state)

    def feature_payload(self, ctx, state: ServerState) -> Tensors:
        """In the first dictionary round: the encoder weights and the shared standardization (clients
        ``feature_stats``); nothing otherwise."""
        if not self.uses_encoder or ctx.round != self.rounds + 1:
            return {}
        replies = ctx.call("feature_stats", state["weights"], self.federation.client_ids)
        mean, std = mean_std(combine_stats(FeatureStats.from_tensors(r.tensors) for r in replies.values()))
        return {
            "weights": state["weights"],
            "feature_mean": mean.astype(np.float32),
            "feature_std": std.astype(np.float32),
        }

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> dict:
        return self.fedavg.init_client(data) if self.uses_encoder else {}

    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        return self.fedavg.fit(instruction, state, data)

    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        return self.fedavg.evaluate(instruction, state, data)

    @torch.no_grad()
    def encode(self, model: torch.nn.Module, x: np.ndarray) -> torch.Tensor:
        return encode_in_chunks(model.eval().features, x, self.device)

    def feature_stats(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Sums of the encoded training features (count, sum, sum of squares): aggregate statistics only."""
        load_numpy(state["model"], instruction.tensors)
        stats = feature_stats(self.encode(state["model"], data.train.x).numpy())
        return Reply(data.client_id, stats.to_tensors(), {}, num_examples=len(data.train)), state

    def prepare(self, state: Any, data: ClientData, tensors: Tensors) -> None:
        """Encode and standardize the client's splits once (``train_features``, ``test_features`` in its state):
        when the encoder and the standardization arrive (first dictionary round), or on first use."""
        if "weights" in tensors:
            load_numpy(state["model"], tensors["weights"])
            state["feature_mean"] = torch.tensor(np.asarray(tensors["feature_mean"]))
            state["feature_std"] = torch.tensor(np.asarray(tensors["feature_std"]))
            state.pop("test_features", None)
        if "test_features" not in state:
            state["train_features"] = self.standardized(state, data.train.x)
            state["test_features"] = self.standardized(state, data.test.x)

    def standardized(self, state: Any, x: np.ndarray) -> torch.Tensor:
        if not self.uses_encoder:
            return torch.from_numpy(x).float()
        # (x - mean) / std in float32, as every FedDaDiL result so far: normalization.standardize computes in
        # float64 and rounds once, which moves the DiL losses in the 7th digit
        return (self.encode(state["model"], x) - state["feature_mean"]) / state["feature_std"]


class DictionaryMethod(Method):
    """What FedDaDiL and DaDiL share as an interface: an :class:`EncoderStage` in ``self.encoder`` whose
    client operations they expose, and the dictionary (atoms, plus the encoder's weights) as the global tensors."""

    encoder: EncoderStage

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.num_atoms = num_atoms(self.params, len(federation.domains))
        self.encoder = EncoderStage(config, federation, self.device, self.params.encoder_rounds)

    @classmethod
    def check_setting(cls, config, federation) -> None:
        check_batch_size(config.method.params, config.method.batch_size)
        EncoderStage.check_setting(config.method.params.encoder_rounds, federation, config.run.rounds)

    def global_tensors(self, state: ServerState) -> dict:
        return {**atom_tensors(state), **state.get("weights", {})}

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Encoder stage: FedAvg's local training."""
        return self.encoder.fit(instruction, state, data)

    @client_operation
    def feature_stats(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Encoder stage: the sums that standardize the encoded features."""
        return self.encoder.feature_stats(instruction, state, data)
