"""Every shipped config loads, names a registered method and benchmark, and is valid."""

from pathlib import Path

import pytest

from fedsim.config import load_config
from fedsim.registry import BENCHMARKS, METHODS

CONFIGS = sorted((Path(__file__).parent.parent / "experiments" / "configs").glob("*.yaml"))


def test_there_are_configs():
    assert CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_loads(path):
    config = load_config(path)
    assert config.method.name in METHODS
    assert config.data.benchmark in BENCHMARKS
