"""The share of a FedDaDiL round spent inside optimal transport solver calls (POT, and scipy's assignment).

Runs FedDaDiL on the local backend and times every call into POT made by
``fedsim.ot`` (``ot.emd``, ``ot.sinkhorn``, ``ot.dist``), the barycenter's costs
(``squared_distances``, ``ot.dist``'s operations) and scipy's assignment against the rounds'
wall time, and, separately, the per-round drift metrics (``atom_drift`` and
``atom_dispersion``, whose POT calls are part of the POT column). Default: the
TEP benchmark (6 modes, target mode2) with the spec's PyDiL settings
(n = 500, n_b = 200, E = 5). TEP's default windows are images to the dictionary: its first 5 rounds train the
encoder (``method.encoder_rounds``), so time dictionary rounds with ``--set method.encoder_rounds=1 --rounds 4``, or
on the 53 raw features with ``--set data.variant=snapshot`` (no encoder).

Square problems with uniform weights (every mini-batch and atom comparison of DaDiL) are solved exactly as an
assignment (scipy's ``linear_sum_assignment``, timed with the POT calls). The last round also evaluates (DaDiL-R
and -E classifiers), which is not OT. On a 2-core x86_64, TEP snapshots (d = 53, K = 5): about 60 % of a
dictionary round in OT, most of it in scipy's assignment.

Then, on ``--steps`` of the run's own DiL steps (the inputs of ``dil_loss``, drawn evenly over the run), it times
one step (the barycenter B(alpha; P) of Cuturi & Doucet's fixed point with DaDiL's labels, W_c to the client's
batch, DaDiL Eq. 9, and the backward pass) with the dense reference (``tools.ot_reference``: a dense plan and
product for every atom at every iteration) and with ``labeled_barycenter`` (plans as permutations), checks that
both give the same loss and gradients bit for bit, and prints the time per step of each.

    python -m tools.benchmarks.feddadil_ot [--benchmark tep --target mode2 --rounds 3 --steps 20]
"""

from __future__ import annotations

import argparse
import functools
import logging
import time

from tools.benchmarks.measure import machine


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="tep")
    parser.add_argument("--target", default="mode2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--steps", type=int, default=20, help="DiL steps timed with both barycenters (0: none)")
    parser.add_argument("--repeats", type=int, default=3, help="timings of each step (the fastest is kept)")
    return parser.parse_args()


def run_config(args: argparse.Namespace):
    """One local FedDaDiL run at the spec's PyDiL settings, evaluated only after its last round."""
    from fedsim.config import load_config

    overrides = [
        f"data.benchmark={args.benchmark}",
        f"data.target={args.target}",
        "method.name=feddadil",
        f"run.rounds={args.rounds}",
        "method.batch_size=200",
        "method.local_epochs=5",
        f"run.eval_every={args.rounds + 1}",
        "run.backend=local",
        "run.progress=false",
        "run.tensorboard=false",
        "run.checkpoint_every=0",
    ]
    return load_config(None, overrides + args.set)


def instrument(spent: dict) -> None:
    """Time every POT call of ``fedsim.ot.wasserstein``, the barycenter's costs, scipy's assignment and the drift
    metrics into ``spent``."""
    import ot

    from fedsim.methods.dictionary import learning as dictionary
    from fedsim.ot import barycenter, wasserstein  # the modules whose OT calls are timed

    for name in ("emd", "sinkhorn", "dist"):
        setattr(wasserstein.ot, name, timed(getattr(ot, name), spent, "seconds", "calls"))
    # the barycenter's costs (ot.dist's operations) and the exact solver of square uniform problems are OT too
    barycenter.squared_distances = timed(barycenter.squared_distances, spent, "seconds", "calls")
    wasserstein.linear_sum_assignment = timed(wasserstein.linear_sum_assignment, spent, "seconds", "calls")
    for name in ("atom_drift", "atom_dispersion"):
        setattr(dictionary, name, timed(getattr(dictionary, name), spent, "drift"))


