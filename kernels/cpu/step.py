"""A LO-FI update for an MLP in one compiled call: forward pass, Jacobian structure,
likelihood moments, update (Chang et al. 2023, eqs 26-43).

For an MLP the Jacobian never needs to be formed. With delta^c_l = d f_c / d a_{l+1}
(one reverse pass per output c) the Jacobian entry of weight W_l[j, k] is
delta^c_{l,j} h_{l,k}, and of bias b_l[j] it is delta^c_{l,j} (write h~_l = [h_l, 1]).
With H = M J (M = dm/deta, the likelihood's mean Jacobian) and A^T A = R^{-1}, the
whitened columns H^T A^T and g = H^T R^{-1} e are then, for parameter i = (l, j, k),

    x_{i,r} = Delta_l[r, j] h~_{l,k},   g_i = Gamma_l[j] h~_{l,k},
    Delta_l = (A M) [delta^1_l ... delta^C_l]^T,   Gamma_l = (M^T R^{-1} e)^T [delta^c_l]_c,

a rank-one block per output unit (l, j). Every sum over parameters that involves these
columns folds into per-unit sums: with T[u, a] = sum_k h~_k W[i, a],
TD[u, a] = sum_k h~_k W[i, a] / ups_i and Z[u] = sum_k h~_k^2 / ups_i (u = (l, j)),

    W~^T W~   = [[W^T W, T^T Delta^T], [., Delta diag(|h~|^2) Delta^T]]
    W~^T D W~ = [[W^T D W, TD^T Delta^T], [., Delta diag(Z) Delta^T]],  D = diag(1/ups)
    W~^T D g  = [TD^T Gamma; Delta (Z Gamma)],

so the pass over the parameters costs O(P L^2) (BLAS) plus O(P L), not O(P L C).
The R factor comes from one Gram matrix, as the "gram" route of
``refbayes.kernels.cpu.lofi``; when its accuracy guard fails, ``lofi_mlp_update``
returns None and the caller takes the general route (materialised H).
The outputs (eqs 38-42) are W~ V and g - W~ c, row by row: [W V_W](i) + h~_k [Delta V_G](u).

Likelihoods (codes): 0 Gaussian with a fixed R (passed in, jitter included), 1 Categorical
"drop_last", 2 Categorical "full" (pseudo-inverse when jitter = 0); moments as in
``refbayes.likelihoods``.
"""

import numba
import numpy as np

from .. import _host
from ._blocks import EPS, REDUCE, chol_lower, chol_solve, lower_inverse, scaled_gram, whitener
from .lofi import TAU_GRAM, gram_tiles
from .mlp import _forward, _offsets, backprop_layer

__all__ = ["lofi_mlp_update", "LIKELIHOOD_CODES"]

LIKELIHOOD_CODES = {"gaussian": 0, "categorical-drop_last": 1, "categorical-full": 2}
OK, FALLBACK, NOT_PD_R, NOT_PD_CORE, BAD = 0, 1, 2, 3, 4
# rows with |x_i|^2 <= TAU_SUB ups_i take the discarded mass as |x_i|^2 - |W'_i|^2: its
# round-off, below 3 (K + 1) eps |x_i|^2, stays below 1e-12 ups_i for K <= 40
TAU_SUB = 64.0


@numba.njit(cache=True, fastmath=REDUCE)
def _dot(a, b):
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


@numba.njit(cache=True)
def _reverse_deltas(theta, sizes, w0, hs, dact, os, Dl):
    """Dl[c, os[l] + j] = d f_c / d a_{l+1, j} for every output c and layer l (as mlp._jacobian)."""
    nl = sizes.shape[0] - 1
    Cf = sizes[nl]
    width = 0
    for s in sizes:
        width = max(width, s)
    delta = np.empty(width)
    nd = np.empty(width)
    for c in range(Cf):
        for r in range(Cf):
            delta[r] = 0.0
        delta[c] = 1.0
        for l in range(nl - 1, -1, -1):
            n_in = sizes[l]
            n_out = sizes[l + 1]
            for r in range(n_out):
                Dl[c, os[l] + r] = delta[r]
            if l > 0:
                backprop_layer(theta, w0[l], n_in, n_out, dact, hs[l], delta, nd)


