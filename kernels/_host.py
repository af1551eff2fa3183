"""Host-side helpers shared by the CPU and CUDA wrappers.

The kernels stream over P-sized arrays; everything of size C x C or K x K
(K = L + C) is done here in NumPy/SciPy. Checks run before any work: shapes
and dtypes of every argument, finiteness of the small ones. Large arrays are
not scanned up front (that would cost a full extra pass); the kernels flag a
non-finite output instead, and ``raise_nonfinite`` then names the bad input.
"""

import functools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.linalg as sla

from refbayes.errors import NotPositiveDefiniteError, r_not_positive_definite
from refbayes.threads import restore_blas_threads, set_blas_threads

__all__ = [
    "one_blas_thread",
    "blas_threads",
    "run_chunks",
    "n_threads",
    "as_f64",
    "as_scalar",
    "check_finite",
    "as_process_noise",
    "raise_nonfinite",
    "whitener",
    "innovation_factor",
]

_EPS = np.finfo(np.float64).eps

class blas_threads:
    """Context manager: BLAS/LAPACK limited to ``n`` threads inside (a few microseconds).

    The kernels call BLAS on small blocks from their own threads; a multi-threaded
    BLAS inside would oversubscribe the cores and wake its pool for nothing
    (about 10 ms per call on a busy 2-core machine, against 40 us single-threaded).
    Only libraries whose setting differs are touched, and they are restored on exit.
    """

    def __init__(self, n=1):
        self.n = n
        self.saved = []

    def __enter__(self):
        self.saved += set_blas_threads(self.n)
        return self

    def __exit__(self, *exc):
        restore_blas_threads(self.saved)
        return False


def one_blas_thread(func):
    """Run ``func`` with BLAS/LAPACK limited to one thread (see :class:`blas_threads`)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with blas_threads(1):
            return func(*args, **kwargs)

    return wrapper


# -- threads ---------------------------------------------------------------------------------
# The CPU passes over P are ``kernel(*args, ch0, ch1)``: ``nogil`` Numba functions that handle
# chunks ch0 <= ch < ch1 of the rows and write each chunk's partial result to its own slot.
# ``run_chunks`` splits [0, nch) into contiguous pieces, one per thread, and the caller adds
# the slots in chunk order, so the numbers do not depend on the thread count. Waiting threads
# sleep on futures and never spin: on a shared machine a spinning OpenMP pool (numba's
# ``prange`` default) loses more than it gains.

MIN_CHUNKS_PER_THREAD = 16  # shorter passes run on the calling thread
_POOLS = {}
_POOL_LOCK = threading.Lock()


def n_threads():
    """Threads the CPU kernels may use in this Python thread: the count the running filter step
    chose (refbayes.threads, docs/threads.md), else the automatic policy's count for a large problem."""
    from refbayes.threads import current_numba_threads

    return max(1, int(current_numba_threads()))


def _pool(n):
    with _POOL_LOCK:
        pool = _POOLS.get(n)
        if pool is None:
            pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="refbayes-kernels")
            _POOLS[n] = pool
        return pool


def side_pool():
    """A one-worker pool for work that runs beside a pass on the kernel threads (its own worker, so that
    it never waits behind the pass's chunks)."""
    with _POOL_LOCK:
        pool = _POOLS.get("side")
        if pool is None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="refbayes-side")
            _POOLS["side"] = pool
        return pool


