"""The encoder stage computed once per grid: FedDaDiL and DaDiL runs with the same data, model, seed and encoder
settings read it from ``run.cache_dir`` and give the numbers they give without it; another setting is another
entry; runs that start it at once take turns."""

import json
import threading
import time

import numpy as np
from conftest import assert_same_results

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.methods.common.stage_cache import StageCache, StoredRound, stage_key

SMALL = [
    "method.samples_per_atom=40",
    "method.batch_size=20",
    "method.classifier_steps=50",
    "method.encoder_rounds=2",
    "method.encoder_epochs=1",
    "method.local_epochs=1",
    "model.hidden=12",
    "run.rounds=4",
    "run.eval_every=1",
    "run.checkpoint_every=0",
    "run.tensorboard=false",
    "run.backend=local",
]
SUMMARY = ["target_accuracy", "target_accuracy_E", "source_accuracy", "source_accuracy_E"]


def _run(overrides, out):
    result = run_experiment(load_config(None, overrides), out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return result, rows


def _numbers(rows):
    """Every evaluated round's accuracies and the training losses, as the metrics file holds them."""
    keys = ("round", "stage", "train_loss", "target_accuracy", "target_accuracy_E", "dil_loss", "atom_drift")
    return [{k: row[k] for k in keys if k in row} for row in rows]


def test_a_cached_encoder_gives_the_same_numbers_and_is_shared_by_dadil(toy_overrides, tmp_path):
    cache = f"run.cache_dir={tmp_path / 'cache'}"
    base = toy_overrides + SMALL
    plain, plain_rows = _run(base + ["method.name=feddadil"], tmp_path / "plain")
    cold, cold_rows = _run(base + ["method.name=feddadil", cache], tmp_path / "cold")
    warm, warm_rows = _run(base + ["method.name=feddadil", cache], tmp_path / "warm")
    assert len(list((tmp_path / "cache").glob("encoder-*.npz"))) == 1
    assert [r.get("encoder_cache") for r in cold_rows[:2]] == [None, None]
    assert [r.get("encoder_cache") for r in warm_rows[:2]] == ["hit", "hit"]
    for key in ("bytes_sent", "bytes_received", "bytes_sent_by_stage", "bytes_received_by_stage"):
        assert [r[key] for r in warm_rows] == [r[key] for r in cold_rows] == [r[key] for r in plain_rows], key
    assert _numbers(plain_rows) == _numbers(cold_rows) == _numbers(warm_rows)
    assert_same_results(plain, cold, SUMMARY)
    assert_same_results(plain, warm, SUMMARY)

    dadil_plain, dadil_plain_rows = _run(base + ["method.name=dadil"], tmp_path / "dadil-plain")
    dadil_warm, dadil_warm_rows = _run(base + ["method.name=dadil", cache], tmp_path / "dadil-warm")
    assert [r.get("encoder_cache") for r in dadil_warm_rows[:2]] == ["hit", "hit"]
    assert _numbers(dadil_plain_rows) == _numbers(dadil_warm_rows)
    assert_same_results(dadil_plain, dadil_warm, SUMMARY)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1  # DaDiL read FedDaDiL's encoder


def test_another_encoder_setting_or_seed_is_another_entry(toy_overrides, tmp_path):
    cache = f"run.cache_dir={tmp_path / 'cache'}"
    base = toy_overrides + SMALL + ["method.name=feddadil", cache, "run.rounds=3", "method.encoder_rounds=1"]
    _run(base, tmp_path / "a")
    _, rows = _run(base + ["method.encoder_epochs=2"], tmp_path / "b")
    assert rows[0].get("encoder_cache") is None
    _, rows = _run(base + ["run.seed=1"], tmp_path / "c")
    assert rows[0].get("encoder_cache") is None
    _, rows = _run(base + ["method.lr_atoms=1.0"], tmp_path / "d")  # a dictionary setting: the same encoder
    assert rows[0].get("encoder_cache") == "hit"
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 3


def test_the_clients_resources_are_in_the_key_and_unreliable_clients_or_a_short_run_skip_the_cache(
    toy_overrides, tmp_path
):
    from fedsim.data.scenario import build_federation
    from fedsim.methods.dictionary.feddadil import FedDaDiL

    base = toy_overrides + SMALL + ["method.name=feddadil", f"run.cache_dir={tmp_path}"]

    def cache_of(extra):
        config = load_config(None, base + extra)
        return FedDaDiL(config, build_federation(config.data)).encoder.cache

    names = {
        cache_of(extra).name
        for extra in ([], ["resources.cpus_per_client=2"], ["resources.gpus_per_client=0.5", "run.backend=ray"])
    }
    assert len(names) == 3
    assert cache_of(["clients.link_mbps=10"]) is None  # the simulated clock: the run's own
    assert cache_of(["run.rounds=2"]) is None  # every round an encoder round: the stage never ends


def test_a_run_without_an_encoder_stage_writes_nothing(toy_overrides, tmp_path):
    _run(
        toy_overrides + SMALL + ["method.name=feddadil", "method.encoder_rounds=0", f"run.cache_dir={tmp_path}/c"],
        tmp_path / "r",
    )
    assert not (tmp_path / "c").exists()


def test_the_key_ignores_order_and_sees_every_value():
    assert stage_key({"a": 1, "b": [1, 2]}) == stage_key({"b": [1, 2], "a": 1})
    assert stage_key({"a": 1, "b": [1, 2]}) != stage_key({"a": 1, "b": [2, 1]})


def _weights(value: float) -> dict:
    return {"w": np.full((2, 3), value, np.float32), "b": np.array([value], np.float32)}


def test_runs_that_start_the_same_stage_take_turns(tmp_path):
    """The second run waits for the first to write the stage, then reads it instead of computing it."""
    first, second = (StageCache(str(tmp_path), "encoder", {"k": 1}, rounds=2) for _ in range(2))
    assert first.begin() is False
    found = []
    waiting = threading.Thread(target=lambda: found.append(second.begin()))
    waiting.start()
    time.sleep(0.3)
    assert found == []  # still waiting on the lock
    first.record(1, StoredRound(_weights(1.0), {"train_loss": {"0": 0.5}}, "fit", 100, 80))
    time.sleep(0.1)
    assert found == []
    first.record(2, StoredRound(_weights(2.0), {"train_loss": {"0": 0.25}}, "fit", 100, 80))
    waiting.join(timeout=10)
    assert found == [True]
    stored = second.replay(2)
    np.testing.assert_array_equal(stored.tensors["w"], np.full((2, 3), 2.0, np.float32))
    assert (stored.metrics, stored.operation, stored.sent, stored.received) == (
        {"train_loss": {"0": 0.25}},
        "fit",
        100,
        80,
    )
    assert second.replay(1).metrics == {"train_loss": {"0": 0.5}}


def test_a_run_that_stops_early_lets_the_others_compute(tmp_path):
    first, second = (StageCache(str(tmp_path), "encoder", {"k": 1}, rounds=2) for _ in range(2))
    assert first.begin() is False
    first.record(1, StoredRound(_weights(1.0), {}, "fit", 1, 1))
    first.release()  # the run failed before the stage's last round
    assert second.begin() is False  # nothing stored: it computes the stage itself
    assert second.replay(1) is None


def test_a_corrupt_entry_is_computed_again(tmp_path):
    cache = StageCache(str(tmp_path), "encoder", {"k": 1}, rounds=1)
    cache.begin()
    cache.record(1, StoredRound(_weights(1.0), {}, "fit", 1, 1))
    (tmp_path / f"{cache.name}.npz").write_bytes(b"not a zip file")
    again = StageCache(str(tmp_path), "encoder", {"k": 1}, rounds=1)
    assert again.begin() is False


def test_a_grid_trains_each_encoder_once_per_target_and_seed(toy_root, tmp_path):
    """fedsim reproduce with FedDaDiL and DaDiL on two seeds: two encoders trained, each read by the other run."""
    import yaml

    from fedsim.experiments.cli import main

    settings = [f for f in SMALL if not f.startswith(("run.backend", "run.eval_every"))] + ["run.rounds=3"]
    spec = {
        "paper": "encoder sharing",
        "seeds": [0, 1],
        "set": ["run.progress=false", "data.target=dom1", *settings],
        "benchmarks": {"npz": {"set": [f"data.root={toy_root}"], "targets": ["dom1"]}},
        "runs": {"feddadil": {"set": ["method.name=feddadil"]}, "dadil": {"set": ["method.name=dadil"]}},
        "rows": [{"name": "feddadil"}, {"name": "dadil"}],
    }
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    assert main(["reproduce", "--spec", str(spec_file), "--out", str(out)]) == 0
    assert len(list((out / "cache").glob("encoder-*.npz"))) == 2
    hits = {}
    for run_dir in (out / "runs").iterdir():
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        seed = yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["seed"]
        hits.setdefault(seed, []).append(str([r.get("encoder_cache") for r in rows[:2]]))
    assert {seed: sorted(h) for seed, h in hits.items()} == {s: ["['hit', 'hit']", "[None, None]"] for s in (0, 1)}
