"""LO-FI update as a compiled kernel (Chang et al. 2023, eqs 26-43).

Belief N(mu, (diag(ups) + W W^T)^{-1}), ups (P,), W (P, L). The new factor is
W~ = [W, H^T A^T] (P, K), K = L + k, with A^T A = R^{-1} (eq. 31), and the update needs

- the mean (eq. 38): mu' = mu + D (g - W~ c), D = diag(1/ups), g = H^T R^{-1} e,
  c = (I + N)^{-1} b with N = W~^T D W~ and b = W~^T D g;
- the thin SVD W~ = U diag(s) V^T (eq. 39): W' = W~ V[:, :L] (eq. 40) and
  ups' = ups + rowsumsq(W~ V[:, L:]) (eqs 41-42).

W~ is never stored. Every pass walks the P rows in chunks of ``NB`` (contiguous runs of
chunks go to a few threads, ``_host.run_chunks``); per-chunk sums go to their own slot
and are added in chunk order afterwards, so the result does not depend on the number
of threads.

Pass 1 (reads W, H, ups): the Gram matrices of the *unwhitened* rows Y = [W, H^T],
Y^T Y and Y^T D Y, from a transposed copy of each chunk's rows in 2 x 4 register tiles
(``gram_tiles``). LLVM vectorises a floating-point sum only when it may reorder it, so the
tiles are compiled with fastmath {"reassoc", "contract"} and nothing else (NaN and
infinity keep their meaning); the order is then fixed by the compiled code, the same on
every call and for every thread count, as it is inside BLAS. With T = blockdiag(I_L, A^T) (so
W~ = Y T) the small side forms G = W~^T W~ = T^T (Y^T Y) T, N = T^T (Y^T D Y) T and
b = T^T (Y^T D Y) [0; w] (w = R^{-1} e).

The right singular vectors come from an R factor of W~ (never from an eigensolver on G),
picked by the conditioning of the column-scaled G (a Gram matrix squares it):

- "gram": R = chol(G), one pass. Its columns carry relative errors of about
  err = eps * cond^2 * phi^2, where cond is the condition number of W~ with unit columns and
  phi >= 1 bounds the growth that whitening after the product adds (both read off the
  small matrices). Used when err <= ``TAU_GRAM``.
- "cholqr2": a second pass forms Q1 = W~ R1^{-1} from whitened rows and R = chol(Q1^T Q1)^T R1
  (CholeskyQR2); relative column errors of about eps * cond. Used when err <= ``TAU_CHOLQR2``.
  Recomputes N and b from the whitened rows.
- "tsqr": a Householder tall-skinny QR streamed chunk by chunk (any conditioning, rank
  deficiency, P < K), plus whitened N and b.

The thresholds come from comparing each route with the thin-SVD reference on 400 random
problems (cond up to 1e8): below them a route's error on ups' stays within a factor 2 of
the Householder route's. Then R = U_r diag(s) V^T (LAPACK) gives V, and pass 2 (reads W, H,
ups, mu; writes the outputs) computes Y (T V) and Y ([0; w] - T c) by one product per chunk
(``_blocks.tile_matmul``). Exactly zero columns of W~ (the prior W = 0) are left out of the factorisation.
"""

import numba
import numpy as np

from refbayes.errors import NotPositiveDefiniteError, r_not_positive_definite

from .. import _host
from ._status import BAD, OK
from ._blocks import (
    EPS,
    NL,
    REDUCE,
    SB,
    _four_rows,
    block_buffer,
    chol_lower,
    chol_solve,
    dot_block,
    finish_dot,
    finish_gram,
    gram_block,
    load_cols_block,
    lower_inverse,
    matmul,
    nonfinite_vec,
    project_block,
    scaled_gram,
    tile_matmul,
    whiten_block,
    whitener,
)

__all__ = ["lofi_update", "check_update_args", "METHODS", "householder_block"]

NB = 1024  # rows per chunk
METHODS = ("auto", "gram", "cholqr2", "tsqr")
ROUTE_GRAM, ROUTE_CHOLQR2, ROUTE_TSQR = 0, 1, 2
TAU_GRAM = 1e-12  # largest eps * cond^2 * phi^2 for one Gram matrix (see the module docstring)
TAU_CHOLQR2 = 1e-8  # largest eps * cond^2 * phi^2 for CholeskyQR2



def _nchunks(P):
    return (P + NB - 1) // NB


