"""`fedsim` starts light: building its parser loads none of the heavy libraries, so a command pays only for what
it runs (tests/test_overhead.py checks that a FedAvg run's driver and server never load torch)."""

import subprocess
import sys

HEAVY = ("torch", "ray", "ot", "sklearn", "matplotlib", "pandas", "scipy")


def test_building_the_command_line_loads_no_heavy_library():
    probe = (
        "import sys; from fedsim.experiments.cli import build_parser; build_parser(); "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "", f"the fedsim parser imported {loaded}: import them inside the command that needs them"
