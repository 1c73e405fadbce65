"""tools/device: the GPU machine's protocol driver runs its trials through the local backend, writes results.csv and
the table as `fedsim reproduce` does, and never imports Ray; its TEP spec is a valid protocol."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.errors import UserError
from tools.device import tep_protocol

ROOT = Path(__file__).resolve().parents[1]

TINY_SPEC = """
paper: "a tiny protocol"
seeds: [0]
set: [run.rounds=1, run.tensorboard=false, run.checkpoint_every=0, method.batch_size=16]
benchmarks:
  npz:
    targets: [dom1]
    set: [data.root={root}]
runs:
  fedavg: {{set: [method.name=fedavg]}}
  centralized: {{set: [method.name=centralized, method.optimizer=adam, method.lr=0.001]}}
rows:
  - {{name: fedavg, label: "FedAvg source-only"}}
  - {{name: centralized, label: "Centralized"}}
columns: [target, source]
claims:
  - {{claim: "centralized above FedAvg", order: [centralized, fedavg]}}
"""


def test_the_driver_runs_a_tiny_protocol_on_the_cpu_without_ray(toy_root, tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC.format(root=toy_root))
    out = tmp_path / "out"
    code = subprocess.run(
        [sys.executable, "-m", "tools.device.tep_protocol", "--out", str(out), "--spec", str(spec)]
        + ["--device", "cpu", "--precision", "bf16"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert code.returncode == 0, code.stderr[-2000:]
    assert "ray imported: False" in code.stdout
    with (out / "results.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    assert [(line["row"], line["status"], line["seed"]) for line in lines] == [
        ("fedavg", "finished", "0"),
        ("centralized", "finished", "0"),
    ]
    for line in lines:
        assert 0 <= float(line["target"]) <= 1 and 0 <= float(line["source"]) <= 1
    assert "FedAvg source-only" in (out / "table.md").read_text()
    assert "centralized above FedAvg" in (out / "claims.md").read_text()
    with (out / "trials.csv").open() as fh:
        assert {row["device"] for row in csv.DictReader(fh)} == {"cpu"}
    for run in ("fedavg", "centralized"):
        summary = (out / "runs" / f"{run}-seed0" / "summary.json").read_text()
        assert '"backend": "local"' in summary


def test_the_driver_imports_no_ray():
    code = "import sys, tools.device.tep_protocol as t; t.load; import fedsim.api; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_the_tep_spec_is_the_protocol_with_this_machines_settings(tmp_path):
    from fedsim.experiments.reproduce_spec import to_sweep

    args = tep_protocol.parse_args(
        ["--out", str(tmp_path), "--windows", "3", "--device", "cuda", "--workers", "4", "--seeds", "0,1,2"]
    )
    spec = tep_protocol.load(args)
    sweep = to_sweep(spec)
    configs = {str(point): sweep.config_for(point) for point in sweep.points()}  # no data built: the configs only
    assert len(configs) == 7 * 3
    by_method = {c.method.name: c for c in configs.values()}
    assert sorted(by_method) == ["centralized", "dadil", "fada", "fedavg", "feddadil", "feddann", "fedmmd"]
    for config in configs.values():
        assert (config.data.benchmark, config.data.target) == ("tep", "mode2")
        assert config.data.options.variant == "windows" and config.data.options.windows_per_class == 3
        assert config.data.options.workers == 4
        assert config.run.precision == "bf16" and config.resources.gpus_per_client == 1
        assert config.run.backend == "local"
    central = by_method["centralized"]
    assert (central.method.params.optimizer, central.method.lr, central.method.batch_size) == ("adam", 1e-4, 256)
    assert central.run.rounds * central.method.local_epochs == 70
    assert by_method["fada"].method.params.disentangle and by_method["fada"].method.params.adversarial
    assert by_method["feddadil"].method.params.encoder_rounds == 10


def test_the_shell_script_parses():
    done = subprocess.run(["bash", "-n", str(ROOT / "tools" / "device" / "tep_gpu.sh")], capture_output=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("runs", ["fedavg,nope"])
def test_an_unknown_run_is_one_line(runs, tmp_path):
    from fedsim.errors import UserError

    with pytest.raises(UserError, match="nope"):
        tep_protocol.load(tep_protocol.parse_args(["--out", str(tmp_path), "--runs", runs]))


PROTOCOLS = ROOT / "tools" / "device"


def _trials(path: Path) -> dict:
    from fedsim.experiments.reproduce_spec import load_spec, to_sweep
    from fedsim.experiments.sweep_grid import VARIANT_KEY

    spec = load_spec(None, str(path))
    sweep = to_sweep(spec)
    return {
        (run, target): sweep.config_for({VARIANT_KEY: name, "run.seed": 0}) for name, run, _, target in spec.variants()
    }


def test_the_device_spec_runs_the_results_specs_mode2_trials():
    """Every run of tools/device/tep_mode2.yaml is the mode2 trial of the windows results specs, setting for
    setting: FADA III of fada-tep-windows, every other run of feddadil-tep-windows."""
    device = _trials(tep_protocol.SPEC)
    feddadil = _trials(PROTOCOLS / "feddadil-tep-windows.yaml")
    fada = _trials(PROTOCOLS / "fada-tep-windows.yaml")
    assert {target for _, target in device} == {"mode2"}
    for (run, target), config in device.items():
        expected = fada["fada-III", target] if run == "fada" else feddadil[run, target]
        assert config == expected, run


def test_the_targets_filter_keeps_the_named_targets_and_titles_the_table(tmp_path):
    args = tep_protocol.parse_args(
        ["--out", str(tmp_path), "--spec", str(PROTOCOLS / "feddadil-tep-windows.yaml"), "--targets", "mode2"]
        + ["--windows", "7", "--precision", "fp32"]
    )
    spec = tep_protocol.load(args)
    assert spec.raw["benchmarks"]["tep"]["targets"] == ["mode2"]
    assert spec.raw["paper"].endswith("TEP on the authors' windows, 7 windows a class, fp32")
    with pytest.raises(UserError, match="--targets mode9: not a target"):
        tep_protocol.load(tep_protocol.parse_args(["--out", str(tmp_path), "--targets", "mode9"]))


def test_the_joiner_writes_one_directory_from_one_call_per_run(toy_root, tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC.format(root=toy_root))
    folders = []
    for run in ("fedavg", "centralized"):
        folders.append(tmp_path / run)
        code = subprocess.run(
            [sys.executable, "-m", "tools.device.tep_protocol", "--out", str(folders[-1]), "--spec", str(spec)]
            + ["--device", "cpu", "--runs", run],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert code.returncode == 0, code.stderr[-2000:]
    from tools.device import tep_join

    joined = tmp_path / "joined"
    assert tep_join.main(["--spec", str(spec), "--out", str(joined), *map(str, folders)]) == 0
    with (joined / "results.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    assert [(line["row"], line["seed"]) for line in lines] == [("fedavg", "0"), ("centralized", "0")]
    for line, folder in zip(lines, folders):
        with (folder / "results.csv").open() as fh:
            (alone,) = list(csv.DictReader(fh))
        assert (line["target"], line["source"]) == (alone["target"], alone["source"])
    assert {p.name for p in joined.iterdir()} >= {"table.md", "claims.md", "accuracy-npz.png"}
    assert tep_join.main(["--spec", str(spec), "--out", str(tmp_path / "twice"), str(folders[0]), str(folders[0])]) == 2
