"""FD-EKF and VD-EKF steps for an MLP (or ``rb.Linear``) with the belief on the GPU: predict, forward
pass, Jacobian structure, likelihood moments and update as one chain of kernels, the GPU form of
``refbayes.kernels.cpu.mlp_diag`` (Chang, Jones & Murphy 2022, eqs 3, 10-14 and 25; docs/gpu.md).

The belief stays on the device: mean and var (P,), float64 or float32 (read as stored, computed in
float64, the new arrays written in the belief's dtype and checked as stored). Per step only x (n_0,)
goes up and yhat (C,) comes down, plus numbers that grow with the units of the network, never with P:

1. the forward and reverse passes of ``refbayes.kernels.cuda.step`` at mu_bar = gamma mu (its
   workspace with L = rank = 0: the same tables, buffers and mailbox);
2. ``_zeta_partial``: one block per slice of at most SEG rows of one unit, the slice's sum of
   h~_k^2 v_bar_i with v_bar = gamma^2 v + q; ``step._reduce`` adds each unit's slices in order into
   the mailbox (zeta, where the LO-FI step keeps its unit sums);
3. one copy of the mailbox to the host; there ``refbayes.kernels.cpu.mlp_diag.diag_middle`` (the CPU
   kernel's own code) turns eta, Dl and zeta into two numbers per unit, sq and dd; they go up in one copy;
4. ``_diag_rows``: a thread per parameter i = (l, j, k) of unit u writes
   FD-EKF  v' = v_bar - v_bar^2 h~_k^2 sq[u],        mu' = mu_bar + v_bar h~_k dd[u];
   VD-EKF  v' = 1 / (1 / v_bar + h~_k^2 sq[u]),     mu' = mu_bar + v' h~_k dd[u] ("paper") or
                                                     mu_bar + v_bar h~_k dd[u] ("ekf"),
   and flags a non-finite output (1) or a variance <= 0 (2).

``diag_predict`` is the predict step alone (one elementwise kernel).
"""

import math

import numpy as np
from numba import cuda

from .. import _host
from .._host import blas_threads
from ..cpu.mlp import layer_bias
from ..cpu.mlp_diag import MODES, diag_middle
from ..cpu._status import raise_status
from ..cpu.step import _likelihood
from . import _launch, step as S

__all__ = ["mlp_diag_step", "diag_predict"]

TPB = S.TPB


@cuda.jit
def _zeta_partial(tab, var, q, qstride, qs, gamma, h, part_u):
    """One block per slice tab[b] = (first weight row of the unit, k0, k1, start of h_l, bias row or -1):
    part_u[0, b] = sum over the slice's rows i of h~_k^2 (gamma^2 var[i] + q_i) (the bias row: h~ = 1)."""
    sh = cuda.shared.array(TPB, dtype=np.float64)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    rb = tab[b, 0]
    k0 = tab[b, 1]
    hb = tab[b, 3]
    bi = tab[b, 4]
    nw = tab[b, 2] - k0
    nrow = nw + (1 if bi >= 0 else 0)
    g2 = gamma * gamma
    acc = 0.0
    rr = t
    while rr < nrow:
        i, hk = S.slice_row(rr, nw, rb, k0, hb, bi, h)
        qi = q[i] if qstride else qs
        acc += hk * hk * (g2 * var[i] + qi)
        rr += TPB
    sh[t] = acc
    S._device.tree(sh, t)
    if t == 0:
        part_u[0, b] = sh[0]


@cuda.jit
def _diag_rows(theta, var, q, qstride, qs, gamma, lay, h, sd, NO, mode, out_mean, out_var, bad):
    """A thread per parameter: v' and mu' of FD-EKF (mode 0), VD-EKF "paper" (1) or "ekf" (2) from
    sq = sd[:NO] and dd = sd[NO:2 NO]; bad[0] = 1 where an output as stored is not finite, 2 where a
    variance is not positive (the larger code wins)."""
    i = cuda.blockIdx.x * TPB + cuda.threadIdx.x
    if i >= theta.shape[0]:
        return
    hk, u = S.locate(i, lay, h)
    qi = q[i] if qstride else qs
    vb = gamma * gamma * var[i] + qi
    mb = gamma * theta[i]
    sq = sd[u]
    dd = sd[NO + u]
    if mode == 0:
        out_var[i] = vb - vb * vb * (hk * hk * sq)
        out_mean[i] = mb + vb * (hk * dd)
    else:
        vn = 1.0 / (1.0 / vb + hk * hk * sq)
        out_var[i] = vn
        out_mean[i] = mb + (vn if mode == 1 else vb) * (hk * dd)
    v = out_var[i]
    if not (math.isfinite(out_mean[i]) and math.isfinite(v)):
        cuda.atomic.max(bad, 0, 1)
    elif not v > 0.0:
        cuda.atomic.max(bad, 0, 2)


@cuda.jit
def _predict_rows(theta, var, q, qstride, qs, gamma, out_mean, out_var, bad):
    """mu_bar = gamma mu, v_bar = gamma^2 v + q; bad[0] = 1 where an output as stored is not finite."""
    i = cuda.blockIdx.x * TPB + cuda.threadIdx.x
    if i >= theta.shape[0]:
        return
    qi = q[i] if qstride else qs
    out_mean[i] = gamma * theta[i]
    out_var[i] = gamma * gamma * var[i] + qi
    if not (math.isfinite(out_mean[i]) and math.isfinite(out_var[i])):
        bad[0] = 1


