"""Numba CPU kernels (``@numba.njit(cache=True)``, float64).

Each wrapper takes plain arrays, checks shapes, and returns new arrays; it
gives the same numbers (to round-off, rtol 1e-10 in the tests) as the NumPy
reference function named in its docstring. Kernels import nothing from the
reference filters.

Modules: ``diagonal`` (FD/VD-EKF updates from H), ``dlr`` (DLR predict, Woodbury
solve, sampling), ``lofi`` (the LO-FI update from H), ``mlp`` (forward pass and
Jacobian), ``step`` (the whole LO-FI predict + update of an MLP in one call),
``mlp_diag`` (the FD/VD-EKF step of an MLP in one call), ``bong`` (BONG/BLR/BOG/BBB
inner steps for the diagonal and DLR families), ``rownorms``; ``_blocks`` holds the
shared building blocks.

Floating point: fastmath is off except for reductions (Gram tiles, dot products,
finiteness checks), which allow only {"reassoc", "contract"} so that LLVM can
vectorise the sums; no flag that assumes away NaN or inf is used, and a test
enforces that subset.
Threads: large chunked passes may run on a small Python thread pool; sums are
added in chunk order, so results are identical for any thread count
(``numba.set_num_threads`` / ``NUMBA_NUM_THREADS`` set the count).
"""

from . import bong
from .diagonal import VD_MEAN_RULES, fd_update, vd_update
from .dlr import dlr_inner, dlr_predict, dlr_sample, dlr_solve
from .lofi import lofi_update
from .mlp import mlp_forward, mlp_value_and_jacobian, mlp_value_and_jacobian_batch
from .rownorms import rowsumsq

__all__ = [
    "bong",
    "fd_update",
    "vd_update",
    "VD_MEAN_RULES",
    "rowsumsq",
    "dlr_predict",
    "dlr_inner",
    "dlr_solve",
    "dlr_sample",
    "lofi_update",
    "mlp_value_and_jacobian",
    "mlp_value_and_jacobian_batch",
    "mlp_forward",
]
