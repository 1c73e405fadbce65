"""`fedsim reproduce`: the paper specs are valid grids, a spec's claims are checked on a results table,
bad input is one line (exit 2, nothing written), and one protocol runs end to end as Ray Tune trials."""

import csv
import json
import math
from pathlib import Path

import pytest

from fedsim.errors import UserError
from fedsim.experiments.cli import main
from fedsim.experiments.reproduce import STATE_FILE, output_names
from fedsim.experiments.reproduce_results import (
    Strength,
    check_claim,
    claims_text,
    judge,
    metric_value,
    paired_differences,
    read_results_csv,
    results_rows,
    strength,
    table,
    write_results_csv,
)
from fedsim.experiments.reproduce_spec import PaperSpec, available, load_spec, shrink, to_sweep
from fedsim.experiments.sweep import SPEC_FILE

PAPERS = {  # paper -> (methods its full grid runs, its targets per benchmark, its seeds per (run, benchmark))
    "fada": (
        {"fedavg", "feddann", "fedmmd", "fada"},
        {"digits": ["mnist", "usps", "mnistm", "synth"], "tep": [f"mode{i}" for i in range(1, 7)]},
        lambda run, bench: [0, 1, 2, 3, 4] if bench == "tep" else [0, 1, 2],  # TEP's trials cost seconds
    ),
    "feddadil": (
        {"fedavg", "feddann", "fedmmd", "feddadil", "dadil"},
        {"tep": [f"mode{i}" for i in range(1, 7)], "digits": ["mnistm", "usps"]},
        lambda run, bench: [0, 1, 2] if run.startswith("feddadil") else [0, 1, 2, 3, 4],  # FedDaDiL's cost minutes
    ),
    "fedod": ({"fedod", "fedavg_det", "fedbn_det", "fedrep_det"}, {"scenes": ["dusk"]}, lambda run, bench: [0, 1, 2]),
    "privacy": (  # accuracy against epsilon, client-level DP (tests/test_privacy_protocol.py)
        {"fedavg", "feddann", "fada", "feddadil"},
        {"digits": ["mnistm", "usps"], "amazon": ["books", "dvd", "electronics", "kitchen"]},
        lambda run, bench: [0, 1, 2],
    ),
    "privacy-record": (  # accuracy against epsilon, record-level DP (tests/test_privacy_rows.py)
        {"fedavg", "feddann"},
        {"digits": ["mnistm", "usps"], "amazon": ["books", "dvd", "electronics", "kitchen"]},
        lambda run, bench: [0, 1, 2],
    ),
    "selection": (  # hyperparameter selection without target labels (tests/test_selection_protocol.py)
        {"fedavg", "feddann", "fedmmd", "fada", "feddadil"},
        {"digits": ["mnistm", "usps"], "amazon": ["books", "kitchen"], "office_googlenet": ["amazon", "webcam"]},
        lambda run, bench: [0, 1, 2],
    ),
}


def test_the_paper_specs_are_shipped():
    assert available() == sorted(PAPERS)


@pytest.mark.parametrize("paper", sorted(PAPERS))
def test_paper_spec_builds_every_trial_config(paper):
    """Every trial's config of the full and the quick grid loads (methods, parameters, task pairs), without running:
    the full grid runs each run on its targets with its seeds (5 where a trial costs under a minute), the quick grid
    seed 0."""
    methods, targets, seeds = PAPERS[paper]
    for is_quick in (False, True):
        spec = shrink(load_spec(paper, None), is_quick, None)
        sweep = to_sweep(spec)
        points = sweep.points()
        configs = [sweep.config_for(p) for p in points]
        assert {c.method.name for c in configs} == methods
        trials = sorted((p["spec.variant"].split("#")[0], c.run.seed) for p, c in zip(points, configs))
        if is_quick:
            assert {c.run.seed for c in configs} == {0} and len(trials) == len(spec.variants())
        else:
            assert {(bench, target) for _, _, bench, target in spec.variants()} == {
                (bench, t) for bench, names in targets.items() for t in names
            }
            expected = [(name, seed) for name, run, bench, _ in spec.variants() for seed in seeds(run, bench)]
            assert trials == sorted(expected)
        for row in spec.rows:  # every row reads a run of the grid
            assert any(run == row.run for _, run, _, _ in spec.variants())
        assert spec.claims or spec.select, "a paper spec states the paper's claims or a selection to make"


def test_feddadil_protocol_preprocesses_tep_as_the_authors():
    """TEP: every row on per-domain standardized modes; the dictionary rows on a frozen 256-feature MLP encoder
    with the same encoder training for E = 1, 5, 10 and 50 dictionary rounds after it (DaDiL: 40)."""
    sweep = to_sweep(shrink(load_spec("feddadil", None), False, None))
    tep = [c for c in map(sweep.config_for, sweep.points()) if c.data.benchmark == "tep"]
    assert {c.data.normalization for c in tep} == {"per-domain"}
    dictionary = [c for c in tep if c.method.name in ("feddadil", "dadil")]
    assert {(c.method.params.encoder_rounds, c.method.params.encoder_epochs, c.model.hidden) for c in dictionary} == {
        (10, 5, 256)
    }
    assert {c.method.local_epochs for c in dictionary if c.method.name == "feddadil"} == {1, 5, 10}
    assert {(c.method.name, c.run.rounds) for c in dictionary} == {("feddadil", 60), ("dadil", 50)}


