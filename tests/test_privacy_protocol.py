"""`fedsim reproduce privacy`: the shipped privacy protocol (experiments/specs/privacy.yaml) runs each method without
privacy and at epsilon 16, 4 and 1 (delta 1e-5, central mode), every private run is its method's run plus a privacy
section whose clips follow the rule of the spec's header, the quick grid runs on the digits alone within each
budget, and the accuracy-against-epsilon plot groups and places its points."""

import copy
import csv
import dataclasses
import json
import math

import pytest
from test_amazon_review import write_npz

from fedsim.data.scenario import build_federation
from fedsim.experiments.cli import main
from fedsim.experiments.reproduce import output_names
from fedsim.experiments.reproduce_data import DATA_DIR_VARIABLE, resolve_data_roots
from fedsim.experiments.reproduce_plots import EpsilonCurve, epsilon_curves, epsilon_points, plot_names
from fedsim.experiments.reproduce_spec import PaperSpec, load_spec, shrink, to_sweep
from fedsim.experiments.sweep_grid import VARIANT_KEY
from fedsim.privacy.exchanges import EACH, UNIFORM, WEIGHTED, population
from fedsim.privacy.protocol import RunPrivacy
from fedsim.registry import METHODS

METHODS_RUN = {"fedavg": "fedavg", "feddann": "feddann", "fada": "fada", "feddadil": "feddadil"}
BUDGETS = (16, 4, 1)
TARGETS = {"digits": ["mnistm", "usps"], "amazon": ["books", "dvd", "electronics", "kitchen"]}
#: the spec header's M: the median norm of each stage's unclipped contributions, one significant digit
#: (FADA's "*": its model-level stages, disentangle and update, and its features, all capped alike)
MEDIANS = {
    "digits": {
        "fedavg": {"fit": 0.7},
        "feddann": {"fit": 0.1, "features": 7},
        "fada": {"disentangle": 2, "features": 3, "update": 2, "adversarial": 2e-6},
        "feddadil": {"fit": 1, "dil": 600},
    },
    "amazon": {
        "fedavg": {"fit": 4},
        "feddann": {"fit": 1, "features": 40},
        "fada": {"disentangle": 4, "features": 20, "update": 2, "adversarial": 7e-6},
        "feddadil": {"dil": 1000},
    },
}
NOISE_PER_ENTRY = 0.01  # the header's s0


def _configs(spec, seed=0):
    """(run, benchmark, target) -> the trial's config at ``seed``."""
    sweep = to_sweep(spec)
    return {
        (run, bench, target): sweep.config_for({VARIANT_KEY: name, "run.seed": seed})
        for name, run, bench, target in spec.variants()
    }


def _budget(run: str):
    """The epsilon a run's name states (``fedavg-eps4`` -> 4), None for a run without privacy."""
    method, _, budget = run.partition("-eps")
    assert method in METHODS_RUN, run
    return int(budget) if budget else None


def test_the_spec_runs_each_method_at_each_budget_beside_its_run_without_privacy():
    spec = load_spec("privacy", None)
    runs = [f"{m}{suffix}" for m in METHODS_RUN for suffix in ("", *(f"-eps{e}" for e in BUDGETS))]
    assert list(spec.runs) == runs and [row.name for row in spec.rows] == runs
    assert {b: s["targets"] for b, s in spec.benchmarks.items()} == TARGETS
    assert spec.uniform_seeds() and spec.seeds == [0, 1, 2]
    assert len(spec.variants()) * len(spec.seeds) == 16 * 6 * 3 == 288  # the grid's cost: the spec's header
    configs = _configs(spec)
    for (run, bench, target), config in configs.items():
        assert config.method.name == METHODS_RUN[run.partition("-")[0]]
        assert config.data.target == target
        if bench == "digits":  # LeNet-5 (no batch norm), 1000 images, 10 rounds (FedDaDiL: 5 encoder + 20)
            rounds = 25 if config.method.name == "feddadil" else 10
            assert (config.model.name, config.data.max_train_per_domain, config.run.rounds) == ("lenet5", 1000, rounds)
        else:
            assert (config.data.max_train_per_domain, config.run.rounds) == (None, 20)
        assert config.run.eval_every >= config.run.rounds  # one evaluation, after the last round
        budget = _budget(run)
        if budget is None:
            assert not config.privacy.active
            continue
        privacy = config.privacy
        assert privacy.active and privacy.mode == "central" and privacy.accountant == "rdp"
        assert (privacy.epsilon, privacy.delta, privacy.noise_multiplier) == (budget, 1e-5, None)
        assert privacy.clip is not None and privacy.clip > 0 and not privacy.stages  # every training stage
        # the private run is its method's run without privacy plus the privacy section, nothing else
        reference = configs[(run.partition("-eps")[0], bench, target)]
        assert dataclasses.replace(config, privacy=reference.privacy) == reference, (run, bench, target)


