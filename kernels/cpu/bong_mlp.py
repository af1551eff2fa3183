"""BONG, BLR, BOG and BBB steps of an MLP with the LIN-HESS or LIN-EF estimator in one compiled
call (Jones, Chang & Murphy 2024, Alg. 6-7, App. E.3-E.5).

For an MLP the columns of the linearised estimates have a per-unit structure (see
``refbayes.kernels.cpu.step``): with delta^c_u = d f_c / d a_u the reverse-pass sensitivity of
output unit u = (l, j) and h~_l = [h_l, 1] its inputs, parameter i = (l, j, k) has

    g_i = h~_k Gamma_u,           Gamma_u = (M^T R^{-1} e)^T delta_u          (eqs 91-92)
    U_{i,r} = h~_k Delta_{r,u},   Delta = A M [delta_u]_u,  A^T A = R^{-1}    (LIN-HESS, G = -U U^T)

(M = dm/deta, e = y - yhat). So:

- LIN-EF (Alg. 7) needs only Gamma, i.e. ONE reverse pass of the vector M^T R^{-1} e through the
  network (no C x P Jacobian, no C reverse passes); its curvature is d_i = -g_i^2 (diagonal
  families) or the single column U = g (DLR).
- LIN-HESS (Alg. 6) needs the C reverse passes (Delta); its diagonal curvature is
  d_i = -h~_k^2 |Delta_u|^2.

``mlp_diag_bong_step``: predict (gamma, q), then ``n_iter`` inner iterations of any of the eight
diagonal steps (``kernels.cpu.bong.DIAG_STEPS``: natural eqs 212-231, moment eqs 248-261), each
one forward pass, the reverse pass(es) and one fused pass over the parameters that forms g_i and
d_i from the per-unit sums and writes the new mean and variance; g and G are never stored.

``mlp_lin_factor``: g (P,) and the factor U (P, k) of LIN-HESS (or U = g for LIN-EF) and the
coefficients c with g = U c, written from the per-unit sums without forming the Jacobian J
(C, P) or H = M J; the DLR inner steps (``kernels.cpu.bong``) take them from there.

Networks without biases (``rb.Linear(bias=False)``): h~_l = h_l and no bias rows. The diagonal step's
body (``mlp_diag_bong_kernel``) is inlined into one compiled entry point per value of that flag
(``mlp_diag_bong_kernel_biased`` / ``_unbiased``), so that the flag is a constant of each: 10-19 %
faster than one entry point with the flag as an argument (docs/bong.md §6); a process that meets
both kinds of network compiles the body twice.

Numbers: those of ``refbayes.filters.bong`` (estimators + algorithms) to round-off.
"""

import numba
import numpy as np

from .. import _host
from ._blocks import nonfinite_mat, nonfinite_vec, whitener
from .bong import DIAG_STEPS, NAT_BONG_GIVEN_STEP, diag_what
from .mlp import _forward, _offsets, _row_dot, _set_unit, layer_bias
from ._status import BAD_ESTIMATE, BAD_MODEL, BAD_OUT, BAD_VAR, NOT_PD_R, OK, raise_status
from .step import _likelihood, log_sum_exp, mlp_front, n_outputs, r_at

__all__ = ["mlp_diag_bong_step", "mlp_lin_factor", "mlp_mc_ef", "ESTIMATORS"]

ESTIMATORS = ("lin-hess", "lin-ef")


@numba.njit(cache=True, error_model="numpy")
def _unit_offsets(sizes):
    nl = sizes.shape[0] - 1
    os = np.zeros(nl + 1, np.int64)
    for l in range(nl):
        os[l + 1] = os[l] + sizes[l + 1]
    return os


@numba.njit(cache=True, error_model="numpy")
def _weighted_residual(A, M, e):
    """(Ae (k,), wt (C_f,)) with Ae = A e and wt = M^T A^T A e = M^T R^{-1} e."""
    k, C = A.shape
    Cf = M.shape[1]
    Ae = np.zeros(k)
    for r in range(k):
        for c in range(C):
            Ae[r] += A[r, c] * e[c]
    w = np.zeros(C)
    for c in range(C):
        for r in range(k):
            w[c] += A[r, c] * Ae[r]
    wt = np.zeros(Cf)
    for cf in range(Cf):
        for c in range(C):
            wt[cf] += M[c, cf] * w[c]
    return Ae, wt


@numba.njit(cache=True, error_model="numpy")
def _reverse_units(theta, sizes, w0, hs, os, dact, delta, gam):
    """One reverse pass of the output-space vector delta (C_f,) through the network at theta: writes
    gam_u = delta^T d f / d a_u for every unit u (gam (units,), unit offsets os), from the activations'
    derivatives dact (``mlp._offsets`` layout). Shared by LIN-EF (delta = M^T R^{-1} e) and the MC-EF
    draws (delta = the exact log-likelihood gradient in eta)."""
    nl = sizes.shape[0] - 1
    for l in range(nl - 1, -1, -1):
        n_in = sizes[l]
        n_out = sizes[l + 1]
        for r in range(n_out):
            gam[os[l] + r] = delta[r]
        if l > 0:
            nd = np.zeros(n_in)
            for r in range(n_out):
                dr = delta[r]
                row = theta[w0[l] + r * n_in:w0[l] + (r + 1) * n_in]
                for kk in range(n_in):
                    nd[kk] += dr * row[kk]
            for kk in range(n_in):
                nd[kk] *= dact[hs[l] + kk]
            delta = nd