def test_quick_shrinks_rounds_and_data():
    spec = shrink(load_spec("fada", None), True, [4, 5])
    configs = [to_sweep(spec).config_for(p) for p in to_sweep(spec).points()]
    assert {c.run.rounds for c in configs} == {2} and {c.data.max_train_per_domain for c in configs} == {100}
    assert {(c.data.benchmark, c.data.target) for c in configs} == {("digits", "usps"), ("tep", "mode2")}
    assert {c.run.seed for c in configs} == {4, 5}
    control = [c for c in configs if c.method.name == "fedavg" and c.method.local_epochs == 3]
    assert (
        len(control) == 4
    )  # the compute-matched control keeps its 3 local epochs in the quick grid (2 targets x 2 seeds)


SPEC = {
    "paper": "toy",
    "seeds": [0, 1],
    "benchmarks": {"npz": {"targets": ["dom1", "dom2"]}},
    "runs": {"a": {}, "b": {}, "c": {"only": {"npz": ["dom1"]}}},
    "metrics": {"loss": "rounds:train_loss:last"},
    "rows": [
        {"name": "a"},
        {"name": "b"},
        {"name": "c"},
        {"name": "a-e", "run": "a", "metrics": {"target": "target_accuracy_E"}},
    ],
    "claims": [
        {"claim": "a above b", "order": ["a", "b"]},
        {"claim": "a at least b and c on dom1", "order": ["a", ["b", "c"]], "strict": False, "target": "dom1"},
        {"claim": "c above a on each target", "order": ["c", "a"], "per_target": True},
        {"claim": "b's loss above a's", "order": ["b:loss", "a:loss"]},
    ],
}


def _record(spec, run, target, seed, accuracy, losses, status="finished"):
    variant = next(name for name, r, _, t in spec.variants() if (r, t) == (run, target))
    summary = {"target_accuracy": accuracy, "source_accuracy/dom0": 0.9, "source_accuracy/dom2": 0.7}
    return {
        "trial_id": f"{run}-{target}-{seed}",
        "status": status,
        "params": {"variant": variant, "seed": seed},
        "summary": summary,
        "round_metrics": [
            {"round": i + 1, "train_loss/0": loss, "train_loss/1": loss + 0.2} for i, loss in enumerate(losses)
        ],
    }


def test_results_table_and_claims_from_records():
    spec = PaperSpec("toy", SPEC, Path("."))
    records = [
        _record(spec, "a", "dom1", 0, 0.6, [1.0, 0.5]),
        _record(spec, "a", "dom1", 1, 0.8, [1.0, 0.3]),
        _record(spec, "a", "dom2", 0, 0.5, [1.0, 0.4]),
        _record(spec, "a", "dom2", 1, 0.5, [1.0, 0.4]),
        _record(spec, "b", "dom1", 0, 0.6, [2.0, 0.9]),
        _record(spec, "b", "dom1", 1, 0.6, [2.0, 0.9]),
        _record(spec, "b", "dom2", 0, 0.4, [2.0, 0.9]),
        _record(spec, "b", "dom2", 1, 0.0, [2.0, 0.9], status="error"),
        _record(spec, "c", "dom1", 0, 0.7, [1.0, 1.0]),
        _record(spec, "c", "dom1", 1, 0.7, [1.0, 1.0]),
    ]
    assert metric_value(records[0], "source_accuracy") == pytest.approx(0.8)  # a mapping: the mean of its numbers
    assert metric_value(records[0], "rounds:train_loss:last") == pytest.approx(0.6)  # mean over clients, last round
    assert metric_value(records[0], "rounds:train_loss:first_half") == pytest.approx(1.1)
    assert metric_value(records[0], "target_accuracy_E") is None
    lines = results_rows(spec, records)
    assert len(lines) == 3 * 4 + 2  # rows a, b, a-e on 4 trials each (b's error included), c on 2
    assert [ln for ln in lines if ln["status"] == "error"][0]["target"] is None  # a failed trial has no value
    text = table(spec, lines)
    assert "| row | -> dom1 | sources (dom1) | -> dom2 | sources (dom2) | mean target | sources (mean) |" in text
    assert "| a | 0.700 ± 0.141 | 0.800 ± 0.000 | 0.500 ± 0.000 | 0.800 ± 0.000 | 0.600 | 0.800 |" in text
    assert "| b | 0.600 ± 0.000 | 0.800 ± 0.000 | 0.400 | 0.800 | 0.500 | 0.800 |" in text  # one seed: no std
    assert "| c | 0.700 ± 0.000 | 0.800 ± 0.000 | n/a | n/a | n/a | n/a |" in text
    verdicts = {c.text: check_claim(spec, lines, c) for c in spec.claims}
    assert verdicts["a above b"] == [  # a mean over seeds that lost one is not the claim's figure
        (
            "not measurable",
            "npz, mean over dom1, dom2: a 0.600 vs b 0.500; needs trial b-dom2-1 (b, dom2, seed 1), which failed",
        )
    ]
    assert verdicts["a at least b and c on dom1"] == [  # a - b: 0 (a tie: in favour), +0.2; a - c: -0.1, +0.1
        (
            "within the spread",
            "npz, target dom1: a 0.700 vs b 0.600, c 0.700; paired by seed: "
            "a over b +0.100 ± 0.141 (n = 2, 2/2 in favour; one-sided p: sign 0.25, t 0.25), "  # t = 1, 1 dof
            "a over c +0.000 ± 0.141 (n = 2, 1/2 in favour; one-sided p: sign 0.75, t 0.5)",
        )
    ]
    assert [v for v, _ in verdicts["c above a on each target"]] == ["within the spread", "not measurable"]
    assert verdicts["b's loss above a's"][0][0] == "not measurable"


