"""Optimal-transport building blocks for DaDiL / FedDaDiL, on POT's torch backend.

:mod:`fedsim.ot.wasserstein` (joint ground cost, transport plans, W_2 between labeled samples),
:mod:`fedsim.ot.barycenter` (free-support labeled barycenters, exact plans kept as permutations),
:mod:`fedsim.ot.simplex` (projection of barycentric coordinates on the simplex). The dense transcription of the
barycenter its tests and benchmark compare with is tools/ot_reference.py, outside the package.
"""