# ---------------------------------------------------------------------------------------------
# Householder tall-skinny QR (the "tsqr" route)


@numba.njit(cache=True, error_model="numpy")
def householder_block(Rq, B, n):
    """Rq <- R factor of [Rq; B[:, :n]^T] by Householder reflections (B is overwritten).

    Rq (K, K) upper triangular (a running R, zeros to start), B (K, m >= n) holds the
    next n rows of the tall matrix, transposed. Reflector for column a as in
    LAPACK dlarfg: beta = -sign(alpha) |x|, tau = (beta - alpha) / beta,
    v = [1, tail / (alpha - beta)]. A zero tail needs no reflection.
    """
    K = Rq.shape[0]
    nv = n - n % NL
    lanes = np.empty(NL)
    for a in range(K):
        for l in range(NL):
            lanes[l] = 0.0
        for j in range(0, nv, NL):
            for l in range(NL):
                lanes[l] += B[a, j + l] * B[a, j + l]
        for j in range(nv, n):
            lanes[0] += B[a, j] * B[a, j]
        sig = 0.0
        for l in range(NL):
            sig += lanes[l]
        if sig == 0.0:
            continue
        alpha = Rq[a, a]
        nrm = np.hypot(alpha, np.sqrt(sig))
        beta = -nrm if alpha >= 0.0 else nrm
        inv = 1.0 / (alpha - beta)
        tau = (beta - alpha) / beta
        for j in range(n):
            B[a, j] *= inv
        Rq[a, a] = beta
        for b in range(a + 1, K):
            for l in range(NL):
                lanes[l] = 0.0
            for j in range(0, nv, NL):
                for l in range(NL):
                    lanes[l] += B[a, j + l] * B[b, j + l]
            for j in range(nv, n):
                lanes[0] += B[a, j] * B[b, j]
            s = Rq[a, b]
            for l in range(NL):
                s += lanes[l]
            s *= tau
            Rq[a, b] -= s
            for j in range(n):
                B[b, j] -= s * B[a, j]


@numba.njit(nogil=True, cache=True, error_model="numpy")
def tsqr_range(ups, W, H, A, w, partsR, partsN, ch0, ch1):
    """Chunks ch0 <= ch < ch1: the R factor of the chunk's whitened rows W~ (partsR[ch], (K, K))
    and [W~^T D W~ | W~^T D g] (partsN[ch], (K, K + 1)), g_i = h_i^T w.
    """
    P, L = W.shape
    K = partsR.shape[1]
    B = np.empty((K, SB))
    z = np.empty(SB)
    d = np.empty(SB)
    dinv = np.empty(SB)
    y = np.empty(SB)
    t = np.empty(SB)
    N = np.empty((K, K))
    bv = np.empty(K)
    for ch in range(ch0, ch1):
        c0 = ch * NB
        c1 = min(P, c0 + NB)
        accN = np.zeros((K, K, NL))
        accb = np.zeros((K, NL))
        Rq = partsR[ch]
        Rq[:, :] = 0.0
        for i0 in range(c0, c1, SB):
            n = min(SB, c1 - i0)
            load_cols_block(W, i0, n, B, 0)
            whiten_block(H, A, i0, n, B, L, z)
            project_block(H, w, i0, n, d)
            u = ups[i0:i0 + n]
            for j in range(n):
                dinv[j] = 1.0 / u[j]
                y[j] = dinv[j] * d[j]
            gram_block(B, dinv, n, accN, t)
            dot_block(B, y, n, accb)
            householder_block(Rq, B, n)
        finish_gram(accN, N)
        finish_dot(accb, bv)
        for a in range(K):
            for b in range(K):
                partsN[ch, a, b] = N[a, b]
            partsN[ch, a, K] = bv[a]


# ---------------------------------------------------------------------------------------------
# pass 1: Gram matrices of the unwhitened rows Y = [W, H^T]


@numba.njit(nogil=True, cache=True, error_model="numpy")
def load_rows(W, H, i0, n, Yt):
    """Yt[:L + C, :n] = [W[i0:i0+n]^T; H[:, i0:i0+n]]: the chunk's rows of Y = [W, H^T], transposed."""
    L = W.shape[1]
    C = H.shape[0]
    Wb = W[i0:i0 + n]
    n8 = n - n % 8
    for j0 in range(0, n8, 8):
        for a in range(L):
            for t in range(8):
                Yt[a, j0 + t] = Wb[j0 + t, a]
    for j in range(n8, n):
        for a in range(L):
            Yt[a, j] = Wb[j, a]
    for c in range(C):
        hc = H[c, i0:i0 + n]
        for j in range(n):
            Yt[L + c, j] = hc[j]