def test_ties_count_for_an_at_least_claim_and_against_a_strict_one():
    spec = PaperSpec("toy", SPEC, Path("."))
    records = [_record(spec, run, "dom1", seed, 0.7, [1.0]) for run in ("a", "b", "c") for seed in range(5)]
    claim = next(c for c in spec.claims if c.text == "a at least b and c on dom1")
    assert check_claim(spec, results_rows(spec, records), claim) == [  # 5 ties of 5 in favour: p = 1/32
        (
            "holds",
            "npz, target dom1: a 0.700 vs b 0.700, c 0.700; paired by seed: "
            "a over b +0.000 ± 0.000 (n = 5, 5/5 in favour; one-sided p: sign 0.0312, t n/a), "
            "a over c +0.000 ± 0.000 (n = 5, 5/5 in favour; one-sided p: sign 0.0312, t n/a)",
        )
    ]
    records = [r for r in records if r["params"]["seed"] < 3]  # 3 ties of 3: p = 1/8
    assert check_claim(spec, results_rows(spec, records), claim)[0][0] == "within the spread"
    strict = next(c for c in spec.claims if c.text == "a above b")  # ties under a strict claim: no side wins
    assert check_claim(spec, results_rows(spec, records), strict)[0][0] == "not measurable"  # a has no dom2
    assert judge([0.0] * 5) == "within the spread"
    assert strength([0.0] * 5) == Strength(0.0, 0.0, 5, 0, 0, 1.0, None, 1.0, None)


@pytest.mark.parametrize(
    "differences, strict, verdict",
    [
        ([0.001, 0.030, 0.002], True, "within the spread"),  # all 3 in favour: sign p = 1/8; t p = 0.18
        ([0.001, 0.030, 0.002, 0.05], True, "within the spread"),  # all 4: sign p = 1/16; t p = 0.089
        ([0.001, 0.030, 0.002, 0.05, 0.001], True, "holds"),  # all 5: sign p = 1/32
        ([0.02, 0.03, 0.025], True, "holds"),  # 3 seeds, the t-test's p = 0.0065 (test_the_t_test_by_hand)
        ([0.2, 0.2, -0.01], True, "within the spread"),  # mean 0.13 over std 0.121: t p = 0.10
        ([-0.02, -0.03, -0.025], True, "does not hold"),  # the reverse order at the same strength
        ([-0.01] * 5, False, "does not hold"),  # 5 below 0: sign p = 1/32 for the reverse order
        ([0.001, 0.0, 0.002, 0.001, 0.05], True, "within the spread"),  # a tie is against a strict claim: 4/5
        ([0.001, 0.0, 0.002, 0.001, 0.05], False, "holds"),  # and for an at-least claim: 5/5
        ([0.0] * 5, True, "within the spread"),  # ties favour neither a strict claim nor its reverse
        ([0.01], True, "within the spread"),  # one seed: sign p = 1/2, no t
        ([-0.01], True, "within the spread"),
        ([-0.001] * 15 + [0.1] * 5, True, "within the spread"),  # sign p = 0.021 reversed, t p = 0.013 in favour
        ([], True, "not measurable"),
    ],
)
def test_the_verdict_rule(differences, strict, verdict):
    assert judge(differences, strict) == verdict


