"""`fedsim reproduce`: the paper specs are valid grids, a spec's claims are checked on a results table,
bad input is one line (exit 2, nothing written), and one protocol runs end to end as Ray Tune trials."""

import csv
import json
from pathlib import Path

import pytest

from fedsim.errors import UserError
from fedsim.experiments.cli import main
from fedsim.experiments.reproduce import STATE_FILE, output_names
from fedsim.experiments.reproduce_results import check_claim, metric_value, results_rows, table
from fedsim.experiments.reproduce_spec import PaperSpec, available, load_spec, shrink, to_sweep
from fedsim.experiments.sweep import SPEC_FILE

PAPERS = {  # paper -> (methods its full grid runs, trials of the full grid, trials with --quick)
    "fada": ({"fedavg", "feddann", "fedmmd", "fada"}, 11 * (4 + 6) * 3, 11 * 2),
    "feddadil": ({"fedavg", "feddann", "fedmmd", "feddadil", "dadil"}, (6 * 5 + 2 + 2 * 5) * 3, 7 + 5),
    "fedod": ({"fedod", "fedavg_det", "fedbn_det", "fedrep_det"}, 6 * 3, 6),
}


def test_the_three_papers_are_shipped():
    assert available() == sorted(PAPERS)


@pytest.mark.parametrize("paper", sorted(PAPERS))
def test_paper_spec_builds_every_trial_config(paper):
    """Every trial's config of the full and the quick grid loads (methods, parameters, task pairs), without running."""
    methods, full, quick = PAPERS[paper]
    for is_quick, count in ((False, full), (True, quick)):
        spec = shrink(load_spec(paper, None), is_quick, None)
        sweep = to_sweep(spec)
        points = sweep.points()
        configs = [sweep.config_for(p) for p in points]
        assert len(configs) == count
        assert {c.method.name for c in configs} == methods
        assert {c.run.seed for c in configs} == ({0} if is_quick else {0, 1, 2})
        for row in spec.rows:  # every row reads a run of the grid
            assert any(run == row.run for _, run, _, _ in spec.variants())
        assert spec.claims, "a paper spec states the paper's claims"


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
    assert verdicts["a at least b and c on dom1"] == [("holds", "npz, target dom1: a 0.700 vs b 0.600, c 0.700")]
    assert [v for v, _ in verdicts["c above a on each target"]] == ["does not hold", "not measurable"]
    assert verdicts["b's loss above a's"][0][0] == "not measurable"


def test_at_least_claims_accept_ties():
    spec = PaperSpec("toy", SPEC, Path("."))
    records = [_record(spec, run, "dom1", seed, 0.7, [1.0]) for run in ("a", "b", "c") for seed in (0, 1)]
    claim = next(c for c in spec.claims if c.text == "a at least b and c on dom1")
    assert check_claim(spec, results_rows(spec, records), claim) == [
        ("holds", "npz, target dom1: a 0.700 vs b 0.700, c 0.700")
    ]


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
    ],
)
def test_bad_specs_name_the_problem(change, expected):
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        to_sweep(PaperSpec("toy", {**SPEC, **change}, Path(".")))


@pytest.mark.parametrize(
    "args, expected",
    [
        (["fad"], "unknown paper 'fad': did you mean 'fada'?"),
        ([], "give a paper (fada, feddadil, fedod) or --spec FILE, not neither"),
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
    assert len(verdicts) == len(raw["claims"]) and all(
        ("**holds**" in v) != ("**does not hold**" in v) for v in verdicts
    ), claims
    assert f"fada-III {float(fada3['target']):.3f}" in verdicts[0]
    for name in ("accuracy-digits.png", "accuracy_per_round-digits.png", "series-attention.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = {p.name for p in out.iterdir() if p.is_file()} - {STATE_FILE, SPEC_FILE}
    assert written == set(output_names(shrink(load_spec(None, str(spec_file)), True, None)))
    assert main(["reproduce", "-q", "--resume", "--out", str(out)]) == 0
    assert _rows(out / "results.csv") == lines  # same trials, same wall times: nothing ran again
    assert (out / "table.md").read_text() == table_text
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