@numba.njit(nogil=True, cache=True, fastmath=REDUCE, error_model="numpy")
def gram_tiles(Yt, w1, w2, j0, n, M, w3=None):
    """M[a, b] = sum_j Yt[a, j] w1[j - j0] Yt[b, j] and M[a, Ky + b] = sum_j Yt[a, j] w2[j - j0] Yt[b, j]
    over j0 <= j < j0 + n, for b <= a (and some b > a), in 2 x 4 register tiles: the weights w1, w2
    (>= n,) are those of the block's n columns, from index 0 (so that a caller can keep them in a
    block-sized buffer); w1 = None means w1 = 1 (Numba compiles that case without the
    multiplication). With a third weight w3, also M[a, 2 Ky + b] = sum_j Yt[a, j] w3[j - j0] Yt[b, j]
    in the same sweep (24 sums in registers; Numba compiles the w3 = None case without them).
    Yt (K, >= j0 + n), Ky = M.shape[0] <= K (rows past Ky are not written). Rows past K - 1 are read
    as row K - 1 and their sums dropped. (The loops index slices from 0, see ``_blocks.row_gram``.)
    """
    K4 = Yt.shape[0]
    Ky = M.shape[0]
    last = K4 - 1
    v2 = w2[:n]
    v1 = v2 if w1 is None else w1[:n]
    v3 = v2 if w3 is None else w3[:n]
    for a in range(0, K4, 2):
        ya0 = Yt[a, j0:j0 + n]
        ya1 = Yt[min(a + 1, last), j0:j0 + n]
        for b in range(0, a + 1, 4):
            yb0, yb1, yb2, yb3 = _four_rows(Yt, b, K4, j0, n)
            g00 = g01 = g02 = g03 = g10 = g11 = g12 = g13 = 0.0
            n00 = n01 = n02 = n03 = n10 = n11 = n12 = n13 = 0.0
            q00 = q01 = q02 = q03 = q10 = q11 = q12 = q13 = 0.0
            for j in range(n):
                z0 = yb0[j]
                z1 = yb1[j]
                z2 = yb2[j]
                z3 = yb3[j]
                # this g-block and the n-block below are the same 2 x 4 tile with weights w1 and w2: kept
                # apart on purpose, the 16 sums stay in registers (a shared helper returns them via memory)
                if w1 is None:
                    x0 = ya0[j]
                    x1 = ya1[j]
                else:
                    x0 = v1[j] * ya0[j]
                    x1 = v1[j] * ya1[j]
                g00 += x0 * z0
                g01 += x0 * z1
                g02 += x0 * z2
                g03 += x0 * z3
                g10 += x1 * z0
                g11 += x1 * z1
                g12 += x1 * z2
                g13 += x1 * z3
                # the n-block: same tile as the g-block above, weights w2 (deliberate register unrolling)
                u0 = v2[j] * ya0[j]
                u1 = v2[j] * ya1[j]
                n00 += u0 * z0
                n01 += u0 * z1
                n02 += u0 * z2
                n03 += u0 * z3
                n10 += u1 * z0
                n11 += u1 * z1
                n12 += u1 * z2
                n13 += u1 * z3
                if w3 is not None:  # the q-block: the same tile again, weights w3
                    s0 = v3[j] * ya0[j]
                    s1 = v3[j] * ya1[j]
                    q00 += s0 * z0
                    q01 += s0 * z1
                    q02 += s0 * z2
                    q03 += s0 * z3
                    q10 += s1 * z0
                    q11 += s1 * z1
                    q12 += s1 * z2
                    q13 += s1 * z3
            g = (g00, g01, g02, g03, g10, g11, g12, g13)
            nn = (n00, n01, n02, n03, n10, n11, n12, n13)
            qq = (q00, q01, q02, q03, q10, q11, q12, q13)
            for t in range(8):
                r = a + t // 4
                c = b + t % 4
                if r < Ky and c < Ky and r <= last and c <= last:
                    M[r, c] = g[t]
                    M[r, Ky + c] = nn[t]
                    if w3 is not None:
                        M[r, 2 * Ky + c] = qq[t]