@S._one_at_a_time
def mlp_diag_step(spec, dmean, dvar, x, target, mode, gamma=1.0, q=0.0, dq=None):
    """FD-EKF or VD-EKF predict then update (Chang et al. 2022, eqs 3, 10-14, 25) of an MLP's diagonal
    belief held on the GPU.

    spec: ``refbayes.filters.base.mlp_kernel_spec`` (sizes, activation code, likelihood code, Rc, jitter);
    dmean, dvar (P,): device arrays, both float64 or both float32; x (n_0,) and the encoded target (C,):
    host arrays; mode: "fd", "vd-paper" or "vd-ekf"; gamma > 0 and q >= 0 (a scalar; or dq, a (P,) device
    array of per-parameter q); gamma = 1, q = 0: the update alone.

    Returns (mean, var) as new device arrays of the belief's dtype and yhat (C,) on the host. Raises
    NotPositiveDefiniteError (R or S not positive definite, a variance <= 0) or DivergenceError (naming
    the quantity) on numerical failure; the inputs are never written.
    """
    from refbayes.errors import DivergenceError

    if mode not in MODES:
        raise ValueError(f"mode must be one of {tuple(MODES)}; got {mode!r}")
    sizes, code, lik, Rc, jitter = spec
    dt = S.belief_dtype(dmean, dvar)
    what = "FD-EKF" if mode == "fd" else "VD-EKF"
    P = dmean.shape[0]
    ws = S.workspace(sizes, layer_bias(sizes, P), 0, 0)  # L = rank = 0: the network's tables and mailbox
    ws.code = int(code)
    qstride, qs, dq = S.q_args(q, dq, ws.dq0)
    g = float(gamma)
    S.network_passes(ws, dmean, g, x)
    _launch.launch(_zeta_partial, ws.nslices, TPB, ws.tab, dvar, dq, qstride, qs, g, ws.h, ws.part_u)
    S._mark("pass 1")
    _launch.launch(S._reduce, ws.g_reduce, TPB, ws.part_g, ws.gram, 0, ws.part_u, ws.first, ws.units)
    S._mark("reductions")
    box = ws.hbox
    _launch.to_host(box, ws.box)
    S.TRANSFERS.add(box.nbytes)
    S._mark("copy down")
    Cf, NO = ws.Cf, ws.NO
    if not np.all(np.isfinite(box[:ws.o_units + NO])):
        raise DivergenceError(f"{what} step: the forward or reverse pass, or the predicted variances, left the "
                              "floating-point range (the model output, its Jacobian or v_bar is not finite)",
                              quantity="model output")
    eta = box[:Cf].copy()
    Dl = box[ws.o_dl:ws.o_gram].reshape(Cf, NO).copy()
    zeta = box[ws.o_units:ws.o_units + NO].copy()
    target = np.ascontiguousarray(target, dtype=np.float64)
    info = np.zeros(2, np.int64)
    with blas_threads(1):
        yh, M, R = _likelihood(lik, eta, Rc, float(jitter))
        sq, dd = diag_middle(zeta, Dl, M, R, target - yh, lik == 2 and float(jitter) == 0.0, MODES[mode], info)
    raise_status(int(info[0]), what, x=np.asarray(x, dtype=np.float64))
    hup = ws.hup
    hup[:NO] = sq
    hup[NO:2 * NO] = dd
    if 2 * NO not in ws.up_views:
        ws.up_views[2 * NO] = (ws.up[:2 * NO], hup[:2 * NO])
    dst, src = ws.up_views[2 * NO]
    _launch.to_device(dst, src)
    S.TRANSFERS.add(8 * 2 * NO)
    S._mark("host algebra")
    out_mean, out_var = S._take((P,), dt), S._take((P,), dt)
    S._mark("allocate outputs")
    _launch.launch(_diag_rows, max(1, (P + TPB - 1) // TPB), TPB, dmean, dvar, dq, qstride, qs, g, ws.lay, ws.h,
                   ws.up, NO, MODES[mode], out_mean, out_var, ws.bad)
    _launch.to_host(ws.hbad, ws.bad)
    S.TRANSFERS.add(8)
    S._mark("pass 2")
    flag = int(ws.hbad[0])
    if flag:
        host_var = S.to_host(out_var) if flag == 2 else None  # to name the parameter (a copy on failure only)
        S._recycle((out_mean, out_var))
        if flag == 2:
            _host.raise_variance_roundoff(what, host_var)
        raise DivergenceError(f"{what} step produced a non-finite mean or variance from finite inputs (overflow: "
                              "the belief left the floating-point range)", quantity=f"{what} step")
    return out_mean, out_var, yh.copy()


@S._one_at_a_time
def diag_predict(dmean, dvar, gamma=1.0, q=0.0, dq=None):
    """The predict step (Chang et al. 2022, eq. 3) of a diagonal belief on the GPU: mu_bar = gamma mu,
    v_bar = gamma^2 v + q. dmean, dvar (P,): device arrays (both float64 or both float32); q a scalar, or dq
    a (P,) device array. Returns new device arrays of the same dtype; raises DivergenceError on overflow."""
    from refbayes.errors import DivergenceError

    dt = S.belief_dtype(dmean, dvar)
    P = dmean.shape[0]
    qstride, qs, dq = S.q_args(q, dq, dmean)
    out_mean, out_var = S._take((P,), dt), S._take((P,), dt)
    bad = S.to_device(np.zeros(1, np.int64))
    _launch.launch(_predict_rows, max(1, (P + TPB - 1) // TPB), TPB, dmean, dvar, dq, qstride, qs, float(gamma),
                   out_mean, out_var, bad)
    if S.to_host(bad)[0]:
        S._recycle((out_mean, out_var))
        raise DivergenceError("diagonal predict produced a non-finite mean or variance (overflow: the belief left "
                              "the floating-point range)", quantity="diagonal predict")
    return out_mean, out_var