def test_the_t_test_by_hand():
    """mean 0.025, std 0.005, n 3: t = 0.025 / (0.005 / sqrt 3) = 5 sqrt 3; with 2 degrees of freedom
    P(T >= t) = (1 - t / sqrt(t^2 + 2)) / 2 = (1 - sqrt(75 / 77)) / 2."""
    s = strength([0.02, 0.03, 0.025])
    assert (s.mean, s.std, s.n, s.favour, s.against) == (pytest.approx(0.025), pytest.approx(0.005), 3, 3, 0)
    assert s.p_t == pytest.approx((1 - math.sqrt(75 / 77)) / 2, rel=1e-9)  # 0.00654
    assert s.p_t_reverse == pytest.approx(1 - s.p_t, rel=1e-9)
    assert (s.p_sign, s.p_sign_reverse) == (0.125, 1.0)  # 3 of 3 in favour; none below 0: P(at least 0) = 1
    s = strength([0.1, 0.3, -0.1, 0.2, 0.0], strict=True)  # sign: 3 of 5, P = (10 + 5 + 1) / 32
    assert (s.favour, s.against, s.p_sign, s.p_sign_reverse) == (3, 1, 0.5, 31 / 32)


RULE = {  # (row, target) -> target accuracy at seeds 0, 1, 2 (None: no line)
    ("a", "dom1"): [0.60, 0.70, 0.80],
    ("b", "dom1"): [0.57, 0.66, 0.78],  # a - b: +0.03, +0.04, +0.02: t = 3 sqrt 3, p = (1 - sqrt(27 / 29)) / 2
    ("c", "dom1"): [0.65, 0.75, 0.70],  # c - a: +0.05, +0.05, -0.10: mean 0
    ("a", "dom2"): [0.50, 0.50, 0.50],
    ("b", "dom2"): [0.52, 0.40, 0.45],  # a - b: -0.02, +0.10, +0.05
}


def _lines(values: dict) -> list[dict]:
    """Hand-made results.csv lines (finished trials of the toy spec), one per (row, target, seed) with a value."""
    return [
        {
            "row": row,
            "label": row,
            "run": row,
            "benchmark": "npz",
            "target_domain": target,
            "seed": seed,
            "status": "finished",
            "trial_id": f"{row}-{target}-{seed}",
            "wall_seconds": 1.0,
            "target": value,
            "source": 0.9,
        }
        for (row, target), per_seed in values.items()
        for seed, value in enumerate(per_seed)
        if value is not None
    ]


def _claim(order, **extra):
    spec = PaperSpec(
        "toy", {**SPEC, "seeds": [0, 1, 2], "claims": [{"claim": "x", "order": order, **extra}]}, Path(".")
    )
    return spec, spec.claims[0]


def test_paired_verdicts_on_hand_made_lines():
    lines = _lines(RULE)
    spec, claim = _claim(["a", "b"], target="dom1")
    assert check_claim(spec, lines, claim) == [
        (
            "holds",
            "npz, target dom1: a 0.700 vs b 0.670; paired by seed: a over b +0.030 ± 0.010 "
            "(n = 3, 3/3 in favour; one-sided p: sign 0.125, t 0.0175)",
        )
    ]
    spec, claim = _claim(["c", "a"], target="dom1")
    assert check_claim(spec, lines, claim) == [
        (
            "within the spread",
            "npz, target dom1: c 0.700 vs a 0.700; paired by seed: c over a +0.000 ± 0.087 "
            "(n = 3, 2/3 in favour; one-sided p: sign 0.5, t 0.5)",
        )
    ]
    spec, claim = _claim(["b", "a"], target="dom1")  # the reverse order reached: its p-values printed too
    assert check_claim(spec, lines, claim)[0] == (
        "does not hold",
        "npz, target dom1: b 0.670 vs a 0.700; paired by seed: b over a -0.030 ± 0.010 "
        "(n = 3, 0/3 in favour; one-sided p: sign 1, t 0.982; reverse: sign 0.125, t 0.0175)",
    )
    # over two targets a seed's difference is the mean over the targets: +0.005, +0.070, +0.035
    spec, claim = _claim(["a", "b"], benchmark="npz")
    assert check_claim(spec, lines, claim) == [
        (
            "within the spread",
            "npz, mean over dom1, dom2: a 0.600 vs b 0.563; paired by seed: a over b +0.037 ± 0.033 "
            "(n = 3, 3/3 in favour; one-sided p: sign 0.125, t 0.0951)",
        )
    ]
    spec, claim = _claim(["a", "b"], per_target=True)
    assert [verdict for verdict, _ in check_claim(spec, lines, claim)] == ["holds", "within the spread"]


