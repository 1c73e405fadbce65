"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, Algorithm 1): FedAvg that keeps batch norm local.

Each labeled source client keeps the weights, biases and running statistics of
every batch-norm layer as private state (never uploaded); it trains from the
global non-BN weights plus its own BN (the initial BN before its first round)
and uploads only the non-BN tensors, which the server averages weighted by the
number of training samples, as FedAvg. A source evaluates the global weights
with its own BN.

Target rule (the unlabeled target has no BN of its own and the server never
sees any): the target evaluates the global non-BN weights with the BN affine
parameters of the global initialization (gamma=1, beta=0) and, with
``method.target_bn=adabn`` (default), BN statistics re-estimated on its own
unlabeled training inputs (AdaBN, Li et al. 2016: one deterministic forward pass
in train mode, cumulative averages, no gradients, no labels); ``none`` keeps the
initial running statistics (an ablation). A model without batch norm makes
FedBN equal to FedAvg.

The FedAvg half (initialization, client sampling, local training, weighted mean)
is a :class:`~fedsim.methods.fedavg.FedAvg` object; this file adds the split of
every model into shared and private (BN) tensors around it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply, Tensors
from fedsim.methods.base import Exchange, Replies, ServerState, SingleExchange, client_operation
from fedsim.methods.common.batchnorm import reestimate_bn
from fedsim.methods.common.selection_hooks import ClassifierPredictor, model_tensors, selection_reply
from fedsim.methods.common.training import evaluate_model, load_numpy, model_to_numpy
from fedsim.methods.fedavg import FedAvg
from fedsim.models.normalization import bn_keys, bn_layers
from fedsim.privacy.exchanges import Exchanges, fit_exchanges
from fedsim.registry import METHODS

log = logging.getLogger(__name__)

TARGET_BN = ("adabn", "none")


def initial_bn(model: nn.Module) -> dict[str, np.ndarray]:
    """The BN tensors of the global initialization (gamma=1, beta=0, mean 0, variance 1, no batch seen):
    what a freshly built model holds, computed from copies of ``model``'s layers (no random draw)."""
    out = {}
    for name, module in bn_layers(model):
        fresh = copy.deepcopy(module)
        fresh.reset_parameters()
        out.update(
            {f"{name}.{key}" if name else key: t.detach().cpu().numpy().copy() for key, t in fresh.state_dict().items()}
        )
    return out


def split(tensors: Tensors, keys: frozenset[str]) -> tuple[dict, dict]:
    """(shared non-BN tensors, private BN tensors)."""
    return {k: v for k, v in tensors.items() if k not in keys}, {k: v for k, v in tensors.items() if k in keys}


@METHODS.register("fedbn")
class FedBN(SingleExchange):
    """FedBN (Li et al. 2021): batch norm stays with each source client; the target re-estimates its statistics."""

    copes_with_missing_replies = True  # it aggregates the replies that arrive

    @staticmethod
    def privacy_exchanges(config) -> Exchanges:
        """One ``fit`` a round, the model without its batch norm; refused under ``privacy.unit=record``."""
        return fit_exchanges(
            "the model after its local epochs without its batch-norm layers (they stay on the source), clipped as its "
            "difference from the global model; not in the data's space",
            record_level="its batch-norm layers are what it keeps on each source, and record-level DP-SGD replaces "
            "batch norm with group norm (per-example gradients): it would be FedAvg",
        )

    @dataclass(frozen=True)
    class Params:
        target_bn: str = "adabn"  # the target's BN statistics: "adabn" (re-estimated) or "none" (initial)

        def __post_init__(self):
            if self.target_bn not in TARGET_BN:
                raise UserError(f"method.target_bn must be one of {', '.join(TARGET_BN)}, got {self.target_bn!r}")

    def __init__(self, config, federation, device: str = "cpu"):
        super().__init__(config, federation, device)
        self.fedavg = FedAvg(config, federation, device)

    # ---- server half ------------------------------------------------------
    def init_server(self) -> ServerState:
        model = self.fedavg.classifier.build()
        keys = bn_keys(model)
        if not keys:
            log.warning("fedbn: model %r has no batch-norm layer, so FedBN equals FedAvg", self.config.model.name)
        return {"weights": split(model_to_numpy(model), keys)[0]}

    def configure(self, ctx, state: ServerState) -> Exchange:
        return self.fedavg.configure(ctx, state)  # the non-BN weights to the sampled sources

    def aggregate(self, ctx, state: ServerState, replies: Replies) -> tuple[ServerState, dict]:
        return self.fedavg.aggregate(ctx, state, replies)  # weighted mean of the non-BN weights

    # ---- client half ------------------------------------------------------
    def init_client(self, data: ClientData) -> Any:
        # "bn" (not transient): this client's BN tensors as numpy; None until its first fit (initial BN)
        return {**self.fedavg.init_client(data), "bn": None}

    def own_bn(self, state: dict) -> dict:
        return state["bn"] if state["bn"] is not None else initial_bn(state["model"])

    @client_operation
    def fit(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """FedAvg's local epochs from the global non-BN weights and the client's own BN; only non-BN tensors go back."""
        full = dataclasses.replace(instruction, tensors={**instruction.tensors, **self.own_bn(state)})
        reply, state = self.fedavg.fit(full, state, data)
        shared, state["bn"] = split(reply.tensors, bn_keys(state["model"]))
        return dataclasses.replace(reply, tensors=shared), state

    @client_operation
    def evaluate(self, instruction: Instruction, state: Any, data: ClientData) -> tuple[Reply, Any]:
        """The global weights with the client's own BN; the target re-estimates BN statistics (AdaBN) first. The
        selection statistics are this model's (features: ``model.features``, with the client's BN)."""
        model = state["model"]
        load_numpy(model, {**model_tensors(instruction), **self.own_bn(state)})
        if data.is_target and self.params.target_bn == "adabn" and bn_keys(model):
            reestimate_bn(model, data.train.x, self.device)  # inputs only: the target's train.y is None
        reply = Reply(data.client_id, {}, evaluate_model(model, data.test, self.device), num_examples=len(data.test))
        predictor = ClassifierPredictor(model, self.device)
        return selection_reply(self.selection_scores, instruction, data, reply, {"": predictor}), state
