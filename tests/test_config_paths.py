"""One typed configuration path: ``fedsim run`` flags and ``fedsim.run`` keywords build the same ExperimentConfig
(neither writes nor starts anything), and a bad value ends in one UserError naming the key."""

import dataclasses

import pytest

from fedsim.api import make_config
from fedsim.config import KEYWORDS, load_config
from fedsim.errors import UserError
from fedsim.experiments.cli import COMMANDS, build_parser, config_from_args


def cli_config(*flags):
    return config_from_args(build_parser().parse_args(["run", "--backend", "local", "-q", *flags]))


@pytest.mark.parametrize(
    "flags, keywords",
    [
        (["--local-epochs", "3"], {"local_epochs": 3}),
        (["--rounds", "4"], {"rounds": 4}),
        (["--seed", "7"], {"seed": 7}),
        (["--target", "usps"], {"target": "usps"}),
        (["--sources", "mnist,synth"], {"sources": ["mnist", "synth"]}),
        (["--clients-per-round", "0.5"], {"clients_per_round": 0.5}),
        (["--clients-per-round", "2"], {"clients_per_round": 2}),
        (
            ["--method", "fedprox", "--local-epochs", "2", "--target", "synth", "--set", "method.mu=0.25"],
            {"method": "fedprox", "local_epochs": 2, "target": "synth", "set": {"method.mu": 0.25}},
        ),
    ],
)
def test_cli_flags_and_api_keywords_build_equal_configs(flags, keywords):
    assert cli_config(*flags) == make_config(**keywords)


def test_local_epochs_arrive_typed_on_both_paths():
    for config in (cli_config("--local-epochs", "3"), make_config(local_epochs=3)):
        assert config.method.local_epochs == 3 and type(config.method.local_epochs) is int
        assert (config.run.backend, config.run.progress) == ("local", False)


def test_every_keyword_is_a_cli_flag():
    dests = {action.dest for action in build_parser()._subparsers._group_actions[0].choices["run"]._actions}
    assert set(KEYWORDS) <= dests


def test_typed_values_are_not_reparsed_as_text():
    """A YAML round trip would turn the string 'no' into False (and then into 'False')."""
    assert make_config(set={"data.target": "no"}).data.target == "no"
    assert make_config(sources=("mnist", "usps")).data.sources == ("mnist", "usps")


def test_set_strings_from_the_cli_still_parse_as_yaml_scalars():
    config = cli_config("--set", "method.lr=0.01", "--set", "run.tensorboard=no")
    assert config.method.lr == 0.01 and config.run.tensorboard is False


def test_a_config_object_is_used_as_it_is():
    config = load_config(None, ["run.backend=local", "method.name=fedprox", "method.mu=0.3"])
    assert make_config(config) is config
    changed = make_config(config, rounds=3)
    assert changed == dataclasses.replace(config, run=dataclasses.replace(config.run, rounds=3))


@pytest.mark.parametrize(
    "keywords, expected",
    [
        ({"local_epochs": "many"}, "method.local_epochs must be an integer, got 'many'"),
        ({"local_epochs": 2.5}, "method.local_epochs must be an integer, got 2.5"),
        ({"local_epochs": 0}, "method.local_epochs must be positive, got 0: pass --local-epochs 1 or more"),
        ({"rounds": True}, "run.rounds must be an integer, got True"),
        ({"clients_per_round": "half"}, "run.clients_per_round must be a number, got 'half'"),
        ({"sources": 3}, "data.sources must be a list, got 3"),
        ({"set": {"method.lrr": 0.1}}, "unknown config key 'method.lrr' for method 'fedavg': did you mean 'lr'?"),
        ({"set": {"lr": 0.1}}, "write it as section.key=value"),
        ({"roundz": 3}, "fedsim.run got unknown argument(s) ['roundz']"),
    ],
)
def test_a_bad_value_gives_one_clear_user_error(keywords, expected):
    with pytest.raises(UserError) as info:
        make_config(**keywords)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_commands_are_wired_to_the_installed_package():
    assert COMMANDS["reproduce"] == "fedsim.experiments.reproduce" and "diagnose" not in COMMANDS
    assert {"run", "sweep", "reproduce", "report", "list", "data"} == set(
        build_parser()._subparsers._group_actions[0].choices
    )
