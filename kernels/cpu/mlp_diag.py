"""FD-EKF and VD-EKF steps for an MLP in one compiled call: predict, forward pass, Jacobian
structure, likelihood moments, update (Chang, Jones & Murphy 2022, eqs 10-14 and 25).

For an MLP the column of H = M J for weight W_l[j, k] is h_i = h~_{l,k} beta_u, with
beta_u = M delta_u (C,) the likelihood-weighted reverse-pass sensitivities of output unit
u = (l, j) and h~_l = [h_l, 1] its input activations (bias: h~ = 1; h~_l = h_l for a network
without biases, ``rb.Linear(bias=False)``); see ``refbayes.kernels.cpu.step``. Every quantity of the diagonal updates then folds into
per-unit sums, so a step costs O(P) plus O(P_units C^2 + C^3), and H is never formed:

- predict: mu_bar = gamma mu, v_bar = gamma^2 v + q;
- FD-EKF (eqs 10-12): S = R + sum_u zeta_u beta_u beta_u^T with zeta_u = sum_k h~_k^2 v_bar_i,
  w = S^{-1} e, s_u = beta_u^T S^{-1} beta_u, d_u = beta_u^T w; then
  v'_i = v_bar_i - v_bar_i^2 h~_k^2 s_u and mu'_i = mu_bar_i + v_bar_i h~_k d_u;
- VD-EKF (eqs 13-14): r_u = beta_u^T R^{-1} beta_u, 1 / v'_i = 1 / v_bar_i + h~_k^2 r_u; mean
  "paper" (eq. 25) mu'_i = mu_bar_i + v'_i h~_k beta_u^T R^{-1} e, or "ekf" the FD-EKF mean.

A singular R or S (the full-class categorical without jitter) takes the pseudo-inverse with the
cut-offs of the reference (``likelihoods.whiten`` for R, least squares for S).
"""

import numba
import numpy as np

from .. import _host
from ._blocks import EPS, chol_inverse_factor, eig_inverse_factor, nonfinite_mat, nonfinite_vec, whitener
from ._status import BAD, BAD_VAR, NOT_PD_R, NOT_PD_S, OK, raise_status
from .mlp import _offsets
from .step import arrays_dtype, host_inputs, mlp_front, r_at

__all__ = ["mlp_diag_step", "diag_middle", "MODES"]

MODES = {"fd": 0, "vd-paper": 1, "vd-ekf": 2}


@numba.njit(cache=True, error_model="numpy")
def _inverse_factor(S, singular):
    """A (k, C) with A^T A = S^{-1}, or S^+ when ``singular`` (eigenvalues above eps C max kept,
    as least squares does); ok=False when S is not positive (semi-)definite."""
    C = S.shape[0]
    if not singular:
        return chol_inverse_factor(S)
    w, V = np.linalg.eigh(S)
    wmax = max(abs(w[0]), abs(w[C - 1])) if C else 0.0
    if C and w[0] < -1e-8 * wmax:
        return np.zeros((0, C)), False
    A = eig_inverse_factor(w, V, EPS * C * wmax)
    return A, True


@numba.njit(cache=True, error_model="numpy")
def _quadratic_terms(A, B, e):
    """For A (k, C), B (C, n), e (C,): q_u = |A B[:, u]|^2 and d_u = (A B[:, u]) . (A e)."""
    k = A.shape[0]
    n = B.shape[1]
    AB = np.dot(A, B) if k > 0 else np.zeros((0, n))
    Ae = np.dot(A, e) if k > 0 else np.zeros(0)
    q = np.zeros(n)
    d = np.zeros(n)
    for r in range(k):
        for u in range(n):
            q[u] += AB[r, u] * AB[r, u]
            d[u] += AB[r, u] * Ae[r]
    return q, d