def _floor2(value: float) -> float:
    """Two significant digits, rounded down (the header's rounding of the cap)."""
    scale = 10 ** (math.floor(math.log10(value)) - 1)
    return math.floor(value / scale + 1e-9) * scale


@pytest.mark.parametrize("bench", ["digits", "amazon"])
def test_each_clip_is_the_median_norm_capped_at_the_noise_per_entry(bench, tmp_path, monkeypatch):
    """The header's rule on every stage a private run noises and calls: C = min(M, s0 D / z), the cap rounded down
    to two significant digits, so each entry of what the server combines carries noise of std z C / D <= s0
    (D = sum(w) / max(w) on FedAvg's weighted mean, 1 on a stage whose replies are used one by one; z the run's
    calibrated multiplier). Amazon's z is computed on a few rows in the release's layout: it depends on the rounds'
    exchanges alone; its D on the real files is 2.9994 (sources of 1599, 1598 and 1599 rows), 3 here."""
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    (tmp_path / "amazon_review").mkdir()
    write_npz(tmp_path / "amazon_review")
    spec = resolve_data_roots(load_spec("privacy", None), str(tmp_path), {})
    checked = 0
    for (run, where, target), config in _configs(spec).items():
        if where != bench or target != TARGETS[bench][0] or _budget(run) is None:
            continue
        federation = build_federation(config.data)
        method = METHODS.get(config.method.name)(config, federation, device="cpu")
        privacy = RunPrivacy(config, federation, method)
        z = privacy.noise_multiplier
        called = {op for rnd in range(1, config.run.rounds + 1) for op, _ in privacy.exchanges.calls(rnd, method)}
        medians = MEDIANS[bench][config.method.name]
        assert set(medians) <= called
        for operation in called:
            stage = privacy.stages[operation]
            divisor = {WEIGHTED: 3.0, UNIFORM: population(stage.senders, federation), EACH: 1.0}[stage.combined]
            clip = privacy.clips[operation]
            cap = NOISE_PER_ENTRY * divisor / z
            assert clip == pytest.approx(min(medians[operation], _floor2(cap)), rel=1e-12), (run, operation)
            assert z * clip / divisor <= NOISE_PER_ENTRY * (1 + 1e-9), (run, operation)
            checked += 1
    assert checked == 3 * (1 + 2 + 4 + (2 if bench == "digits" else 1))  # budgets x stages called