@numba.njit(cache=True)
def _likelihood(code, eta, Rc, jitter):
    """(yhat (C,), M = dm/deta (C, C_f), R (C, C)) for the likelihood ``code`` at eta (C_f,)."""
    Cf = eta.shape[0]
    if code == 0:
        return eta.copy(), np.eye(Cf), Rc.copy()
    mx = eta.max()
    s = 0.0
    for i in range(Cf):
        s += np.exp(eta[i] - mx)
    lse = np.log(s) + mx
    p = np.empty(Cf)
    for i in range(Cf):
        p[i] = np.exp(eta[i] - lse)
    kmax = np.argmax(p)
    full = np.empty((Cf, Cf))
    for i in range(Cf):
        for j in range(Cf):
            full[i, j] = -p[i] * p[j]
    for i in range(Cf):
        if i == kmax:
            qi = 0.0
            for j in range(Cf):
                if j != kmax:
                    qi += p[j]
        else:
            qi = 1.0 - p[i]
        full[i, i] = p[i] * qi
    C = Cf - 1 if code == 1 else Cf
    R = full[:C, :C].copy()
    for i in range(C):
        R[i, i] += jitter
    return p[:C].copy(), full[:C].copy(), R


@numba.njit(cache=True, fastmath=REDUCE)
def _output_rows(theta, ups, W, ZW, EW, Fu, dnu, hk, one, i0, n, rank, m, out_mean, out_ups, out_W):
    """Rows i0 <= i < i0 + n of one unit u (h~_k = hk[k], or 1 when ``one``) of
    W' = W~ V[:, :rank], ups' and mu' (eqs 38-42), from ZW = W EW[:, :rank + 1] and the unit's
    coefficients Fu. The discarded mass is |x_i|^2 - |W'_i|^2 where that is accurate
    (|x_i|^2 <= TAU_SUB ups_i), else the sum of squares of W~ V[:, rank:].
    Returns the count of non-finite rows.
    """
    L = W.shape[1]
    mm = EW.shape[1]
    Zb = ZW[i0:i0 + n]
    Ob = out_W[i0:i0 + n]
    Wb = W[i0:i0 + n]
    ub = ups[i0:i0 + n]
    tb = theta[i0:i0 + n]
    oub = out_ups[i0:i0 + n]
    omb = out_mean[i0:i0 + n]
    nbad = 0
    for kk in range(n):
        h = 1.0 if one else hk[kk]
        on2 = 0.0
        for c in range(rank):
            z = Zb[kk, c] + h * Fu[c]
            Ob[kk, c] = z
            on2 += z * z
        wn2 = 0.0
        for a in range(L):
            wn2 += Wb[kk, a] * Wb[kk, a]
        xn2 = wn2 + h * h * dnu
        ui = ub[kk]
        if m == 0:
            disc = 0.0
        elif xn2 <= TAU_SUB * ui:
            disc = max(xn2 - on2, 0.0)
        else:
            disc = 0.0
            for c in range(rank + 1, mm):
                z = h * Fu[c]
                for a in range(L):
                    z += Wb[kk, a] * EW[a, c]
                disc += z * z
        uu = ui + disc
        mu = tb[kk] + (Zb[kk, rank] + h * Fu[rank]) / ui
        oub[kk] = uu
        omb[kk] = mu
        if not (np.isfinite(uu) and np.isfinite(mu) and np.isfinite(on2)):
            nbad += 1
    return nbad


@numba.njit(cache=True)
def _outputs(theta, ups, W, h, sizes, w0, b0, hs, os, ZW, EW, F, dn2, rank, m, out_mean, out_ups, out_W):
    """All rows, unit by unit (the weights of a unit are contiguous, its bias is elsewhere)."""
    nl = sizes.shape[0] - 1
    nbad = 0
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        for j in range(sizes[l + 1]):
            u = os[l] + j
            nbad += _output_rows(theta, ups, W, ZW, EW, F[u], dn2[u], hl, False, w0[l] + j * n_in, n_in, rank, m,
                                 out_mean, out_ups, out_W)
            nbad += _output_rows(theta, ups, W, ZW, EW, F[u], dn2[u], hl, True, b0[l] + j, 1, rank, m,
                                 out_mean, out_ups, out_W)
    return nbad


