"""`python -m tools.diagnose`: each diagnostic on a tiny run this file makes, its printed values against a direct
computation."""

from __future__ import annotations

import argparse
import csv
import json
import pickle
import re

import numpy as np
import ot
import pytest
import torch

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.errors import UserError
from tools import diagnose
from tools.diagnostics.feddadil_plateau import plateau_round

DICTIONARY = ["method.samples_per_atom=40", "method.batch_size=20", "method.classifier_steps=20", "method.num_atoms=0"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    diagnose.add_arguments(parser)
    return parser.parse_args(argv)


def diagnosed(argv: list[str], capsys) -> str:
    assert diagnose.run(parse(argv)) == 0
    return capsys.readouterr().out


def numbers(line: str) -> list[float]:
    """The decimals of a printed line (labels such as W2^2 or dom0 hold none)."""
    return [float(v) for v in re.findall(r"-?\d+\.\d+", line)]


@pytest.fixture(scope="module")
def feddadil_run(toy_overrides, tmp_path_factory):
    """A 3-round FedDaDiL run on the toy federation (target dom1), checkpointed after round 2."""
    out = tmp_path_factory.mktemp("feddadil") / "toy-feddadil"
    settings = ["method.name=feddadil", "run.rounds=3", "run.checkpoint_every=2", "run.tensorboard=false"]
    run_experiment(load_config(None, toy_overrides + settings + DICTIONARY), out)
    with (out / "checkpoint.pkl").open("rb") as fh:
        return out, pickle.load(fh)


def test_atoms_distances_equal_exact_ot(feddadil_run, capsys):
    out, checkpoint = feddadil_run
    printed = diagnosed(["feddadil-atoms", str(out), "--no-accuracy"], capsys)
    assert "atoms at round 2" in printed
    atoms_x = np.asarray(checkpoint["server"]["method_state"]["atoms_x"], dtype=np.float64)
    lines = printed.splitlines()
    for cid, domain in ((0, "dom0"), (2, "dom2")):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"source {domain} "))
        state = checkpoint["clients"][cid]
        np.testing.assert_allclose(numbers(lines[at + 1]), state["alpha"].numpy(), atol=0.006)
        x = state["test_features"].numpy().astype(np.float64)  # 30 test rows, fewer than an atom's 40: all of them
        direct = [ot.emd2(ot.unif(len(x)), ot.unif(len(a)), ot.dist(x, a)) for a in atoms_x]
        np.testing.assert_allclose(numbers(lines[at + 2]), direct, atol=0.006)
    assert "dom1" not in printed  # the target is not diagnosed


def test_atoms_accuracies_and_plot(feddadil_run, capsys, tmp_path):
    out, _ = feddadil_run
    printed = diagnosed(["feddadil-atoms", str(out), "--plot", str(tmp_path / "atoms.png")], capsys)
    accuracies = [numbers(line) for line in printed.splitlines() if "acc of h_k" in line]
    assert len(accuracies) == 2 and all(len(row) == 3 for row in accuracies)
    for value in np.ravel(accuracies):  # a share of 30 test rows
        assert 0 <= value <= 1 and abs(value * 30 - round(value * 30)) < 0.04
    assert (tmp_path / "atoms.png").stat().st_size > 0


def test_labels_count_each_atoms_hard_labels(feddadil_run, capsys):
    out, checkpoint = feddadil_run
    printed = diagnosed(["feddadil-labels", str(out)], capsys)
    logits = torch.tensor(np.asarray(checkpoint["server"]["method_state"]["atoms_logits"]))
    for k in range(len(logits)):
        counts = np.bincount(logits[k].argmax(-1).numpy(), minlength=3).tolist()
        top = float(torch.softmax(logits[k], -1).max(-1).values.mean())
        assert f"atom {k}: hard labels per class {counts}, mean top probability {top:.2f}" in printed
    for cid, client in checkpoint["clients"].items():
        line = next(line for line in printed.splitlines() if line.startswith(f"client {cid} "))
        np.testing.assert_allclose(numbers(line), client["alpha"].numpy(), atol=0.006)
    assert "(dom1, target)" in printed


def test_alpha_refit_without_steps_is_the_own_alpha(feddadil_run, capsys):
    out, _ = feddadil_run
    printed = diagnosed(["feddadil-alpha", str(out), "--steps", "0"], capsys)
    rows = [line.split() for line in printed.splitlines() if line.startswith(("dom0", "dom2", "mean"))]
    assert [row[0] for row in rows] == ["dom0", "dom2", "mean"]
    for row in rows:
        assert row[1:3] == row[3:5]  # the same alpha gives the same DaDiL-R and -E accuracy


def test_alpha_refit_stays_on_the_simplex(feddadil_run, capsys):
    out, _ = feddadil_run
    printed = diagnosed(["feddadil-alpha", str(out), "--steps", "3"], capsys)
    for line in printed.splitlines():
        if line.startswith(("dom0", "dom2")):
            refit = [float(v) for v in line.split("->")[1].split()]
            assert len(refit) == 3 and min(refit) >= 0 and abs(sum(refit) - 1) < 0.02


