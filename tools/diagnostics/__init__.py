"""Diagnostics: small, tested tools that explain a result from what a run directory holds.

Each module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``;
`python -m tools.diagnose NAME ...` (:mod:`tools.diagnose`) dispatches to them. They use only public names of fedsim.
"""

from __future__ import annotations

from tools.diagnostics import disclosure, feddadil_alpha, feddadil_atoms, feddadil_labels, feddadil_plateau, sources

#: diagnostic name -> its module
DIAGNOSTICS = {
    module.NAME: module
    for module in (feddadil_atoms, feddadil_labels, feddadil_alpha, feddadil_plateau, sources, disclosure)
}