def ledger(spent: dict, per_round: list):
    """A callback that moves ``spent`` into one ``per_round`` line per round and starts it again."""
    from fedsim.runtime.callbacks import Callback

    class Ledger(Callback):
        def on_round_end(self, simulator, metrics):
            seconds, calls, drift = spent["seconds"], spent["calls"], spent["drift"]
            per_round.append((metrics["round"], metrics.get("stage"), metrics["round_seconds"], seconds, calls, drift))
            spent["seconds"], spent["calls"], spent["drift"] = 0.0, 0, 0.0

    return Ledger()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    from fedsim.api import run_experiment

    spent = {"seconds": 0.0, "calls": 0, "drift": 0.0}
    per_round: list = []
    problems: list = []
    instrument(spent)
    if args.steps > 0:
        record_steps(problems)
    run_experiment(run_config(args), callbacks=[ledger(spent, per_round)])
    report(args, per_round)
    if problems:
        compare_steps(problems[:: max(len(problems) // args.steps, 1)][: args.steps], args.repeats)


def report(args, per_round: list) -> None:
    """The per-round table and the dictionary rounds' POT and drift shares."""
    print(f"FedDaDiL OT share, {args.benchmark} -> {args.target}, {machine()}")
    print(f"{'round':>5s} {'stage':>10s} {'round s':>8s} {'OT s':>7s} {'calls':>6s} {'share':>6s} {'drift s':>8s}")
    for rnd, stage, seconds, pot, calls, drift in per_round:
        note = "  (includes DaDiL-R/E evaluation)" if rnd == len(per_round) else ""
        print(
            f"{rnd:5d} {str(stage):>10s} {seconds:8.2f} {pot:7.2f} {calls:6d} "
            f"{100 * pot / seconds:5.1f}% {drift:8.2f}{note}"
        )
    train = [r for r in per_round[:-1] if r[1] == "dictionary"]
    if not train:
        print("no dictionary round before the last: raise --rounds above method.encoder_rounds")
    if train:
        share = sum(r[3] for r in train) / sum(r[2] for r in train)
        print(
            f"dictionary rounds without evaluation: {100 * share:.1f} % of the time inside OT calls "
            "(POT and linear_sum_assignment)"
        )
        drift = sum(r[5] for r in train) / sum(r[2] for r in train)
        print(
            "of which the drift metrics (atom_drift, atom_dispersion; their OT calls included): "
            f"{100 * drift:.1f} % of the time"
        )


def record_steps(problems: list) -> None:
    """Keep a copy of the inputs of every ``dil_loss`` call (its generator's state included) in ``problems``."""
    from fedsim.methods.dictionary import learning as dictionary

    dil_loss = dictionary.dil_loss

    @functools.wraps(dil_loss)
    def recording(atoms_x, atoms_logits, alpha, x, y_onehot, p, generator=None):
        copies = [None if t is None else t.detach().clone() for t in (atoms_x, atoms_logits, alpha, x, y_onehot)]
        problems.append((*copies, p, None if generator is None else generator.get_state()))
        return dil_loss(atoms_x, atoms_logits, alpha, x, y_onehot, p, generator)

    dictionary.dil_loss = recording


def dil_step(problem, barycenter_function):
    """One DiL step of ``problem`` (``dil_loss`` and its backward pass) with ``barycenter_function`` in place of
    ``labeled_barycenter``: (seconds, loss, gradients w.r.t. the atoms' features, label logits and alpha)."""
    import torch

    from fedsim.methods.dictionary import learning as dictionary

    dil_loss = getattr(dictionary.dil_loss, "__wrapped__", dictionary.dil_loss)  # not record_steps' copy
    atoms_x, atoms_logits, alpha, x, y, p, state = problem
    leaves = [t.clone().requires_grad_() for t in (atoms_x, atoms_logits, alpha)]
    generator = None if state is None else torch.Generator().set_state(state)
    kept, dictionary.labeled_barycenter = dictionary.labeled_barycenter, barycenter_function
    try:
        started = time.perf_counter()
        loss = dil_loss(*leaves, x, y, p, generator)
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)  # the target's loss: no labels
        return time.perf_counter() - started, loss.detach(), grads
    finally:
        dictionary.labeled_barycenter = kept


def compare_steps(problems: list, repeats: int) -> None:
    """Time each recorded step with the dense reference and with ``labeled_barycenter`` (the fastest of
    ``repeats`` runs each), check both give the same bits, and print the mean time and exact solves per step."""
    import torch

    from fedsim.ot import wasserstein
    from fedsim.ot.barycenter import labeled_barycenter
    from tools.ot_reference import reference_barycenter

    paths = {"dense reference": reference_barycenter, "labeled_barycenter": labeled_barycenter}
    times, solves = {name: [] for name in paths}, {name: 0 for name in paths}
    solve, repeats, identical = wasserstein.linear_sum_assignment, max(repeats, 1), True
    for problem in problems:
        outcomes = {}
        for name, function in paths.items():
            wasserstein.linear_sum_assignment = counted(solve, solves, name)
            try:
                runs = [dil_step(problem, function) for _ in range(repeats)]
            finally:
                wasserstein.linear_sum_assignment = solve
            times[name].append(min(run[0] for run in runs))
            outcomes[name] = runs[0][1:]
        (loss_a, grads_a), (loss_b, grads_b) = outcomes.values()
        identical &= torch.equal(loss_a, loss_b) and all(same(a, b) for a, b in zip(grads_a, grads_b))
    zeros = sum(int((problem[2] == 0).sum()) for problem in problems) / len(problems)
    k, n, d = problems[0][0].shape
    print(
        f"one DiL step (barycenter, W_c to the batch, backward; K = {k} atoms of {n} rows, d = {d}), mean of "
        f"{len(problems)} steps of the run ({zeros:.1f} atoms with alpha_k = 0 on average), fastest of {repeats}:"
    )
    before, after = (1e3 * sum(t) / len(t) for t in times.values())
    per_step = [solves[name] / (repeats * len(problems)) for name in paths]
    print(f"  dense reference {before:8.2f} ms   labeled_barycenter {after:8.2f} ms   ({before / after:.2f}x)")
    print(f"  exact OT solves per step: {per_step[0]:.1f} and {per_step[1]:.1f}")
    print(f"  same loss and gradients bit for bit: {'yes' if identical else 'NO'}")


def counted(function, counts: dict, key: str):
    """``function`` with its calls counted in ``counts[key]``."""

    @functools.wraps(function)
    def wrapper(*a, **k):
        counts[key] += 1
        return function(*a, **k)

    return wrapper


def same(a, b) -> bool:
    """Two gradients are the same bits (or both absent)."""
    import torch

    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def timed(function, spent: dict, seconds_key: str, calls_key: str = ""):
    """``function`` with its wall time added to ``spent[seconds_key]`` (its calls counted in ``spent[calls_key]``)."""

    @functools.wraps(function)
    def wrapper(*a, **k):
        started = time.perf_counter()
        try:
            return function(*a, **k)
        finally:
            spent[seconds_key] += time.perf_counter() - started
            if calls_key:
                spent[calls_key] += 1

    return wrapper


if __name__ == "__main__":
    main()