def test_plateau_rule():
    # falls by a fifth a round for 12 rounds, then flat: M_r = mean of the 5 losses ending at r (1-based)
    losses = [100.0 * 0.8**r for r in range(12)] + [6.87] * 10
    means = {r: sum(losses[r - 5 : r]) / 5 for r in range(5, len(losses) + 1)}
    assert means[21] < 0.98 * means[16] and means[22] >= 0.98 * means[17]
    assert plateau_round(losses) == 22
    assert plateau_round(losses[:21]) is None
    assert plateau_round([10.0 * 0.5**r for r in range(30)]) is None  # halves every round: never flat
    assert plateau_round([1.0] * 9) is None  # fewer rounds than the rule may stop at


def test_plateau_reads_the_sources_dil_loss(feddadil_run, capsys):
    out, _ = feddadil_run
    printed = diagnosed(["feddadil-plateau", str(out), "--start", "2", "--window", "1", "--cap", "12"], capsys)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [(m["dil_loss"]["0"] + m["dil_loss"]["2"]) / 2 for m in metrics]  # client 1 is the target
    expected = plateau_round(losses, window=1, start=2)
    row = next(line for line in printed.splitlines() if line.startswith("toy-feddadil "))
    assert row.split()[1:3] == ["3", "none" if expected is None else str(expected)]
    needs = 12 if expected is None else expected
    assert f"protocol run.rounds = {needs}" in printed


def write_reproduction(root, rows: dict) -> None:
    """A `fedsim reproduce` layout: results.csv and runs/<trial>/summary.json with given source accuracies."""
    lines = []
    for (row, target, seed), sources in rows.items():
        trial = f"{row}-{target}-{seed}"
        (root / "runs" / trial).mkdir(parents=True)
        (root / "runs" / trial / "summary.json").write_text(json.dumps({"source_accuracy": sources}))
        lines.append(
            {
                "row": row,
                "benchmark": "toy",
                "target_domain": target,
                "seed": seed,
                "status": "finished",
                "trial_id": trial,
            }
        )
    with (root / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerows(lines)


def test_sources_against_a_control(tmp_path, capsys):
    write_reproduction(
        tmp_path,
        {
            ("control", "t", 0): {"a": 0.80, "b": 0.70},
            ("control", "t", 1): {"a": 0.90, "b": 0.70},
            ("method", "t", 0): {"a": 0.70, "b": 0.72},
            ("method", "t", 1): {"a": 0.70, "b": 0.74},
        },
    )
    printed = diagnosed(["sources", str(tmp_path), "--control", "control"], capsys)
    row = next(line for line in printed.splitlines() if line.startswith("toy "))
    # a: (-0.10 - 0.20) / 2 = -0.15; b: (0.02 + 0.04) / 2 = +0.03; mean -0.06; one pair below -0.05, the worst a
    assert row.split()[:5] == ["toy", "method", "2", "-6.0", "1"]
    assert "a (target t) -15.0 pts" in row


def test_wrong_directory_and_wrong_method(tmp_path, toy_overrides):
    with pytest.raises(UserError, match="is not a directory"):
        diagnose.run(parse(["feddadil-atoms", str(tmp_path / "missing")]))
    with pytest.raises(UserError, match="holds no run"):
        diagnose.run(parse(["feddadil-labels", str(tmp_path)]))
    fedavg = tmp_path / "fedavg"
    run_experiment(load_config(None, toy_overrides + ["method.name=fedavg", "run.tensorboard=false"]), fedavg)
    with pytest.raises(UserError, match="is a fedavg run; this diagnostic reads feddadil or dadil runs"):
        diagnose.run(parse(["feddadil-atoms", str(fedavg)]))
    with pytest.raises(UserError, match="no results.csv"):
        diagnose.run(parse(["sources", str(fedavg), "--control", "fedavg"]))


def test_no_checkpoint_is_one_clear_line(tmp_path, toy_overrides, capsys):
    from tools.diagnose import main

    out = tmp_path / "run"
    settings = ["method.name=feddadil", "run.checkpoint_every=0", "run.eval_every=2", "run.tensorboard=false"]
    run_experiment(load_config(None, toy_overrides + settings + DICTIONARY), out)
    assert main(["feddadil-labels", str(out)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("fedsim: error: feddadil-labels: ")
    assert error.endswith(
        "has no checkpoint.pkl: run it with run.checkpoint_every below run.rounds (the diagnostic "
        "reads the state of the last checkpointed round)"
    )


def test_through_the_cli(feddadil_run, capsys):
    from tools.diagnose import main

    out, _ = feddadil_run
    assert main(["feddadil-atoms", str(out), "--no-accuracy", "--seed", "1", "--samples", "20"]) == 0
    assert "W2^2 to atom k" in capsys.readouterr().out
    assert main(["feddadil-alpha", str(out.parent / "elsewhere")]) == 2
    assert "is not a directory" in capsys.readouterr().err
