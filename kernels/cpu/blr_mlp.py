"""One BLR inner iteration over the DLR family for an MLP with LIN-HESS, from the per-unit structure of
the estimate's factor (Jones, Chang & Murphy 2024, eqs 293-308).

``bong.dlr_blr`` takes the factor U = H^T A^T (P, k) of LIN-HESS as k dense columns, so its pass,
its two Gram matrices and its output product all run over n = L + R + k columns of
W~ = [sqrt(1 - alpha) W, sqrt(alpha) W_p, sqrt(alpha) U]. For an MLP, U is rank one per output unit
u = (l, j) (``bong_mlp``): parameter i = (l, j, m) has U_{i,r} = h~_m Delta_{r,u}, with h~ = [h_l, 1]
the unit's inputs. Every sum over the parameters that involves U then folds into sums over each
unit's rows, and only the n0 = L + R dense columns Y0 = [sqrt(1 - alpha) W, sqrt(alpha) W_p] are
read as rows of P:

    W~^T W~       = [[Y0^T Y0, ra T Delta^T], [., alpha Delta diag(|h~_u|^2) Delta^T]]
    W~^T D W~     = [[Y0^T D Y0, ra TD Delta^T], [., alpha Delta diag(Z_u) Delta^T]]
    W~^T D rhs    = [Y0^T D rhs; ra Delta Rr]

with D = diag(1 / ups~), ra = sqrt(alpha), T[c, u] = sum_{i in u} h~_i Y0[i, c],
TD[c, u] = sum_{i in u} h~_i Y0[i, c] / ups~_i, Z_u = sum_{i in u} h~_i^2 / ups~_i and
Rr_u = sum_{i in u} h~_i r0_i. The n x n algebra is ``bong.blr_small`` (the same as the dense
step's), and the output product W~ E = Y0 E0 + (per unit) h~_i (ra Delta^T E_U)[u] is one BLAS
product over n0 rows and one pass; ``bong.blr_out`` then writes the new mean, diagonal and W.

Numbers: those of ``bong.dlr_blr`` (and so of the reference) to round-off. Where the dense step
would end with its small-gap truncation (``bong._blr_fused_truncate``), or any guard fails, this
route returns None and the caller runs the dense step, which decides and names any failure.
Networks without biases (``rb.Linear(bias=False)``): h~ = h and no bias rows.
"""

import numba
import numpy as np

from .. import _host
from ._blocks import nonfinite_mat, nonfinite_vec, unit_sums
from ._status import BAD_ESTIMATE, OK
from .bong import DROP_TOL, TRUNC_TOL, blr_load, blr_out, blr_small
from .bong_mlp import _hess_units, _unit_offsets
from .lofi import gram_blocks
from .mlp import _offsets, _row_dot, layer_bias
from .step import n_outputs

__all__ = ["mlp_blr_lin_hess_iteration"]


@numba.njit(cache=True, error_model="numpy")
def lin_hess_units(theta, x, target, sizes, bias, act, lik, Rc, jitter, yhat, info):
    """The LIN-HESS estimate at ``theta`` without its factor: (h, Delta (k, units), Gamma (units,)), so
    that U_{i,r} = h~_i Delta_{r,u} and g_i = h~_i Gamma_u (Gamma = Delta^T A e, the numbers of
    ``bong_mlp.mlp_lin_factor``'s g); writes yhat (C,). info[0] = OK or the status of
    ``bong_mlp.mlp_lin_factor_kernel`` (NOT_PD_R, BAD_MODEL, BAD_ESTIMATE)."""
    h, Delta, gam, Ae, status = _hess_units(theta, x, target, sizes, bias, act, lik, Rc, jitter, yhat)
    if status == OK and (nonfinite_vec(gam) or nonfinite_mat(Delta)):
        status = BAD_ESTIMATE
    info[0] = status
    return h, Delta, gam


@numba.njit(cache=True, error_model="numpy")
def _per_row(sizes, bias, h, val, out, square, add):
    """out[i] = h~_i val[u] (``square``: h~_i^2 val[u]; ``add``: added to out[i]) for every parameter i
    of unit u; val (units,), out (P,)."""
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, _ = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        for j in range(sizes[l + 1]):
            v = val[os[l] + j]
            o = out[w0[l] + j * n_in:w0[l] + (j + 1) * n_in]
            for m in range(n_in):
                t = hl[m] * hl[m] * v if square else hl[m] * v
                o[m] = o[m] + t if add else t
            if bias:
                out[b0[l] + j] = out[b0[l] + j] + v if add else v


