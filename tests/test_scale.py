"""A 1,000-client federation runs on this 2-core machine: clients multiplexed on a small actor pool."""

import json

from conftest import write_toy_domains

from fedsim.api import run_experiment
from fedsim.config import load_config


def test_thousand_clients_on_two_cores(tmp_path, ray_cluster):
    root = tmp_path / "data"
    root.mkdir()
    write_toy_domains(str(root), num_domains=4, per_domain=2500)
    config = load_config(
        None,
        [
            "data.benchmark=npz",
            f"data.root={root}",
            "data.target=dom3",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.clients_per_domain=250",
            "run.clients_per_round=10",
            "run.rounds=3",
            "run.eval_every=3",
            "run.progress=false",
            "run.tensorboard=false",
            "run.checkpoint_every=0",
            "method.batch_size=8",
        ],
    )
    result = run_experiment(config, tmp_path / "run")
    assert len(result.federation.clients) == 1000
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [len(m["train_loss"]) for m in lines] == [10, 10, 10]  # only the sampled clients work
    assert (
        len(lines[0]["client_nodes"]) == 1
        and 0.0 <= result.summary["target_accuracy"] <= 1.0
        and result.summary["rounds"] == 3
    )
