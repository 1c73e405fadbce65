import subprocess
import sys


def test_fedsim_never_imports_ray():
    code = (
        "import sys, fedsim, fedsim.registry, fedsim.runtime, fedsim.methods, fedsim.models, fedsim.data.benchmarks;"
        "from fedsim.registry import METHODS; METHODS.names();"
        "sys.exit(1 if 'ray' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_registry_imports_only_what_a_run_asks_for():
    """A FedAvg run on digits must not pay for POT, scikit-learn or torchvision (memory and start-up of every actor)."""
    code = (
        "import sys; from fedsim.registry import METHODS, BENCHMARKS, MODELS;"
        "METHODS.get('fedavg'); BENCHMARKS.get('digits'); MODELS.get('lenet5');"
        "heavy = [m for m in ('ot', 'sklearn', 'torchvision') if m in sys.modules];"
        "assert not heavy, heavy;"
        "assert {'feddadil', 'fedod', 'fada'} <= set(METHODS.names()), METHODS.names();"
        "assert 'ot' in sys.modules"  # listing imports every method file, FedDaDiL's POT included
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


BLOCK_TORCHVISION = "; ".join(
    [
        "import sys",
        "sys.modules['torchvision'] = None",
        "from fedsim.experiments.cli import main",
        "sys.exit(main(sys.argv[1:]))",
    ]
)


def test_without_torchvision_classification_works_and_detection_says_what_to_install(tmp_path):
    """torchvision is the optional 'detection' extra: listing still works, a detection run exits 2 naming the extra."""
    listing = subprocess.run([sys.executable, "-c", BLOCK_TORCHVISION, "list"], capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr[-2000:]
    assert "fedavg" in listing.stdout and "feddadil" in listing.stdout
    family = [line for line in listing.stdout.splitlines() if line.split()[:1] == ["detection"]]  # fedod's family
    assert len(family) == 1 and "not available" in family[0] and "'.[detection]'" in family[0], listing.stdout
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCK_TORCHVISION,
            "run",
            "--method",
            "fedod",
            "--benchmark",
            "scenes",
            "--rounds",
            "1",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "'.[detection]'" in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / "run").exists()