@numba.njit(cache=True, error_model="numpy")
def blr_unit_load(Wt, Wpt, Delta, gam, h, sizes, bias, mean, ups, mean_p, ups_p, a, Y0, ut, dinv, r0, s2, delta):
    """Pass 1 (rows): ``bong.blr_load`` over the dense columns only, with g_i = h~_i gam_u:
    Y0 (n0, P) = [sqrt(1 - a) W, sqrt(a) W_p]^T from Wt (L, P) and Wpt (R, P); ups~, 1 / ups~, delta,
    r0 = (g + ups_p delta) / ups~ into ut, dinv, delta, r0; and s2 = |W~_i|^2, each row's squared norm over
    all n columns (U's part, a h~_i^2 |Delta_u|^2, added to the dense columns' sum)."""
    P = Wt.shape[1]
    k, NO = Delta.shape
    du = np.zeros(NO)
    for u in range(NO):
        for r in range(k):
            du[u] += Delta[r, u] * Delta[r, u]
        du[u] *= a
    g = np.empty(P)
    _per_row(sizes, bias, h, gam, g, False, False)
    blr_load(Wt, Wpt, np.empty((0, P)), np.zeros(0), g, False, mean, ups, mean_p, ups_p, a, Y0, ut, dinv, r0, s2,
             delta)
    _per_row(sizes, bias, h, du, s2, True, True)


@numba.njit(cache=True, error_model="numpy")
def blr_unit_sums(Y0, dinv, r0, h, sizes, bias, T, TD, Zh, ZD, Rr):
    """The per-unit sums of the header: T[c, u] = sum_{i in u} h~_i Y0[c, i], TD[c, u] (the same with
    1 / ups~_i), Zh[u] = |h~_u|^2, ZD[u] = sum h~_i^2 / ups~_i, Rr[u] = sum h~_i r0_i; T, TD (n0, units)."""
    n0 = Y0.shape[0]
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, _ = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    hd = np.empty(int(np.max(sizes[:-1])))
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        hn = _row_dot(hl, hl) + (1.0 if bias else 0.0)
        for j in range(sizes[l + 1]):
            u = os[l] + j
            lo = w0[l] + j * n_in
            hi = lo + n_in
            dv = dinv[lo:hi]
            for m in range(n_in):
                hd[m] = hl[m] * dv[m]
            hdv = hd[:n_in]
            zd = _row_dot(hdv, hl)
            rr = _row_dot(hl, r0[lo:hi])
            for c in range(n0):
                yr = Y0[c, lo:hi]
                T[c, u] = _row_dot(yr, hl)
                TD[c, u] = _row_dot(yr, hdv)
            if bias:
                ib = b0[l] + j
                db = dinv[ib]
                zd += db
                rr += r0[ib]
                for c in range(n0):
                    yb = Y0[c, ib]
                    T[c, u] += yb
                    TD[c, u] += yb * db
            Zh[u] = hn
            ZD[u] = zd
            Rr[u] = rr


@numba.njit(cache=True, error_model="numpy")
def blr_unit_assemble(M0, bd, T, TD, Zh, ZD, Rr, Delta, ra):
    """(M (n, 2n), b0 (n,)): the lower triangles of G = W~^T W~ and N = W~^T D W~ and b0 = W~^T D rhs
    over all n = n0 + k columns, from the dense rows' M0 (n0, 2 n0) (``gram_blocks``), bd = Y0 r0 (n0,)
    and the per-unit sums (``blr_unit_sums``); U's columns are ra h~_i Delta_{r,u}."""
    n0 = M0.shape[0]
    k, NO = Delta.shape
    n = n0 + k
    M = np.zeros((n, 2 * n))
    b0 = np.empty(n)
    for i in range(n0):
        b0[i] = bd[i]
        for j in range(i + 1):
            M[i, j] = M0[i, j]
            M[i, n + j] = M0[i, n0 + j]
    a = ra * ra
    GX = np.empty((n0, k))
    NX = np.empty((n0, k))
    GXX = np.empty((k, k))
    NXX = np.empty((k, k))
    unit_sums(T, TD, Delta, Zh, ZD, GX, NX, GXX, NXX)
    for r in range(k):
        for c in range(n0):
            M[n0 + r, c] = ra * GX[c, r]
            M[n0 + r, n + c] = ra * NX[c, r]
        for r2 in range(r + 1):
            M[n0 + r, n0 + r2] = a * GXX[r, r2]
            M[n0 + r, n + n0 + r2] = a * NXX[r, r2]
        b0[n0 + r] = ra * _row_dot(Delta[r], Rr)
    return M, b0


