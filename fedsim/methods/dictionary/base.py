"""The feature space a dataset dictionary is learned in (FedDaDiL, DaDiL): the inputs, or a FedAvg encoder.

By default, on vector benchmarks (Office-Caltech features, Amazon reviews) the dictionary lives on the inputs
themselves. On raw-input benchmarks (images), and on vectors when ``encoder_rounds`` is positive (CWRU and TEP,
where the authors learn the dictionary on the features of an MLP trained on the sources), the first
``encoder_rounds`` rounds are FedAvg rounds (McMahan et al. 2017, Alg. 1, composed from
:mod:`fedsim.methods.common`) that train an encoder (the model's feature layers: ``model.hidden`` features) on the
sources; the dictionary never updates it afterwards. In the first dictionary round every client encodes its data
once, standardized as ``method.feature_standardization`` says: "sources" (the default), the source clients send the
sums of their encoded training features (count, sum, sum of squares: no rows) and the server combines them into one
mean and standard deviation per feature (:mod:`fedsim.data.normalization`) that every client applies, the target's
statistics never used; "none", the features as the encoder gives them (the authors' CWRU script, whose
standardization line is commented out); "all", the sums of every client, the target's included (an adaptation of
its own, reported as its own row).

The server half lives in :class:`EncoderStage`; :class:`DictionaryMethod`, the base of FedDaDiL and DaDiL,
declares the client operations (``fit``, ``evaluate``, ``feature_stats``) and passes them on.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import torch

from fedsim.data.base import ClientData
from fedsim.data.normalization import FeatureStats, combine_stats, feature_stats, mean_std
from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply, Tensors
from fedsim.methods.base import Method, ServerState, client_operation
from fedsim.methods.common.aggregation import federated_average
from fedsim.methods.common.classifier import GlobalClassifier
from fedsim.methods.common.selection_hooks import (
    ClassifierPredictor,
    FixedOutputs,
    model_tensors,
    selection_inputs,
    selection_reply,
)
from fedsim.methods.common.stage_cache import StageCache, StoredRound
from fedsim.methods.common.training import encode_in_chunks, load_numpy, model_to_numpy
from fedsim.methods.dictionary.learning import atom_tensors, check_batch_size, num_atoms
from fedsim.methods.dictionary.predictors import evaluate_and_apply

logger = logging.getLogger(__name__)

#: encoder rounds when ``method.encoder_rounds`` is -1 (automatic) and the inputs are images
DEFAULT_IMAGE_ENCODER_ROUNDS = 5


def has_image_inputs(federation) -> bool:
    return len(federation.input_shape) != 1


def encoder_rounds(requested: int, federation) -> int:
    """``requested`` rounds, or the default when it is -1: none for vectors, 5 for images."""
    if requested >= 0:
        return requested
    return DEFAULT_IMAGE_ENCODER_ROUNDS if has_image_inputs(federation) else 0


class EncoderStage:
    """The encoder rounds and the (standardized) encoded features of every client."""

    def __init__(self, host: Method, requested_rounds: int):
        self.host = host  # the dictionary method: its client sampling and per-round settings
        self.federation = federation = host.federation
        self.device = host.device
        self.rounds = encoder_rounds(requested_rounds, federation)
        self.uses_encoder = self.rounds > 0
        self.feature_dim = host.config.model.hidden if self.uses_encoder else federation.input_shape[0]
        self.classifier = GlobalClassifier(host.config, federation, self.device) if self.uses_encoder else None
        self.cache = (
            StageCache(host.config.run.cache_dir, "encoder", self.cache_parts(), self.rounds) if self.cached() else None
        )

    def cached(self) -> bool:
        """Whether the stage goes through ``run.cache_dir``: not with unreliable clients (their draws and clock
        are the run's own), nor with differential privacy (its noise is the run's own), nor in a run that never
        finishes the stage (it would hold the lock to its end)."""
        config = self.host.config
        private = config.privacy.active
        return bool(
            config.run.cache_dir
            and self.uses_encoder
            and not config.clients.active
            and not private
            and self.rounds < config.run.rounds
        )

    def cache_parts(self) -> dict:
        """Everything the encoder stage's result depends on: the data and model sections, the run's seed and client
        sampling, the local settings of each encoder round, the clients' resources (threads, GPUs) and the backend
        that places them (not the method: FedDaDiL and DaDiL with the same settings train the same encoder);
        :class:`StageCache` adds fedsim's source and the library versions."""
        config = self.host.config
        data = {k: v for k, v in config.to_dict()["data"].items() if k != "cache_dir"}
        return {
            "data": data,
            "model": config.to_dict()["model"],
            "seed": config.run.seed,
            "clients_per_round": config.run.clients_per_round,
            "resources": config.to_dict()["resources"],
            "client_device": "cuda" if config.resources.asks_gpus and config.run.backend == "ray" else "cpu",
            "rounds": self.rounds,
            "local": [dataclasses.asdict(self.round_settings(r)) for r in range(1, self.rounds + 1)],
        }

    def round_settings(self, rnd: int):
        """The local settings of encoder round ``rnd``: the method's, with ``encoder_epochs`` epochs when set."""
        settings = self.host.client_settings(rnd)
        if self.host.params.encoder_epochs:
            settings = dataclasses.replace(settings, local_epochs=self.host.params.encoder_epochs)
        return settings

    def close(self) -> None:
        """Let other runs waiting for this encoder go on when this run stops before the stage's end."""
        if self.cache is not None:
            self.cache.release()

    @staticmethod
    def check_setting(requested_rounds: int, federation, total_rounds: int) -> None:
        """Images need at least one encoder round; vectors need none; a run whose rounds are all encoder
        rounds never learns a dictionary (warned: its accuracy is FedAvg's)."""
        rounds = encoder_rounds(requested_rounds, federation)
        if rounds == 0 and has_image_inputs(federation):
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
        return {"weights": self.classifier.initial_weights()} if self.uses_encoder else {}

    def run_round(self, ctx, state: ServerState) -> tuple[ServerState, dict]:
        """One FedAvg round on the sampled sources (clients ``fit``), their weights averaged by sample count; the
        local epochs are ``encoder_epochs`` when set, so that studies of E share one encoder. With ``run.cache_dir``
        the round is read from the stage cache when another run computed it (``encoder_cache: hit``)."""
        if self.cache is not None:
            if ctx.round == 1:
                self.cache.begin()
            stored = self.cache.replay(ctx.round)
            if stored is not None:
                ctx.count_replayed(stored.operation, stored.sent, stored.received)
                return {**state, "weights": stored.tensors}, {
                    **stored.metrics,
                    "stage": "encoder",
                    "encoder_cache": "hit",
                }
        clients = self.host.sample_clients(ctx.round, self.federation.source_ids)
        sent, received = ctx.bytes_of("fit")
        replies = ctx.call("fit", state["weights"], clients, local=self.round_settings(ctx.round))
        weights, metrics = federated_average(replies)
        if self.cache is not None:
            now_sent, now_received = ctx.bytes_of("fit")
            self.cache.record(ctx.round, StoredRound(weights, metrics, "fit", now_sent - sent, now_received - received))
        return {**state, "weights": weights}, {**metrics, "stage": "encoder"}

    def evaluate_round(self, ctx, state: ServerState) -> dict:
        """FedAvg's evaluation of the encoder-and-head classifier (every client ``evaluate``s the weights)."""
        tensors = self.host.selection_payload(ctx, state["weights"])
        replies = ctx.call("evaluate", tensors, self.federation.client_ids)
        return self.host.summarize_evaluation(ctx.round, replies)

    def feature_payload(self, ctx, state: ServerState) -> Tensors:
        """In the first dictionary round: the encoder weights and, unless ``feature_standardization`` is "none",
        the shared standardization from the sums of the source clients ("sources") or of every client ("all")
        (clients ``feature_stats``); nothing otherwise."""
        if not self.uses_encoder or ctx.round != self.rounds + 1:
            return {}
        how = self.host.params.feature_standardization
        if how == "none":
            return {"weights": state["weights"]}
        clients = self.federation.client_ids if how == "all" else self.federation.source_ids
        replies = ctx.call("feature_stats", state["weights"], clients)
        mean, std = mean_std(combine_stats(FeatureStats.from_tensors(r.tensors) for r in replies.values()))
        return {
            "weights": state["weights"],
            "feature_mean": mean.astype(np.float32),
            "feature_std": std.astype(np.float32),
        }

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> dict:
        return {"model": self.classifier.shared()} if self.uses_encoder else {}

    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """FedAvg's local epochs of cross-entropy from the global weights (McMahan et al. 2017, Alg. 1)."""
        model, settings = state["model"], instruction.local
        loss = self.classifier.train(model, instruction.tensors, data.train, settings, instruction.seed)
        return Reply(data.client_id, model_to_numpy(model), {"train_loss": loss}, num_examples=len(data.train)), state

    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """FedAvg's evaluation, and its selection statistics (features: the encoder's, ``model.features``)."""
        metrics = self.classifier.evaluate(state["model"], model_tensors(instruction), data.test)
        reply = Reply(data.client_id, {}, metrics, num_examples=len(data.test))
        predictor = ClassifierPredictor(state["model"], self.device)
        return selection_reply(self.host.selection_scores, instruction, data, reply, {"": predictor}), state

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
            standardize = "feature_mean" in tensors
            state["feature_mean"] = torch.tensor(np.asarray(tensors["feature_mean"])) if standardize else None
            state["feature_std"] = torch.tensor(np.asarray(tensors["feature_std"])) if standardize else None
            state.pop("test_features", None)
        if "test_features" not in state:
            state["train_features"] = self.standardized(state, data.train.x)
            state["test_features"] = self.standardized(state, data.test.x)

    def standardized(self, state: Any, x: np.ndarray) -> torch.Tensor:
        if not self.uses_encoder:
            return torch.from_numpy(x).float()
        features = self.encode(state["model"], x)
        if state.get("feature_mean") is None:  # feature_standardization "none"
            return features
        # (x - mean) / std in float32 (normalization.standardize computes in float64 and rounds once)
        return (features - state["feature_mean"]) / state["feature_std"]


