"""Thread policy of the filter steps: how many numba and BLAS threads one step may use.

Every public step of every filter (``predict``, ``update``, ``predict_update``,
``update_batch``, ``scan``, ``predict_obs``) runs inside :func:`step_threads`,
which picks the counts, applies them for the duration of the call and restores
the process-wide settings afterwards (the BLAS count through threadpoolctl; the
count of the numba kernels' threads is this Python thread's own, read by
``refbayes.kernels._host.run_chunks``).

Policy (see ``docs/threads.md``):

- Small problems (P below ``MIN_PARALLEL_P[backend]`` parameters) run on one numba
  thread and one BLAS thread: waking a pool costs more than it saves there, and on a
  busy machine threads that wait for a core cost milliseconds per step. The two
  thresholds differ because the backends' threads differ (measurements in
  docs/threads.md): the numba passes gain from a second thread from a few ten
  thousand parameters, a threaded BLAS inside the reference step did not gain up to
  P = 500,000 on the 2-core machine.
- Large problems use up to ``cores`` threads, where ``cores`` is the number of
  CPUs this process may run on (``os.sched_getaffinity``), capped by
  ``REFBAYES_NUM_THREADS`` or :func:`set_threads` (and, on the numba backend, by
  ``NUMBA_NUM_THREADS``). The numba backend runs its passes over P as ``nogil``
  compiled functions on refbayes' own thread pool (``_host.run_chunks``) and calls
  BLAS only on small blocks, so BLAS gets one thread there; the NumPy backend gives
  the threads to BLAS. Kernel threads plus the extra BLAS threads (beyond the
  calling one) never exceed ``cores``.
- No kernel uses numba's ``parallel=True`` (``prange``), so numba's threading layer
  plays no part: steps from several Python threads run concurrently under every
  layer, ``workqueue`` included, and ``numba.set_num_threads`` is left alone.

Importing this module imports neither numba nor threadpoolctl and changes no
global setting.
"""

import functools
import importlib
import os
import threading

__all__ = ["set_threads", "get_threads", "available_cores", "plan", "step_threads", "MIN_PARALLEL_P"]

#: per backend, below this many parameters a step runs on one thread (docs/threads.md gives
#: the 2-core measurements behind them: numba's fused LO-FI step ran 1.5-2x faster on two
#: threads from P = 50,000 on an idle machine and no slower on a busy one; the reference
#: step ran slower on two BLAS threads at P = 10,000 and 100,000 and even at 500,000)
MIN_PARALLEL_P = {"numba": 50_000, "numpy": 1_000_000, "cuda": 50_000}

ENV = "REFBAYES_NUM_THREADS"

_user = {"numba": None, "blas": None}
_local = threading.local()
_BLAS = []  # cached threadpoolctl BLAS controllers