@numba.njit(nogil=True, cache=True, fastmath=REDUCE, error_model="numpy")
def cross_tiles(At, Xt, w, j0, n, out, c0):
    """out[a, c0 + c] += sum_j At[a, j] w[j - j0] Xt[c, j] over j0 <= j < j0 + n, for every row a of At
    (R, >= j0 + n) and c of Xt (Rx, >= j0 + n): the weighted cross sums of two factors' rows, in 4 x 4
    register tiles (16 sums per eight row loads, where one row of At against one of Xt at a time loads
    two rows per multiply-add). w (>= n,): the block's weights from index 0. Rows past the last of At
    or Xt are read as the last and their sums dropped (``_blocks._four_rows``); out (>= R, >= c0 + Rx)."""
    R = At.shape[0]
    Rx = Xt.shape[0]
    if R == 0 or Rx == 0:
        return
    v = w[:n]
    for a in range(0, R, 4):
        ya0, ya1, ya2, ya3 = _four_rows(At, a, R, j0, n)
        for c in range(0, Rx, 4):
            xb0, xb1, xb2, xb3 = _four_rows(Xt, c, Rx, j0, n)
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = 0.0
            s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = 0.0
            for j in range(n):
                z0 = xb0[j]
                z1 = xb1[j]
                z2 = xb2[j]
                z3 = xb3[j]
                x0 = v[j] * ya0[j]
                x1 = v[j] * ya1[j]
                x2 = v[j] * ya2[j]
                x3 = v[j] * ya3[j]
                s00 += x0 * z0
                s01 += x0 * z1
                s02 += x0 * z2
                s03 += x0 * z3
                s10 += x1 * z0
                s11 += x1 * z1
                s12 += x1 * z2
                s13 += x1 * z3
                s20 += x2 * z0
                s21 += x2 * z1
                s22 += x2 * z2
                s23 += x2 * z3
                s30 += x3 * z0
                s31 += x3 * z1
                s32 += x3 * z2
                s33 += x3 * z3
            ss = (s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33)
            for t in range(16):
                r = a + t // 4
                cc = c + t % 4
                if r < R and cc < Rx:
                    out[r, c0 + cc] += ss[t]


#: columns per block of ``gram_blocks``: the block's rows (up to about 40 of them, 16 KB each) stay in
#: the L2 cache while every tile reads them, where one call over all P columns reads each row from
#: memory or L3 once per tile (at P = 123,610 and 20 rows: 3.2 against 7.0 ms, docs/bong.md §6)
GRAM_BLOCK = 2048


@numba.njit(nogil=True, cache=True, fastmath=REDUCE, error_model="numpy")
def gram_blocks(Yt, dinv, r, M, b):
    """The lower triangles (at least) of M (n, 2n) = [Yt Yt^T | Yt diag(dinv) Yt^T] and b (n,) = Yt r, over
    all P columns of Yt (n, P), dinv, r (P,): ``gram_tiles`` on blocks of GRAM_BLOCK columns, each
    block's sums added to M (and its part of b taken) while the block is in cache. M and b are
    overwritten. The sums are blocked sums: the same numbers as one ``gram_tiles`` call to round-off.
    """
    n, P = Yt.shape
    tmp = np.zeros((n, 2 * n))
    M[:] = 0.0
    b[:] = 0.0
    for j0 in range(0, P, GRAM_BLOCK):
        m = min(GRAM_BLOCK, P - j0)
        gram_tiles(Yt, None, dinv[j0:j0 + m], j0, m, tmp)
        for a in range(n):
            for c in range(a + 1):
                M[a, c] += tmp[a, c]
                M[a, n + c] += tmp[a, n + c]
        rr = r[j0:j0 + m]
        for a in range(n):
            ya = Yt[a, j0:j0 + m]
            s = 0.0
            for j in range(m):
                s += ya[j] * rr[j]
            b[a] += s


@numba.njit(nogil=True, cache=True, error_model="numpy")
def gram_range(ups, W, H, parts, ch0, ch1):
    """Chunks ch0 <= ch < ch1: parts[ch] (Ky, 2 Ky) = [Y^T Y | Y^T D Y] over the chunk's
    rows, Y = [W, H^T] (Ky = L + C columns), D = diag(1/ups); the lower triangles (at least)
    are written.
    """
    P, L = W.shape
    Ky = L + H.shape[0]
    Yt = np.zeros((Ky + (-Ky) % 4, NB))
    dinv = np.empty(NB)
    for ch in range(ch0, ch1):
        i0 = ch * NB
        n = min(NB, P - i0)
        load_rows(W, H, i0, n, Yt)
        u = ups[i0:i0 + n]
        for j in range(n):
            dinv[j] = 1.0 / u[j]
        gram_tiles(Yt, None, dinv, 0, n, parts[ch])


