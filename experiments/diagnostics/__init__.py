"""Diagnostics: small, tested tools that explain a result from what a run directory holds.

Each module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; `fedsim diagnose NAME ...`
(:mod:`experiments.diagnose`) dispatches to them. They use only public names of fedsim and experiments.
"""

from __future__ import annotations

from experiments.diagnostics import feddadil_alpha, feddadil_atoms, feddadil_labels, feddadil_plateau, sources

#: diagnostic name -> its module
DIAGNOSTICS = {
    module.NAME: module for module in (feddadil_atoms, feddadil_labels, feddadil_alpha, feddadil_plateau, sources)
}