def available_cores():
    """CPUs this process may run on (``os.sched_getaffinity`` where present, else ``os.cpu_count``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _env_cap():
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{ENV} must be a positive integer; got {raw!r}") from None
    if n < 1:
        raise ValueError(f"{ENV} must be a positive integer; got {raw!r}")
    return n


def _check_count(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int or None; got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int or None; got {value!r}")
    return value


def set_threads(numba: int | None = None, blas: int | None = None) -> None:
    """Fix the thread counts of every filter step (None: back to the automatic policy).

    Args:
        numba: threads for the numba kernels' passes over P (int >= 1 or None).
        blas: threads for BLAS/LAPACK inside a step (int >= 1 or None).

    The counts are capped so that numba + BLAS threads never exceed the available cores.
    ``REFBAYES_NUM_THREADS`` caps the automatic policy the same way.
    """
    n = _check_count(numba, "numba")
    b = _check_count(blas, "blas")
    _user["numba"], _user["blas"] = n, b


def get_threads() -> dict[str, int | None]:
    """The settings: {"numba", "blas"} (None = automatic), "cores" available, "cap" from the environment."""
    return {"numba": _user["numba"], "blas": _user["blas"], "cores": available_cores(), "cap": _env_cap()}


def plan(n_params, backend="numpy"):
    """(numba_threads, blas_threads) that a step on ``n_params`` parameters with ``backend`` uses."""
    cores = available_cores()
    cap = _env_cap()
    total = min(cores, cap) if cap else cores
    un, ub = _user["numba"], _user["blas"]
    big = n_params >= MIN_PARALLEL_P.get(backend, MIN_PARALLEL_P["numpy"])
    if backend == "numba":
        nb = un if un is not None else (total if big else 1)
        bl = ub if ub is not None else 1
    else:
        nb = 1
        bl = ub if ub is not None else (total if big else 1)
    # a one-thread BLAS runs on the calling thread; extra BLAS threads come on top of numba's
    nb = max(1, min(nb, cores))
    bl = max(1, min(bl, cores - nb + 1))
    return nb, bl


def _blas_libs():
    """The BLAS libraries' threadpoolctl controllers, found on first use ([] without threadpoolctl)."""
    if not _BLAS:
        libs = []
        try:
            from threadpoolctl import ThreadpoolController

            importlib.import_module("scipy.linalg.cython_blas")  # load the BLAS that SciPy and the kernels call
            libs = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
        except Exception:  # threadpoolctl missing: BLAS is left as it is
            pass
        _BLAS.append(libs)
    return _BLAS[0]


def set_blas_threads(n):
    """Set every BLAS library to ``n`` threads; returns [(library, previous count)] for those it changed,
    to hand to :func:`restore_blas_threads` (libraries already at ``n`` are left alone)."""
    saved = []
    for lib in _blas_libs():
        cur = lib.get_num_threads()
        if cur != n:
            lib.set_num_threads(n)
            saved.append((lib, cur))
    return saved


def restore_blas_threads(saved):
    """Undo :func:`set_blas_threads` (last change first); empties ``saved``."""
    while saved:
        lib, cur = saved.pop()
        lib.set_num_threads(cur)


def current_numba_threads():
    """numba threads the kernels may use in this Python thread (set by the running step)."""
    n = getattr(_local, "numba", None)
    if n is not None:
        return n
    return plan(MIN_PARALLEL_P["numba"], "numba")[0]


class kernel_threads:
    """Context manager: inside a running step, let the kernels of this Python thread use ``n`` threads
    (at least one) instead of the step's count, e.g. while another thread of the step's own works
    beside them; outside a step it changes nothing."""

    __slots__ = ("n", "saved")

    def __init__(self, n):
        self.n = max(1, int(n))

    def __enter__(self):
        self.saved = getattr(_local, "numba", None)
        if self.saved is not None:
            _local.numba = self.n
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            _local.numba = self.saved
        return False


class step_threads:
    """Context manager: the thread policy for one step (nested uses are free)."""

    __slots__ = ("n_params", "backend", "saved_blas", "outer")

    def __init__(self, n_params, backend):
        self.n_params = n_params
        self.backend = backend

    def __enter__(self):
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        self.outer = depth == 0
        self.saved_blas = []
        if not self.outer:
            return self
        nb, bl = plan(self.n_params, self.backend)
        if self.backend == "numba":
            import numba  # the numba backend needs it anyway

            nb = min(nb, numba.config.NUMBA_NUM_THREADS)  # NUMBA_NUM_THREADS caps the kernels' threads too
        _local.numba = nb
        self.saved_blas = set_blas_threads(bl)
        return self

    def __exit__(self, *exc):
        _local.depth -= 1
        if not self.outer:
            return False
        _local.numba = None
        restore_blas_threads(self.saved_blas)
        return False


def wrap_step(method):
    """Decorator: run a filter method under :class:`step_threads` for its size (``Filter._thread_size``) and backend."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if getattr(_local, "depth", 0):
            return method(self, *args, **kwargs)
        with step_threads(self._thread_size(), getattr(self, "backend", "numpy")):
            return method(self, *args, **kwargs)

    wrapper.__refbayes_threads__ = True
    return wrapper