# ---------------------------------------------------------------------------------------------
# CholeskyQR2 second pass (whitened rows)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def cholqr2_range(ups, W, H, Aw, Mt, partsG, partsN, ch0, ch1):
    """Chunks ch0 <= ch < ch1: partsG[ch] = Q^T Q with Q = W~ Mt^T (Mt (K', K)) and
    partsN[ch] = [W~^T D W~ | W~^T D g] (K, K + 1) over the chunk's rows; Aw = [A; w^T]
    (k + 1, C >= 1) gives the whitened columns and g = H^T w.
    """
    P, L = W.shape
    C = H.shape[0]
    K = Mt.shape[1]
    k1 = Aw.shape[0]
    for ch in range(ch0, ch1):
        i0 = ch * NB
        n = min(NB, P - i0)
        Xt = np.empty((K + 1, n))
        Hc = np.empty((L + C, n))
        load_rows(W, H, i0, n, Hc)
        for a in range(L):
            for j in range(n):
                Xt[a, j] = Hc[a, j]
        Xh = np.dot(Aw, Hc[L:])
        for r in range(k1):
            for j in range(n):
                Xt[L + r, j] = Xh[r, j]
        Qt = np.dot(Mt, Xt[:K])
        partsG[ch] = np.dot(Qt, Qt.T)
        DX = np.empty((K + 1, n))
        u = ups[i0:i0 + n]
        for a in range(K + 1):
            for j in range(n):
                DX[a, j] = Xt[a, j] / u[j]
        partsN[ch] = np.dot(Xt[:K], DX.T)


# ---------------------------------------------------------------------------------------------
# pass 2: the outputs


@numba.njit(nogil=True, cache=True, error_model="numpy")
def output_range(mean, ups, W, H, Et, out_mean, out_ups, out_W, ch0, ch1):
    """Chunks ch0 <= ch < ch1 of the outputs, with Y = [W, H^T] (rows) and Et = [EW^T; ERt]
    (rank + m + 1, Ky) (``coefficients``' EW (Ky, rank) and ERt (m + 1, Ky)): per chunk, one product
    Zt = Et Y^T (``_blocks.tile_matmul``), then out_W = Y EW (Zt's first rank rows, transposed into
    out_W's rows), out_ups = ups + rowsumsq(Z[:, :m]) and out_mean = mean + Z[:, m] / ups with
    Z = Y ERt^T (Zt's last m + 1 rows). Returns the count of chunks with a non-finite output.
    """
    P, L = W.shape
    Ky = L + H.shape[0]
    rank = out_W.shape[1]
    m1 = Et.shape[0] - rank
    nbad = 0
    flat_W = out_W.ravel()  # a view: out_W is C-contiguous
    Yt = block_buffer(Ky, NB)
    Zt = block_buffer(rank + m1, NB)
    disc = np.empty(NB)
    for ch in range(ch0, ch1):
        i0 = ch * NB
        n = min(NB, P - i0)
        load_rows(W, H, i0, n, Yt)
        tile_matmul(Et, Yt, 0, n, Zt)
        ow = flat_W[i0 * rank:(i0 + n) * rank]
        for j in range(n):  # W+'s rows from Zt's columns (Zt is in cache)
            for c in range(rank):
                ow[j * rank + c] = Zt[c, j]
        for j in range(n):
            disc[j] = 0.0
        for l in range(rank, rank + m1 - 1):
            zl = Zt[l, :n]
            for j in range(n):
                disc[j] += zl[j] * zl[j]
        zm = Zt[rank + m1 - 1, :n]
        u = ups[i0:i0 + n]
        mu = mean[i0:i0 + n]
        ou = out_ups[i0:i0 + n]
        om = out_mean[i0:i0 + n]
        for j in range(n):
            ou[j] = u[j] + disc[j]
            om[j] = mu[j] + zm[j] / u[j]
        if nonfinite_vec(ou) or nonfinite_vec(om) or nonfinite_vec(ow):
            nbad += 1
    return nbad


# ---------------------------------------------------------------------------------------------
# the small algebra between the passes


