import subprocess
import sys


def test_fedsim_never_imports_ray():
    code = (
        "import sys, fedsim, fedsim.registry, fedsim.runtime, fedsim.methods, fedsim.models, fedsim.data.benchmarks;"
        "from fedsim.registry import METHODS; METHODS.names();"
        "sys.exit(1 if 'ray' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
