"""Every registered method gives the numbers recorded in tests/golden/summaries.json on its tiny fixed-seed case.

The record holds both backends (``python -m tools.golden record``); the Ray half is compared with the local
half by tests/test_backends.py and by the golden check itself, so this test runs the local backend only: a
refactoring that changes a metric, a round's history or the final global model fails here. Floats match within
the rounding that separates two CPUs (``tools.golden.RTOL``/``ATOL``); the record's two halves, made on one
machine, match bit for bit.
"""

import json
from pathlib import Path

import pytest

from tools.golden import CASES, differences, record_case

RECORD = Path(__file__).parent / "golden" / "summaries.json"
SLOW_KINDS = {"scenes"}  # the detection cases build FCOS models: covered by tests/test_fedod.py's runs


def _local_cases() -> list[str]:
    return [case for case, (kind, _) in CASES.items() if kind not in SLOW_KINDS]


def test_every_case_is_recorded_on_both_backends():
    recorded = json.loads(RECORD.read_text())
    assert set(recorded) == {f"{case}/{backend}" for case in CASES for backend in ("local", "ray")}


def test_the_record_has_the_same_numbers_on_both_backends():
    recorded = json.loads(RECORD.read_text())
    for case in CASES:
        local, ray = recorded[f"{case}/local"], recorded[f"{case}/ray"]
        assert differences(local, ray, case, exact=True) == [], case


@pytest.mark.parametrize("case", _local_cases())
def test_case_matches_the_record(case, tmp_path):
    expected = json.loads(RECORD.read_text())[f"{case}/local"]
    actual = json.loads(json.dumps(record_case(case, "local", tmp_path)))
    assert differences(expected, actual, case) == []


def test_floats_match_within_the_cpus_rounding_and_nothing_else_moves():
    recorded = {"loss": 0.5, "correct": 7, "accuracy": 0.75, "name": "fedavg", "evaluated": True, "digest": "a"}
    drifted = {**recorded, "loss": 0.5 * (1 + 2e-6), "digest": "b"}  # what another CPU's rounding gives
    assert differences(recorded, drifted) == []
    assert len(differences(recorded, drifted, exact=True)) == 2  # one machine: the same bits
    for changed in ({"loss": 0.501}, {"correct": 8}, {"accuracy": 0.74}, {"name": "fedprox"}, {"evaluated": 1.0}):
        assert len(differences(recorded, {**recorded, **changed})) == 1, changed