class DictionaryMethod(Method):
    """What FedDaDiL and DaDiL share as an interface: an :class:`EncoderStage` in ``self.encoder`` whose
    client operations they expose, and the dictionary (atoms, plus the encoder's weights) as the global tensors."""

    encoder: EncoderStage

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.num_atoms = num_atoms(self.params, len(federation.domains))
        self.encoder = EncoderStage(self, self.params.encoder_rounds)

    @classmethod
    def check_setting(cls, config, federation) -> None:
        check_batch_size(config.method.params, config.method.batch_size)
        EncoderStage.check_setting(config.method.params.encoder_rounds, federation, config.run.rounds)

    def global_tensors(self, state: ServerState) -> dict:
        return {**atom_tensors(state), **state.get("weights", {})}

    def close(self) -> None:
        self.encoder.close()

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Encoder stage: FedAvg's local training."""
        return self.encoder.fit(instruction, state, data)

    @client_operation
    def feature_stats(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """Encoder stage: the sums that standardize the encoded features."""
        return self.encoder.feature_stats(instruction, state, data)

    def evaluate_dictionary(
        self, instruction: Instruction, state: Any, data: ClientData, alpha: torch.Tensor
    ) -> tuple[Reply, Any]:
        """DaDiL-R and DaDiL-E with the barycentric coordinates ``alpha`` (each method says whose), and their
        selection statistics on the client's encoded, standardized selection inputs (features, for iwv/dev: their
        logits); FedAvg's evaluation while the encoder stage runs."""
        if "atoms_x" not in instruction.tensors:
            return self.encoder.evaluate(instruction, state, data)
        self.encoder.prepare(state, data, instruction.tensors)
        x = selection_inputs(self.selection_scores, data)
        metrics, outputs = evaluate_and_apply(
            instruction.tensors,
            alpha,
            state["test_features"],
            data.test.y,
            self.params,
            instruction.seed,
            None if x is None else self.encoder.standardized(state, x),
        )
        reply = Reply(data.client_id, {}, metrics, num_examples=len(data.test))
        predictors = {name: FixedOutputs(logits) for name, logits in outputs.items()}
        return selection_reply(self.selection_scores, instruction, data, reply, predictors), state