@numba.njit(cache=True)
def mlp_lofi_kernel(theta, ups, W, x, target, sizes, act, lik, Rc, jitter, rank, force,
                    out_mean, out_ups, out_W, yhat, info):
    """The whole update; writes out_mean, out_ups (P,), out_W (P, rank), yhat (C,).

    info[0] = OK, FALLBACK (the one-Gram route fails its guard; nothing written but yhat),
    NOT_PD_R, NOT_PD_CORE or BAD (non-finite output); info[1] = eps * cond^2 of W~.
    force: take the one-Gram route whatever its guard says (tests).
    """
    P, L = W.shape
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, nh = _offsets(sizes)
    h = np.empty(nh)
    dact = np.empty(nh)
    _forward(theta, x, sizes, act, w0, b0, hs, h, dact)
    Cf = sizes[nl]
    eta = h[hs[nl]:hs[nl] + Cf].copy()
    os = np.zeros(nl + 1, np.int64)
    for l in range(nl):
        os[l + 1] = os[l] + sizes[l + 1]
    NO = os[nl]
    Dl = np.empty((Cf, NO))
    _reverse_deltas(theta, sizes, w0, hs, dact, os, Dl)

    # likelihood moments and the whitened unit coefficients Delta (k, NO), Gamma (NO,)
    yh, M, R = _likelihood(lik, eta, Rc, jitter)
    C = yh.shape[0]
    for c in range(C):
        yhat[c] = yh[c]
    A, ok = whitener(R, lik == 2 and jitter == 0.0)
    if not ok:
        info[0] = NOT_PD_R
        return
    k = A.shape[0]
    K = L + k
    e = target - yh
    Ae = np.dot(A, e) if k > 0 else np.zeros(0)
    w = np.zeros(C)
    for c in range(C):
        for r in range(k):
            w[c] += A[r, c] * Ae[r]
    AM = np.zeros((k, Cf))
    for r in range(k):
        for cf in range(Cf):
            s = 0.0
            for c in range(C):
                s += A[r, c] * M[c, cf]
            AM[r, cf] = s
    wt = np.zeros(Cf)
    for cf in range(Cf):
        for c in range(C):
            wt[cf] += M[c, cf] * w[c]
    Delta = np.zeros((k, NO))
    Gam = np.zeros(NO)
    for u in range(NO):
        for cf in range(Cf):
            dv = Dl[cf, u]
            Gam[u] += wt[cf] * dv
            for r in range(k):
                Delta[r, u] += AM[r, cf] * dv

    # pass 1 over the parameters: W^T (transposed copy), 1/ups, per-unit T, TD, Z, |h~_l|^2
    L4 = L + (-L) % 4
    Wt = np.zeros((L4, P))
    dinv = np.empty(P)
    hd = np.empty(P)  # h~_k / ups_i
    for i in range(P):
        di = 1.0 / ups[i]
        dinv[i] = di
        wr = W[i]
        for a in range(L):
            Wt[a, i] = wr[a]
    T = np.zeros((NO, L))
    TD = np.zeros((NO, L))
    Z = np.zeros(NO)
    hn2 = np.zeros(NO)
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        s = 1.0
        for kk in range(n_in):
            s += hl[kk] * hl[kk]
        for j in range(sizes[l + 1]):
            u = os[l] + j
            hn2[u] = s
            base = w0[l] + j * n_in
            seg = slice(base, base + n_in)
            hs_d = hd[seg]
            dv = dinv[seg]
            for kk in range(n_in):
                hs_d[kk] = hl[kk] * dv[kk]
            ib = b0[l] + j
            hd[ib] = dinv[ib]
            Z[u] = _dot(hl, hs_d) + dinv[ib]
            for a in range(L):
                wa = Wt[a, seg]
                T[u, a] = _dot(hl, wa) + Wt[a, ib]
                TD[u, a] = _dot(hs_d, wa) + Wt[a, ib] * dinv[ib]
    GN = np.zeros((L, 2 * L))
    if L > 0:
        gram_tiles(Wt, dinv, P, GN)

    # G = W~^T W~, N = W~^T D W~, b = W~^T D g
    G = np.zeros((K, K))
    N = np.zeros((K, K))
    b = np.zeros(K)
    for a in range(L):
        for c in range(a + 1):
            G[a, c] = GN[a, c]
            N[a, c] = GN[a, L + c]
    for u in range(NO):
        for r in range(k):
            dr = Delta[r, u]
            for a in range(L):
                G[a, L + r] += T[u, a] * dr
                N[a, L + r] += TD[u, a] * dr
            for s2 in range(r + 1):
                G[L + r, L + s2] += dr * Delta[s2, u] * hn2[u]
                N[L + r, L + s2] += dr * Delta[s2, u] * Z[u]
            b[L + r] += dr * Gam[u] * Z[u]
        for a in range(L):
            b[a] += TD[u, a] * Gam[u]
    for a in range(K):
        for c in range(a):
            if c >= L or a < L:
                G[c, a] = G[a, c]
                N[c, a] = N[a, c]
            else:
                G[a, c] = G[c, a]
                N[a, c] = N[c, a]
    if not (np.all(np.isfinite(G)) and np.all(np.isfinite(N)) and np.all(np.isfinite(b))):
        info[0] = BAD
        return

    # the one-Gram route and its guard (eps * cond^2 of the column-scaled W~)
    d, idx, Gs = scaled_gram(G)
    nz = idx.shape[0]
    L1 = np.empty((nz, nz))
    err = np.inf
    if nz > 0 and chol_lower(Gs, L1):
        # cond(Gs) <= |Gs|_F |Gs^{-1}|_F <= |Gs|_F |L1^{-1}|_F^2 (an upper bound, within a factor K)
        Li = np.empty((nz, nz))
        lower_inverse(L1, Li)
        err = EPS * np.sqrt(np.sum(Gs * Gs)) * np.sum(Li * Li)
    info[1] = err
    if not (err <= TAU_GRAM or (force and np.isfinite(err))):
        info[0] = FALLBACK
        return

    # mean (eq. 38) and right singular vectors (eq. 39)
    core = np.empty((K, K))
    for a in range(K):
        for c in range(K):
            core[a, c] = N[a, c]
        core[a, a] += 1.0
    Lk = np.empty((K, K))
    if not chol_lower(core, Lk):
        info[0] = NOT_PD_CORE
        return
    cvec = np.empty(K)
    chol_solve(Lk, b, cvec)
    Rf = np.zeros((nz, nz))
    for i in range(nz):
        for j in range(i, nz):
            Rf[i, j] = L1[j, i] * d[idx[j]]
    _, sv, Vt = np.linalg.svd(Rf)
    Vf = np.zeros((K, nz))
    for i in range(nz):
        for j in range(nz):
            Vf[idx[i], j] = Vt[j, i]
    keep = min(rank, nz)
    m = nz - keep
    mm = rank + m + 1

    # pass 2 coefficients: row i = (l, j, k) gives W[i] EW + h~_k F[u] over the columns
    # [W' (rank) | g - W~ c | discarded (m)]
    EW = np.zeros((L, mm))
    F = np.zeros((NO, mm))
    for a in range(L):
        for j in range(nz):
            EW[a, j if j < keep else rank + 1 + j - keep] = Vf[a, j]
        EW[a, rank] = -cvec[a]
    dn2 = np.zeros(NO)  # |Delta[:, u]|^2: the whitened part of row i has squared norm h~_k^2 dn2[u]
    for u in range(NO):
        for j in range(nz):
            s = 0.0
            for r in range(k):
                s += Delta[r, u] * Vf[L + r, j]
            F[u, j if j < keep else rank + 1 + j - keep] = s
        s = Gam[u]
        for r in range(k):
            s -= Delta[r, u] * cvec[L + r]
            dn2[u] += Delta[r, u] * Delta[r, u]
        F[u, rank] = s
    EW1 = np.ascontiguousarray(EW[:, :rank + 1])
    ZW = np.dot(W, EW1) if L > 0 else np.zeros((P, rank + 1))
    nbad = _outputs(theta, ups, W, h, sizes, w0, b0, hs, os, ZW, EW, F, dn2, rank, m, out_mean, out_ups, out_W)
    info[0] = BAD if nbad else OK