@numba.njit(cache=True, error_model="numpy")
def diag_middle(zeta, Dl, M, R, e, singular, mode, info):
    """The per-unit terms of the FD-EKF / VD-EKF update from numbers that grow with the units, not with P
    (shared by this module's kernel and the GPU step, refbayes.kernels.cuda.diag_step): zeta (NO,) the
    units' sums of h~_k^2 v_bar_i, Dl (C_f, NO) the reverse-pass sensitivities, M (C, C_f), R (C, C),
    e (C,) the residual; ``singular``: pseudo-inverses (the full-class categorical without jitter).
    Returns (sq, dd) (NO,): v'_i and mu'_i follow from sq[u] h~_k^2 and dd[u] h~_k (``_diag_rows``).
    info[0] = OK, NOT_PD_S, NOT_PD_R or BAD (S not finite)."""
    B = np.dot(M, Dl)  # beta_u = M delta_u, (C, NO)
    NO = B.shape[1]
    C = B.shape[0]
    sq = np.zeros(NO)  # the quadratic term per unit (times h~_k^2 per parameter)
    dd = np.zeros(NO)  # the mean term per unit (times h~_k per parameter)
    if mode != 0:  # the VD-EKF precision (and the paper's mean): R^{-1}, checked first, as the reference does
        AR, ok = whitener(R, singular)
        if not ok:
            info[0] = NOT_PD_R
            return sq, dd
    if mode != 1:  # the FD-EKF gain: S = R + B diag(zeta) B^T
        S = np.empty((C, C))
        for a in range(C):
            for c in range(C):
                t = 0.5 * (R[a, c] + R[c, a])
                for u in range(NO):
                    t += B[a, u] * zeta[u] * B[c, u]
                S[a, c] = t
        for a in range(C):
            for c in range(a):
                t = 0.5 * (S[a, c] + S[c, a])
                S[a, c] = t
                S[c, a] = t
        AS, ok = _inverse_factor(S, singular)
        if not ok:  # an overflow (BAD), or a finite S that is not positive definite (a saturated likelihood)
            info[0] = BAD if nonfinite_mat(S) else NOT_PD_S
            return sq, dd
        sq, dd = _quadratic_terms(AS, B, e)
    if mode != 0:
        rq, rd = _quadratic_terms(AR, B, e)
        sq = rq
        if mode == 1:
            dd = rd
    info[0] = OK
    return sq, dd


@numba.njit(cache=True, error_model="numpy")
def mlp_diag_kernel(theta, var, x, target, sizes, bias, act, lik, Rc, jitter, gamma, q, qstride, mode,
                    out_mean, out_var, yhat, info, lin):
    """Predict (gamma, q) then the FD-EKF / VD-EKF update (``mode`` from MODES); writes out_mean,
    out_var (P,) and yhat (C,); bias: whether the layers have biases. lin (P,) float64 receives the
    predicted mean gamma mu where the network is linearised: out_mean itself for a float64 belief, a
    float64 buffer for a float32 one (theta, var, out_mean, out_var float32: read and written in float32,
    computed in float64). info[0] = OK, NOT_PD_R, NOT_PD_S, BAD_VAR (a variance became
    <= 0; info[1] its index) or BAD (non-finite)."""
    P = theta.shape[0]
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, _ = _offsets(sizes, bias)
    g2 = gamma * gamma
    vbar = np.empty(P)
    for i in range(P):
        m = gamma * theta[i]
        lin[i] = m
        out_mean[i] = m
        vbar[i] = g2 * var[i] + q[i * qstride]

    h, os, Dl, yh, M, R = mlp_front(lin, x, sizes, act, lik, Rc, jitter, yhat, bias)
    NO = os[nl]
    e = target - yh
    singular = lik == 2 and jitter == 0.0

    # per-unit weighted input norms: zeta[u] = sum_k h~_k^2 v_bar_i
    # (this unit walk and the one of "the rows" below are the same loop nest over (layer, unit): deliberate,
    # Numba compiles no generator over units; the first reads v_bar, the second writes the rows; BONG's
    # LIN-EF gradient in bong_mlp.py walks the units the same way)
    zeta = np.zeros(NO)
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        for j in range(sizes[l + 1]):
            u = os[l] + j
            base = w0[l] + j * n_in
            vb = vbar[base:base + n_in]
            z = vbar[b0[l] + j] if bias else 0.0
            for kk in range(n_in):
                z += hl[kk] * hl[kk] * vb[kk]
            zeta[u] = z

    sq, dd = diag_middle(zeta, Dl, M, R, e, singular, mode, info)
    if info[0] != OK:
        return

    # the rows, unit by unit (the same (layer, unit) walk as zeta's above: deliberate, see there)
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        for j in range(sizes[l + 1]):
            u = os[l] + j
            base = w0[l] + j * n_in
            _diag_rows(mode, out_mean[base:base + n_in], vbar[base:base + n_in], out_var[base:base + n_in], hl,
                       sq[u], dd[u])
            if not bias:
                continue
            ib = b0[l] + j
            _diag_rows(mode, out_mean[ib:ib + 1], vbar[ib:ib + 1], out_var[ib:ib + 1], np.ones(1), sq[u], dd[u])
    if nonfinite_vec(out_mean) or nonfinite_vec(out_var):
        info[0] = BAD
        return
    for i in range(P):
        if not out_var[i] > 0.0:
            info[0] = BAD_VAR
            info[1] = i
            return
    info[0] = OK


