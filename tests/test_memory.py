"""Memory stays flat over a long run: no growth of the driver or the object store after warm-up."""
import re

import psutil

from experiments.run import run_experiment
from fedsim.config import load_config
from fedsim.runtime.callbacks import Callback


def plasma_mib(ray) -> float:
    from ray._private.internal_api import memory_summary

    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    match = re.search(r"Plasma memory usage (\d+) MiB", text)
    return float(match.group(1)) if match else 0.0


def test_driver_and_object_store_memory_flat_over_100_rounds(toy_overrides, ray_cluster, tmp_path):
    samples = {}

    class Probe(Callback):
        def on_round_end(self, simulator, metrics):
            if metrics["round"] in (10, 100):
                samples[metrics["round"]] = (psutil.Process().memory_info().rss, plasma_mib(ray_cluster))

    config = load_config(None, toy_overrides + ["run.rounds=100", "run.eval_every=10", "run.checkpoint_every=0", "run.backend=ray"])
    run_experiment(config, tmp_path / "long", callbacks=[Probe()])
    (rss10, store10), (rss100, store100) = samples[10], samples[100]
    assert rss100 <= rss10 * 1.05, f"driver grew from {rss10 / 2**20:.0f} to {rss100 / 2**20:.0f} MiB"
    assert store100 <= max(store10 * 1.05, store10 + 1), f"object store grew from {store10} to {store100} MiB"
