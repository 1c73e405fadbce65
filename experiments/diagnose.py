"""`fedsim diagnose NAME RUN_DIR [options]`: explain a result from what a run directory holds.

    fedsim diagnose feddadil-atoms runs/feddadil-tep      # where the atoms sit relative to each source domain
    fedsim diagnose feddadil-labels runs/feddadil-tep     # each atom's labels, every client's alpha
    fedsim diagnose feddadil-alpha runs/feddadil-tep      # own alpha vs alpha re-fitted on the atoms
    fedsim diagnose feddadil-plateau runs/pilot-*         # the plateau rule on the sources' DiL loss
    fedsim diagnose sources runs/reproduce-fada --control fedavg-3ep

The checkpoint-based ones read the state of the run's last checkpoint (``run.checkpoint_every``). Each
diagnostic lives in :mod:`experiments.diagnostics`; a wrong directory or a run of another method is one line
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse

from experiments.diagnostics import DIAGNOSTICS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = parser.add_subparsers(dest="diagnostic", metavar="NAME", required=True)
    for name, module in DIAGNOSTICS.items():
        sub = names.add_parser(name, help=module.HELP, description=module.__doc__.split("\n\n")[0])
        module.add_arguments(sub)


def run(args: argparse.Namespace) -> int:
    return DIAGNOSTICS[args.diagnostic].run(args)