def test_a_chain_holds_only_when_every_adjacent_pair_holds():
    lines = _lines({**RULE, ("c", "dom1"): [0.55, 0.63, 0.77]})  # b - c: +0.02, +0.03, +0.01
    spec, claim = _claim(["a", "b", "c"], target="dom1")
    verdict, figures = check_claim(spec, lines, claim)[0]
    assert verdict == "holds"
    assert figures.endswith(
        "a over b +0.030 ± 0.010 (n = 3, 3/3 in favour; one-sided p: sign 0.125, t 0.0175), "
        "b over c +0.020 ± 0.010 (n = 3, 3/3 in favour; one-sided p: sign 0.125, t 0.0371)"  # t = 2 sqrt 3
    )
    lines = _lines(RULE)  # b - c: -0.08, -0.09, +0.08 (within the spread): the chain is not shown
    assert check_claim(spec, lines, claim)[0][0] == "within the spread"
    spec, claim = _claim(["b", "a", "c"], target="dom1")  # b below a, separated: the chain does not hold
    assert check_claim(spec, lines, claim)[0][0] == "does not hold"
    spec, claim = _claim(["a", ["b", "c"]], target="dom1")  # a group: a above each of its rows
    assert check_claim(spec, lines, claim)[0][1].endswith(
        "a over b +0.030 ± 0.010 (n = 3, 3/3 in favour; one-sided p: sign 0.125, t 0.0175), "
        "a over c +0.000 ± 0.087 (n = 3, 1/3 in favour; one-sided p: sign 0.875, t 0.5)"
    )


def test_unpaired_seeds_are_named_and_left_out():
    values = {**RULE, ("b", "dom1"): [0.57, 0.66, None], ("c", "dom1"): [0.65, None, None]}
    lines = _lines(values)
    spec, claim = _claim(["a", "b"], target="dom1")
    assert check_claim(spec, lines, claim) == [  # the means keep every seed, the pairs the complete ones
        (
            "holds",  # +0.03, +0.04: t = 7 with 1 dof, p = 1/2 - atan(7) / pi
            "npz, target dom1: a 0.700 vs b 0.615; paired by seed: a over b +0.035 ± 0.007 "
            "(n = 2, 2/2 in favour; one-sided p: sign 0.25, t 0.0452; seed 2 unpaired: no b on dom1)",
        )
    ]
    spec, claim = _claim(["c", "b"], target="dom1")
    assert check_claim(spec, lines, claim)[0] == (
        "within the spread",  # one pair: its sign alone is a fair coin's
        "npz, target dom1: c 0.650 vs b 0.615; paired by seed: c over b +0.080 (n = 1, 1/1 in favour; one-sided p: "
        "sign 0.5, t n/a; seed 1 unpaired: no c on dom1)",  # seed 2 has neither: no pair to leave out
    )
    spec, claim = _claim(["a", "b"], benchmark="npz")  # seed 2 lacks b on dom1: left out on both targets
    assert check_claim(spec, lines, claim)[0][1].endswith(
        "a over b +0.037 ± 0.046 (n = 2, 2/2 in favour; one-sided p: sign 0.25, t 0.227; "  # t = 0.0375 / 0.0325
        "seed 2 unpaired: no b on dom1)"
    )
    assert paired_differences(lines, "npz", ["dom1"], ("c", "target"), ("a", "target")) == (
        {0: pytest.approx(0.05)},
        {1: ["c on dom1"], 2: ["c on dom1"]},
    )
    values = {("a", "dom1"): [0.6, None, None], ("b", "dom1"): [None, 0.5, None]}
    spec, claim = _claim(["a", "b"], target="dom1")
    assert check_claim(spec, _lines(values), claim)[0] == (
        "not measurable",
        "npz, target dom1: a 0.600 vs b 0.500; paired by seed: a over b (no seed with both rows; seed 0 unpaired: "
        "no b on dom1; seed 1 unpaired: no a on dom1)",
    )


