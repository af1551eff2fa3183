"""BONG and its relatives: Bayesian online natural gradient (Jones, Chang & Murphy, NeurIPS 2024).

Four algorithms (BONG, BLR, BOG, BBB) x five variational families (full and
diagonal, each in moment or natural parameters, and diagonal-plus-low-rank)
x four gradient/Hessian estimators (MC-HESS, MC-EF, LIN-HESS, LIN-EF): 76
defined methods (DLR with MC-HESS is not).

- estimators: (g, G) from Monte Carlo draws or a linearisation.
- families: beliefs, predict steps, the DLR projection.
- algorithms: one inner-step function per (algorithm, family).
- names: the paper's method names and the option table.
- filter: the Bong class.
- compiled: the inner steps on compiled kernels (backend="numba"; diagonal and DLR families).
"""

from . import algorithms, compiled, estimators, families, names
from .algorithms import ALGORITHMS, STEPS, get_step, supports
from .estimators import ESTIMATORS, Curvature, Estimate
from .families import FAMILIES, dlr_project, predict_dlr, predict_full, predict_diag
from .filter import Bong
from .names import COMBINATIONS, format_name, parse_name

__all__ = [
    "Bong",
    "ALGORITHMS",
    "FAMILIES",
    "ESTIMATORS",
    "COMBINATIONS",
    "STEPS",
    "Curvature",
    "Estimate",
    "get_step",
    "supports",
    "dlr_project",
    "predict_dlr",
    "predict_full",
    "predict_diag",
    "parse_name",
    "format_name",
    "algorithms",
    "compiled",
    "estimators",
    "families",
    "names",
]