@numba.njit(cache=True, error_model="numpy")
def blr_unit_correct(Z, E, Delta, h, sizes, bias, ra):
    """Z (m, P) += U's part of E^T W~^T: row j gets h~_i (ra Delta^T E[n0:, j])[u] at each parameter i
    of unit u (E (n, m), its last k rows U's)."""
    m = Z.shape[0]
    k, NO = Delta.shape
    n0 = E.shape[0] - k
    F = np.zeros(NO)
    for j in range(m):
        for u in range(NO):
            s = 0.0
            for r in range(k):
                s += Delta[r, u] * E[n0 + r, j]
            F[u] = ra * s
        _per_row(sizes, bias, h, F, Z[j], False, True)


def mlp_blr_lin_hess_iteration(sizes, activation, likelihood, Rc, jitter, mean, ups, W, mean_p, ups_p, W_p, x,
                               target, alpha, bias=None):
    """One BLR inner iteration (0 < alpha < 1) over the DLR family with LIN-HESS for an MLP: the estimate at
    ``mean`` (no factor formed) and the step of ``bong.dlr_blr`` from it, by the per-unit sums above.

    sizes, activation, likelihood, Rc, jitter: the MLP spec of ``bong_mlp.mlp_lin_factor``; mean, ups (P,),
    W (P, L): the current iterate; mean_p, ups_p (P,), W_p (P, R): the prior (its rank R is the
    projection's); x (n_0,), target (C,). Returns (mean, ups, W (P, R) column-major, yhat (C,)), or None
    when this route does not apply (rank 0, alpha = 1, a failed estimate or guard, a small eigen-gap at
    the cut, a bad output): the caller then runs the estimate and ``bong.dlr_blr``, which decide and
    name any failure.
    """
    a = float(alpha)
    if not 0.0 < a < 1.0:
        return None
    P = mean.shape[0]
    bias = layer_bias(sizes, P, bias)
    Wt = _host.as_f64(W, "W", (P, None), transpose=True)
    Wpt = _host.as_f64(W_p, "W_p", (P, None), transpose=True)
    L, Rp = Wt.shape[0], Wpt.shape[0]
    yhat = np.empty(n_outputs(sizes, likelihood))
    info = np.zeros(1)
    with _host.blas_threads(1), np.errstate(all="ignore"):
        h, Delta, gam = lin_hess_units(mean, x, target, sizes, bias, activation, likelihood, Rc, float(jitter), yhat,
                                        info)
        k = Delta.shape[0]
        n0 = L + Rp
        if info[0] != OK or Rp == 0 or n0 + k <= Rp:
            return None
        Y0 = np.empty((n0, P))
        ut, dinv, r0, s2, delta = np.empty((5, P))
        blr_unit_load(Wt, Wpt, Delta, gam, h, sizes, bias, mean, ups, mean_p, ups_p, a, Y0, ut, dinv, r0, s2, delta)
        M0 = np.empty((n0, 2 * n0))
        bd = np.empty(n0)
        gram_blocks(Y0, dinv, r0, M0, bd)
        NO = Delta.shape[1]
        T, TD = np.empty((2, n0, NO))
        Zh, ZD, Rr = np.empty((3, NO))
        blr_unit_sums(Y0, dinv, r0, h, sizes, bias, T, TD, Zh, ZD, Rr)
        M, b0 = blr_unit_assemble(M0, bd, T, TD, Zh, ZD, Rr, Delta, np.sqrt(a))
        status, _, _, _, _, E = blr_small(M, b0, Wpt @ delta, L, Rp, np.sqrt(a), Rp, DROP_TOL, TRUNC_TOL)
        if status != 0:
            return None
        Z = np.dot(np.ascontiguousarray(E[:n0].T), Y0)
        blr_unit_correct(Z, E, Delta, h, sizes, bias, np.sqrt(a))
        out_mean = np.empty(P)
        out_ups = np.empty(P)
        if blr_out(Z, s2, ut, dinv, r0, mean, a, out_mean, out_ups):
            return None
    return out_mean, out_ups, Z[:Rp].T, yhat