def test_claims_text_prints_the_rule_and_each_pair():
    spec, _ = _claim(["a", "b"], target="dom1")
    text = claims_text(spec, _lines(RULE))
    assert text.startswith("# The claims of toy, as measured here\n\nEach figure is the mean over seeds (0, 1, 2)")
    assert (
        "A pair's order is separated when either p is at most 0.05: every seed in favour reaches that by the sign "
        "test from 5 seeds on (p = 0.031), not at 3 (0.125) or 4 (0.062), where the t-test must. A claim **holds** "
        "when every pair's order is separated; it **does not hold** when some pair's reverse order is" in text
    )
    assert "a tie stays in n, against a strict claim's order and the reverse order, for an 'at or above' claim" in text
    assert text.endswith(
        "- x: **holds** (npz, target dom1: a 0.700 vs b 0.670; paired by seed: a over b +0.030 ± 0.010 "
        "(n = 3, 3/3 in favour; one-sided p: sign 0.125, t 0.0175))\n"
    )


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"rowz": []}, "unknown key 'rowz' in spec toy: did you mean 'rows'?"),
        ({"rows": [{"name": "a", "run": "zz"}]}, "row a names an unknown run 'zz'"),
        ({"claims": [{"claim": "x", "order": ["a", "q"]}]}, "claim 'x' names an unknown row 'q'"),
        ({"claims": [{"claim": "x", "order": ["a"]}]}, "order needs two or more rows"),
        ({"claims": [{"claim": "x", "order": ["a:speed", "b"]}]}, "row a has no metric 'speed'"),
        (
            {"runs": {"a": {"config": "nowhere.yaml"}}, "rows": [{"name": "a"}], "claims": []},
            "config file 'nowhere.yaml' is neither",
        ),
        ({"benchmarks": {"npz": {"targets": []}}}, "benchmark npz lists no targets"),
        ({"seeds": [0, "1"]}, "spec toy: seeds must be a list of integers of 0 or more, e.g. [0, 1, 2], got [0, '1']"),
        ({"seeds": []}, "spec toy: seeds must be a list of integers"),
        ({"benchmarks": {"npz": {"targets": ["dom1"], "seeds": [0, 0]}}}, "benchmark npz: seeds lists a seed twice"),
        ({"runs": {**SPEC["runs"], "a": {"seeds": [-1]}}}, "run a: seeds must be a list of integers of 0 or more"),
        ({"runs": {**SPEC["runs"], "a": {"seed": [1]}}}, "unknown key 'seed' in run a: did you mean 'seeds'?"),
        (
            {"quick": {"benchmarks": {"npz": {"seeds": [0]}}}},
            "quick.benchmarks.npz: give the quick grid's seeds as quick.seeds",
        ),
    ],
)
def test_bad_specs_name_the_problem(change, expected):
    with pytest.raises(UserError) as error:
        to_sweep(shrink(PaperSpec("toy", {**SPEC, **change}, Path(".")), "quick" in change, None))
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_seeds_per_benchmark_and_per_run():
    """A benchmark's ``seeds`` replace the spec's for its trials, a run's replace both; the grid then holds one
    point per variant and seed (``<variant>#<seed>``, the seed in its overrides), and the outputs name the seeds.
    ``--seeds`` and ``quick.seeds`` replace them all."""
    raw = {
        **SPEC,
        "seeds": [0, 1],
        "benchmarks": {"npz": {"targets": ["dom1", "dom2"], "seeds": [0, 1, 2, 3, 4]}},
        "runs": {"a": {}, "b": {"seeds": [0, 1, 2]}, "c": {"only": {"npz": ["dom1"]}}},
        "quick": {"seeds": [7]},
    }
    spec = PaperSpec("toy", raw, Path("."))
    assert (spec.seeds_of("a", "npz"), spec.seeds_of("b", "npz")) == ([0, 1, 2, 3, 4], [0, 1, 2])
    assert spec.seeds_text() == "0, 1 (benchmark npz: 0, 1, 2, 3, 4; run b: 0, 1, 2)"
    sweep = to_sweep(spec)
    points = sweep.points()
    assert list(sweep.axes) == ["spec.variant"] and len(points) == 2 * 5 + 2 * 3 + 5
    assert points[:2] == [{"spec.variant": "a@npz.dom1#0"}, {"spec.variant": "a@npz.dom1#1"}]
    configs = {p["spec.variant"]: sweep.config_for(p) for p in points}
    assert configs["b@npz.dom2#2"].run.seed == 2 and configs["b@npz.dom2#2"].data.target == "dom2"
    assert "b@npz.dom2#3" not in configs and configs["c@npz.dom1#4"].run.seed == 4
    assert sweep.variants["a@npz.dom1"]["overrides"] + ["run.seed=3"] == sweep.variants["a@npz.dom1#3"]["overrides"]
    records = [  # Tune's records of such a grid carry the point's name, no seed
        {"trial_id": f"t{i}", "status": "finished", "params": {"variant": name}, "summary": {"target_accuracy": 0.5}}
        for i, name in enumerate(configs)
    ]
    lines = results_rows(spec, records)
    assert sorted({(ln["row"], ln["target_domain"], ln["seed"]) for ln in lines if ln["row"] in ("b", "c")}) == [
        ("b", t, s) for t in ("dom1", "dom2") for s in (0, 1, 2)
    ] + [("c", "dom1", s) for s in range(5)]
    assert "over seeds 0, 1 (benchmark npz: 0, 1, 2, 3, 4; run b: 0, 1, 2) (one seed" in table(spec, lines)
    assert "Each figure is the mean over seeds (0, 1 (benchmark npz: 0, 1, 2, 3, 4; run b: 0, 1, 2))" in claims_text(
        spec, lines
    )
    for quick, seeds in ((True, None), (False, [5, 6])):
        small = shrink(spec, quick, seeds)
        assert small.uniform_seeds() and small.seeds == (seeds or [7])
        assert list(to_sweep(small).axes) == ["spec.variant", "run.seed"]
    same = PaperSpec(
        "toy", {**raw, "benchmarks": {"npz": {"targets": ["dom1"], "seeds": [0, 1]}}, "runs": SPEC["runs"]}, Path(".")
    )
    assert same.uniform_seeds() and same.seeds_text() == "0, 1"  # the spec's own seeds again: one product grid


