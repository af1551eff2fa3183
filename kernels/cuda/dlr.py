"""rowsumsq and the DLR predict step on an NVIDIA GPU (numba.cuda); same arguments and
results as ``refbayes.kernels.cpu.rowsumsq`` / ``dlr_predict`` (Chang et al. 2023,
eqs 13-25). The L x L Cholesky factor is computed on the host.
"""

import numpy as np
import scipy.linalg as sla
from numba import cuda

from refbayes.errors import NotPositiveDefiniteError

from .. import _host
from . import _device, _gram

__all__ = ["rowsumsq", "dlr_predict"]


def rowsumsq(M):
    """Row sums of M * M: (P, K) -> (P,)."""
    M = _host.as_f64(M, "M", (None, None))
    P = M.shape[0]
    dout = cuda.device_array(P)
    if P:
        blocks, threads = _device.launch_1d(P)
        _device.rowsumsq[blocks, threads](cuda.to_device(M), dout)
    return dout.copy_to_host()


@_host.one_blas_thread
def dlr_predict(mean, ups, W, gamma, q):
    """LO-FI predict step (Chang et al. 2023, eqs 13-25) on the GPU.

    mean, ups: (P,); W: (P, L); gamma > 0; q >= 0 scalar or (P,).
    Returns (mean, ups, W), new host arrays. See ``refbayes.kernels.cpu.dlr_predict``.
    """
    ups = _host.check_positive(_host.as_f64(ups, "ups", (None,)), "ups")
    P = ups.shape[0]
    W = _host.as_f64(W, "W", (P, None))
    mean = _host.as_f64(mean, "mean", (P,))
    L = W.shape[1]
    gamma = _host.as_scalar(gamma, "gamma", positive=True)
    qv, qstride = _host.as_process_noise(q, P)
    do_gram = bool(np.any(qv > 0)) and L > 0
    blocks, threads = _device.launch_1d(P)
    dups, dW = cuda.to_device(ups), cuda.to_device(W)
    dout_ups, dweight = cuda.device_array(P), cuda.device_array(P)
    if P:
        _device.dlr_predict_diag[blocks, threads](dups, gamma * gamma, cuda.to_device(qv), qstride, dout_ups, dweight)
    S = np.eye(L)
    if do_gram:
        M = _gram.gram_cols(dW, dweight, False, L, P)
        if not np.all(np.isfinite(M)):
            _host.raise_nonfinite("LO-FI predict", ups=ups, W=W)
        try:
            Lc = np.linalg.cholesky(np.eye(L) + M)
        except np.linalg.LinAlgError as exc:
            raise NotPositiveDefiniteError("I + q W^T diag(D) W is not positive definite") from exc
        S = sla.solve_triangular(Lc, np.eye(L), lower=True).T
    dout_m, dout_W = cuda.device_array(P), cuda.device_array((P, L))
    if P:
        _device.dlr_predict_rows[blocks, threads](cuda.to_device(mean), dups, dout_ups, dW, gamma,
                                                 cuda.to_device(np.ascontiguousarray(S)), not do_gram, dout_m, dout_W)
    out_ups = dout_ups.copy_to_host()
    if not (np.all(np.isfinite(out_ups)) and out_ups.min(initial=1.0) > 0):
        raise NotPositiveDefiniteError("predicted diagonal precision is not finite and positive")
    return dout_m.copy_to_host(), out_ups, dout_W.copy_to_host()
