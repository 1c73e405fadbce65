"""Memory stays flat over a long run: no growth of the driver or the object store after warm-up."""

import psutil

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.runtime.callbacks import Callback
from tools.benchmarks.measure import plasma_mib


def test_driver_and_object_store_memory_flat_over_100_rounds(toy_overrides, ray_cluster, tmp_path):
    samples = {}

    class Probe(Callback):
        def on_round_end(self, simulator, metrics):
            if metrics["round"] >= 10 and metrics["round"] % 5 == 0:
                samples[metrics["round"]] = (psutil.Process().memory_info().rss, plasma_mib())

    # a ~275 KB model: leaking one payload per round would add ~24 MiB over the late window
    config = load_config(
        None,
        toy_overrides
        + ["run.rounds=100", "run.eval_every=10", "run.checkpoint_every=0", "run.backend=ray", "model.hidden=256"],
    )
    run_experiment(config, tmp_path / "long", callbacks=[Probe()])
    # Ray frees released objects in batches, so the store's usage is a sawtooth: compare the peaks of an
    # early window (rounds 10-40) and a late one (rounds 70-100), with 10 MiB of slack for the batch freeing
    early = [v for r, v in samples.items() if r <= 40]
    late = [v for r, v in samples.items() if r >= 70]
    rss_early, rss_late = max(v[0] for v in early), max(v[0] for v in late)
    store_early, store_late = max(v[1] for v in early), max(v[1] for v in late)
    assert rss_late <= rss_early * 1.05, f"driver grew from {rss_early / 2**20:.0f} to {rss_late / 2**20:.0f} MiB"
    assert store_late <= max(store_early * 1.05, store_early + 10), (
        f"object store peak grew from {store_early} to {store_late} MiB"
    )