def lofi_mlp_update(sizes, activation, likelihood, Rc, jitter, mean, ups, W, x, target, rank, force=False):
    """LO-FI update (Chang et al. 2023, eqs 26-43) of an MLP's DLR belief for one observation.

    sizes: the layer sizes (n_0, ..., n_L); activation: code from ``mlp.ACTIVATION_CODES``;
    likelihood: code from ``LIKELIHOOD_CODES``; Rc (C, C): the Gaussian noise covariance
    (jitter included; ignored otherwise); jitter: added to a categorical R.
    mean, ups: (P,); W: (P, L0); x: (n_0,); target: T(y) (C,); rank L >= 0.
    Returns (mean (P,), ups (P,), W (P, rank), yhat (C,)) as new arrays, or None when the
    one-Gram route would not be accurate (the caller then takes the general update).
    Raises NotPositiveDefiniteError on numerical failure.
    """
    from refbayes.errors import NotPositiveDefiniteError

    P, L0 = W.shape
    Cf = int(sizes[-1])
    C = Cf - 1 if likelihood == 1 else Cf
    out_mean = np.empty(P)
    out_ups = np.empty(P)
    out_W = np.empty((P, rank))
    yhat = np.empty(C)
    info = np.zeros(2)
    with _host.blas_threads(1):
        mlp_lofi_kernel(mean, ups, W, x, target, sizes, activation, likelihood, Rc, float(jitter), rank, bool(force),
                        out_mean, out_ups, out_W, yhat, info)
    status = int(info[0])
    if status == FALLBACK:
        return None
    if status == NOT_PD_R:
        raise NotPositiveDefiniteError("the observation covariance R is not positive (semi-)definite")
    if status == NOT_PD_CORE:
        raise NotPositiveDefiniteError("I + W~^T diag(1/ups) W~ is not positive definite")
    if status == BAD:
        _host.raise_nonfinite("LO-FI update", mean=mean, ups=ups, W=W, x=x)
    return out_mean, out_ups, out_W, yhat