def test_results_csv_reads_back_as_written(tmp_path):
    spec = PaperSpec("toy", SPEC, Path("."))
    records = [
        _record(spec, "a", "dom1", 0, 0.6123456789012345, [1.0, 0.5]),
        _record(spec, "b", "dom1", 1, 0.0, [2.0, 0.9], status="error") | {"error": "b, round 1: loss is nan"},
        _record(spec, "c", "dom1", 1, 0.7, [1.0, 1.0]) | {"wall_seconds": 12.345},
    ]
    lines = results_rows(spec, records)
    path = write_results_csv(tmp_path / "results.csv", lines)
    assert read_results_csv(path, spec) == lines
    assert any("error" in ln for ln in lines) and any(ln["target"] is None for ln in lines)
    other = PaperSpec("other", {**SPEC, "rows": [{"name": "a"}, {"name": "b"}], "claims": []}, Path("."))
    with pytest.raises(UserError, match="line 4 names row 'c', which spec other does not have"):
        read_results_csv(path, other)
    with pytest.raises(UserError, match="has the column loss, a metric no row of spec"):
        read_results_csv(path, PaperSpec("other", {**SPEC, "metrics": {}, "claims": []}, Path(".")))
    with pytest.raises(UserError, match="does not exist"):
        read_results_csv(tmp_path / "none.csv", spec)


ROOT = Path(__file__).resolve().parents[1]