@numba.njit(cache=True, error_model="numpy")
def setup(R, e, singular):
    """(A (k, C), w = A^T A e (C,), ok): the whitener of R (eq. 31) and R^{-1} e."""
    A, ok = whitener(R, singular)
    C = R.shape[0]
    k = A.shape[0]
    w = np.zeros(C)
    if ok and k > 0:
        Ae = np.dot(A, e)
        for c in range(C):
            s = 0.0
            for r in range(k):
                s += A[r, c] * Ae[r]
            w[c] = s
    return A, w, ok


@numba.njit(cache=True, error_model="numpy")
def _sum_parts(parts, out):
    out[...] = 0.0
    for ch in range(parts.shape[0]):
        out += parts[ch]


@numba.njit(cache=True, error_model="numpy")
def _finite(M):
    for x in M.ravel():
        if not np.isfinite(x):
            return False
    return True


@numba.njit(cache=True, error_model="numpy")
def plan(parts, A, w, L, method):
    """From pass 1: G, N, b of the whitened rows, the route, and for "gram"/"cholqr2" the R
    factor of the nonzero columns idx (Rf (K', K'), upper) and Mt = Rf^{-T} on them (K', K).

    Returns (status, route, err, T (L + C, K), y0 (L + C,), N (K, K), b (K,), idx, Rf, Mt); status is
    ``_status.OK``, or BAD for non-finite sums; err = eps * cond^2 * phi^2 (inf when the scaled Gram
    matrix is numerically singular).
    """
    C, k = A.shape[1], A.shape[0]
    Ky = L + C
    K = L + k
    M = np.empty((Ky, 2 * Ky))
    _sum_parts(parts, M)
    T = np.zeros((Ky, K))
    y0 = np.zeros(Ky)
    N = np.zeros((K, K))
    b = np.zeros(K)
    idx = np.arange(K)
    Rf = np.zeros((K, K))
    Mt = np.zeros((K, K))
    if not _finite(M):
        return BAD, ROUTE_TSQR, np.inf, T, y0, N, b, idx, Rf, Mt
    for a in range(Ky):
        for c in range(a + 1, Ky):
            M[a, c] = M[c, a]
            M[a, Ky + c] = M[c, Ky + a]
    for a in range(L):
        T[a, a] = 1.0
    for c in range(C):
        y0[L + c] = w[c]
        for r in range(k):
            T[L + c, L + r] = A[r, c]
    Gy = M[:, :Ky]
    Ny = M[:, Ky:]
    tmp = np.empty((Ky, K))
    G = np.empty((K, K))
    matmul(Gy, T, tmp)
    matmul(T, tmp, G, True)
    matmul(Ny, T, tmp)
    matmul(T, tmp, N, True)
    Ny0 = np.zeros(Ky)
    for a in range(Ky):
        for c in range(Ky):
            Ny0[a] += Ny[a, c] * y0[c]
    for a in range(K):
        for c in range(Ky):
            b[a] += T[c, a] * Ny0[c]

    # column norms, the exactly-zero columns, the growth phi of whitening after the product
    d, idx, Gs = scaled_gram(G)
    nz = idx.shape[0]
    phi2 = 1.0
    for r in range(k):
        if d[L + r] > 0.0:
            s = 0.0
            for c in range(C):
                s += abs(A[r, c]) * np.sqrt(max(Gy[L + c, L + c], 0.0))
            phi2 = max(phi2, (s / d[L + r]) ** 2)

    # conditioning of the column-scaled Gram matrix, and its Cholesky factor
    L1 = np.empty((nz, nz))
    chol_ok = nz > 0 and C > 0 and chol_lower(Gs, L1)
    err = np.inf
    if chol_ok:
        lam = np.linalg.eigvalsh(Gs)
        if lam[0] > 0.0:
            err = EPS * (lam[nz - 1] / lam[0]) * phi2
    route = ROUTE_TSQR
    if chol_ok and (method == 1 or (method == 0 and err <= TAU_GRAM)):
        route = ROUTE_GRAM
    elif chol_ok and (method == 2 or (method == 0 and err <= TAU_CHOLQR2)):
        route = ROUTE_CHOLQR2
    if route == ROUTE_TSQR:
        return OK, route, err, T, y0, N, b, np.arange(K), Rf, Mt
    Rf = np.zeros((nz, nz))
    for i in range(nz):
        for jj in range(i, nz):
            Rf[i, jj] = L1[jj, i] * d[idx[jj]]
    Mt = np.zeros((nz, K))
    if route == ROUTE_CHOLQR2:
        Linv = np.empty((nz, nz))
        lower_inverse(np.ascontiguousarray(Rf.T), Linv)  # (Rf^T)^{-1} = Rf^{-T}
        for i in range(nz):
            for jj in range(nz):
                Mt[i, idx[jj]] = Linv[i, jj]
    return OK, route, err, T, y0, N, b, idx, Rf, Mt


