"""A reproduce grid survives a failing trial: its error goes to results.csv and claims.md (the claims that need it
are not measurable, naming it), the other trials finish, and --resume runs the failed trial again, alone."""

import csv
import json
from pathlib import Path

from fedsim.experiments.cli import main
from fedsim.experiments.reproduce_results import check_claim, results_rows
from fedsim.experiments.reproduce_spec import PaperSpec


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _spec(toy_root, cache) -> dict:
    return {
        "paper": "toy protocol with a run that diverges",
        "seeds": [0],
        "set": [
            f"data.root={toy_root}",
            f"data.cache_dir={cache}",
            "run.rounds=2",
            "run.tensorboard=false",
            "run.checkpoint_every=0",
            "method.batch_size=16",
            "method.lr=0.05",
            "resources.cpus_per_client=1",
        ],
        "benchmarks": {"npz": {"targets": ["dom1"]}},
        "runs": {"fedavg": {}, "fedprox": {"set": ["method.name=fedprox"]}, "diverges": {"set": ["method.lr=1e30"]}},
        "rows": [{"name": "fedavg"}, {"name": "fedprox"}, {"name": "diverges"}],
        "claims": [
            {"claim": "fedavg at least fedprox", "order": ["fedavg", "fedprox"], "strict": False},
            {"claim": "fedavg above the run that diverges", "order": ["fedavg", "diverges"]},
        ],
    }


def test_a_claim_that_needs_a_failed_or_unfinished_trial_is_not_measurable_and_names_it():
    raw = _spec("/nowhere", "/nowhere")
    raw["seeds"] = [0, 1]
    spec = PaperSpec("toy", raw, Path("."))
    variant = {run: name for name, run, _, _ in spec.variants()}

    def record(run, seed, status="finished", error=None):
        out = {"trial_id": f"{run}-{seed}", "status": status, "params": {"variant": variant[run], "seed": seed}}
        out.update(summary={"target_accuracy": 0.5 + 0.1 * seed}, round_metrics=[])
        return out | ({"error": error} if error else {})

    records = [record("fedavg", 0), record("fedavg", 1), record("fedprox", 0), record("fedprox", 1, "interrupted")]
    records += [record("diverges", 0), record("diverges", 1, "error", "diverges, round 1, client 0: loss is nan")]
    lines = results_rows(spec, records)
    assert [ln.get("error") for ln in lines if ln["row"] == "diverges"] == [
        None,
        "diverges, round 1, client 0: loss is nan",
    ]
    first, second = (check_claim(spec, lines, claim) for claim in spec.claims)
    assert first == [
        (
            "not measurable",
            "npz, target dom1: fedavg 0.550 vs fedprox 0.500; needs trial fedprox-1 (fedprox, dom1, seed 1), "
            "which is interrupted",
        )
    ]
    assert second[0][0] == "not measurable"
    assert second[0][1].endswith(
        "needs trial diverges-1 (diverges, dom1, seed 1), which failed: diverges, round 1, client 0: loss is nan"
    )


def test_a_failing_trial_is_recorded_the_others_finish_and_resume_retries_it_alone(
    toy_root, tmp_path, ray_cluster, capsys
):
    import yaml

    spec_file = tmp_path / "toy.yaml"
    spec_file.write_text(yaml.safe_dump(_spec(toy_root, tmp_path / "cache")))
    out = tmp_path / "out"
    assert main(["reproduce", "-q", "--spec", str(spec_file), "--backend", "local", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    reason = "fedavg, round 1, client 0: tensor 'encoder.0.weight' of its fit reply is no longer finite (nan"
    lines = {ln["row"]: ln for ln in _rows(out / "results.csv")}
    assert {row: ln["status"] for row, ln in lines.items()} == {
        "fedavg": "finished",
        "fedprox": "finished",
        "diverges": "error",
    }
    failed = lines["diverges"]
    assert failed["error"].startswith(reason) and failed["target"] == ""
    assert f"fedsim: trial {failed['trial_id']} failed: {reason}" in err
    assert "continue with 'fedsim reproduce --resume --out" in err
    for row in ("fedavg", "fedprox"):
        assert 0 <= float(lines[row]["target"]) <= 1 and lines[row]["error"] == ""
    claims = [line for line in (out / "claims.md").read_text().splitlines() if line.startswith("- ")]
    assert claims[0].startswith("- fedavg at least fedprox: **") and "not measurable" not in claims[0]
    assert claims[1].startswith("- fedavg above the run that diverges: **not measurable** (npz, target dom1: fedavg ")
    assert f"needs trial {failed['trial_id']} (diverges, dom1, seed 0), which failed: {reason}" in claims[1]

    runs = out / "runs"
    stamps = {row: (runs / ln["trial_id"] / "config.yaml").stat().st_mtime_ns for row, ln in lines.items()}
    assert main(["reproduce", "-q", "--resume", "--out", str(out)]) == 1
    again = {ln["row"]: ln for ln in _rows(out / "results.csv")}
    assert [again[row]["status"] for row in ("fedavg", "fedprox", "diverges")] == ["finished", "finished", "error"]
    for row in ("fedavg", "fedprox"):  # finished: not run again
        assert again[row]["wall_seconds"] == lines[row]["wall_seconds"]
        assert (runs / lines[row]["trial_id"] / "config.yaml").stat().st_mtime_ns == stamps[row]
        assert json.loads((runs / lines[row]["trial_id"] / "summary.json").read_text())["rounds"] == 2
    retried = runs / again["diverges"]["trial_id"]  # Tune restarts a failed trial afresh (it may get a new id)
    assert retried.joinpath("config.yaml").stat().st_mtime_ns > stamps["diverges"]
    assert again["diverges"]["error"].startswith(reason) and not (retried / "summary.json").exists()
    assert sorted(p.name for p in runs.iterdir()) == sorted(
        {lines[row]["trial_id"] for row in lines} | {again["diverges"]["trial_id"]}
    )
