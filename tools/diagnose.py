"""`python -m tools.diagnose NAME RUN_DIR [options]` (from the repository): explain a result from what a run
directory holds.

    python -m tools.diagnose feddadil-atoms runs/feddadil-tep   # where the atoms sit relative to each source domain
    python -m tools.diagnose feddadil-labels runs/feddadil-tep  # each atom's labels, every client's alpha
    python -m tools.diagnose feddadil-alpha runs/feddadil-tep   # own alpha vs alpha re-fitted on the atoms
    python -m tools.diagnose feddadil-plateau runs/pilot-*      # the plateau rule on the sources' DiL loss
    python -m tools.diagnose sources runs/reproduce-fada --control fedavg-3ep

The checkpoint-based ones read the state of the run's last checkpoint (``run.checkpoint_every``). Each
diagnostic lives in :mod:`tools.diagnostics`; a wrong directory or a run of another method is one line
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from tools.diagnostics import DIAGNOSTICS
from tools.diagnostics.command import run_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = parser.add_subparsers(dest="diagnostic", metavar="NAME", required=True)
    for name, module in DIAGNOSTICS.items():
        sub = names.add_parser(name, help=module.HELP, description=module.__doc__.split("\n\n")[0])
        module.add_arguments(sub)


def run(args: argparse.Namespace) -> int:
    return DIAGNOSTICS[args.diagnostic].run(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse, run; a :class:`fedsim.errors.UserError` is one line on stderr and exit code 2."""
    parser = argparse.ArgumentParser(prog="python -m tools.diagnose", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run_command(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
