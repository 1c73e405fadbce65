"""cluster.yaml (and its commented local-provider variant) validate against Ray's own autoscaler schema."""

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster.yaml"


def _validate(config: dict) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))  # merges the provider's defaults, as `ray up` does
    validate_config(prepared)  # jsonschema against ray/autoscaler/ray-schema.json, then Ray's own checks
    return prepared


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load(CLUSTER.read_text())


def test_cluster_yaml_validates(cluster):
    prepared = _validate(cluster)
    assert prepared["provider"]["type"] == "aws"
    types = prepared["available_node_types"]
    assert prepared["head_node_type"] in types
    workers = {name: t for name, t in types.items() if name != prepared["head_node_type"]}
    gpu = [t for t in workers.values() if t["resources"].get("GPU", 0) > 0]
    cpu = [t for t in workers.values() if not t["resources"].get("GPU")]
    assert gpu and cpu, "a CPU and a GPU worker type"
    for t in workers.values():
        assert 0 <= t["min_workers"] <= t["max_workers"]


def test_cluster_installs_fedsim_with_constraints_and_mounts_data(cluster):
    setup = "\n".join(cluster["setup_commands"])
    assert "-c ~/fedsim/constraints.txt -e ~/fedsim" in setup
    assert cluster["file_mounts"]["~/fedsim"] == "."
    assert "~/fedsim-data" in cluster["file_mounts"]
    for commands in (cluster["head_start_ray_commands"], cluster["worker_start_ray_commands"]):
        assert any("RAY_AUTH_MODE=token" in c and "ray start" in c for c in commands)


def test_local_provider_variant_in_the_comments_validates(cluster):
    text = CLUSTER.read_text()
    block = text.split("# BEGIN LOCAL VARIANT\n", 1)[1].split("# END LOCAL VARIANT", 1)[0]
    variant = yaml.safe_load("\n".join(line[2:] for line in block.splitlines()))
    config = {k: v for k, v in cluster.items() if k not in ("available_node_types", "head_node_type")}
    config.update(variant, head_setup_commands=[])
    prepared = _validate(config)
    assert prepared["provider"]["type"] == "local"
    assert prepared["available_node_types"]["local.cluster.node"]["max_workers"] == len(
        variant["provider"]["worker_ips"]
    )


def test_validation_can_fail(cluster):
    import jsonschema

    broken = copy.deepcopy(cluster)
    broken["available_node_types"]["gpu_worker"]["min_workers"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        _validate(broken)
    broken = copy.deepcopy(cluster)
    broken["available_node_types"]["cpu_worker"]["gpus"] = 1
    with pytest.raises(jsonschema.ValidationError):
        _validate(broken)
