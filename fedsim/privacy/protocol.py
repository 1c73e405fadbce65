"""The privacy layer of a run: which replies are noised and by how much, and the budget spent (``docs/privacy.md``).

    privacy = RunPrivacy(config, federation, method)     # one per run, beside the server
    round_privacy = privacy.round(rnd)                   # one per round (RoundContext)
    replies = round_privacy.protect("fit", instructions, replies)
    metrics.update(privacy.close_round(round_privacy))   # privacy_epsilon, privacy_noise_multiplier, ...

It runs where the server runs, on the replies that arrived, for every backend: the noise of a reply derives from
(run seed, round, client, operation, the call's occurrence in the round, "privacy"), so both backends and any actor
layout give the same numbers.

Noise per reply, z the noise multiplier and C the stage's clip:

* ``local`` mode: std z C on every reply, each one private against the server that reads it;
* ``central`` mode (client-level DP-FedAvg, McMahan et al., ICLR 2018): the Gaussian noise of std z C that
  DP-FedAvg adds to the sum of the m clipped contributions is split among the m replies that answered, std
  z C / sqrt(m) each, so that their sum carries exactly N(0, z^2 C^2) (sums of independent Gaussians are
  Gaussian). Where the server weighs reply k by w_k (FedAvg's sample counts) reply k gets z C max(w) / (w_k sqrt(m)):
  the weighted sum then carries std z C max(w), z times its sensitivity to one client (C max(w)). A stage whose
  replies are used one by one (features, FADA's deltas, FedDaDiL's drawn version) gives each the full z C.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from typing import TYPE_CHECKING, Mapping, Optional

import numpy as np

from fedsim.errors import UserError
from fedsim.messages import Instruction, Reply
from fedsim.privacy.accountant import Ledger, Rates, calibrate_noise_multiplier, spent_epsilon
from fedsim.privacy.exchanges import Exchanges, Stage, method_exchanges, population, sample_size
from fedsim.privacy.mechanism import float_names, make_mechanism, unnoisable, update_reference
from fedsim.registry import MECHANISMS
from fedsim.seeding import numpy_rng

if TYPE_CHECKING:  # torch: the module loads only when a record-level run needs it
    from fedsim.privacy.dpsgd import RecordPlan

log = logging.getLogger(__name__)

PRIVACY_SUMMARY_KEYS = (
    "privacy_epsilon",
    "privacy_delta",
    "privacy_noise_multiplier",
    "privacy_epsilon_clients",
    "privacy_noise_multipliers",
)
"""The round metrics that ``summary.json`` carries from the last round."""
RUNNING_VARIANCE_FLOOR = 1e-2
"""What a batch-norm running variance is clamped to after the noise when it falls below (a noised variance can be
negative, and the model's outputs then NaN): post-processing of the noised reply, so the guarantee holds."""


def noised_stages(config, exchanges: Exchanges) -> tuple[str, ...]:
    """The operations whose replies are noised: ``privacy.stages``, or every training stage but the setup ones."""
    return tuple(config.privacy.stages) or exchanges.default_stages


def reply_noise_stds(
    mode: str, combined: str, noise_multiplier: float, clip: float, weights: Mapping[int, float]
) -> dict[int, float]:
    """The noise standard deviation of each of the m replies of one call under the mechanism ``mode`` (the module
    docstring): z C in the local mode or on a stage whose replies are used one by one; z C / sqrt(m) on a uniform
    sum; z C max(w) / (w_k sqrt(m)) on a sum weighted by ``weights`` (the replies' sample counts)."""
    return MECHANISMS.get(mode)().noise_stds(combined, noise_multiplier, clip, weights)


class RunPrivacy:
    """The run's noise multiplier (given, or calibrated to ``privacy.epsilon``), its noised stages, and the ledger
    of the budget spent."""

    def __init__(self, config, federation, method):
        """``method``: the run's Method object (FedDaDiL's encoder rounds decide its calls); a target epsilon that
        is calibrated here, before any round."""
        self.settings = settings = config.privacy
        self.config = config
        self.federation = federation
        self.root_seed = config.run.seed
        self.mechanism = make_mechanism(settings)
        self.exchanges = method_exchanges(config)
        self.stages: dict[str, Stage] = {op: self.exchanges.stage(op) for op in noised_stages(config, self.exchanges)}
        self.clips = {op: float((settings.stage_clip or {}).get(op, settings.clip)) for op in self.stages}
        self.delta = settings.target_delta
        plan = self.planned_rounds(method)
        if settings.noise_multiplier is not None:
            self.noise_multiplier = float(settings.noise_multiplier)
        else:
            self.noise_multiplier = calibrate_noise_multiplier(
                plan, settings.epsilon, self.delta, settings.accountant, self.mechanism.event
            )
            log.info(
                "privacy: noise multiplier %.6g spends epsilon %.6g of %g at delta %g over %d rounds",
                self.noise_multiplier,
                spent_epsilon(plan, self.noise_multiplier, self.delta, settings.accountant, self.mechanism.event),
                settings.epsilon,
                self.delta,
                len(plan),
            )
        self.ledger = Ledger(settings.accountant, self.noise_multiplier, self.delta, self.mechanism.event)

    def planned_rounds(self, method) -> list[Rates]:
        """The sampling rates of every round's noised exchanges, as the method will call them (what the
        calibration composes)."""
        rounds = []
        for rnd in range(1, self.config.run.rounds + 1):
            rates = []
            for operation, sampled in self.exchanges.calls(rnd, method):
                if operation not in self.stages:
                    continue
                senders = population(self.stages[operation].senders, self.federation)
                called = sample_size(self.config, senders) if sampled else senders
                rates.append(self.rate(self.stages[operation], senders, called))
            rounds.append(tuple(rates))
        return rounds

    def rate(self, stage: Stage, senders: int, called: int) -> float:
        """The sampling rate an exchange is accounted at: the share of its population called, in the central mode
        on a summed stage; 1 otherwise (the server, or the client the replies go to, sees who sent each one)."""
        return self.mechanism.rate(stage.combined, senders, called)

    def noise_stds(self, stage: Stage, replies: Mapping[int, Reply]) -> dict[int, float]:
        """Each reply's noise standard deviation (:func:`reply_noise_stds`)."""
        weights = {cid: float(max(r.num_examples, 1)) for cid, r in replies.items()}
        clip = self.clips[stage.operation]
        return self.mechanism.noise_stds(stage.combined, self.noise_multiplier, clip, weights)

    def round(self, rnd: int) -> RoundPrivacy:
        return RoundPrivacy(self, rnd)

    def close_round(self, round_privacy: RoundPrivacy) -> dict:
        """Compose the round's noised exchanges; the round's privacy metrics."""
        self.ledger.add_round(tuple(round_privacy.rates))
        metrics = {
            "privacy_epsilon": self.ledger.epsilon(),
            "privacy_delta": self.delta,
            "privacy_noise_multiplier": self.noise_multiplier,
            "privacy_exchanges": len(round_privacy.rates),
        }
        if round_privacy.contributions:
            metrics["privacy_clipped"] = round_privacy.clipped / round_privacy.contributions
        return metrics

    def state(self) -> dict:
        """What a checkpoint keeps: the noise multiplier and the rounds' exchanges."""
        return {"noise_multiplier": self.noise_multiplier, "rounds": self.ledger.state()}

    def restore(self, saved: dict) -> None:
        self.noise_multiplier = self.ledger.noise_multiplier = float(saved["noise_multiplier"])
        self.ledger.restore(saved["rounds"])


class RoundPrivacy:
    """One round: noises the replies of its training calls, and keeps their sampling rates for the ledger."""

    def __init__(self, run: RunPrivacy, rnd: int):
        self.run = run
        self.round = rnd
        self.sent: dict[str, np.ndarray] = {}  # the float tensors the server sent in the round's earlier calls
        self.occurrences: Counter = Counter()
        self.rates: list[float] = []
        self.clipped = 0
        self.contributions = 0

    def protect(self, operation: str, instructions: Mapping[int, Instruction], replies: dict[int, Reply]) -> dict:
        """The replies of one training call, noised when ``operation`` is a noised stage and they carry float
        tensors (each one's contribution clipped to the stage's C first)."""
        occurrence = self.occurrences[operation]
        self.occurrences[operation] += 1
        stage = self.run.stages.get(operation)
        if stage is not None:
            self.refuse_integers(operation, replies)
        carrying = {cid: r for cid, r in replies.items() if float_names(r.tensors)} if stage else {}
        out = dict(replies)
        if carrying:
            stds, clip = self.run.noise_stds(stage, carrying), self.run.clips[operation]
            for cid, reply in carrying.items():
                rng = numpy_rng(self.run.root_seed, self.round, cid, operation, occurrence, "privacy")
                reference = update_reference(reply.tensors, self.references(instructions[cid]))
                tensors, norm = self.run.mechanism.privatize(reply.tensors, reference, clip, stds[cid], rng)
                out[cid] = dataclasses.replace(reply, tensors=clamp_running_variances(tensors))
                self.contributions += 1
                self.clipped += norm > clip
            senders = population(stage.senders, self.run.federation)
            self.rates.append(self.run.rate(stage, senders, len(instructions)))
        self.remember(instructions)
        return out

    def refuse_integers(self, operation: str, replies: Mapping[int, Reply]) -> None:
        """A noised stage's reply that holds integer or boolean tensors (other than batch-norm step counters)
        stops the run: noise cannot protect them."""
        for cid, reply in sorted(replies.items()):
            names = unnoisable(reply.tensors)
            if names:
                raise UserError(
                    f"privacy: method {self.run.config.method.name!r}, stage {operation!r}: client {cid} sends "
                    f"integer or boolean tensors {names}, which noise cannot protect; leave the stage out of "
                    "privacy.stages"
                )

    def references(self, instruction: Instruction) -> dict[str, np.ndarray]:
        """What a reply may be an update of: the instruction's tensors, else those sent earlier in the round."""
        own = {name: value for name, value in instruction.tensors.items() if isinstance(value, np.ndarray)}
        return {**self.sent, **own}

    def remember(self, instructions: Mapping[int, Instruction]) -> None:
        for instruction in instructions.values():
            for name, value in instruction.tensors.items():
                if isinstance(value, np.ndarray):
                    self.sent[name] = value


def batch_norm_statistics(tensors: Mapping[str, np.ndarray]) -> list[str]:
    """The running variances among ``tensors``: noise can turn one negative (``docs/privacy.md``)."""
    return sorted(name for name in tensors if str(name).endswith("running_var"))


def clamp_running_variances(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``tensors`` with every batch-norm running variance raised to at least :data:`RUNNING_VARIANCE_FLOOR`."""
    out = dict(tensors)
    for name in batch_norm_statistics(tensors):
        value = np.asarray(tensors[name])
        if np.issubdtype(value.dtype, np.floating):
            out[name] = np.maximum(value, RUNNING_VARIANCE_FLOOR).astype(value.dtype)
    return out


def warn_batch_norm(config, global_tensors: Optional[Mapping[str, np.ndarray]]) -> None:
    """Log once when the noised updates carry batch-norm running variances: noised, then clamped."""
    names = batch_norm_statistics(global_tensors or {})
    if names and config.privacy.unit == "client":
        log.info(
            "privacy: the updates of %s carry %d batch-norm running variances (%s, ...): noised with the rest, then "
            "raised to at least %g where the noise took them below",
            config.method.name,
            len(names),
            names[0],
            RUNNING_VARIANCE_FLOOR,
        )


def make_privacy(config, federation, method):
    """The run's privacy layer for ``privacy.unit``: :class:`RunPrivacy` (client) or :class:`RecordPrivacy`."""
    return (RecordPrivacy if config.privacy.unit == "record" else RunPrivacy)(config, federation, method)


class RecordPrivacy:
    """``privacy.unit=record``: each client noises its own steps (DP-SGD, :mod:`fedsim.privacy.dpsgd`), or each row
    it sends of a stage whose values are records' own (:mod:`fedsim.privacy.rows`), so the replies pass as they are;
    the server counts each client's steps and releases and reports the epsilon they spend, with the same plans the
    clients noised with (:func:`fedsim.privacy.dpsgd.record_plan`, :func:`fedsim.privacy.rows.rows_plan`). A client
    under both mechanisms (none of the built-ins) is charged the sum of the two epsilons (basic composition)."""

    def __init__(self, config, federation, method):
        self.config = config
        self.federation = federation
        self.delta = config.privacy.target_delta
        exchanges = method_exchanges(config)
        self.epochs = exchanges.record_epochs(config) if exchanges.record_epochs else None
        self.rows_stages = frozenset(
            s.operation for s in exchanges.stages if s.records and s.record_mechanism and not s.setup
        )
        self.stages = frozenset(exchanges.default_stages) - self.rows_stages
        self.steps: dict[int, int] = {}
        self.releases: dict[tuple[int, str], int] = {}
        kind = config.privacy.accountant
        for cid in federation.source_ids:
            plan = self.plan(cid)
            log.info(
                "privacy: client %d, %d records, q %.4g: noise multiplier %.6g spends epsilon %.6g at delta %g over "
                "%d DP-SGD steps",
                cid,
                plan.records,
                plan.rate,
                plan.noise_multiplier,
                plan.epsilon(plan.total_steps, self.delta, kind),
                self.delta,
                plan.total_steps,
            )
        for operation in sorted(self.rows_stages):
            rows = self.rows_plan(operation)
            log.info(
                "privacy: %r rows clipped to %.6g, noise multiplier %.6g (std %.6g an entry) spends epsilon %.6g at "
                "delta %g over %d releases of a record",
                operation,
                rows.clip,
                rows.noise_multiplier,
                rows.std,
                rows.epsilon(rows.releases, self.delta, kind),
                self.delta,
                rows.releases,
            )

    def plan(self, cid: int) -> RecordPlan:
        """Client ``cid``'s DP-SGD (its training records from the federation)."""
        from fedsim.privacy.dpsgd import record_plan

        return record_plan(self.config, self.federation.info(cid).num_train, self.epochs)

    def rows_plan(self, operation: str):
        """The per-row mechanism of stage ``operation``."""
        from fedsim.privacy.rows import rows_plan

        return rows_plan(self.config, operation)

    def round(self, rnd: int) -> RecordRound:
        return RecordRound(self)

    def close_round(self, round_privacy: RecordRound) -> dict:
        """Count the round's local updates and rows released; each client's epsilon so far, and the largest (the
        federation's)."""
        for cid in round_privacy.trained:
            self.steps[cid] = self.steps.get(cid, 0) + self.plan(cid).steps_per_round
        for key in round_privacy.released:
            self.releases[key] = self.releases.get(key, 0) + 1
        kind = self.config.privacy.accountant
        spent: dict[int, float] = {}
        multipliers: dict[int, float] = {}
        for cid, steps in self.steps.items():
            spent[cid] = self.plan(cid).epsilon(steps, self.delta, kind)
            multipliers[cid] = self.plan(cid).noise_multiplier
        for (cid, operation), count in self.releases.items():
            rows = self.rows_plan(operation)
            if count == rows.releases + 1:  # once, when the plan's releases are exceeded
                log.warning(
                    "client %d has sent its rows in stage '%s' %d times, more than the %d its noise was calibrated "
                    "for (one a round): the epsilon reported exceeds privacy.epsilon; call the stage once a round",
                    cid,
                    operation,
                    count,
                    rows.releases,
                )
            spent[cid] = spent.get(cid, 0.0) + rows.epsilon(count, self.delta, kind)
            multipliers.setdefault(cid, rows.noise_multiplier)
        return {
            "privacy_epsilon": max(spent.values(), default=0.0),
            "privacy_delta": self.delta,
            "privacy_epsilon_clients": {str(cid): spent[cid] for cid in sorted(spent)},
            "privacy_noise_multipliers": {str(cid): multipliers[cid] for cid in sorted(spent)},
        }

    def state(self) -> dict:
        """What a checkpoint keeps: each client's steps and releases so far."""
        return {
            "steps": {str(cid): steps for cid, steps in self.steps.items()},
            "releases": [[cid, operation, count] for (cid, operation), count in sorted(self.releases.items())],
        }

    def restore(self, saved: dict) -> None:
        self.steps = {int(cid): int(steps) for cid, steps in saved["steps"].items()}
        self.releases = {(int(cid), str(op)): int(count) for cid, op, count in saved.get("releases", [])}


class RecordRound:
    """One round under ``privacy.unit=record``: the replies as they are, and which clients trained."""

    def __init__(self, run: RecordPrivacy):
        self.run = run
        self.trained: list[int] = []
        self.released: list[tuple[int, str]] = []

    def protect(self, operation: str, instructions: Mapping[int, Instruction], replies: dict[int, Reply]) -> dict:
        """``replies`` unchanged (their DP-SGD steps, or their rows, were noised by the clients); the senders of a
        training stage, and of a stage of records' rows, are counted."""
        if operation in self.run.stages:
            self.trained.extend(sorted(replies))
        elif operation in self.run.rows_stages:
            self.released.extend((cid, operation) for cid in sorted(replies))
        return replies
