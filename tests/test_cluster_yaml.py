"""cluster.yaml, its commented local-provider variant and the config of tools/cluster_check.py validate against
Ray's own autoscaler schema; the check's node stops only the Ray sessions it started. Nothing here starts a cluster.
"""

import copy
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tools.cluster.node_ray import session_of, stop
from tools.cluster_check import HEAD_IP, PORT_NAMES, local_config

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
    assert "~/fedsim-data" in cluster["file_mounts"]
    for commands in (cluster["head_start_ray_commands"], cluster["worker_start_ray_commands"]):
        assert any("RAY_AUTH_MODE=token" in c and "~/fedsim-venv/bin/ray start" in c for c in commands)


def test_cluster_mounts_what_the_install_needs_and_no_more(cluster):
    """Every package folder of pyproject.toml, the files its build reads and the constraints; never "." (ray up
    hashes every file of a mounted folder, the .venv's included)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {name.split(".")[0] for name in project["tool"]["setuptools"]["packages"]}
    folders |= {path.split("/")[0] for path in project["tool"]["setuptools"]["package-dir"].values()}
    needed = folders | {"pyproject.toml", "constraints.txt", project["project"]["readme"]}
    checkout = {
        remote.removeprefix("~/fedsim/"): local
        for remote, local in cluster["file_mounts"].items()
        if remote.startswith("~/fedsim/")
    }
    assert checkout == {name: name for name in needed}
    assert "." not in cluster["file_mounts"].values()
    for local in checkout.values():
        assert (ROOT / local).exists(), local


def test_local_provider_variant_in_the_comments_validates(cluster):
    text = CLUSTER.read_text()
    block = text.split("# BEGIN LOCAL VARIANT\n", 1)[1].split("# END LOCAL VARIANT", 1)[0]
    variant = yaml.safe_load("\n".join(line[2:] for line in block.splitlines()))
    config = {k: v for k, v in cluster.items() if k not in ("available_node_types", "head_node_type")}
    config.update(variant, head_setup_commands=[])
    prepared = _validate(config)
    assert prepared["provider"]["type"] == "local"
    assert prepared["max_workers"] == len(variant["provider"]["worker_ips"])
    assert prepared["available_node_types"]["local.cluster.node"]["max_workers"] == len(
        variant["provider"]["worker_ips"]
    )


def _check_config(cluster: dict) -> dict:
    ports = {name: 20000 + i for i, name in enumerate(PORT_NAMES)}
    ports.update(min_worker=21000, max_worker=21099)
    return local_config(
        cluster,
        cluster_name="fedsim-check-test",
        user="root",
        private_key="/tmp/fsck/ssh/id_ed25519",
        ssh_port=2222,
        ports=ports,
        token="/tmp/fsck/auth_token",
        data="/tmp/fsck/data",
        site_packages="/venv/lib/python3.11/site-packages",
    )


def test_cluster_check_config_validates(cluster):
    config = _check_config(cluster)
    prepared = _validate(config)
    assert prepared["provider"] == {"type": "local", "head_ip": HEAD_IP, "worker_ips": []}
    assert prepared["auth"]["ssh_proxy_command"] == "nc %h 2222"  # Ray's auth has no port setting
    assert list(prepared["available_node_types"]) == ["local.cluster.node"]
    # cluster.yaml's mounts (remote paths) and setup, plus the stand-in for an image's packages after the venv
    assert set(config["file_mounts"]) == set(cluster["file_mounts"])
    assert config["file_mounts"]["~/fedsim-data"] == "/tmp/fsck/data"
    setup = config["setup_commands"]
    assert [c for c in setup if "preinstalled.sh" not in c] == cluster["setup_commands"]
    made = next(i for i, c in enumerate(setup) if "-m venv ~/fedsim-venv" in c)
    assert setup[made + 1] == "bash ~/image/preinstalled.sh ~/fedsim-venv /venv/lib/python3.11/site-packages"


def test_cluster_check_starts_ray_as_cluster_yaml_does_on_its_own_ports(cluster):
    config = _check_config(cluster)
    [stop, start] = config["head_start_ray_commands"]
    assert stop == cluster["head_start_ray_commands"][0] == "~/fedsim-venv/bin/ray stop"
    assert start.startswith(cluster["head_start_ray_commands"][1].split(" --head")[0] + " --head")
    assert "--port=20000 " in start and "--object-manager-port=20001 " in start
    assert "--min-worker-port=21000" in start and "--max-worker-port=21099" in start
    assert f"--node-ip-address={HEAD_IP}" in start and f"--dashboard-host={HEAD_IP}" in start
    assert "6379" not in start and "8076" not in start and "0.0.0.0" not in start
    assert config["head_setup_commands"] == [] and config["worker_start_ray_commands"] == []


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


def test_the_nodes_ray_stop_stops_its_sessions_only(tmp_path):
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen(sleep, start_new_session=True)
    other = subprocess.Popen(sleep, start_new_session=True)
    try:
        sessions = tmp_path / ".ray-sessions"
        sessions.write_text(f"{os.getsid(ours.pid)}\n")
        assert stop(sessions, grace_s=5) == (1, [])
        assert ours.wait(timeout=5) is not None
        assert session_of(other.pid) == other.pid and other.poll() is None
        assert not sessions.exists()
        assert stop(sessions) == (0, [])
    finally:
        for process in (ours, other):
            process.kill()
            process.wait()