@numba.njit(cache=True, error_model="numpy")
def _ef_units(theta, x, target, sizes, bias, act, lik, Rc, jitter, yhat):
    """Forward pass, likelihood moments and one reverse pass of wt = M^T R^{-1} e.

    Returns (h, Gamma (units,), Ae (k,), status): h the activations (``mlp._offsets`` layout),
    Gamma_u = wt^T d f / d a_u; writes yhat (C,). bias: whether the layers have biases."""
    w0, b0, hs, _, nh = _offsets(sizes, bias)
    h = np.empty(nh)
    dact = np.empty(nh)
    _forward(theta, x, sizes, act, w0, b0, hs, h, dact)
    return _ef_reverse(theta, h, dact, target, sizes, bias, lik, Rc, jitter, yhat)


@numba.njit(cache=True, error_model="numpy")
def _ef_reverse(theta, h, dact, target, sizes, bias, lik, Rc, jitter, yhat):
    """``_ef_units`` after its forward pass (h, dact filled at theta)."""
    nl = sizes.shape[0] - 1
    w0, _, hs, _, _ = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    gam = np.zeros(os[nl])
    if nonfinite_vec(h):
        return h, gam, np.zeros(0), BAD_MODEL
    Cf = sizes[nl]
    eta = h[hs[nl]:hs[nl] + Cf].copy()
    yh, M, R = _likelihood(lik, eta, Rc, jitter)
    for c in range(yh.shape[0]):
        yhat[c] = yh[c]
    if nonfinite_vec(yh) or nonfinite_mat(R) or nonfinite_mat(M):
        return h, gam, np.zeros(0), BAD_MODEL
    A, ok = whitener(R, lik == 2 and jitter == 0.0)
    if not ok:
        return h, gam, np.zeros(0), NOT_PD_R
    Ae, delta = _weighted_residual(A, M, target - yh)
    _reverse_units(theta, sizes, w0, hs, os, dact, delta, gam)
    return h, gam, Ae, OK


@numba.njit(cache=True, error_model="numpy")
def _predict_forward(mean, var, gamma, q, qstride, x, sizes, bias, act, mu_p, s_p, want_tu, tu):
    """The predict step and the forward pass at the predicted mean in one pass over the parameters:
    writes mu_p = gamma mean, s_p = gamma^2 var + q (P,) row by row, each unit's row just before its
    dot product (``mlp._forward``'s numbers), and, ``want_tu``, tu[u] = sum_k h~_k^2 s_p,i over the
    unit's rows and bias (what BONG's given-step gain reads). Returns (h, dact) as ``mlp._forward``
    fills them. (The layer loop is ``mlp._forward``'s, with the predict rows written before each dot
    product: kept apart so that the forward pass every other kernel uses stays as simple.)"""
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, nh = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    h = np.empty(nh)
    dact = np.empty(nh)
    g2 = gamma * gamma
    for k in range(sizes[0]):
        h[k] = x[k]
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        for r in range(sizes[l + 1]):
            base = w0[l] + r * n_in
            # separate loops over slices, q read once when it is a scalar: loops LLVM vectorises
            m_out = mu_p[base:base + n_in]
            m_in = mean[base:base + n_in]
            for k in range(n_in):
                m_out[k] = gamma * m_in[k]
            v_out = s_p[base:base + n_in]
            v_in = var[base:base + n_in]
            if qstride == 0:
                q0 = q[0]
                for k in range(n_in):
                    v_out[k] = g2 * v_in[k] + q0
            else:
                q_in = q[base:base + n_in]
                for k in range(n_in):
                    v_out[k] = g2 * v_in[k] + q_in[k]
            a = 0.0
            if bias:
                i = b0[l] + r
                mu_p[i] = gamma * mean[i]
                s_p[i] = g2 * var[i] + q[i * qstride]
                a = mu_p[i]
            if want_tu:
                tu[os[l] + r] = _sum_sq_var(s_p, base, n_in, hl) + (s_p[b0[l] + r] if bias else 0.0)
            a = _row_dot(m_out, hl) + a
            _set_unit(h, dact, hs[l + 1] + r, a, l == nl - 1, act)
    return h, dact


