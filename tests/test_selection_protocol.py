"""`fedsim reproduce selection`: the shipped selection protocol (experiments/specs/selection.yaml) sweeps each
method's key hyperparameter with its default configuration among the candidates, every trial reports the seven
label-free scores on a 20 % source validation part, and its quick grid runs on the embedded digits alone and writes
the selection report (default, each score's pick, oracle)."""

import copy
import csv
import json

import pytest

from fedsim.errors import UserError
from fedsim.experiments.cli import main
from fedsim.experiments.reproduce_data import DATA_DIR_VARIABLE, resolve_data_roots
from fedsim.experiments.reproduce_spec import PaperSpec, default_run, load_spec, shrink, to_sweep
from fedsim.experiments.sweep_grid import VARIANT_KEY
from fedsim.selection import SCORES

SEVEN = ["source_accuracy", "source_loss", "entropy", "snd", "mano", "iwv", "dev"]
#: group -> its runs in the group's order (the default first), each with its values of the swept keys
GRID = {
    "fedavg": {"fedavg": {"lr": 0.05}, "fedavg-lr0.01": {"lr": 0.01}, "fedavg-lr0.1": {"lr": 0.1}},
    "feddann": {
        "feddann": {"lambda_domain": 0.1},
        "feddann-l0.01": {"lambda_domain": 0.01},
        "feddann-l1": {"lambda_domain": 1.0},
    },
    "fedmmd": {
        "fedmmd": {"lambda_domain": 0.1},
        "fedmmd-l0.01": {"lambda_domain": 0.01},
        "fedmmd-l1": {"lambda_domain": 1.0},
    },
    "fada": {"fada": {"lambda_adv": 0.01}, "fada-adv0.001": {"lambda_adv": 0.001}, "fada-adv0.1": {"lambda_adv": 0.1}},
    "feddadil": {
        "feddadil": {"lr_atoms": 10.0, "num_atoms": 5},
        "feddadil-lr1": {"lr_atoms": 1.0, "num_atoms": 5},
        "feddadil-lr100": {"lr_atoms": 100.0, "num_atoms": 5},
        "feddadil-k3": {"lr_atoms": 10.0, "num_atoms": 3},
        "feddadil-k8": {"lr_atoms": 10.0, "num_atoms": 8},
    },
}
TARGETS = {"digits": ["mnistm", "usps"], "amazon": ["books", "kitchen"], "office_googlenet": ["amazon", "webcam"]}


def _swept(config, key):
    """A swept key's value: a field of the method section (lr), else of the method's own parameters."""
    return getattr(config.method, key) if hasattr(config.method, key) else getattr(config.method.params, key)


def _configs(spec: PaperSpec, drop_keys=frozenset()) -> dict[tuple[str, str, str], object]:
    """(run, benchmark, target) -> the trial's config at seed 0, with every override of a ``drop_keys`` key (spec,
    benchmark or run) left out: what the run gets from its config file and the library alone for those keys."""
    sweep = to_sweep(spec)
    out = {}
    for name, run, bench, target in spec.variants():
        variant = copy.deepcopy(sweep.variants[name])
        variant["overrides"] = [o for o in variant["overrides"] if o.split("=", 1)[0] not in drop_keys]
        sweep.variants[name] = variant
        out[(run, bench, target)] = sweep.config_for({VARIANT_KEY: name, "run.seed": 0})
    return out


def _digits_default(group: str, runs: dict) -> str:
    """A group's default on the digits: the run a plain run of its method matches (lambda 1 for FedDANN and FedMMD,
    the library's: the digits have no recipe for them), else the group's first run."""
    return f"{group}-l1" if group in ("feddann", "fedmmd") else next(iter(runs))


def test_the_spec_sweeps_each_method_on_three_benchmarks_with_every_score():
    spec = load_spec("selection", None)
    assert spec.select.scores == SEVEN == list(SCORES)
    assert {name: g.runs for name, g in spec.select.groups.items()} == {name: list(runs) for name, runs in GRID.items()}
    assert {run for runs in GRID.values() for run in runs} == set(spec.runs)
    assert {b: s["targets"] for b, s in spec.benchmarks.items()} == TARGETS
    assert spec.uniform_seeds() and spec.seeds == [0, 1, 2]
    assert len(spec.variants()) * len(spec.seeds) == 17 * 6 * 3 == 306  # the grid's cost: docs/selection.md
    for (run, bench, target), config in _configs(spec).items():
        assert config.data.validation_fraction == 0.2
        assert config.run.scores == ",".join(SEVEN)
        assert config.run.eval_every >= config.run.rounds  # one evaluation, after the last round
        assert config.data.target == target
        cut = (400, 10) if bench == "digits" else (None, 20)
        rounds = cut[1] + (15 if bench == "digits" and run.startswith("feddadil") else 0)  # 5 encoder + 20
        assert (config.data.max_train_per_domain, config.run.rounds) == (cut[0], rounds), (run, bench)


