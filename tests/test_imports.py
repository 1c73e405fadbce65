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
