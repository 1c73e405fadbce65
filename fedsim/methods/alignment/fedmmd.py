"""FedMMD: DAN's multi-kernel MMD (Long et al., ICML 2015) in the federated setting, as the baseline of Peng et al.
(FADA, ICLR 2020).

Each source client adds lambda * MK-MMD^2 between its encoded batch and a batch
of encoded target features sent by the target client; the model weights are
averaged as in FedAvg. The exchange and the local loop are
:class:`fedsim.methods.alignment.base.FeatureAlignment`'s; only the loss
object differs from FedDANN.

Training, from the sources: equal-weight Gaussian kernels with bandwidths at
multiples of the median heuristic (Long et al. 2015, Sec. 3 and 4: a family of
kernels, sigma^2 = 2^k times the median squared distance); lambda = 1 on the
ramp 2/(1+exp(-10p))-1 and the learning rate annealed as mu_0/(1+10p)^0.75,
the training schedule DAN's own follow-up work (JAN, Long et al. 2017) takes
from Ganin et al. (2016), shared with FedDANN so the two baselines differ by
the loss alone (:mod:`fedsim.methods.alignment.base`). MMD has no parameters:
there is no discriminator learning rate. The digits config sets ``lambda_domain = 0.1``,
FedDANN's value, so the two differ by the loss alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedsim.data.base import ClientData
from fedsim.errors import UserError
from fedsim.losses import DomainLoss, MMDLoss
from fedsim.losses.mmd import DEFAULT_MULTIPLIERS
from fedsim.messages import Instruction, Reply
from fedsim.methods.alignment.base import AlignmentParams, FeatureAlignment
from fedsim.methods.alignment.exchanges import fedmmd_exchanges
from fedsim.methods.alignment.objective import steps_per_epoch
from fedsim.methods.common.target_features import TARGET_FEATURES
from fedsim.registry import METHODS
from fedsim.seeding import derive_seed


@METHODS.register("fedmmd")
class FedMMD(FeatureAlignment):
    """FedMMD: multi-kernel MMD between source and target features (Long et al. 2015)."""

    privacy_exchanges = staticmethod(fedmmd_exchanges)  # what privacy noises; its answer to privacy.unit=record

    copes_with_missing_replies = True  # it aggregates the replies that arrive

    @dataclass(frozen=True)
    class Params(AlignmentParams):
        kernel_multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS  # sigma^2 = multiplier * median squared distance
        bandwidths: tuple[float, ...] = ()  # fixed Gaussian sigmas; empty: median heuristic with the multipliers

        def __post_init__(self):
            super().__post_init__()
            if any(b <= 0 for b in self.bandwidths) or any(m <= 0 for m in self.kernel_multipliers):
                raise UserError(
                    "method.bandwidths and method.kernel_multipliers must be positive numbers, e.g. "
                    "method.kernel_multipliers=0.5,1,2"
                )
            if not self.bandwidths and not self.kernel_multipliers:
                raise UserError(
                    "method.kernel_multipliers is empty: give some (e.g. 0.5,1,2) or fixed method.bandwidths"
                )

    #: ``fit`` has a batched counterpart for ``resources.vectorize: auto`` (a subclass keeps the loop unless it
    #: declares it too; FedDANN's private discriminators are not batched)
    vectorized_operations = {"fit": "fit_vectorized"}

    def make_domain_loss(self, in_features: int) -> DomainLoss:
        return MMDLoss(self.params.bandwidths, self.params.kernel_multipliers)

    def vectorizable(self, operation: str) -> bool:
        """The rule of ``auto`` (:func:`fedsim.methods.common.vectorized.vectorizable_model`)."""
        from fedsim.methods.common.vectorized import vectorizable_model

        return vectorizable_model(self.classifier.shared(), self.device)

    def fit_vectorized(self, items: list[tuple[Instruction, Any, ClientData]]) -> list[tuple[Reply, Any]]:
        """:meth:`fit` for several sources at once (fedsim.methods.alignment.vectorized): the same batches,
        target batches, schedule and SGD, one batched computation."""
        from fedsim.methods.alignment.vectorized import AlignmentJob, train_alignment_grouped
        from fedsim.methods.common.vectorized import ClientJob

        if any(
            len(ins.tensors[TARGET_FEATURES]) < ins.local.batch_size for ins, _, _ in items
        ):  # fewer target rows than a batch: the loop's unequal-size MMD
            return [self.fit(instruction, state, data) for instruction, state, data in items]
        jobs, settings, targets = [], [], []
        for instruction, _, data in items:
            if data.train.y is None:
                raise ValueError("fit needs labels: only source clients train, the target client only sends features")
            local, seed = instruction.local, instruction.seed
            weights = {k: v for k, v in instruction.tensors.items() if k != TARGET_FEATURES}
            batches, _ = steps_per_epoch(len(data.train), local.batch_size)
            schedule = self.step_schedule(instruction.round, local.local_epochs * batches)
            job = ClientJob(data.train.x, data.train.y, weights, seed)
            jobs.append(AlignmentJob(job, derive_seed(seed, "target-batch"), schedule))
            settings.append(local)
            targets.append(instruction.tensors[TARGET_FEATURES])
        kernels = (self.params.bandwidths, self.params.kernel_multipliers)
        model = self.classifier.shared()
        weights, metrics = train_alignment_grouped(model, jobs, settings, targets, self.device, kernels)
        return [
            (Reply(data.client_id, w, m, num_examples=len(data.train)), state)
            for (_, state, data), w, m in zip(items, weights, metrics)
        ]