def test_each_group_base_is_its_config_file_and_its_default_a_plain_run():
    """The first run of each group is what its config file and the library give without any override of the
    swept keys; every other candidate differs from it in the swept keys alone, by the values of GRID. The group's
    default is the run a plain run of the method matches: lambda 1 (the library's) for FedDANN and FedMMD on the
    digits, which have no recipe; elsewhere the first run (lambda 0.1 is their recipe on Amazon and Office)."""
    spec = load_spec("selection", None)
    configs = _configs(spec)
    for group, runs in GRID.items():
        keys = {key for values in runs.values() for key in values}
        dotted = {f"method.{key}" for key in keys}
        bare = _configs(spec, drop_keys=dotted)
        default = next(iter(runs))
        for (run, bench, target), config in configs.items():
            if run not in runs:
                continue
            found = default_run(spec, spec.select.groups[group])({"benchmark": bench, "target": target})["run"]
            digits_l1 = group in ("feddann", "fedmmd") and bench == "digits"
            assert found == (f"{group}-l1" if digits_l1 else default), (group, bench, target)
            assert {key: _swept(config, key) for key in keys} == runs[run], (run, bench, target)
            # the default: exactly the base's values; a candidate: the default's config but the swept keys
            assert bare[(run, bench, target)] == configs[(default, bench, target)], (run, bench, target)
            if run == default:
                assert config == bare[(run, bench, target)]
            else:
                assert config != configs[(default, bench, target)]


def test_the_quick_grid_leaves_the_file_benchmarks_out(monkeypatch):
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    full = load_spec("selection", None)
    with pytest.raises(UserError, match="benchmark amazon of spec selection reads files from amazon_review/: pass"):
        resolve_data_roots(full, None, {})
    quick = resolve_data_roots(shrink(full, True, None), None, {})  # no data directory needed
    assert {b: s["targets"] for b, s in quick.benchmarks.items()} == {"digits": ["usps"]}
    assert quick.seeds == [0] and set(quick.select.groups) == set(GRID)
    configs = _configs(quick)
    assert {c.run.rounds for c in configs.values()} == {2}
    assert {c.method.params.encoder_rounds for (run, _, _), c in configs.items() if run.startswith("feddadil")} == {1}
    raw = copy.deepcopy(full.raw)
    raw["quick"]["targets"]["digits"] = []
    with pytest.raises(UserError, match="quick.targets leaves out every benchmark: give one its targets"):
        shrink(PaperSpec("selection", raw, full.origin), True, None)


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _first_best(values: dict):
    """The key of the highest value; a tie goes to the first (the group's order)."""
    best = None
    for key, value in values.items():
        if best is None or value > values[best]:
            best = key
    return best


def test_quick_protocol_end_to_end_writes_the_selection(tmp_path, ray_cluster, monkeypatch, capsys):
    """`fedsim reproduce selection --quick --backend local` without any data directory: every trial finishes on
    the digits, and selection.csv holds per group the default, each score's pick (the candidate with the highest
    score in the trials' summaries) and the oracle (the highest target accuracy), with the gaps between them."""
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    out = tmp_path / "out"
    code = main(["reproduce", "-q", "selection", "--quick", "--backend", "local", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    lines = _csv(out / "results.csv")
    assert [ln["run"] for ln in lines] == [run for runs in GRID.values() for run in runs]
    assert {(ln["benchmark"], ln["target_domain"], ln["seed"], ln["status"]) for ln in lines} == {
        ("digits", "usps", "0", "finished")
    }
    summaries = {ln["run"]: json.loads((out / "runs" / ln["trial_id"] / "summary.json").read_text()) for ln in lines}
    chosen = {}
    for line in _csv(out / "selection.csv"):
        assert (line["benchmark"], line["target"]) == ("digits", "usps")
        chosen.setdefault(line["group"], {})[line["rule"]] = line
    assert list(chosen) == list(GRID)
    for group, runs in GRID.items():
        rules = chosen[group]
        assert list(rules) == ["default", *SEVEN, "oracle"]
        assert rules["default"]["setting"] == _digits_default(group, runs)
        accuracy = {run: summaries[run]["target_accuracy"] for run in runs}
        oracle = _first_best(accuracy)
        assert rules["oracle"]["setting"] == oracle
        for score in SEVEN:
            pick = _first_best({run: summaries[run][f"score_{score}"] for run in runs})
            assert rules[score]["setting"] == pick, (group, score)
            assert float(rules[score]["score"]) == pytest.approx(summaries[pick][f"score_{score}"])
            assert float(rules[score]["gap"]) == pytest.approx(accuracy[oracle] - accuracy[pick])
    report = (out / "selection.md").read_text()
    assert "| group | default | " + " | ".join(SEVEN) + " | oracle |" in report
    for group, runs in GRID.items():
        section = report.split(f"## group={group}, benchmark=digits, target=usps")[1].split("## ")[0]
        assert f"| default | {_digits_default(group, runs)} |" in section
        assert f"| oracle (target labels) | {chosen[group]['oracle']['setting']} |" in section
        for score in SEVEN:
            assert f"| {score} (score) | {chosen[group][score]['setting']} |" in section
    assert (out / "selection.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
