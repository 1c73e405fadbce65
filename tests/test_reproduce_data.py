"""Specs whose benchmarks read files: the data folder comes from --data-dir, FEDSIM_DATA_DIR or --data-root, is
checked before anything runs, and travels in the spec (so --resume reads the same files)."""

import pytest

from fedsim.errors import UserError
from fedsim.experiments.cli import main
from fedsim.experiments.reproduce_data import DATA_DIR_VARIABLE, parse_data_roots, resolve_data_roots
from fedsim.experiments.reproduce_spec import PaperSpec, to_sweep


def _spec(tmp_path, **benchmarks) -> PaperSpec:
    raw = {
        "paper": "files",
        "benchmarks": benchmarks or {"cwru": {"targets": ["3hp"], "data_root": "cwru"}},
        "runs": {"fedavg": {"set": ["method.name=fedavg"]}},
        "rows": [{"name": "fedavg"}],
    }
    return PaperSpec("files", raw, tmp_path)


def _roots(spec: PaperSpec) -> dict:
    return {
        name: [s for s in bench.get("set", []) if s.startswith("data.root=")] for name, bench in spec.benchmarks.items()
    }


def test_data_root_is_relative_to_the_data_dir(tmp_path):
    (tmp_path / "data" / "cwru").mkdir(parents=True)
    resolved = resolve_data_roots(_spec(tmp_path), str(tmp_path / "data"), {})
    assert _roots(resolved) == {"cwru": [f"data.root={(tmp_path / 'data' / 'cwru').resolve()}"]}
    (variant,) = to_sweep(resolved).variants.values()
    assert f"data.root={(tmp_path / 'data' / 'cwru').resolve()}" in variant["overrides"]


def test_the_environment_names_the_data_dir(tmp_path, monkeypatch):
    (tmp_path / "cwru").mkdir()
    monkeypatch.setenv(DATA_DIR_VARIABLE, str(tmp_path))
    assert _roots(resolve_data_roots(_spec(tmp_path), None, {}))["cwru"] == [
        f"data.root={(tmp_path / 'cwru').resolve()}"
    ]


def test_data_root_flag_overrides_and_needs_no_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    (tmp_path / "mine").mkdir()
    resolved = resolve_data_roots(_spec(tmp_path), None, parse_data_roots([f"cwru={tmp_path / 'mine'}"]))
    assert _roots(resolved)["cwru"] == [f"data.root={(tmp_path / 'mine').resolve()}"]


def test_an_entry_without_data_root_is_left_alone(tmp_path):
    spec = _spec(tmp_path, digits={"targets": ["usps"]})
    assert _roots(resolve_data_roots(spec, None, {})) == {"digits": []}


def test_benchmark_key_runs_another_entry_name(tmp_path):
    spec = _spec(
        tmp_path, office_surf={"benchmark": "office_caltech", "targets": ["dslr"], "set": ["data.variant=surf"]}
    )
    (variant,) = to_sweep(spec).variants.values()
    assert "data.benchmark=office_caltech" in variant["overrides"] and "data.variant=surf" in variant["overrides"]


@pytest.mark.parametrize(
    "data_dir, roots, expected",
    [
        (None, [], "pass --data-dir DIR (the folder holding cwru), --data-root cwru=DIR, or set FEDSIM_DATA_DIR"),
        ("missing", [], "is not a folder"),
        (None, ["cwru"], "give BENCHMARK=DIR"),
        (None, ["tep=/tmp"], "spec files has no such benchmark; its benchmarks are cwru"),
    ],
)
def test_missing_or_wrong_folders_name_the_fix(tmp_path, monkeypatch, data_dir, roots, expected):
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        resolve_data_roots(_spec(tmp_path), data_dir and str(tmp_path / data_dir), parse_data_roots(roots))


def test_cli_refuses_before_writing(tmp_path, monkeypatch, capsys):
    import yaml

    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    spec_file = tmp_path / "files.yaml"
    spec_file.write_text(yaml.safe_dump(_spec(tmp_path).raw))
    out = tmp_path / "out"
    assert main(["reproduce", "-q", "--spec", str(spec_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--data-dir DIR" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert main(["reproduce", "-q", "--resume", "--out", str(out), "--data-dir", str(tmp_path)]) == 2
    assert "drop --data-dir" in capsys.readouterr().err