def run_chunks(kernel, nch, *args, rows=None):
    """kernel(*args, ch0, ch1) over the chunks [0, nch); returns the pieces' return values in order.

    rows: None (chunks of equal size: at least MIN_CHUNKS_PER_THREAD of them per thread, split into
    equal counts) or the rows of each chunk (nch,) for chunks of unequal, large sizes (the fused MLP
    steps' whole units): then one chunk per thread is enough, and the cuts split the rows evenly.
    """
    if rows is None:
        nt = min(n_threads(), nch // MIN_CHUNKS_PER_THREAD)
        cuts = [nch * i // nt for i in range(nt + 1)] if nt > 1 else None
    else:
        nt = min(n_threads(), nch)
        cuts = _even_cuts(rows, nt) if nt > 1 else None
        nt = len(cuts) - 1 if cuts else 1
    if nt <= 1:
        return [kernel(*args, 0, nch)]
    futures = [_pool(nt - 1).submit(kernel, *args, cuts[i], cuts[i + 1]) for i in range(1, nt)]
    out = [kernel(*args, cuts[0], cuts[1])]
    return out + [f.result() for f in futures]


def _even_cuts(rows, nt):
    """Cuts 0 = c_0 < c_1 < ... < c_k = len(rows), k <= nt, that split the chunks into contiguous runs
    of about equal total rows (empty runs dropped)."""
    total = float(np.sum(rows))
    csum = np.cumsum(rows)
    cuts = [0]
    for i in range(1, nt):
        target = total * i / nt
        j = int(np.searchsorted(csum, target))  # chunk j crosses the i-th share: end the run before or after it
        c = j if j > 0 and target - csum[j - 1] < csum[j] - target else j + 1
        if cuts[-1] < c < len(rows):
            cuts.append(c)
    cuts.append(len(rows))
    return cuts


def _shape_str(shape):
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def as_f64(value, name, shape, transpose=False, dtype=np.float64):
    """``value`` as a C-contiguous float64 array of ``shape`` (None = any size); with ``transpose``
    (a 2-D shape), its transpose as a C-contiguous array instead (the kernels that read the columns
    of a (P, k) factor as rows of k x P). dtype: np.float32 for the arrays of a float32 belief
    that a kernel reads in float32.

    Copies only when the input is not already C-contiguous ``dtype`` (with ``transpose``: when it is
    not column-major). TypeError for non-real input, ValueError for a wrong shape.
    Always read-only (a read-only view where the array is writable): the kernels never write their
    inputs, and numba compiles a separate specialisation for a read-only and a writable array, so
    one type per input keeps a belief's arrays (read-only) and a user's (writable) on one compiled
    kernel, the one `refbayes warmup` compiles.
    """
    if type(value) is np.ndarray and value.dtype == dtype:  # the common case: no dtype checks needed
        arr = value
    else:
        try:
            arr = np.asarray(value)
        except Exception as exc:  # ragged lists and similar
            raise TypeError(f"{name} must be array-like of real numbers; got {type(value).__name__}") from exc
        if arr.dtype == object or arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
            raise TypeError(f"{name} must contain real numbers; got dtype {arr.dtype}")
    ok = arr.ndim == len(shape) and all(s is None or s == a for s, a in zip(shape, arr.shape))
    if not ok:
        raise ValueError(f"{name} must have shape {_shape_str(shape)}; got {arr.shape}")
    out = np.ascontiguousarray(arr.T if transpose else arr, dtype=dtype)
    if out.flags.writeable:
        out = out.view()
        out.setflags(write=False)
    return out


def as_scalar(value, name, positive=False):
    """A finite real scalar (> 0 if ``positive``, else >= 0)."""
    if type(value) is float:  # the common case, checked without NumPy
        v = value
    else:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be a real scalar; got {value!r}")
        arr = np.asarray(value)
        if arr.shape != () or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
            raise TypeError(f"{name} must be a real scalar; got {value!r}")
        v = float(arr)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite; got {v}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0; got {v}")
    if not positive and v < 0:
        raise ValueError(f"{name} must be >= 0; got {v}")
    return v


def as_process_noise(q, P):
    """q (scalar or (P,)) as (qv, stride) for kernels that read q[i * stride]: a finite q >= 0."""
    if type(q) is float and 0.0 <= q < np.inf:  # the common case, checked faster
        return np.array([q]), 0
    if np.ndim(q) == 0:
        return np.array([as_scalar(q, "q")]), 0
    qv = check_finite(as_f64(q, "q", (P,)), "q")
    if np.any(qv < 0):
        raise ValueError(f"q must be >= 0; got minimum {qv.min()}")
    return qv, 1


def check_finite(arr, name):
    """ValueError if ``arr`` holds NaN or inf (use on small arrays only)."""
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def raise_nonfinite(what, **inputs):
    """A kernel produced a non-finite value: name the bad input, or report a numerical failure."""
    for name, arr in inputs.items():
        if arr is not None and not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or inf")
    from refbayes.errors import DivergenceError

    raise DivergenceError(f"{what} produced a non-finite value from finite inputs (overflow: the model output, "
                          "its Jacobian or the belief left the floating-point range)", quantity=what)


def raise_variance_roundoff(what, var, i=None):
    """A diagonal update left variance ``i`` of ``var`` (P,) at or below 0 from finite inputs: round-off
    in v_i - v_i^2 h_i^T S^{-1} h_i (FD/VD-EKF, docs/diagonal_ekf.md). ``i`` None: the smallest variance.
    The one message of the CPU and CUDA diagonal kernels and the compiled MLP diagonal step."""
    if i is None:
        i = int(np.argmin(var))
    raise NotPositiveDefiniteError(
        f"{what} variance {i} became {float(var[i])!r} (round-off); use a larger prior or observation noise")


def check_positive(vec, name):
    """ValueError if a (P,) variance/precision vector has an entry <= 0 (or NaN)."""
    if vec.size and not vec.min() > 0:
        i = int(np.argmin(np.where(np.isnan(vec), -np.inf, vec)))
        raise ValueError(f"{name} must be > 0; got {float(vec[i])!r} at index {i}")
    return vec


def whitener(R, singular=False, rtol=None):
    """A (k, C) with A^T A = R^{-1} (or R^+ when ``singular``), for the whitened columns H^T A^T.

    singular=False: A = chol(R)^{-1}, k = C (Chang et al. 2023, the A_t of eqs 34-36).
    singular=True: A = diag(w_k^{-1/2}) V_k^T from R = V diag(w) V^T, keeping the eigenvalues
    above rtol * max(w) (default rtol = 10 C eps); k is the numerical rank of R.
    """
    C = R.shape[0]
    R = 0.5 * (R + R.T)
    if C == 0:
        return np.zeros((0, 0))
    if not singular:
        try:
            L = sla.cholesky(R, lower=True)
        except np.linalg.LinAlgError as exc:
            raise r_not_positive_definite(R) from exc
        return sla.solve_triangular(L, np.eye(C), lower=True)
    rtol = 10.0 * C * _EPS if rtol is None else rtol
    w, V = np.linalg.eigh(R)
    if w[-1] <= 0.0:
        return np.zeros((0, C))
    if w[0] < -1e-8 * w[-1]:
        raise NotPositiveDefiniteError(f"R is not positive semi-definite; smallest eigenvalue {w[0]:.3e}")
    keep = w > rtol * w[-1]
    return (V[:, keep] / np.sqrt(w[keep])).T


def innovation_factor(S, singular=False, name="innovation covariance S"):
    """A with A^T A = S^{-1} (Cholesky) or S^+ (``singular``: the least-squares pseudo-inverse).

    Returns (A (k, C), Sinv_apply) where Sinv_apply(b) = S^{-1} b (or S^+ b).
    """
    C = S.shape[0]
    S = 0.5 * (S + S.T)
    if not singular:
        try:
            L = sla.cholesky(S, lower=True)
        except np.linalg.LinAlgError as exc:
            raise NotPositiveDefiniteError(f"{name} is not positive definite") from exc
        A = sla.solve_triangular(L, np.eye(C), lower=True)
        return A, lambda b: sla.cho_solve((L, True), b)
    # the cut-off of np.linalg.lstsq(rcond=None): |eigenvalues| <= eps * C * max are zero. Round-off
    # negatives above -1e-8 * max are dropped too (their terms are products of round-off).
    w, V = np.linalg.eigh(S)
    wmax = max(abs(w[0]), abs(w[-1])) if C else 0.0
    if C and w[0] < -1e-8 * wmax:
        raise NotPositiveDefiniteError(f"{name} is not positive semi-definite; smallest eigenvalue {w[0]:.3e}")
    keep = w > _EPS * C * wmax
    A = (V[:, keep] / np.sqrt(w[keep])).T
    return A, lambda b: A.T @ (A @ b)