@numba.njit(cache=True, error_model="numpy")
def finish_cholqr2(partsG, partsN, Rf):
    """R = chol(Q^T Q)^T Rf and the whitened N, b; ok False when Q^T Q is not positive definite."""
    nz = Rf.shape[0]
    K = partsN.shape[1]
    G2 = np.empty((nz, nz))
    Nb = np.empty((K, K + 1))
    _sum_parts(partsG, G2)
    _sum_parts(partsN, Nb)
    L2 = np.empty((nz, nz))
    ok = _finite(G2) and _finite(Nb) and chol_lower(G2, L2)
    R = np.dot(np.ascontiguousarray(L2.T), Rf) if ok else Rf
    return R, np.ascontiguousarray(Nb[:, :K]), np.ascontiguousarray(Nb[:, K]), ok


@numba.njit(cache=True, error_model="numpy")
def finish_tsqr(partsR, partsN):
    """The R factor of all rows (Householder on the stacked chunk factors, in chunk order)
    and the whitened N, b."""
    nch, K = partsR.shape[0], partsR.shape[1]
    Rf = np.zeros((K, K))
    Bt = np.empty((K, K))
    for ch in range(nch):
        for a in range(K):
            for c in range(K):
                Bt[a, c] = partsR[ch, c, a]
        householder_block(Rf, Bt, K)
    Nb = np.empty((K, K + 1))
    _sum_parts(partsN, Nb)
    return Rf, np.ascontiguousarray(Nb[:, :K]), np.ascontiguousarray(Nb[:, K])


@numba.njit(cache=True, error_model="numpy")
def coefficients(Rf, N, b, idx, T, y0, rank):
    """Pass-2 coefficients on the unwhitened rows Y = [W, H^T]: EW = T V[:, :rank] (Ky, rank),
    zero columns past the K' components) and ERt = [T V[:, rank:], y0 - T c]^T (m + 1, Ky), with
    V from the SVD of Rf (eq. 39) and c = (I + N)^{-1} b (eq. 38).
    Returns (ok, EW, ERt); ok False when I + N is not positive definite.
    """
    Ky, K = T.shape
    nz = Rf.shape[0]
    keep = min(rank, nz)
    m = nz - keep
    EW = np.zeros((Ky, rank))
    ERt = np.zeros((m + 1, Ky))
    core = np.empty((K, K))
    for a in range(K):
        for c in range(K):
            core[a, c] = 0.5 * (N[a, c] + N[c, a])
        core[a, a] += 1.0
    Lk = np.empty((K, K))
    if not (_finite(core) and chol_lower(core, Lk)):
        return False, EW, ERt
    cvec = np.empty(K)
    chol_solve(Lk, b, cvec)
    Vf = np.zeros((K, nz))
    if nz > 0:
        _, s, Vt = np.linalg.svd(Rf)
        for i in range(nz):
            for j in range(nz):
                Vf[idx[i], j] = Vt[j, i]
    for a in range(Ky):
        for j in range(nz):
            s = 0.0
            for c in range(K):
                s += T[a, c] * Vf[c, j]
            if j < keep:
                EW[a, j] = s
            else:
                ERt[j - keep, a] = s
        s = y0[a]
        for c in range(K):
            s -= T[a, c] * cvec[c]
        ERt[m, a] = s
    return True, EW, ERt


# ---------------------------------------------------------------------------------------------
# wrapper


def _rank(rank, default):
    if rank is None:
        return default
    if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"rank must be a non-negative integer; got {rank!r}")
    if rank < 0:
        raise ValueError(f"rank must be >= 0; got {rank}")
    return int(rank)


def check_update_args(mean, ups, W, H, R, e, rank, method):
    """The arguments of ``lofi_update`` checked and as float64 arrays: (mean, ups, W, H, R, e, rank)."""
    mean = _host.as_f64(mean, "mean", (None,))
    P = mean.shape[0]
    ups = _host.check_positive(_host.as_f64(ups, "ups", (P,)), "ups")
    W = _host.as_f64(W, "W", (P, None))
    H = _host.as_f64(H, "H", (None, P))
    C = H.shape[0]
    R = _host.check_finite(_host.as_f64(R, "R", (C, C)), "R")
    e = _host.check_finite(_host.as_f64(e, "e", (C,)), "e")
    rank = _rank(rank, W.shape[1])
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    return mean, ups, W, H, R, e, rank