def test_the_quick_grid_leaves_amazon_out(monkeypatch):
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    quick = resolve_data_roots(shrink(load_spec("privacy", None), True, None), None, {})  # no data directory
    assert {b: s["targets"] for b, s in quick.benchmarks.items()} == {"digits": ["usps"]} and quick.seeds == [0]
    configs = _configs(quick)
    assert len(configs) == 16 and {c.run.rounds for c in configs.values()} == {2}
    assert {c.data.max_train_per_domain for c in configs.values()} == {100}
    assert {c.method.params.encoder_rounds for c in configs.values() if c.method.name == "feddadil"} == {1}
    assert {c.method.params.adversarial_steps for c in configs.values() if c.method.name == "fada"} == {2}
    assert {_budget(run): c.privacy.epsilon for (run, _, _), c in configs.items()} == {None: None, 16: 16, 4: 4, 1: 1}


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_quick_protocol_runs_end_to_end_within_each_budget(tmp_path, ray_cluster, monkeypatch, capsys):
    """`fedsim reproduce privacy --quick --backend local` without any data directory: every trial finishes, a
    private one spends its budget and no more (the calibration's target), the table, the claims and the plots are
    written, accuracy against epsilon among them."""
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    out = tmp_path / "out"
    code = main(["reproduce", "-q", "privacy", "--quick", "--backend", "local", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    lines = _csv(out / "results.csv")
    assert [ln["row"] for ln in lines] == list(load_spec("privacy", None).runs)
    assert {(ln["benchmark"], ln["target_domain"], ln["seed"], ln["status"]) for ln in lines} == {
        ("digits", "usps", "0", "finished")
    }
    for line in lines:
        summary = json.loads((out / "runs" / line["trial_id"] / "summary.json").read_text())
        budget = _budget(line["row"])
        if budget is None:
            assert "privacy_epsilon" not in summary and line["epsilon"] == ""
            continue
        spent = summary["privacy_epsilon"]
        assert budget * 0.999 <= spent <= budget, line["row"]
        assert float(line["epsilon"]) == pytest.approx(spent)
        assert summary["privacy_delta"] == 1e-5 and summary["privacy_noise_multiplier"] > 0
    spec = shrink(load_spec("privacy", None), True, None)
    for name in output_names(spec):
        assert (out / name).is_file(), name
    assert "accuracy_epsilon-digits.png" in output_names(spec)
    assert (out / "accuracy_epsilon-digits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    claims = (out / "claims.md").read_text()
    assert claims.count("\n- ") == 8 and "not measurable" not in claims


def test_epsilon_curves_group_each_method_with_its_run_without_privacy():
    spec = load_spec("privacy", None)
    for bench in TARGETS:
        curves = epsilon_curves(spec, bench)
        assert curves == [
            EpsilonCurve(m, [f"{m}-eps{e}" for e in BUDGETS], m) for m in ("fedavg", "feddann", "fada", "feddadil")
        ]
    fada = load_spec("fada", None)  # no private run: no curve, no plot
    assert all(epsilon_curves(fada, bench) == [] for bench in fada.benchmarks)
    assert not any(name.startswith("accuracy_epsilon") for name in plot_names(fada))
    raw = copy.deepcopy(spec.raw)  # a run whose other settings differ is a curve of its own, without a reference
    raw["runs"]["fedavg-eps4"]["set"] = [*raw["runs"]["fedavg-eps4"]["set"], "method.lr=0.01"]
    changed = epsilon_curves(PaperSpec("privacy", raw, spec.origin), "digits")
    assert changed[:2] == [
        EpsilonCurve("fedavg", ["fedavg-eps16", "fedavg-eps1"], "fedavg"),
        EpsilonCurve("fedavg-eps4", ["fedavg-eps4"], None),
    ]


def test_epsilon_points_are_the_means_over_seeds_of_the_spent_epsilon_and_the_target_metric():
    curve = EpsilonCurve("a", ["a-eps4", "a-eps1"], "a")
    lines, records = [], []
    values = {("a-eps4", 0): (3.999, 0.6), ("a-eps4", 1): (3.998, 0.4), ("a-eps1", 0): (0.999, 0.2)}
    for (row, seed), (spent, accuracy) in values.items():
        trial = f"{row}-{seed}"
        lines.append({"row": row, "benchmark": "b", "target_domain": "t", "trial_id": trial, "target": accuracy})
        records.append({"trial_id": trial, "status": "finished", "summary": {"privacy_epsilon": spent}})
    lines.append({"row": "a-eps1", "benchmark": "b", "target_domain": "t", "trial_id": "failed", "target": None})
    records.append({"trial_id": "failed", "status": "error", "summary": {}})
    lines.append({"row": "a-eps1", "benchmark": "b", "target_domain": "other", "trial_id": "x", "target": 0.9})
    records.append({"trial_id": "x", "status": "finished", "summary": {"privacy_epsilon": 1.0}})
    points = epsilon_points(curve, records, lines, "b", "t")
    assert points == [
        pytest.approx((0.999, 0.2, 0.0)),
        pytest.approx((3.9985, 0.5, math.sqrt(0.02))),  # sample std of 0.6 and 0.4
    ]
    assert epsilon_points(curve, records, lines, "b", "absent") == []