def test_tables_only_rewrites_a_committed_directory_byte_for_byte(tmp_path, capsys):
    """``--tables-only`` reads results/fada/results.csv back and writes its table.md and claims.md as committed."""
    out = tmp_path / "fada"
    out.mkdir()
    (out / "results.csv").write_bytes((ROOT / "results" / "fada" / "results.csv").read_bytes())
    spec = str(ROOT / "experiments" / "specs" / "results" / "fada.yaml")
    assert main(["reproduce", "--spec", spec, "--out", str(out), "--tables-only"]) == 0
    assert "tables of fada rewritten from" in capsys.readouterr().out
    for name in ("table.md", "claims.md"):
        assert (out / name).read_bytes() == (ROOT / "results" / "fada" / name).read_bytes(), name
    assert sorted(p.name for p in out.iterdir()) == ["claims.md", "results.csv", "table.md"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--backend", "local"], "--tables-only runs nothing: drop --backend"),
        (["--resume"], "--tables-only runs nothing: drop --resume"),
        (["--quick"], "--quick and --seeds go with PAPER or --spec"),
        ([], "holds no reproduce.json: give the spec that made it"),
        (["fada"], "results.csv does not exist"),
    ],
)
def test_tables_only_bad_input_is_one_line(args, expected, tmp_path, capsys):
    assert main(["reproduce", "-q", "--tables-only", "--out", str(tmp_path)] + args) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, expected",
    [
        (["fad"], "unknown paper 'fad': did you mean 'fada'?"),
        ([], "give a paper (fada, feddadil, fedod, privacy, privacy-record, selection) or --spec FILE, not neither"),
        (["fada", "--spec", "x.yaml"], "not both"),
        (["--spec", "/nonexistent/spec.yaml"], "spec file /nonexistent/spec.yaml does not exist"),
        (["fada", "--seeds", "0,-1"], "--seeds must be an integer of 0 or more, got '-1'"),
        (["fada", "--seeds", "0,0"], "lists '0' twice"),
        (["fada", "--resume"], "--resume takes the grid from the directory's reproduce.json: drop PAPER"),
        (["--resume"], "--resume needs --out DIR"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(args, expected, tmp_path, capsys):
    out = tmp_path / "never"
    code = main(["reproduce", "-q"] + args + ([] if "--resume" in args and "fada" not in args else ["--out", str(out)]))
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_bad_trial_config_is_refused_before_anything_is_written(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        json.dumps(
            {
                "paper": "bad",
                "benchmarks": {"digits": {"targets": ["usps"]}},
                "runs": {"od": {"set": ["method.name=fedod"]}},
                "rows": [{"name": "od"}],
            }
        )
    )
    assert main(["reproduce", "-q", "--spec", str(spec), "--out", str(tmp_path / "never")]) == 2
    assert "pick a detection benchmark" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_fada_quick_end_to_end_then_resume(tmp_path, ray_cluster, capsys):
    """The FADA protocol's quick grid as Ray Tune trials (clients in each trial's process): every output, every
    claim judged with its figures; --resume of the finished grid runs nothing again and writes the same table.
    The spec is the shipped one with the digits cache in a temporary folder."""
    import yaml

    raw = yaml.safe_load((Path(__file__).parents[1] / "experiments" / "specs" / "fada.yaml").read_text())
    raw["set"].append(f"data.cache_dir={tmp_path / 'cache'}")
    raw["benchmarks"] = {"digits": raw["benchmarks"]["digits"]}  # the digits half: TEP's trials add CI time, not paths
    raw["quick"]["targets"] = {"digits": raw["quick"]["targets"]["digits"]}
    kept = [
        "fedavg",
        "fada-I",
        "fada-II",
        "fada-III",
    ]  # the ablation's core: the shipped grid's other rows cost CI time
    raw["runs"] = {name: run for name, run in raw["runs"].items() if name in kept}
    raw["rows"] = [row for row in raw["rows"] if row["name"] in kept]

    def names(order):
        return [n for item in order for n in (item if isinstance(item, list) else [item])]

    raw["claims"] = [c for c in raw["claims"] if set(names(c["order"])) <= set(kept)]
    assert len(raw["claims"]) >= 2
    spec_file = tmp_path / "fada.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    assert main(["reproduce", "--spec", str(spec_file), "--quick", "--backend", "local", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = _rows(out / "results.csv")
    assert [ln["row"] for ln in lines] == [row["name"] for row in raw["rows"]]
    assert {(ln["benchmark"], ln["target_domain"], ln["seed"], ln["status"]) for ln in lines} == {
        ("digits", "usps", "0", "finished")
    }
    for ln in lines:
        assert 0 <= float(ln["target"]) <= 1 and 0 <= float(ln["source"]) <= 1
        summary = json.loads((out / "runs" / ln["trial_id"] / "summary.json").read_text())
        assert summary["target_accuracy"] == pytest.approx(float(ln["target"]))
        assert summary["rounds"] == 2 and summary["backend"] == "local"
    table_text = (out / "table.md").read_text()
    fada3 = next(ln for ln in lines if ln["row"] == "fada-III")
    assert f"| FADA III: + disentangle | {float(fada3['target']):.3f} | {float(fada3['source']):.3f} |" in table_text
    assert table_text in printed
    claims = (out / "claims.md").read_text().splitlines()
    verdicts = [line for line in claims if line.startswith("- ")]
    assert len(verdicts) == len(raw["claims"]), claims
    for v in verdicts:  # one seed separates no order: its sign alone is a fair coin's (p = 1/2, no t-test)
        assert "**within the spread**" in v, v
        assert "(n = 1, " in v and "/1 in favour; one-sided p: sign " in v and ", t n/a" in v, v
    assert f"fada-III {float(fada3['target']):.3f}" in verdicts[0]
    for name in ("accuracy-digits.png", "accuracy_per_round-digits.png", "series-attention.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = {p.name for p in out.iterdir() if p.is_file()} - {STATE_FILE, SPEC_FILE}
    assert written == set(output_names(shrink(load_spec(None, str(spec_file)), True, None)))
    assert main(["reproduce", "-q", "--resume", "--out", str(out)]) == 0
    assert _rows(out / "results.csv") == lines  # same trials, same wall times: nothing ran again
    assert (out / "table.md").read_text() == table_text
    claims_text_written = (out / "claims.md").read_text()
    (out / "table.md").unlink()
    (out / "claims.md").write_text("stale")
    assert main(["reproduce", "-q", "--tables-only", "--out", str(out)]) == 0  # the spec from reproduce.json
    assert (out / "table.md").read_text() == table_text and (out / "claims.md").read_text() == claims_text_written
    assert main(["reproduce", "-q", "--spec", str(spec_file), "--quick", "--out", str(out)]) == 2
    assert "already holds a reproduction: pass --resume" in capsys.readouterr().err


def test_round_curves_average_the_seeds_and_spread_by_their_sample_std():
    """The series plots' line is the mean over seeds and the shaded band +- the sample std (0 with one seed);
    a per-client metric (dil_loss/<client>) is first averaged over the clients of each round."""
    from fedsim.experiments.reproduce_plots import _by_round

    seeds = [
        {
            "round_metrics": [
                {"round": 1, "dil_loss/0": 10.0, "dil_loss/1": 20.0},
                {"round": 2, "dil_loss/0": 4.0, "dil_loss/1": 6.0},
            ]
        },
        {
            "round_metrics": [
                {"round": 1, "dil_loss/0": 30.0, "dil_loss/1": 40.0},
                {"round": 2, "dil_loss/0": 6.0, "dil_loss/1": 8.0},
            ]
        },
    ]
    rounds, mean, spread = _by_round(seeds, "dil_loss")
    assert rounds == [1, 2] and mean == [25.0, 6.0]
    assert spread == pytest.approx([2**0.5 * 10, 2**0.5])  # sample std of (15, 35) and (5, 7)
    assert _by_round(seeds[:1], "dil_loss")[2] == [0.0, 0.0]


def test_trials_run_in_process_on_this_machine_and_on_client_actors_on_a_cluster_or_gpus():
    """Without --backend: a grid on this machine's own cluster keeps one trial per CPU running (local backend);
    joining a cluster or asking for GPUs puts the clients on Ray actors."""
    from fedsim.config import load_config
    from fedsim.experiments.reproduce import default_backend

    cpu, gpu = load_config(None, []), load_config(None, ["resources.gpus_per_client=0.5"])
    assert default_backend(None, [cpu, cpu]) == "local"
    assert default_backend("auto", [cpu]) == "ray"
    assert default_backend(None, [cpu, gpu]) == "ray"
