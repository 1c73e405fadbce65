"""Optimal-transport building blocks for DaDiL / FedDaDiL (on POT's torch backend)."""
from fedsim.ot.barycenter import labeled_barycenter
from fedsim.ot.simplex import project_simplex
from fedsim.ot.wasserstein import SOLVERS, joint_cost, transport_plan, wasserstein_distance

__all__ = ["SOLVERS", "joint_cost", "labeled_barycenter", "project_simplex", "transport_plan",
           "wasserstein_distance"]