@numba.njit(cache=True, error_model="numpy")
def _hess_units(theta, x, target, sizes, bias, act, lik, Rc, jitter, yhat):
    """Forward pass, the C reverse passes and the likelihood moments.

    Returns (h, Delta (k, units), Gamma (units,), Ae (k,), status) with Delta = A M [delta_u],
    Gamma_u = Delta_u . Ae; writes yhat (C,)."""
    h, os, Dl, yh, M, R = mlp_front(theta, x, sizes, act, lik, Rc, jitter, yhat, bias)
    NO = Dl.shape[1]
    if nonfinite_vec(h) or nonfinite_mat(Dl) or nonfinite_vec(yh) or nonfinite_mat(R) or nonfinite_mat(M):
        return h, np.zeros((0, NO)), np.zeros(NO), np.zeros(0), BAD_MODEL
    A, ok = whitener(R, lik == 2 and jitter == 0.0)
    if not ok:
        return h, np.zeros((0, NO)), np.zeros(NO), np.zeros(0), NOT_PD_R
    k = A.shape[0]
    e = target - yh
    if k == 0:
        return h, np.zeros((0, NO)), np.zeros(NO), np.zeros(0), OK
    Delta = np.dot(np.dot(A, M), Dl)
    Ae = np.dot(A, e)
    gam = np.zeros(NO)
    for r in range(k):
        for u in range(NO):
            gam[u] += Delta[r, u] * Ae[r]
    return h, Delta, gam, Ae, OK


# -- diagonal families -------------------------------------------------------------------------


@numba.njit(cache=True, inline="always", error_model="numpy")
def _formula(mode, a, mu, s, mup, sp, gi, di, stp):
    """(mean, variance) of row i for diagonal step ``mode`` (kernels.cpu.bong.diag_pass)."""
    if mode == 0 or mode == 1:
        # 1 / lam with lam = 1 / sp - a di, as sp / (1 - a di sp): one division instead of two (the
        # division is this loop's bottleneck); the same rounding behaviour, 1 - a di sp >= 1 for di <= 0
        v = sp / (1.0 - a * di * sp)
        if mode == 0:
            m = mup + a * (gi * v)
        else:
            m = mup + a * stp
        return m, v
    # the natural steps below divide once per reciprocal they need (1/sp, 1/s, 1/lam) and multiply by
    # it: a division costs several multiplications wherever the loop is not vectorised
    if mode == 2:
        lam_p = 1.0 / sp
        vi = gi + lam_p * (mup - mu)
        lam = (1.0 - a) / s + a * lam_p - a * di
        v = 1.0 / lam
        return mu + a * (vi * v), v
    if mode == 3:
        lam_p = 1.0 / sp
        lam = lam_p - (4.0 * a) * sp * mup * gi - (2.0 * a) * (sp * sp) * di
        v = 1.0 / lam
        return (mup * lam_p + a * sp * gi) * v, v
    if mode == 4:
        lam_p = 1.0 / sp
        vi = gi + lam_p * (mup - mu)
        lam_c = 1.0 / s
        lam = lam_c - (4.0 * a) * s * mu * vi - (2.0 * a) * (s * s) * (di - lam_p) - (2.0 * a) * s
        v = 1.0 / lam
        return (mu * lam_c + a * s * vi) * v, v
    if mode == 5:
        return mup + a * sp * gi, sp + a * (sp * sp) * di
    if mode == 6:
        lam_p = 1.0 / sp
        vi = gi + lam_p * (mup - mu)
        return mu + a * s * vi, s + a * (s * s) * (di - lam_p + 1.0 / s)
    if mode == 7:
        return mup + a * gi, sp + (0.5 * a) * di
    lam_p = 1.0 / sp
    vi = gi + lam_p * (mup - mu)
    return mu + a * vi, s + (0.5 * a) * (di - lam_p + 1.0 / s)


