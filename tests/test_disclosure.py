"""``python -m tools.diagnose disclosure``: the nearest-neighbour membership test on rows built by hand (copies of
training rows, fresh rows, unequal reference sets), and on what tiny FedDANN and FedDaDiL runs send, with privacy
off and on."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedsim.config import load_config
from fedsim.errors import UserError
from tools.diagnostics import disclosure
from tools.diagnostics.disclosure import capture_stage, main, measure, membership_signal, settings

DICTIONARY = ["method.samples_per_atom=40", "method.batch_size=20", "method.classifier_steps=20", "method.num_atoms=0"]


def gaussian(rows: int, seed: int, width: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, width))


# ---- the test on rows built by hand -------------------------------------------------------------------------------


def test_rows_copied_from_the_training_set_are_all_closer_to_it():
    train, held_out = gaussian(200, 1), gaussian(200, 2)
    signal = membership_signal(train[:50], train, held_out, seed=0)
    assert (signal.rows, signal.reference) == (50, 200)
    assert signal.closer_to_train == 1.0 and signal.median_ratio == 0.0 and signal.copies == 1.0
    assert signal.p_value == pytest.approx(1 / (disclosure.PERMUTATIONS + 1))  # no relabeling does as well


def test_fresh_rows_of_the_same_distribution_carry_no_signal():
    train, held_out, fresh = gaussian(200, 1), gaussian(200, 2), gaussian(1000, 3)
    signal = membership_signal(fresh, train, held_out, seed=0)
    assert abs(signal.closer_to_train - 0.5) < 0.05
    assert 0.9 < signal.median_ratio < 1.1
    assert signal.copies == 0.0
    assert signal.p_value > 0.05


def test_near_copies_carry_the_signal_and_held_out_copies_the_opposite():
    train, held_out = gaussian(200, 1), gaussian(200, 2)
    near = membership_signal(train[:100] + 0.05 * gaussian(100, 4), train, held_out)
    assert near.closer_to_train == 1.0 and near.median_ratio < 0.2 and near.copies == 0.0
    opposite = membership_signal(held_out[:100], train, held_out)
    assert opposite.closer_to_train == 0.0 and opposite.p_value == 1.0


def test_unequal_sets_are_drawn_to_one_size():
    """1000 training rows against 100 held-out: the nearest of all 1000 would be nearer for about 1000 / 1100 of
    fresh rows; the test draws 100 of them, so fresh rows read 0.5, and copies of training rows 0.5 + 0.5 * 100 /
    1000 (a copy counts only when its row is drawn), all of them counted by ``copies``."""
    train, held_out = gaussian(1000, 1), gaussian(100, 2)
    fresh = membership_signal(gaussian(1000, 3), train, held_out, seed=0)
    assert fresh.reference == 100 and abs(fresh.closer_to_train - 0.5) < 0.05
    copied = membership_signal(train[:300], train, held_out, seed=0)
    assert abs(copied.closer_to_train - 0.55) < 0.05 and copied.copies == 1.0


def test_rows_of_another_width_or_no_held_out_rows_are_refused():
    with pytest.raises(ValueError, match="differ in width"):
        membership_signal(gaussian(5, 1, width=3), gaussian(10, 2), gaussian(10, 3))
    with pytest.raises(UserError, match="no held-out rows"):
        membership_signal(gaussian(5, 1), gaussian(10, 2), gaussian(0, 3))


# ---- runs ---------------------------------------------------------------------------------------------------------


def test_feddann_sends_its_training_rows_and_the_noise_hides_them(toy_overrides):
    """The target encodes all its 120 training rows (target_batch 256): every sent row is one of them, as the
    model that encoded it finds; with privacy on, the server receives them with noise of std z C."""
    config = load_config(None, toy_overrides + ["method.name=feddann"])
    lines = measure(config, noise=1.0, clip=1.0, privacy={"stage_clip": {"features": 20}}, wanted_round=1)
    assert [(line.privacy, line.round, line.client) for line in lines] == [
        ("off", 1, 1),
        ("off", 1, None),
        ("z=1, C=1", 1, 1),
        ("z=1, C=1", 1, None),
    ]
    off, on = lines[0].signal, lines[2].signal
    assert (off.rows, off.reference, off.copies) == (120, 30, 1.0)
    assert (on.rows, on.copies) == (120, 0.0)
    # round 1: both runs encode with the initial model, so the private rows are the clipped rows plus the noise
    (_, plain), (_, private) = settings(config, 1.0, 1.0, {"stage_clip": {"features": 20}})
    sent = {name: capture_stage(c, 1)[1][0].sent for name, c in (("off", plain), ("on", private))}
    clipped = sent["off"] * min(1.0, 20.0 / np.linalg.norm(sent["off"]))
    assert np.std(sent["on"] - clipped) == pytest.approx(
        20.0, rel=0.05
    )  # std z C: the target's features are used one by one


def numbers(line: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+\.\d+", line)]


def test_feddadil_end_to_end_from_the_command_line(toy_overrides, capsys):
    """Two FedDaDiL rounds, privacy off and on: each client's 3 atoms x 18 rows, finite numbers in range."""
    flags = [f"--set={o}" for o in toy_overrides + DICTIONARY]
    assert main(["--method", "feddadil", *flags, "--privacy-noise", "1", "--privacy-clip", "1"]) == 0
    printed = capsys.readouterr().out
    assert "stage 'dil'" in printed
    rows = [line.split() for line in printed.splitlines() if line.startswith(("off ", "z=1, C=1 "))]
    assert len(rows) == 8  # 3 clients and all, twice
    for line in printed.splitlines():
        if line.startswith(("off ", "z=1, C=1 ")):
            closer, p, ratio, copies = numbers(line)[-4:]
            assert 0 <= closer <= 1 and 0 < p <= 1 and np.isfinite(ratio) and ratio > 0 and copies == 0.0
            pooled = " all " in line
            assert line.split()[-5 if pooled else -6] == ("162" if pooled else "54")
    assert any("1 dom1 target" in line for line in printed.splitlines())


def test_a_run_directory_is_measured_again_from_its_config(toy_overrides, tmp_path, capsys):
    from fedsim.api import run_experiment

    out = tmp_path / "feddann"
    run_experiment(load_config(None, toy_overrides + ["method.name=feddann", "run.backend=local"]), out)
    assert main(["--run-dir", str(out), "--round", "2"]) == 0
    printed = capsys.readouterr().out
    target = next(line for line in printed.splitlines() if line.startswith("off "))
    assert target.split()[1:7] == ["2", "1", "dom1", "target", "120", "30"]  # round, client, rows, m
    assert numbers(target)[-1] == 1.0  # every row it sent is one of its training rows
    assert main(["--run-dir", str(out), "--config", str(out / "config.yaml")]) == 2
    assert "give --run-dir or --config, not both" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--method", "fedavg"], "method 'fedavg' does not send"),
        (["--method", "feddann", "--privacy-clip", "1"], "--privacy-clip needs --privacy-noise"),
        (["--method", "feddann", "--privacy-noise", "1"], "--privacy-noise needs --privacy-clip"),
        (["--method", "feddann", "--set", "privacy.mode=local"], "privacy.mode applies to the private run"),
        (["--method", "feddann", "--round", "7"], "--round 7 is not a round of the run: give 1 to 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(toy_overrides, capsys, argv, message):
    assert main([*argv, *[f"--set={o}" for o in toy_overrides]]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("fedsim: error: ") and message in error[0]
