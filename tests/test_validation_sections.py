"""Each config section checks its own values when it is built, the rules across sections live in
fedsim.validation, and loose values (config scalars, an instruction's values) become typed ones in fedsim.coercion."""

from dataclasses import dataclass
from typing import Literal, Optional

import pytest

from fedsim.coercion import read_values
from fedsim.config import ClientsConfig, DataConfig, PrivacyConfig, ResourcesConfig, RunConfig, load_config
from fedsim.errors import UserError
from fedsim.methods.common.selection_hooks import MOMENTS, STAGE, SelectionValues
from fedsim.runtime.client_host import StandardizeValues


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: RunConfig(rounds=0), "run.rounds must be a positive integer, got 0: pass --rounds 1 or more"),
        (lambda: DataConfig(target="usps", sources=("usps",)), "data.sources must not contain the target 'usps'"),
        (lambda: ClientsConfig(availability=0), "clients.availability must be in (0, 1], got 0"),
        (lambda: ResourcesConfig(vectorize="always"), "resources.vectorize must be 'off' or 'auto', got 'always'"),
        (lambda: ResourcesConfig(groups={"target": {"gpus": 1}}), "unknown config key 'resources.groups.target.gpus'"),
        (lambda: PrivacyConfig(clip=1.0), "privacy.clip set but privacy is off"),
        (lambda: PrivacyConfig(noise_multiplier=1.0, clip=1.0, accountant="gdp"), "privacy.accountant must be one of"),
    ],
)
def test_a_section_refuses_a_bad_value_when_it_is_built(build, message):
    with pytest.raises(UserError) as caught:
        build()
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_the_defaults_of_every_section_pass_their_own_checks():
    assert PrivacyConfig() == PrivacyConfig() and not PrivacyConfig().active
    assert RunConfig().rounds == 20 and ResourcesConfig().vectorize == "off" and not ClientsConfig().active


def test_load_config_runs_the_section_and_the_cross_section_checks(toy_overrides):
    with pytest.raises(UserError, match="method.lr must be positive, got -1.0"):
        load_config(None, toy_overrides + ["method.lr=-1"])
    with pytest.raises(UserError, match="resources.groups names 'mars', neither a role"):
        load_config(None, toy_overrides + ["resources.groups={mars: {cpus_per_client: 1}}"])


@dataclass(frozen=True)
class _Values:
    step: int
    mode: Optional[Literal["a", "b"]] = None
    weight: float = 1.0


def test_an_instruction_s_values_become_its_reader_s_dataclass():
    assert read_values(_Values, {"step": 3, "weight": 2}, "fit") == _Values(3, None, 2)
    assert read_values(StandardizeValues, {}, "data_standardize") == StandardizeValues(own_statistics=False)
    assert read_values(StandardizeValues, {"own_statistics": True}, "data_standardize").own_statistics
    shared = {STAGE: MOMENTS, "predictors": ["r", "e"]}  # the method's own evaluate values beside the hook's
    assert read_values(SelectionValues, shared, "evaluate", shared=True).selection_stage == MOMENTS
    assert read_values(SelectionValues, {}, "evaluate", shared=True).selection_stage is None
    bad = [
        ({}, "instruction 'fit' lacks its value 'step': its server half must send it"),
        ({"step": True}, "instruction 'fit': value step=True is not of type"),
        ({"step": 1, "mode": "c"}, "instruction 'fit': value mode='c' is not of type"),
        ({"step": 1, "stp": 2}, "instruction 'fit' carries ['stp'], which it does not read"),
    ]
    for values, message in bad:
        with pytest.raises(TypeError) as caught:
            read_values(_Values, values, "fit")
        assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