@numba.njit(cache=True, error_model="numpy")
def _diag_rows(mode, om, vb, ov, hl, sq, dd):
    """One unit's rows: om holds mu_bar (updated in place), vb v_bar, ov receives v'."""
    n = om.shape[0]
    if mode == 0:
        for kk in range(n):
            hv = hl[kk]
            v = vb[kk]
            ov[kk] = v - v * v * (hv * hv * sq)
            om[kk] += v * (hv * dd)
    elif mode == 1:
        for kk in range(n):
            hv = hl[kk]
            vn = 1.0 / (1.0 / vb[kk] + hv * hv * sq)
            ov[kk] = vn
            om[kk] += vn * (hv * dd)
    else:
        for kk in range(n):
            hv = hl[kk]
            ov[kk] = 1.0 / (1.0 / vb[kk] + hv * hv * sq)
            om[kk] += vb[kk] * (hv * dd)


def mlp_diag_step(sizes, activation, likelihood, Rc, jitter, mean, var, x, target, mode, gamma=1.0, q=0.0,
                  bias=None):
    """FD-EKF or VD-EKF predict then update (Chang et al. 2022, eqs 3, 10-14, 25) of an MLP's
    diagonal belief for one observation, in one compiled call.

    sizes: layer sizes; activation: code from ``mlp.ACTIVATION_CODES``; likelihood: code from
    ``step.LIKELIHOOD_CODES``; Rc (C, C): the Gaussian noise covariance (ignored otherwise);
    jitter: added to a categorical R. mean, var: (P,); x: (n_0,); target: T(y) (C,);
    mode: "fd", "vd-paper" or "vd-ekf"; gamma > 0, q >= 0 scalar or (P,) (gamma = 1, q = 0:
    update only); bias: whether the layers have biases (None: read from P, ``mlp.layer_bias``).
    Returns (mean (P,), var (P,), yhat (C,)), new arrays; mean and var float32 when the inputs are
    (a float32 belief), float64 otherwise.
    Raises NotPositiveDefiniteError when R or S is not positive (semi-)definite or a variance
    becomes <= 0.
    """

    if mode not in MODES:
        raise ValueError(f"mode must be one of {tuple(MODES)}; got {mode!r}")
    P, bias, C, qv, qstride = host_inputs(sizes, likelihood, mean, q, bias)
    dt = arrays_dtype(mean, var)
    mean = _host.as_f64(mean, "mean", (P,), dtype=dt)
    var = _host.as_f64(var, "var", (P,), dtype=dt)
    out_mean = np.empty(P, dt)
    out_var = np.empty(P, dt)
    lin = out_mean if dt == np.float64 else np.empty(P)
    yhat = np.empty(C)
    info = np.zeros(2, np.int64)
    with _host.blas_threads(1):
        mlp_diag_kernel(mean, var, x, target, sizes, bias, activation, likelihood, Rc, float(jitter), float(gamma), qv,
                        qstride, MODES[mode], out_mean, out_var, yhat, info, lin)
    status = int(info[0])
    what = "FD-EKF" if mode == "fd" else "VD-EKF"
    if status == BAD_VAR:
        _host.raise_variance_roundoff(what, out_var, int(info[1]))
    R = r_at(sizes, activation, likelihood, Rc, jitter, lin, x, bias) if status == NOT_PD_R else None
    raise_status(status, what, R, mean=mean, var=var, x=x)
    return out_mean, out_var, yhat
