"""numba.cuda kernels for the diagonal updates, rowsumsq, the DLR predict step and the
LO-FI update (whose "tsqr" route, for a very ill-conditioned W~, runs on the CPU).

Same wrappers and arguments as ``refbayes.kernels.cpu`` (host arrays in and out). The steps that keep
the belief on the device are in ``step`` (LO-FI) and ``diag_step`` (FD-EKF, VD-EKF), imported on use.
Without a GPU they run in Numba's CUDA simulator when the environment variable
NUMBA_ENABLE_CUDASIM=1 is set before numba.cuda is first imported (slow; for tests).
"""

from numba import cuda as _cuda

from .diagonal import VD_MEAN_RULES, fd_update, vd_update
from .dlr import dlr_predict, rowsumsq
from .lofi import lofi_update

__all__ = ["fd_update", "vd_update", "VD_MEAN_RULES", "rowsumsq", "dlr_predict", "lofi_update", "is_available"]


def is_available():
    """True when a CUDA GPU (or the CUDA simulator) can run the kernels."""
    try:
        return bool(_cuda.is_available())
    except Exception:  # driver problems surface here as various errors
        return False