def lofi_update(mean, ups, W, H, R, e, rank=None, singular=False, method="auto", return_route=False):
    """LO-FI update step (Chang et al. 2023, eqs 26-43) in two passes over the data (three
    when W~ is ill-conditioned).

    W~ = [W, H^T A^T] (A^T A = R^{-1}); mu' = mu + (diag(ups) + W~ W~^T)^{-1} H^T R^{-1} e
    (eq. 38); thin SVD W~ = U diag(s) V^T, W' = U[:, :L] diag(s[:L]) (eqs 39-40, zero
    columns when fewer than L components), ups' = ups + rowsumsq(U[:, L:] diag(s[L:]))
    (eqs 41-42).

    mean, ups: (P,); W: (P, L0); H: (C, P); R: (C, C); e: (C,); rank: L >= 0
    (default L0); singular: R only positive semi-definite (pseudo-inverse).
    method: "auto" (default: the cheapest route whose error bound is at round-off level,
    see the module docstring), or force "gram", "cholqr2" or "tsqr" (tests, timings;
    "gram" then skips the accuracy guard).
    Returns (mean (P,), ups (P,), W (P, L)), new arrays, plus the route taken when
    ``return_route``. W is defined up to a right orthogonal factor: compare W W^T, not W.
    """
    mean, ups, W, H, R, e, rank = check_update_args(mean, ups, W, H, R, e, rank, method)
    P, L = W.shape
    C = H.shape[0]
    nch = _nchunks(P)
    if L + C == 0:
        return (mean.copy(), ups.copy(), np.zeros((P, rank))) + (("tsqr",) if return_route else ())
    with _host.blas_threads(1):
        A, w, ok = setup(R, e, bool(singular))
        if not ok:
            if not singular:
                raise r_not_positive_definite(R)
            raise NotPositiveDefiniteError("R is not positive semi-definite")
        K = L + A.shape[0]
        parts = np.zeros((nch, L + C, 2 * (L + C)))
        _host.run_chunks(gram_range, nch, ups, W, H, parts)
        status, route, _, T, y0, N, b, idx, Rf, Mt = plan(parts, A, w, L, METHODS.index(method))
        if status != OK:
            _host.raise_nonfinite("LO-FI update", ups=ups, W=W, H=H)
        if route == ROUTE_CHOLQR2:
            nz = Rf.shape[0]
            partsG = np.empty((nch, nz, nz))
            partsN = np.empty((nch, K, K + 1))
            _host.run_chunks(cholqr2_range, nch, ups, W, H, np.vstack([A, w]), Mt, partsG, partsN)
            Rf2, N, b, ok = finish_cholqr2(partsG, partsN, Rf)
            Rf = Rf2 if ok else Rf
            if not ok:
                route = ROUTE_TSQR
        if route == ROUTE_TSQR:
            partsR = np.empty((nch, K, K))
            partsN = np.empty((nch, K, K + 1))
            _host.run_chunks(tsqr_range, nch, ups, W, H, A, w, partsR, partsN)
            Rf, N, b = finish_tsqr(partsR, partsN)
            idx = np.arange(K)
        if not (np.all(np.isfinite(Rf)) and np.all(np.isfinite(N)) and np.all(np.isfinite(b))):
            _host.raise_nonfinite("LO-FI update", ups=ups, W=W, H=H)
        ok, EW, ERt = coefficients(Rf, N, b, idx, T, y0, rank)
        if not ok:
            raise NotPositiveDefiniteError("I + W~^T diag(1/ups) W~ is not positive definite")
        out_mean = np.empty(P)
        out_ups = np.empty(P)
        out_W = np.empty((P, rank))
        Et = np.ascontiguousarray(np.vstack([EW.T, ERt]))
        nbad = sum(_host.run_chunks(output_range, nch, mean, ups, W, H, Et, out_mean, out_ups, out_W))
    if nbad:
        _host.raise_nonfinite("LO-FI update", mean=mean, ups=ups, W=W, H=H)
    if return_route:
        return out_mean, out_ups, out_W, ("gram", "cholqr2", "tsqr")[route]
    return out_mean, out_ups, out_W