@numba.njit(cache=True, inline="always", error_model="numpy")
def _rows(mode, ef, a, i0, n, hl, sq, gam, gain, mu, s, mu_p, s_p, om, ov, gv, dv):
    """Rows i0 <= i < i0 + n of one unit (inputs h~ = hl[:n]): g_i = h~ Gamma_u, d_i = -g_i^2
    (LIN-EF) or -h~^2 |Delta_u|^2 (LIN-HESS, sq); mode 1: the mean step gain s_p,i g_i.
    gv, dv: scratch (>= n). One loop per mode, each calling ``_formula`` with a constant mode, so
    that the compiled loops carry no branch on the mode. Inlined into the kernel's unit loop: as a
    call, its 17 arguments (nine arrays) cost more than a bias row's work, once per unit and bias."""
    for kk in range(n):
        gv[kk] = hl[kk] * gam
    if ef:
        for kk in range(n):
            dv[kk] = -(gv[kk] * gv[kk])
    else:
        for kk in range(n):
            dv[kk] = -(hl[kk] * hl[kk]) * sq
    # the unit's rows as views indexed from 0: so LLVM vectorises the loops below, which it did not do
    # with the index i0 + kk (the natural BLR rows then paid about 0.12 ms per division at P = 123,610)
    e = i0 + n
    omu, ovu, muu, su, mpu, spu = om[i0:e], ov[i0:e], mu[i0:e], s[i0:e], mu_p[i0:e], s_p[i0:e]
    # the per-mode loops repeat one another on purpose: a constant mode per loop lets Numba drop the branch
    if mode == 0:
        for kk in range(n):
            omu[kk], ovu[kk] = _formula(0, a, muu[kk], su[kk], mpu[kk], spu[kk], gv[kk], dv[kk], 0.0)
    elif mode == 1:
        for kk in range(n):
            omu[kk], ovu[kk] = _formula(1, a, muu[kk], su[kk], mpu[kk], spu[kk], gv[kk], dv[kk],
                                        gain * (spu[kk] * gv[kk]))
    elif mode == 2:
        for kk in range(n):
            omu[kk], ovu[kk] = _formula(2, a, muu[kk], su[kk], mpu[kk], spu[kk], gv[kk], dv[kk], 0.0)
    elif mode == 3:
        for kk in range(n):
            omu[kk], ovu[kk] = _formula(3, a, muu[kk], su[kk], mpu[kk], spu[kk], gv[kk], dv[kk], 0.0)
    elif mode == 4:
        for kk in range(n):
            omu[kk], ovu[kk] = _formula(4, a, muu[kk], su[kk], mpu[kk], spu[kk], gv[kk], dv[kk], 0.0)
    elif mode == 5:
        for kk in range(n):
            omu[kk], ovu[kk] = _formula(5, a, muu[kk], su[kk], mpu[kk], spu[kk], gv[kk], dv[kk], 0.0)
    elif mode == 6:
        for kk in range(n):
            omu[kk], ovu[kk] = _formula(6, a, muu[kk], su[kk], mpu[kk], spu[kk], gv[kk], dv[kk], 0.0)
    elif mode == 7:
        for kk in range(n):
            omu[kk], ovu[kk] = _formula(7, a, muu[kk], su[kk], mpu[kk], spu[kk], gv[kk], dv[kk], 0.0)
    else:
        for kk in range(n):
            omu[kk], ovu[kk] = _formula(8, a, muu[kk], su[kk], mpu[kk], spu[kk], gv[kk], dv[kk], 0.0)


