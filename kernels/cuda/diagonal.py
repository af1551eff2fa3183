"""FD-EKF and VD-EKF updates on an NVIDIA GPU (numba.cuda); same arguments and results
as ``refbayes.kernels.cpu.fd_update`` / ``vd_update`` (Chang, Jones & Murphy 2022,
eqs 10-14 and 25). Host arrays in, host arrays out; the C x C algebra stays on the host.
"""

import numpy as np
from numba import cuda

from .. import _host
from . import _device, _gram

__all__ = ["fd_update", "vd_update", "VD_MEAN_RULES"]

VD_MEAN_RULES = ("paper", "ekf")


def _check(mean, var, H, R, e):
    mean = _host.as_f64(mean, "mean", (None,))
    P = mean.shape[0]
    var = _host.check_positive(_host.as_f64(var, "var", (P,)), "var")
    H = _host.as_f64(H, "H", (None, P))
    C = H.shape[0]
    R = _host.check_finite(_host.as_f64(R, "R", (C, C)), "R")
    e = _host.check_finite(_host.as_f64(e, "e", (C,)), "e")
    return mean, var, H, R, e


def _innovation(dH, dvar, var, H, R, singular):
    C, P = H.shape
    S = _gram.gram_rows(dH, dvar, C, P)
    if not np.all(np.isfinite(S)):
        _host.raise_nonfinite("H diag(v) H^T", var=var, H=H)
    return _host.innovation_factor(S + 0.5 * (R + R.T), singular)


def _run(mean, var, H, dH, dvar, A, w, mode, what):
    P = mean.shape[0]
    dmean = cuda.to_device(mean)
    dout_m = cuda.device_array(P)
    dout_v = cuda.device_array(P)
    blocks, threads = _device.launch_1d(P)
    _device.diag_pass[blocks, threads](dmean, dvar, dH, cuda.to_device(np.ascontiguousarray(A)),
                                       cuda.to_device(np.ascontiguousarray(w)), mode, dout_m, dout_v)
    out_m, out_v = dout_m.copy_to_host(), dout_v.copy_to_host()
    if not (np.all(np.isfinite(out_m)) and np.all(np.isfinite(out_v))):
        _host.raise_nonfinite(what, mean=mean, var=var, H=H)
    if P and not out_v.min() > 0:
        _host.raise_variance_roundoff(what, out_v)
    return out_m, out_v


@_host.one_blas_thread
def fd_update(mean, var, H, R, e, singular=False):
    """FD-EKF update (Chang et al. 2022, eqs 10-12) on the GPU. See ``refbayes.kernels.cpu.fd_update``."""
    mean, var, H, R, e = _check(mean, var, H, R, e)
    dH, dvar = cuda.to_device(H), cuda.to_device(var)
    A, solve = _innovation(dH, dvar, var, H, R, singular)
    return _run(mean, var, H, dH, dvar, A, solve(e), 0, "FD-EKF")


@_host.one_blas_thread
def vd_update(mean, var, H, R, e, mean_rule="paper", singular=False):
    """VD-EKF update (Chang et al. 2022, eqs 13-14, 25) on the GPU. See ``refbayes.kernels.cpu.vd_update``."""
    if mean_rule not in VD_MEAN_RULES:
        raise ValueError(f"mean_rule must be one of {VD_MEAN_RULES}; got {mean_rule!r}")
    mean, var, H, R, e = _check(mean, var, H, R, e)
    dH, dvar = cuda.to_device(H), cuda.to_device(var)
    A = _host.whitener(R, singular)
    if mean_rule == "paper":
        return _run(mean, var, H, dH, dvar, A, A.T @ (A @ e), 1, "VD-EKF")
    _, solve = _innovation(dH, dvar, var, H, R, singular)
    return _run(mean, var, H, dH, dvar, A, solve(e), 2, "VD-EKF")
