"""Numba CPU kernels (``@numba.njit(cache=True, error_model="numpy")``, float64).

Each wrapper takes plain arrays, checks shapes, and returns new arrays; it
gives the same numbers (to round-off, rtol 1e-10 in the tests) as the NumPy
reference function named in its docstring. Kernels import nothing from the
reference filters.

Modules: ``diagonal`` (FD/VD-EKF updates from H), ``dlr`` (DLR predict, Woodbury
solve, sampling), ``lofi`` (the LO-FI update from H), ``mlp`` (forward pass and
Jacobian), ``step`` (the whole LO-FI predict + update of an MLP in one call),
``mlp_diag`` (the FD/VD-EKF step of an MLP in one call), ``bong`` (BONG/BLR/BOG/BBB
inner steps for the diagonal and DLR families), ``bong_mlp`` (their MLP estimates and
diagonal steps in one call), ``blr_mlp`` and ``bbb_mlp`` (a DLR BLR or BBB LIN-HESS iteration
of an MLP from per-unit sums), ``hutchinson`` (MC-HESS over the diagonal families: an MLP's gradient
and exact Hessian-vector products at one draw), ``cholupdate`` (the full families' products with the
covariance and update passes; BOG's full-moment certificate: the rank-K Cholesky downdate, and the
update pass that returns the new covariance's Gershgorin bound), ``rownorms``;
``_blocks`` holds the shared building blocks; ``_compile_helper`` compiles part of the first
LO-FI step in a second process.

Floating point: fastmath is off except for reductions (Gram tiles, dot products,
finiteness checks), which allow only {"reassoc", "contract"} so that LLVM can
vectorise the sums; no flag that assumes away NaN or inf is used, and a test
enforces that subset. Division is IEEE 754's (``error_model="numpy"``): x / 0 gives inf or
NaN, which the kernels' finiteness checks name, instead of Python's ZeroDivisionError, whose
test of every divisor keeps LLVM from vectorising any loop that divides (1 / x over 123,610
entries: 117 µs with the test, 17 µs without it, one thread). A test enforces it on every kernel.
Threads: large chunked passes may run on a small Python thread pool; sums are
added in chunk order, so results are identical for any thread count
(``refbayes.set_threads`` / ``REFBAYES_NUM_THREADS`` set the count; docs/threads.md).

Cache: numba keys its on-disk cache on each function's own file, so a change in a
helper (``_blocks.py``) would leave the dependent kernels' cached machine code
stale. The kernels are therefore cached in a directory named after a hash of all
kernel sources (``kernel_cache_dir()``): any edit moves every kernel to a fresh
cache. numba's ``CACHE_DIR`` is set only while the modules below are imported and
restored afterwards (numba reads it when it decorates a function).

First use: when that directory does not exist yet (``FIRST_USE``), importing this module prints
a one-line notice, and the first fused LO-FI step compiles its small algebra in a helper process
while it compiles its other pieces (``_compile_helper``; ``REFBAYES_COMPILE_HELPER=0`` turns it off).

Memory: loading this module sets glibc's malloc thresholds once per process
(``refbayes.allocator``), so that the steps' P-sized buffers are reused instead of
page-faulted back every step; ``REFBAYES_MALLOC=0`` leaves them alone.
"""

import hashlib
import os
from pathlib import Path

import numba


def _source_hash():
    here = Path(__file__).resolve().parent
    h = hashlib.sha256(numba.__version__.encode())
    for path in sorted(here.glob("*.py")) + [here.parent / "_host.py"]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def kernel_cache_dir():
    """Where the compiled kernels are cached: <base>/refbayes-kernels-<hash of the sources>.

    <base> is ``NUMBA_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME`` (default ``~/.cache``)/refbayes.
    """
    base = numba.config.CACHE_DIR or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "refbayes")
    return os.path.join(base, "refbayes-kernels-" + _source_hash())


from refbayes.allocator import tune as _tune_allocator

_tune_allocator()  # glibc's malloc thresholds, once per process (refbayes.allocator; REFBAYES_MALLOC=0 skips it)

_saved_cache_dir = numba.config.CACHE_DIR
numba.config.CACHE_DIR = kernel_cache_dir()
# first use of these sources: say why the next call is slow (and let the fused LO-FI step compile its small
# algebra in a helper process, _compile_helper)
FIRST_USE = not os.path.isdir(numba.config.CACHE_DIR)
if FIRST_USE:
    import sys

    print("refbayes: compiling the numba kernels on first use (cached afterwards; "
          "`refbayes warmup` compiles ahead) ...", file=sys.stderr, flush=True)
try:
    from . import bong
    from .diagonal import VD_MEAN_RULES, fd_update, vd_update
    from .dlr import dlr_inner, dlr_predict, dlr_sample, dlr_solve
    from .lofi import lofi_update
    from .mlp import mlp_forward, mlp_value_and_jacobian, mlp_value_and_jacobian_batch
    from .rownorms import rowsumsq
    from . import mlp_diag, step  # noqa: F401  (decorated here, under the cache directory above)
    from . import bong_mlp  # noqa: F401  (after step and mlp_diag, whose helpers it uses)
    from . import blr_mlp  # noqa: F401  (after bong_mlp)
    from . import bbb_mlp  # noqa: F401  (after blr_mlp)
    from . import cholupdate  # noqa: F401
    from . import hutchinson  # noqa: F401  (after bong_mlp)
finally:
    numba.config.CACHE_DIR = _saved_cache_dir

__all__ = [
    "bong",
    "bong_mlp",
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
