"""``python -m tools.diagnose disclosure --method feddadil --set ...``: what the rows a client sends in the data's
space disclose of its training set, measured by a nearest-neighbour membership test.

The run (``--config``, the ``config.yaml`` of ``--run-dir``, ``--set`` overrides) runs again in this process on the
local backend. Every reply of the method's stage that sends rows in the data's space (FedDaDiL's ``dil``: the atom
rows; FedDANN's, FedMMD's and FADA's ``features``: the target's encoded rows) is kept as the server received it,
after the privacy layer's clip and noise, with the sending client's training rows and held-out rows (the inputs of
its test split; never a label) in the same space, taken in the client's process as it answered: FedDaDiL's
standardized encoded features, or every row encoded by the model that encoded the sent ones. The measured round is
``--round`` (default: the last that called the stage). Per client, the distance-to-closest-record test of
synthetic data (Platzer & Reutterer, *Holdout-Based Fidelity and Privacy Assessment of Mixed-Type Synthetic Data*,
Front. Big Data 2021, Sec. 2.3), with the sent rows as the synthetic ones:

- the training and the held-out rows are drawn down to one size m, the smaller set's (at most ``MAX_REFERENCE``;
  ``--seed``), so that a row unrelated to either set is as likely near one as the other;
- for each sent row x: d_train(x), the Euclidean distance to the nearest of the m training rows, and d_held(x), to
  the nearest of the m held-out rows;
- ``closer to train``: the share of sent rows with d_train < d_held (a tie counts half): 0.5 is no membership
  signal, 1 every row nearer a training row (rows copied from the m drawn);
- ``median ratio``: the median of d_train / d_held (1: no signal; 0: copies);
- ``p``: the one-sided permutation p-value of ``closer to train``: the share of ``PERMUTATIONS`` random
  relabelings of the 2m reference rows (which m are "training") whose share is as high (Good, *Permutation Tests*,
  2000, Ch. 3). The sent rows of one client are compared with the same two sets, so they are not independent
  trials; the relabelings keep that dependence, which a binomial interval would not;
- ``copies``: the share of sent rows within ``COPY_TOLERANCE`` (relative) of a row of all the client's training
  rows: verbatim disclosure, whatever m.

``--privacy-noise Z --privacy-clip C`` measures the same run again with ``privacy.noise_multiplier=Z`` and
``privacy.clip=C``; ``--set privacy.KEY=VALUE`` (``stage_clip``, ``mode``...) applies to that run only. A config
whose own privacy section is on is measured as it is beside the run without it. ``docs/privacy.md`` ("What each
exchange discloses, measured") explains the numbers.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from fedsim.config import ExperimentConfig, load_config, parse_override
from fedsim.errors import UserError

log = logging.getLogger(__name__)

NAME = "disclosure"
HELP = "nearest-neighbour membership signal of the rows a client sends (FedDaDiL, FedDANN, FedMMD, FADA)"
COPY_TOLERANCE = 1e-5
"""A sent row within this distance of a training row, relative to max(1, the row's norm), is a copy of it."""
PERMUTATIONS = 200
"""Relabelings of the reference rows behind each p-value (the smallest p is 1 / (PERMUTATIONS + 1))."""
MAX_REFERENCE = 5000
"""The most rows of each reference set compared (bounds the sent x 2m distance matrix the relabelings reuse)."""
CHUNK_ROWS = 256
"""Sent rows whose distances are computed at once."""


# ---- the test ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signal:
    """The membership signal of a set of sent rows (the module's docstring defines each value)."""

    rows: int
    """Sent rows measured."""
    closer_to_train: float
    """Share of sent rows nearer a training row than a held-out row, both sets of m rows (0.5: no signal)."""
    median_ratio: float
    """Median over sent rows of d_train / d_held (1: no signal; 0: copies)."""
    p_value: float
    """One-sided permutation p-value of ``closer_to_train``."""
    copies: float
    """Share of sent rows that are one of the training rows (all of them), within :data:`COPY_TOLERANCE`."""
    reference: int
    """m: the rows of each reference set (several clients: the largest m)."""


def pairwise_distances(rows: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Euclidean distances (len(rows), len(reference)) in float64, by differences (an identical row is at exactly
    zero, as the ``|a|^2 + |b|^2 - 2ab`` expansion would not guarantee)."""
    import torch

    reference_t = torch.from_numpy(np.ascontiguousarray(reference, dtype=np.float64))
    out = np.empty((len(rows), len(reference)))
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = torch.from_numpy(np.ascontiguousarray(rows[start : start + CHUNK_ROWS], dtype=np.float64))
        out[start : start + len(chunk)] = torch.cdist(chunk, reference_t, compute_mode="donot_use_mm_for_euclid_dist")
    return out


def nearest_distances(rows: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """The distance from each of ``rows`` to its nearest row of ``reference``, in chunks of the reference."""
    out = np.full(len(rows), np.inf)
    for start in range(0, len(reference), 8 * CHUNK_ROWS):
        out = np.minimum(out, pairwise_distances(rows, reference[start : start + 8 * CHUNK_ROWS]).min(axis=1))
    return out


def _closer(d_train: np.ndarray, d_held: np.ndarray) -> np.ndarray:
    return np.where(d_train < d_held, 1.0, np.where(d_train == d_held, 0.5, 0.0))


@dataclass(frozen=True)
class RowTests:
    """The test of each sent row against one client's reference rows, and its null distribution."""

    closer: np.ndarray
    """Per sent row: 1 when d_train < d_held, 0.5 on a tie, else 0."""
    ratio: np.ndarray
    """Per sent row: d_train / d_held (1 when they are equal, zero included)."""
    copies: np.ndarray
    """Per sent row: whether it is a training row, within :data:`COPY_TOLERANCE`."""
    null_sums: np.ndarray
    """Per relabeling of the reference rows: the sum of ``closer`` under it."""
    reference: int
    """m."""


def row_tests(
    sent: np.ndarray,
    train: np.ndarray,
    held_out: np.ndarray,
    seed: int = 0,
    permutations: int = PERMUTATIONS,
    max_reference: int = MAX_REFERENCE,
) -> RowTests:
    """Each of ``sent`` (n, d) against a client's ``train`` and ``held_out`` rows (each (·, d)), both drawn down to
    m = min(their sizes, ``max_reference``) rows with ``seed``, which also draws the ``permutations`` relabelings."""
    if not len(sent) or not len(train) or not len(held_out):
        raise UserError(
            f"disclosure needs sent, training and held-out rows: got {len(sent)}, {len(train)} and {len(held_out)} "
            "(a client with an empty test split has no held-out rows to compare with)"
        )
    sent, train, held_out = (np.asarray(a, dtype=np.float64).reshape(len(a), -1) for a in (sent, train, held_out))
    widths = {sent.shape[1], train.shape[1], held_out.shape[1]}
    if len(widths) != 1:
        raise ValueError(f"sent, training and held-out rows differ in width: {sorted(widths)}")
    rng = np.random.default_rng(seed)
    m = min(len(train), len(held_out), max_reference)
    train_m = train[np.sort(rng.choice(len(train), m, replace=False))]
    held_m = held_out[np.sort(rng.choice(len(held_out), m, replace=False))]
    distances = pairwise_distances(sent, np.concatenate([train_m, held_m]))
    d_train, d_held = distances[:, :m].min(axis=1), distances[:, m:].min(axis=1)
    null_sums = np.empty(permutations)
    for k in range(permutations):
        order = rng.permutation(2 * m)
        null_sums[k] = _closer(distances[:, order[:m]].min(axis=1), distances[:, order[m:]].min(axis=1)).sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(d_train == d_held, 1.0, d_train / d_held)  # both zero: a row of both sets, no signal
    scale = np.maximum(1.0, np.linalg.norm(sent, axis=1))
    return RowTests(
        closer=_closer(d_train, d_held),
        ratio=ratio,
        copies=nearest_distances(sent, train) <= COPY_TOLERANCE * scale,
        null_sums=null_sums,
        reference=m,
    )


def summarize(tests: Sequence[RowTests]) -> Signal:
    """The signal of the rows of ``tests`` together (one client's calls, or every client's); the null of the
    pooled share sums each client's relabelings, drawn independently."""
    closer, ratio, copies = (np.concatenate([getattr(t, k) for t in tests]) for k in ("closer", "ratio", "copies"))
    null = np.sum([t.null_sums for t in tests], axis=0)
    observed = closer.sum()
    return Signal(
        rows=len(closer),
        closer_to_train=float(closer.mean()),
        median_ratio=float(np.median(ratio)),
        p_value=float((1 + np.sum(null >= observed - 1e-9)) / (1 + len(null))),
        copies=float(copies.mean()),
        reference=max(t.reference for t in tests),
    )


def membership_signal(
    sent: np.ndarray, train: np.ndarray, held_out: np.ndarray, seed: int = 0, permutations: int = PERMUTATIONS
) -> Signal:
    """The nearest-neighbour membership signal of ``sent`` against one client's rows (:func:`row_tests`)."""
    return summarize([row_tests(sent, train, held_out, seed, permutations)])


# ---- what each method sends in the data's space ------------------------------------------------------------------

Reference = Callable[[], tuple[np.ndarray, np.ndarray]]
"""The client's (training rows, held-out rows) in the sent rows' space, computed when measured."""


def _dictionary_rows(method, state: dict, data, instruction) -> Reference:
    """FedDaDiL: the client's training and test rows as its DiL steps read them (standardized encoded features,
    or the standardized inputs without an encoder)."""
    train, test = state["train_features"], state["test_features"]
    return lambda: (np.asarray(train), np.asarray(test))


def _encoded_rows(model_key: str, batch_statistics: Callable[[Any], bool]):
    """Every training and test input encoded by the model that encoded the sent features (a copy, taken after the
    call), as :func:`fedsim.methods.common.target_features.encode_subset` encoded the sent subset: the same batch-norm
    mode, chunks of the call's batch size."""

    def reference(method, state: dict, data, instruction) -> Reference:
        from fedsim.methods.common.target_features import encode_subset

        model, chunk, batch = copy.deepcopy(state[model_key]), instruction.local.batch_size, batch_statistics(method)
        inputs = (data.train.x, data.test.x)

        def encoded() -> tuple[np.ndarray, np.ndarray]:
            train, test = (
                encode_subset(copy.deepcopy(model), x, len(x), 0, method.device, chunk=chunk, batch_statistics=batch)
                for x in inputs  # every row, in order; a copy each: batch statistics update buffers
            )
            return train, test

        return encoded

    return reference


@dataclass(frozen=True)
class Disclosure:
    """A method's stage that sends rows in the data's space, and how to read them."""

    stage: str
    """The client operation whose replies carry the rows."""
    tensor: str
    """The reply tensor holding them; its last axis is a row's width."""
    what: str
    """What the rows are, for the report."""
    reference: Callable[[Any, dict, Any, Any], Reference]
    """(method, client state after the call, client data, instruction) -> its :data:`Reference`."""


_ALIGNMENT = Disclosure(
    "features",
    "features",
    "the target's encoded training rows",
    _encoded_rows("model", lambda method: method.params.target_normalization == "batch"),
)
DISCLOSURES: dict[str, Disclosure] = {
    "feddadil": Disclosure(
        "dil", "atoms_x", "every client's atom rows (features; soft labels left out)", _dictionary_rows
    ),
    "feddann": _ALIGNMENT,
    "fedmmd": _ALIGNMENT,
    "fada": Disclosure(
        "features", "features", "G_t's features of the target's training rows", _encoded_rows("net", lambda m: True)
    ),
}
"""Method name -> the stage whose rows are measured."""


def disclosure_of(config: ExperimentConfig) -> Disclosure:
    """The measured stage of ``config.method.name``; a UserError for a method that sends no rows in the data's
    space."""
    name = config.method.name
    if name not in DISCLOSURES:
        raise UserError(
            f"disclosure measures rows sent in the data's space, which method {name!r} does not send (its replies "
            f"are model updates or gradients): use one of {', '.join(sorted(DISCLOSURES))}"
        )
    return DISCLOSURES[name]


# ---- capture ----------------------------------------------------------------------------------------------------


@dataclass
class Capture:
    """One client's reply in one call of the measured stage: the rows the server received, and the client's
    reference rows in their space."""

    round: int
    client: int
    sent: Optional[np.ndarray] = None
    reference: Optional[Reference] = None


class StageRecorder:
    """Keeps the replies of one stage in the wanted round (``None``: the last round that called it): the rows as
    the server received them, after the privacy layer (a wrapped ``RoundContext.call``), and the client's
    reference rows, taken in its process as it answered (a wrapped client operation). A stage called several
    times in a round (FADA's adversarial steps) is paired call by call, in order."""

    def __init__(self, disclosure: Disclosure, wanted_round: Optional[int]):
        self.disclosure = disclosure
        self.wanted_round = wanted_round
        self.captures: dict[tuple[int, int, int], Capture] = {}
        self.rounds: set[int] = set()  # every round that called the stage
        self._calls: dict[str, dict[tuple[int, int], int]] = {"server": {}, "client": {}}

    def _keep(self, rnd: int) -> bool:
        self.rounds.add(rnd)
        if self.wanted_round is not None:
            return rnd == self.wanted_round
        self.captures = {key: c for key, c in self.captures.items() if key[0] >= rnd}  # the last round only
        return True

    def _capture(self, side: str, rnd: int, cid: int) -> Capture:
        occurrence = self._calls[side].get((rnd, cid), 0)
        self._calls[side][(rnd, cid)] = occurrence + 1
        return self.captures.setdefault((rnd, cid, occurrence), Capture(rnd, cid))

    def attach(self, server) -> None:
        """Wrap ``server``'s round contexts and, on its local executor's client host, the stage's operation."""
        method, stage = server.executor.host.method, self.disclosure.stage
        operation = method.operation(stage)

        def recorded_operation(instruction, state, data):
            reply, state = operation(instruction, state, data)
            if self._keep(instruction.round):
                capture = self._capture("client", instruction.round, data.client_id)
                capture.reference = self.disclosure.reference(method, state, data, instruction)
            return reply, state

        recorded_operation.is_client_operation = True
        setattr(method, stage, recorded_operation)  # the host looks the operation up by name, on the instance
        context = server.context

        def recorded_context(rnd: int, setup: bool = False):
            ctx = context(rnd, setup)
            call = ctx.call

            def recorded_call(operation_name: str, *args, **kwargs):
                replies = call(operation_name, *args, **kwargs)
                if operation_name == stage and replies and self._keep(ctx.round):
                    for cid, reply in replies.items():
                        rows = np.asarray(reply.tensors[self.disclosure.tensor])
                        self._capture("server", ctx.round, cid).sent = rows.reshape(-1, rows.shape[-1])
                return replies

            ctx.call = recorded_call
            return ctx

        server.context = recorded_context

    def measured(self) -> list[Capture]:
        """The kept captures, each with a reply and reference rows, in (client, call) order."""
        unpaired = [key for key, c in self.captures.items() if c.sent is None or c.reference is None]
        if unpaired:
            raise RuntimeError(f"replies and client rows of stage {self.disclosure.stage!r} do not pair: {unpaired}")
        return [self.captures[key] for key in sorted(self.captures, key=lambda k: (k[1], k[2]))]


def capture_stage(config: ExperimentConfig, wanted_round: Optional[int] = None) -> tuple[int, list[Capture]]:
    """Run ``config`` in this process (local backend, nothing written) and return the measured round and what each
    client sent in it in the method's disclosing stage (:data:`DISCLOSURES`)."""
    from fedsim.api import checked_federation, open_local
    from fedsim.runtime import Simulator

    disclosure = disclosure_of(config)
    federation = checked_federation(config)
    server, close = open_local(config, federation)
    try:
        recorder = StageRecorder(disclosure, wanted_round)
        recorder.attach(server)
        Simulator(config, server, None).run()  # no run directory: nothing written
    finally:
        close()
    measured_round = wanted_round if wanted_round is not None else max(recorder.rounds, default=None)
    if measured_round not in recorder.rounds:
        called = ", ".join(map(str, sorted(recorder.rounds))) or "none"
        raise UserError(
            f"round {measured_round} did not call stage {disclosure.stage!r} (rounds that did: {called}): give "
            "--round one of them"
        )
    return measured_round, recorder.measured()


# ---- the runs measured ------------------------------------------------------------------------------------------


def _with_privacy(config: ExperimentConfig, section: Mapping[str, Any]) -> ExperimentConfig:
    """``config`` on the local backend, without progress bar or checkpoints, with ``section`` as its privacy
    section (keys whose value is None left out); validated as any config is."""
    raw = config.to_dict()
    raw["run"].update(backend="local", progress=False, tensorboard=False, checkpoint_every=0)
    raw["privacy"] = {k: v for k, v in section.items() if v is not None}
    return load_config(base=raw)


def settings(
    config: ExperimentConfig,
    noise: Optional[float] = None,
    clip: Optional[float] = None,
    privacy: Optional[Mapping[str, Any]] = None,
) -> list[tuple[str, ExperimentConfig]]:
    """(label, config) of each run measured: ``config`` without privacy, then, with ``noise`` or when ``config``'s
    own privacy section is on, a private run: that section, updated by the ``privacy`` keys, then by
    ``noise_multiplier=noise`` (no ``epsilon``) and ``clip``."""
    if config.clients.active:
        raise UserError(
            "disclosure pairs every reply with the client that sent it: leave the clients section out (unreliable "
            "clients measure availability, not what a reply discloses)"
        )
    if clip is not None and noise is None:
        raise UserError("--privacy-clip needs --privacy-noise: the noise multiplier z of the private run")
    runs = [("off", _with_privacy(config, {}))]
    private = noise is not None or config.privacy.active
    if privacy and not private:
        raise UserError(
            f"privacy.{next(iter(privacy))} applies to the private run: give --privacy-noise (and --privacy-clip)"
        )
    if private:
        section = {**dataclasses.asdict(config.privacy), **(privacy or {})}
        if noise is not None:
            section.update(noise_multiplier=noise, epsilon=None)
        if clip is not None:
            section["clip"] = clip
        if section.get("clip") is None:
            raise UserError("--privacy-noise needs --privacy-clip: the L2 bound C of one client's contribution")
        on = _with_privacy(config, section)
        p = on.privacy
        noise_label = f"z={p.noise_multiplier:g}" if p.noise_multiplier is not None else f"eps={p.epsilon:g}"
        runs.append((f"{noise_label}, C={p.clip:g}", on))
    return runs


@dataclass(frozen=True)
class Line:
    """One line of the report: a client's signal in one of the runs measured (``client`` None: every client)."""

    privacy: str
    round: int
    client: Optional[int]
    signal: Signal


def measure(
    config: ExperimentConfig,
    noise: Optional[float] = None,
    clip: Optional[float] = None,
    privacy: Optional[Mapping[str, Any]] = None,
    wanted_round: Optional[int] = None,
    seed: int = 0,
    permutations: int = PERMUTATIONS,
) -> list[Line]:
    """The membership signal of each client's rows in the measured round, and of every client's together, in each
    run of :func:`settings`. Client c's reference rows and relabelings are drawn with ``seed + c``: its calls in
    the round (FADA's adversarial steps) share them, as they share its training and held-out rows."""
    disclosure_of(config)  # an unsupported method is refused before anything runs
    if wanted_round is not None and not 1 <= wanted_round <= config.run.rounds:
        raise UserError(f"--round {wanted_round} is not a round of the run: give 1 to {config.run.rounds}")
    lines = []
    for label, run_config in settings(config, noise, clip, privacy):
        rnd, captures = capture_stage(run_config, wanted_round)
        tests: dict[int, list[RowTests]] = {}
        for c in captures:
            train, held_out = c.reference()
            tests.setdefault(c.client, []).append(row_tests(c.sent, train, held_out, seed + c.client, permutations))
        for cid, own in tests.items():
            lines.append(Line(label, rnd, cid, summarize(own)))
        lines.append(Line(label, rnd, None, summarize([t for own in tests.values() for t in own])))
    return lines


def report(config: ExperimentConfig, lines: Sequence[Line]) -> str:
    """The table: one line per run measured and client, then every client's rows together."""
    from fedsim.data.scenario import build_federation

    disclosure, federation = disclosure_of(config), build_federation(config.data)
    out = [
        f"{NAME}: {config.method.name} on {config.data.benchmark} (target {config.data.target}), stage "
        f"{disclosure.stage!r}: {disclosure.what}, against m training and m held-out rows of the client",
        f"{'privacy':<16} {'round':>5} {'client':<16} {'rows':>6} {'m':>6} {'closer to train':>15} {'p':>6} "
        f"{'median ratio':>12} {'copies':>6}",
    ]
    for line in lines:
        if line.client is None:
            who, m = "all", ""
        else:
            role = "target" if line.client in federation.target_ids else "source"
            who, m = f"{line.client} {federation.info(line.client).domain} {role}", line.signal.reference
        s = line.signal
        out.append(
            f"{line.privacy:<16} {line.round:>5} {who:<16} {s.rows:>6} {m:>6} {s.closer_to_train:>15.3f} "
            f"{s.p_value:>6.3f} {s.median_ratio:>12.3f} {s.copies:>6.3f}"
        )
    out.append(
        "closer to train: 0.5 = no membership signal, 1 = every row nearer a training row (p: one-sided permutation "
        "p-value); median ratio d_train/d_held: 1 = none, 0 = copies; copies: rows equal to a training row"
    )
    return "\n".join(out)


# ---- command line -----------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", help="measure the run of this directory (its config.yaml) again, in process")
    parser.add_argument("--config", help="YAML config file (instead of --run-dir)")
    parser.add_argument("--method", help="method name: " + ", ".join(sorted(DISCLOSURES)))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key (privacy.* keys: the private run's)",
    )
    parser.add_argument("--round", type=int, help="the round measured (default: the last that called the stage)")
    parser.add_argument("--privacy-noise", type=float, metavar="Z", help="also measure with privacy.noise_multiplier")
    parser.add_argument("--privacy-clip", type=float, metavar="C", help="the private run's privacy.clip")
    parser.add_argument("--seed", type=int, default=0, help="seed of the reference rows and relabelings drawn")
    parser.add_argument(
        "--permutations", type=int, default=PERMUTATIONS, help=f"relabelings behind each p (default {PERMUTATIONS})"
    )


def config_from(args: argparse.Namespace) -> tuple[ExperimentConfig, dict[str, Any]]:
    """The config the arguments give, and the private run's ``privacy.*`` keys (set apart: a privacy key on a
    config whose privacy is off would be refused)."""
    if args.run_dir and args.config:
        raise UserError("give --run-dir or --config, not both")
    path = args.config
    if args.run_dir:
        from tools.diagnostics.run_dir import RunDir

        path = RunDir.open(args.run_dir, NAME).path / "config.yaml"
    overrides = ([f"method.name={args.method}"] if args.method else []) + list(args.set)
    privacy = {}
    for text in [t for t in overrides if t.strip().startswith("privacy.")]:
        (_, key), value = parse_override(text)
        privacy[key] = value
    rest = [t for t in overrides if not t.strip().startswith("privacy.")]
    return load_config(path, rest), privacy


def run(args: argparse.Namespace) -> int:
    if args.permutations < 1:
        raise UserError(f"--permutations must be at least 1, got {args.permutations}")
    config, privacy = config_from(args)
    lines = measure(config, args.privacy_noise, args.privacy_clip, privacy, args.round, args.seed, args.permutations)
    print(report(config, lines))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m tools.diagnose disclosure ...`` under its own module name (as :func:`tools.diagnose.main`)."""
    from tools.diagnostics.command import run_command

    parser = argparse.ArgumentParser(prog=f"python -m tools.diagnose {NAME}", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run_command(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
