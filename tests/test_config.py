import dataclasses

import pytest

from fedsim.config import ExperimentConfig, dump_yaml, load_config, parse_override
from fedsim.errors import UserError


def test_defaults_are_the_default_experiment():
    config = load_config()
    assert config == dataclasses.replace(
        ExperimentConfig(), data=dataclasses.replace(ExperimentConfig().data, target="mnistm")
    )
    assert (config.data.benchmark, config.data.target, config.method.name, config.run.backend) == (
        "digits",
        "mnistm",
        "fedavg",
        "ray",
    )


def test_yaml_and_dotted_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("method:\n  name: fedprox\n  mu: 0.5\n  lr: 0.1\nrun:\n  rounds: 3\n")
    config = load_config(path, ["method.lr=0.01", "run.seed=7"])
    assert config.method.name == "fedprox"
    assert config.method.params.mu == 0.5
    assert config.method.lr == 0.01
    assert (config.run.rounds, config.run.seed) == (3, 7)


def test_resolved_config_round_trips(tmp_path):
    config = load_config(None, ["method.name=fedprox", "method.mu=0.2", "data.target=usps"])
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_yaml(config))
    assert load_config(path) == config


@pytest.mark.parametrize(
    "override, expected",
    [
        ("method.lrr=0.1", "did you mean 'lr'"),
        ("methdo.lr=0.1", "did you mean 'method'"),
        ("run.rounds=0", "run.rounds must be a positive integer"),
        ("run.rounds=-3", "run.rounds must be a positive integer"),
        ("run.rounds=abc", "run.rounds must be an integer"),
        ("method.mu=0.1", "unknown config key 'method.mu' for method 'fedavg'"),
        ("run.backend=spark", "run.backend must be 'ray' or 'local'"),
        ("method.name=fedavgg", "did you mean 'fedavg'"),
        ("lr=0.1", "section.key=value"),
    ],
)
def test_bad_overrides_name_the_problem(override, expected):
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [override])


def test_unknown_yaml_key_suggests_closest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  targte: usps\n")
    with pytest.raises(UserError, match="did you mean 'target'"):
        load_config(path)


def test_unreadable_config_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(UserError, match="mapping"):
        load_config(scalar)


def test_parse_override_types():
    assert parse_override("method.lr=0.01") == (["method", "lr"], 0.01)
    assert parse_override("run.address=auto") == (["run", "address"], "auto")


def test_auto_target_is_the_benchmarks_default():
    assert load_config(None, ["data.benchmark=tep"]).data.target == "mode2"
    with pytest.raises(UserError, match="no default target"):
        load_config(None, ["data.benchmark=npz", "data.root=/tmp"])


@pytest.mark.parametrize(
    "old, new",
    [
        ("run.inject_faults=1", "ray.inject_faults"),
        ("resources.max_restarts=2", "ray.max_restarts"),
        ("resources.call_timeout_s=5", "ray.call_timeout_s"),
        ("resources.max_actors=2", "ray.max_actors"),
    ],
)
def test_ray_settings_moved_to_their_own_section(old, new):
    with pytest.raises(UserError, match=f"moved to '{new}'"):
        load_config(None, [old])
    key, value = old.split("=")
    assert getattr(load_config(None, [f"{new}={value}"]).ray, new.split(".")[1]) == float(value)


@pytest.mark.parametrize("method, benchmark, fits", [("fedod", "digits", "scenes"), ("fedavg", "scenes", "digits")])
def test_a_method_on_a_benchmark_of_another_task_is_refused_naming_one_that_fits(method, benchmark, fits):
    with pytest.raises(UserError, match=f"is for .* pick a .* benchmark .*{fits}"):
        load_config(None, [f"method.name={method}", f"data.benchmark={benchmark}"])