@numba.njit(cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _sum_sq_var(s_p, i0, n, hl):
    """sum_k hl[k]^2 s_p[i0 + k], vectorised (its order fixed by the compiled code, as ``mlp._row_dot``)."""
    t = 0.0
    for kk in range(n):
        t += hl[kk] * hl[kk] * s_p[i0 + kk]
    return t


@numba.njit(cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _bad_moments(m, v):
    """0 when m and v (P,) are finite and v > 0; 1 when any entry is NaN or inf; 2 when a variance
    is <= 0. One vectorised pass (x * 0 is 0 only for finite x; a count of the v <= 0)."""
    z = 0.0
    n_bad = 0
    for i in range(m.shape[0]):
        z += m[i] * 0.0 + v[i] * 0.0
        n_bad += v[i] <= 0.0
    if z != 0.0:
        return 1
    return 0 if n_bad == 0 else 2


@numba.njit(cache=True, error_model="numpy")
def mlp_diag_bong_kernel_biased(mean, var, x, target, sizes, act, lik, Rc, jitter, gamma, q, qstride, mode, ef, alpha,
                                n_iter, out_mean, out_var, yhat, info):
    """:func:`mlp_diag_bong_kernel` for layers with biases, the flag a constant of the compiled code."""
    mlp_diag_bong_kernel(mean, var, x, target, sizes, True, act, lik, Rc, jitter, gamma, q, qstride, mode, ef, alpha,
                         n_iter, out_mean, out_var, yhat, info)


@numba.njit(cache=True, error_model="numpy")
def mlp_diag_bong_kernel_unbiased(mean, var, x, target, sizes, act, lik, Rc, jitter, gamma, q, qstride, mode, ef,
                                  alpha, n_iter, out_mean, out_var, yhat, info):
    """:func:`mlp_diag_bong_kernel` for layers without biases (``rb.Linear(bias=False)``)."""
    mlp_diag_bong_kernel(mean, var, x, target, sizes, False, act, lik, Rc, jitter, gamma, q, qstride, mode, ef, alpha,
                         n_iter, out_mean, out_var, yhat, info)


@numba.njit(cache=True, inline="always", error_model="numpy")
def mlp_diag_bong_kernel(mean, var, x, target, sizes, bias, act, lik, Rc, jitter, gamma, q, qstride, mode, ef, alpha,
                         n_iter, out_mean, out_var, yhat, info):
    """Predict (gamma, q), then ``n_iter`` iterations of diagonal step ``mode`` with LIN-EF (``ef``)
    or LIN-HESS at the current mean; writes out_mean, out_var (P,) and yhat (C,) at the predicted
    mean. info[0] = OK, NOT_PD_R, BAD_MODEL (model output or likelihood moments not finite),
    BAD_ESTIMATE, BAD_VAR (info[1] = the smallest variance's index, info[3] = its value) or BAD_OUT (non-finite output);
    info[2] = the inner iteration (from 0) where it stopped; for NOT_PD_R, out_mean holds the mean
    where R failed."""
    P = mean.shape[0]
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, _ = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    one = np.ones(1)
    width = 1
    for l in range(nl):
        width = max(width, sizes[l])
    gv = np.empty(width)
    dv = np.empty(width)
    g2 = gamma * gamma
    mu_p = np.empty(P)
    s_p = np.empty(P)
    tu = np.zeros(os[nl])  # LIN-EF: sum_k h~_k^2 s_p,i of each unit, from the first forward pass
    if not ef:  # LIN-EF writes the predicted moments in its first forward pass (_predict_forward)
        for i in range(P):
            mu_p[i] = gamma * mean[i]
            s_p[i] = g2 * var[i] + q[i * qstride]
    mu = mu_p
    s = s_p
    yh = np.empty(yhat.shape[0])
    for it in range(n_iter):
        if ef:
            if it == 0:
                h, dact = _predict_forward(mean, var, gamma, q, qstride, x, sizes, bias, act, mu_p, s_p,
                                           mode == NAT_BONG_GIVEN_STEP, tu)
                h, gam, _, status = _ef_reverse(mu, h, dact, target, sizes, bias, lik, Rc, jitter, yh)
            else:
                h, gam, _, status = _ef_units(mu, x, target, sizes, bias, act, lik, Rc, jitter, yh)
            sq = gam
        else:
            h, Delta, gam, _, status = _hess_units(mu, x, target, sizes, bias, act, lik, Rc, jitter, yh)
            sq = np.zeros(gam.shape[0])
            for r in range(Delta.shape[0]):
                for u in range(gam.shape[0]):
                    sq[u] += Delta[r, u] * Delta[r, u]
        if it == 0:
            for c in range(yh.shape[0]):
                yhat[c] = yh[c]
        info[2] = it
        if status != OK:
            info[0] = status
            if status == NOT_PD_R:  # the point where R failed, for the wrapper's message (step.r_at)
                for i in range(P):
                    out_mean[i] = mu[i]
            return
        if nonfinite_vec(gam) or nonfinite_vec(sq):
            info[0] = BAD_ESTIMATE
            return
        gain = 0.0
        if mode == NAT_BONG_GIVEN_STEP:  # (diag(1/s_p) + alpha g g^T)^{-1} g = s_p g / (1 + alpha g^T s_p g)
            z = 0.0
            for l in range(nl):
                n_in = sizes[l]
                hl = h[hs[l]:hs[l] + n_in]
                for j in range(sizes[l + 1]):
                    gu = gam[os[l] + j]
                    if ef and it == 0:  # from the first forward pass
                        t = tu[os[l] + j]
                    else:
                        t = _sum_sq_var(s_p, w0[l] + j * n_in, n_in, hl)
                        if bias:
                            t += s_p[b0[l] + j]
                    z += gu * gu * t
            gain = 1.0 / (1.0 + alpha * z)
        last = it == n_iter - 1
        om = out_mean if last else np.empty(P)
        ov = out_var if last else np.empty(P)
        for l in range(nl):
            n_in = sizes[l]
            hl = h[hs[l]:hs[l] + n_in]
            for j in range(sizes[l + 1]):
                u = os[l] + j
                _rows(mode, ef, alpha, w0[l] + j * n_in, n_in, hl, sq[u], gam[u], gain, mu, s, mu_p, s_p, om, ov,
                      gv, dv)
                if bias:
                    _rows(mode, ef, alpha, b0[l] + j, 1, one, sq[u], gam[u], gain, mu, s, mu_p, s_p, om, ov, gv, dv)
        bad = _bad_moments(om, ov)
        if bad == 1:
            info[0] = BAD_OUT
            return
        if bad == 2:  # name the smallest, as the reference does
            i = np.argmin(ov)
            info[0] = BAD_VAR
            info[1] = i
            info[3] = ov[i]
            return
        mu = om
        s = ov
    info[0] = OK


_WHAT = {v: diag_what(f, a) for (f, a), v in DIAG_STEPS.items()}
_WHAT[NAT_BONG_GIVEN_STEP] = diag_what("diag-natural", "bong")


def _estimator(estimator):
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}; got {estimator!r}")
    return estimator == "lin-ef"


def _raise_status(info, what, R=None, n_iter=1):
    """Turn a kernel status into the reference's exception: for BAD_OUT and BAD_VAR the messages of
    ``families.diag_belief``, otherwise ``_status.raise_status`` (R: the covariance of a NOT_PD_R,
    ``step.r_at``); with ``n_iter`` > 1 the inner iteration named as the reference's ``Bong._run``
    names it (``errors.inner_iteration``)."""
    status = int(info[0])
    if status == OK:
        return
    from refbayes.errors import DivergenceError, NotPositiveDefiniteError, inner_iteration

    with inner_iteration(int(info[2]), n_iter):
        if status == BAD_OUT:
            raise DivergenceError(f"{what} update produced NaN or inf (overflow)", quantity=what)
        if status == BAD_VAR:
            raise NotPositiveDefiniteError(f"{what} update made entry {int(info[1])} non-positive "
                                           f"({float(info[3])!r})")
        raise_status(status, what, R)


def mlp_diag_bong_step(sizes, activation, likelihood, Rc, jitter, mean, var, x, target, family, algorithm,
                       estimator, alpha=1.0, n_iter=1, gamma=1.0, q=0.0, full_gain_mean=False, bias=None):
    """Predict then ``n_iter`` inner iterations of BONG/BLR/BOG/BBB over a diagonal family with
    LIN-HESS or LIN-EF (Jones et al. 2024, Alg. 1-3 and 6-7; natural eqs 212-231, moment eqs
    248-261) of an MLP's diagonal belief for one observation, in one compiled call.

    sizes, activation, likelihood, Rc, jitter: as ``step.lofi_mlp_step``. mean, var: (P,);
    x: (n_0,); target: T(y) (C,); family: "diag-natural" | "diag" (moment); algorithm: "bong" |
    "blr" | "bog" | "bbb"; estimator: "lin-hess" | "lin-ef"; alpha > 0; n_iter >= 1 (1 for BONG
    and BOG); gamma > 0, q >= 0 scalar or (P,) (gamma = 1, q = 0: no predict). full_gain_mean:
    natural BONG with the full-gain mean (diag(1/s_p) + alpha G)^{-1} g (LIN-EF only here; the
    LIN-HESS one is ``mlp_diag.mlp_diag_step(mode="vd-ekf")``). bias: whether the layers have biases
    (None: read from P, ``mlp.layer_bias``; False for ``rb.Linear(bias=False)``).
    Returns (mean (P,), var (P,), yhat (C,) at the predicted mean), new arrays. Raises
    NotPositiveDefiniteError (R, or a variance <= 0) or DivergenceError (the model output, the
    estimate or the new moments not finite), as the reference does, the inner iteration named
    when n_iter > 1.
    """
    key = (family, algorithm)
    if key not in DIAG_STEPS:
        raise ValueError(f"(family, algorithm) must be one of {tuple(DIAG_STEPS)}; got {key!r}")
    ef = _estimator(estimator)
    mode = DIAG_STEPS[key]
    if full_gain_mean:
        if mode != 0 or not ef:
            raise ValueError("full_gain_mean applies only to family='diag-natural', algorithm='bong', LIN-EF")
        mode = NAT_BONG_GIVEN_STEP
    n_iter = int(n_iter)
    if n_iter < 1:
        raise ValueError(f"n_iter must be >= 1; got {n_iter}")
    P = mean.shape[0]
    bias = layer_bias(sizes, P, bias)
    C = n_outputs(sizes, likelihood)
    qv, qstride = _host.as_process_noise(q, P)
    a = _host.as_scalar(alpha, "alpha", positive=True)
    out_mean = np.empty(P)
    out_var = np.empty(P)
    yhat = np.empty(C)
    info = np.zeros(4)
    with _host.blas_threads(1):
        kernel = mlp_diag_bong_kernel_biased if bias else mlp_diag_bong_kernel_unbiased
        kernel(mean, var, x, target, sizes, activation, likelihood, Rc, float(jitter), float(gamma), qv, qstride, mode,
               ef, a, n_iter, out_mean, out_var, yhat, info)
    R = r_at(sizes, activation, likelihood, Rc, jitter, out_mean, x, bias) if int(info[0]) == NOT_PD_R else None
    _raise_status(info, _WHAT[mode], R, n_iter)
    return out_mean, out_var, yhat


# -- the linearised estimate as a factor (DLR family) -------------------------------------------


@numba.njit(cache=True, error_model="numpy")
def mlp_lin_factor_kernel(theta, x, target, sizes, bias, act, lik, Rc, jitter, ef, out_g, yhat, info):
    """g (P,) into out_g, and returns (U^T (k, P), coef (k,)) with g = U coef: LIN-HESS U = H^T A^T,
    coef = A e; LIN-EF U = g, coef = [1]. info[0] = OK, NOT_PD_R, BAD_MODEL or BAD_ESTIMATE."""
    P = theta.shape[0]
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, _ = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    if ef:
        h, gam, Ae, status = _ef_units(theta, x, target, sizes, bias, act, lik, Rc, jitter, yhat)
        Delta = np.zeros((0, gam.shape[0]))
    else:
        h, Delta, gam, Ae, status = _hess_units(theta, x, target, sizes, bias, act, lik, Rc, jitter, yhat)
    k = Delta.shape[0]
    Ut = np.empty((k, P))
    if status != OK:
        info[0] = status
        return Ut, Ae
    if nonfinite_vec(gam) or nonfinite_mat(Delta):
        info[0] = BAD_ESTIMATE
        return Ut, Ae
    # the (layer, unit) walk of mlp_diag's steps: deliberate, Numba compiles no generator over units
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        for j in range(sizes[l + 1]):
            u = os[l] + j
            base = w0[l] + j * n_in
            gu = gam[u]
            gb = out_g[base:base + n_in]  # views from 0: vectorised loops (docs/bong.md §6)
            for kk in range(n_in):
                gb[kk] = hl[kk] * gu
            if bias:
                out_g[b0[l] + j] = gu
            for r in range(k):
                dr = Delta[r, u]
                row = Ut[r]
                rb = row[base:base + n_in]
                for kk in range(n_in):
                    rb[kk] = hl[kk] * dr
                if bias:
                    row[b0[l] + j] = dr
    info[0] = OK
    return Ut, Ae


def mlp_lin_factor(sizes, activation, likelihood, Rc, jitter, mean, x, target, estimator, bias=None):
    """The LIN-HESS or LIN-EF estimate of an MLP at ``mean`` (P,) for one observation (Jones et al.
    2024, Alg. 6-7, eqs 91-92), without the Jacobian: (g (P,), U (P, k), coef (k,), yhat (C,)) with
    G = -U U^T and g = U coef. LIN-HESS: U = H^T A^T (A^T A = R^{-1}, or R^+ for the singular
    categorical), coef = A e; LIN-EF: U = g[:, None], coef = [1]. U is a column-major view.
    bias: as in :func:`mlp_diag_bong_step`.
    Raises NotPositiveDefiniteError (R) or DivergenceError (model output or estimate not finite).
    """
    ef = _estimator(estimator)
    P = mean.shape[0]
    bias = layer_bias(sizes, P, bias)
    C = n_outputs(sizes, likelihood)
    g = np.empty(P)
    yhat = np.empty(C)
    info = np.zeros(4)
    with _host.blas_threads(1):
        Ut, coef = mlp_lin_factor_kernel(mean, x, target, sizes, bias, activation, likelihood, Rc, float(jitter), ef, g,
                                         yhat, info)
    R = r_at(sizes, activation, likelihood, Rc, jitter, mean, x, bias) if int(info[0]) == NOT_PD_R else None
    _raise_status(info, "LIN estimate", R)
    if ef:
        return g, g[:, None], np.ones(1), yhat
    return g, Ut.T, coef, yhat


# -- the Monte Carlo EF estimate (diagonal families) -------------------------------------------


@numba.njit(cache=True, error_model="numpy")
def _loglik_grad_units(theta, x, target, sizes, bias, act, lik, Rinv, w0, b0, hs, os, h, dact, gam):
    """Forward pass at theta and ONE reverse pass of r = d log p(y | eta) / d eta (the exact
    log-likelihood gradient, not the linearised M^T R^{-1} e): Gaussian r = R^{-1} (y - eta),
    categorical r = onehot(y) - softmax(eta) over all K logits (``likelihoods.Categorical.grad``).
    Fills h, dact (``mlp._offsets`` layout) and gam (units,) with gam_u = r^T d f / d a_u, so that
    the gradient's entry for parameter (l, j, k) is h~_k gam_u. Returns a status (OK, BAD_MODEL)."""
    nl = sizes.shape[0] - 1
    _forward(theta, x, sizes, act, w0, b0, hs, h, dact)
    if nonfinite_vec(h):
        return BAD_MODEL
    Cf = sizes[nl]
    eta = h[hs[nl]:hs[nl] + Cf]
    delta = np.empty(Cf)
    if lik == 0:
        for c in range(Cf):
            t = 0.0
            for c2 in range(Cf):
                t += Rinv[c, c2] * (target[c2] - eta[c2])
            delta[c] = t
    else:
        lse = log_sum_exp(eta)
        last = 1.0
        for i in range(target.shape[0]):
            last -= target[i]
        for i in range(Cf):
            yi = target[i] if i < target.shape[0] else last  # drop_last: the last class's indicator
            delta[i] = yi - np.exp(eta[i] - lse)
    if nonfinite_vec(delta):
        return BAD_MODEL
    _reverse_units(theta, sizes, w0, hs, os, dact, delta, gam)
    return OK


@numba.njit(cache=True, error_model="numpy")
def mlp_mc_ef_kernel(z, given, antithetic, mean, sd, x, target, sizes, bias, act, lik, Rinv, Rc, jitter, out_g,
                     out_d, out_G, want_yhat, yhat, info):
    """MC-EF at the draws theta_j = mean + sd * z_j (antithetic: also 2 mean - theta_j after them),
    or, with ``given``, at theta_j = z_j themselves (sd not read, antithetic False),
    M = z.shape[0] (x 2): each draw one forward and one reverse pass (:func:`_loglik_grad_units`),
    g_j = grad log p(y | f(x, theta_j)) formed per unit and accumulated into out_g = (1/M) sum g_j
    and out_d = -(1/M) sum g_j^2 (the diagonal of -(1/M) sum g_j g_j^T); with out_G of M rows,
    g_j is also written to out_G[j]. want_yhat: yhat (C,) = the likelihood mean at ``mean``.
    info[0] = OK, BAD_MODEL or BAD_ESTIMATE (a non-finite g, or d without out_G, or a row of out_G:
    what the step reads); info[2] = the draw where it stopped."""
    P = mean.shape[0]
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, nh = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    h = np.empty(nh)
    dact = np.empty(nh)
    gam = np.empty(os[nl])
    if want_yhat:
        _forward(mean, x, sizes, act, w0, b0, hs, h, dact)
        Cf = sizes[nl]
        yh, _, _ = _likelihood(lik, h[hs[nl]:hs[nl] + Cf].copy(), Rc, jitter)
        for c in range(yhat.shape[0]):
            yhat[c] = yh[c]
    half = z.shape[0]
    M = 2 * half if antithetic else half
    store = out_G.shape[0] == M
    for i in range(P):
        out_g[i] = 0.0
        out_d[i] = 0.0
    theta = np.empty(P)
    for j in range(M):
        zj = z[j % half]
        if given:
            for i in range(P):
                theta[i] = zj[i]
        elif j < half:
            for i in range(P):
                theta[i] = mean[i] + zj[i] * sd[i]
        else:  # the reference's mirror image 2 mean - (mean + z sd), with its rounding
            for i in range(P):
                theta[i] = 2.0 * mean[i] - (mean[i] + zj[i] * sd[i])
        info[2] = j
        status = _loglik_grad_units(theta, x, target, sizes, bias, act, lik, Rinv, w0, b0, hs, os, h, dact, gam)
        if status != OK:
            info[0] = status
            return
        # the (layer, unit) walk of the LIN-EF gradient in mlp_lin_factor_kernel: deliberate, it sums the
        # draws' gradients and their squares where that one writes one gradient and its factor rows
        for l in range(nl):
            n_in = sizes[l]
            hl = h[hs[l]:hs[l] + n_in]
            for u in range(sizes[l + 1]):
                gu = gam[os[l] + u]
                base = w0[l] + u * n_in
                gb, db = out_g[base:base + n_in], out_d[base:base + n_in]  # views from 0: vectorised loops
                for kk in range(n_in):
                    gi = hl[kk] * gu
                    gb[kk] += gi
                    db[kk] += gi * gi
                if bias:
                    out_g[b0[l] + u] += gu
                    out_d[b0[l] + u] += gu * gu
                if store:
                    rb = out_G[j, base:base + n_in]
                    for kk in range(n_in):
                        rb[kk] = hl[kk] * gu
                    if bias:
                        out_G[j, b0[l] + u] = gu
    for i in range(P):
        out_g[i] = out_g[i] / M
        out_d[i] = -(out_d[i] / M)
    # the estimate the step will read, as the reference checks it: g and the factor rows when they are
    # stored (the curvature is then U = G^T / sqrt(M); d may overflow where the rows do not), else g and d
    if nonfinite_vec(out_g) or (nonfinite_mat(out_G) if store else nonfinite_vec(out_d)):
        info[0] = BAD_ESTIMATE
        return
    info[0] = OK


def mlp_mc_ef(sizes, activation, likelihood, Rinv, Rc, jitter, mean, var, x, target, z, antithetic=False,
              store=False, want_yhat=False, bias=None, given=False):
    """The MC-EF estimate (Jones et al. 2024, Alg. 5) of an MLP's diagonal belief N(mean, diag(var))
    for one observation, from given standard normals z (M0, P): the draws theta_j = mean +
    sqrt(var) * z_j (``beliefs.Diag`` sampling; antithetic: M0 more, 2 mean - theta_j), each put
    through one forward and one reverse pass in one compiled call (no Jacobian).
    given=True: z holds the draws theta_j themselves (M, P), drawn from any belief (a DLR's
    sampler); ``var`` is not read, antithetic must be False (the mirror images are among the
    draws), and ``mean`` serves only for yhat.

    sizes, activation, likelihood, Rc, jitter: as ``step.lofi_mlp_step``; Rinv (C_f, C_f): the
    Gaussian R^{-1} (without jitter, as ``Gaussian.grad`` solves), unused for a categorical
    likelihood. target: T(y) (C,). store: also return the per-draw gradients (M, P).
    Returns (g (P,) = mean_j g_j, d (P,) = -mean_j g_j^2, G (M, P) or None, yhat (C,) at ``mean``
    or None). Raises DivergenceError (the model output at a draw, or the estimate not finite: g
    and, with store, G, whose rows then give the curvature (d may be -inf where g_j^2 overflows);
    without store, g and d).
    """
    P = mean.shape[0]
    bias = layer_bias(sizes, P, bias)
    C = n_outputs(sizes, likelihood)
    z = np.ascontiguousarray(z, dtype=np.float64)
    if z.ndim != 2 or z.shape[1] != P or z.shape[0] < 1:
        raise ValueError(f"z must have shape (M, {P}) with M >= 1; got {z.shape}")
    if given and antithetic:
        raise ValueError("given draws already hold their antithetic pairs: antithetic must be False")
    M = z.shape[0] * (2 if antithetic else 1)
    sd = np.empty(0) if given else np.sqrt(var)
    g = np.empty(P)
    d = np.empty(P)
    G = np.empty((M if store else 0, P))
    yhat = np.empty(C)
    info = np.zeros(4)
    with _host.blas_threads(1):
        mlp_mc_ef_kernel(z, bool(given), bool(antithetic), mean, sd, x, target, sizes, bias, activation, likelihood,
                         np.ascontiguousarray(Rinv, dtype=np.float64), Rc, float(jitter), g, d, G, bool(want_yhat),
                         yhat, info)
    raise_status(int(info[0]), "MC-EF estimate")
    return g, d, (G if store else None), (yhat if want_yhat else None)
