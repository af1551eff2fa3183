"""Rank-K downdate of an upper Cholesky factor, O(K P^2), and the triangular solve with it: the
definiteness certificate of BOG over the full-covariance moment family
(``refbayes.filters.bong.algorithms.full_bog``, ``refbayes.filters.bong.families.FactorBound``,
docs/bong.md §7). Each step of the certificate solves with the carried factor (``upper_solve_rows``);
every ``families.FLUSH_ROWS`` rows of downdates, ``chol_downdate`` writes the downdated factor.

Given R upper triangular with R^T R = B and X (K, P), ``chol_downdate`` writes the upper factor R'
of a^2 B - X^T X, R'^T R' = a^2 R^T R - X^T X, one row of R after the other. Each row j is scaled
by a and then meets the K vectors in turn, each through one hyperbolic rotation (the rank-one
downdate of Golub and Van Loan, Matrix Computations, sec. 6.5.4, applied to rows of R instead of
columns of L = R^T):

    r = sqrt(R_jj^2 - x_j^2),  c = r / R_jj,  s = x_j / R_jj,
    R_ji <- (R_ji - s x_i) / c,  x_i <- c x_i - s R_ji   (i > j),  R_jj <- r.

a^2 B - X^T X is positive definite exactly when every pivot r^2 stays positive. The function
stops at the first row whose r^2 falls to ``tol`` R_jj^2 or below and returns its index (the
output is then incomplete), else -1. R is read (its upper triangle), X is not written, the whole
of ``out`` is written (zeros below the diagonal). Plain IEEE arithmetic (no fastmath): the
pivots decide a certificate.

Before a factor is carried, the certificate is Gershgorin's bound of the new covariance.
``lowrank_gershgorin`` writes that covariance, s S + diag(d) + sum_k sign_k b_k b_k^T, and
returns its bound min_i (2 S+_ii - sum_j |S+_ij|) in the same pass, each row's sum taken while
the row is in cache: the step then reads the P x P matrix once where writing it and bounding
it would read it twice.

``lowrank_pass`` writes the same array without the bound: the one new P x P array of every
full-covariance step (``refbayes.linalg.lowrank_update``: the EKF's Sigma_p - B^T B, its Joseph
form, BONG's and BOG's updates). Each row is written in one sweep of up to four low-rank terms
(then sweeps of four more), from S's row and the terms' rows, so that S is read once and the
new array written once, where a scaled copy followed by BLAS's in-place gemm reads and writes
the new array twice (docs/bong.md §7). From QUAD_TERMS terms on, each sweep writes four rows,
so that a term's row is read once for four rows of the new array. From COPY_FIRST_P on (S larger
than the caches near a core), COPY_ROWS rows at a time are first written as scale S's rows, two
plain streams, and the sweeps then add the terms to them in place while they are in the L2 cache.
Every element is the same number on every route (the same products, added in the same order).
``update_pass`` and ``update_pass_bound``, the entry points of the filters' steps
(``refbayes.linalg.lowrank_update``, ``families.full_cov_downdate_bound``), run that route's blocks
on the kernel threads (``_host.run_chunks``), each row made by one thread: the same numbers on any
count.

``sym_lower_times`` is the products Sigma U that come before that pass (the gain's M = Sigma_p H^T,
BONG's Sigma_p U): from the lower triangle of a symmetric matrix, each entry read once for all K
columns of U, where one BLAS symv per column reads the triangle K times.
"""

import numba
import numpy as np

from .. import _host
from ._blocks import REDUCE

__all__ = ["chol_downdate", "upper_solve_rows", "lowrank_gershgorin", "lowrank_pass", "update_pass", "update_pass_bound", "sym_lower_times",
           "QUAD_TERMS", "SYM_ROWS", "COPY_FIRST_P", "COPY_ROWS"]

# from this many low-rank terms on, the update passes write four rows at a time (each term's row
# read once per four rows); with one or two terms the four rows' eight streams cost more than the
# term rows' reads they save (docs/bong.md §7)
QUAD_TERMS = 3

# from this order on (S over 10 MB, more than the caches keep close to a core), the update passes take
# COPY_ROWS rows at a time: first their scaled copy, one contiguous stream in and one out, then the
# terms' sweeps over the new rows in place while they are in the L2 cache; below it, the sweeps read
# S's rows themselves. The same numbers either way (scale S_ij is rounded first in both). At P = 1,410
# and four terms: 0.74-0.80 against 0.98-1.01 ms; at P = 1,024 the direct sweeps are faster (docs/bong.md §7)
COPY_FIRST_P = 1152
COPY_ROWS = 8

# rows of the triangle read together by sym_lower_times: each element of U's and of the output's
# columns is then loaded once per eight rows (at P = 1,410 one row at a time took 0.45 ms for
# K = 3, four rows 0.26 ms, eight 0.22 ms, BLAS symv three times 0.31 ms)
SYM_ROWS = 8


@numba.njit(nogil=True, cache=True, error_model="numpy")
def chol_downdate(R, a, X, out, tol):
    """out = the upper Cholesky factor of a^2 R^T R - X^T X (R, out (P, P); X (K, P); a > 0); returns -1,
    or the first row whose pivot r^2 <= tol R_jj^2 (then ``out`` is incomplete). See the module."""
    P = R.shape[0]
    K = X.shape[0]
    x = X.copy()  # the vectors as the rotations leave them
    for j in range(P):
        n = P - j
        row = out[j, j:]
        src = R[j, j:]
        low = out[j, :j]
        for i in range(j):
            low[i] = 0.0
        for i in range(n):
            row[i] = a * src[i]
        for k in range(K):
            xk = x[k, j:]
            rjj = row[0]
            xj = xk[0]
            r2 = (rjj - xj) * (rjj + xj)
            if not r2 > tol * rjj * rjj:  # also catches NaN
                return j
            r = np.sqrt(r2)
            c = r / rjj
            s = xj / rjj
            row[0] = r
            for i in range(1, n):
                v = (row[i] - s * xk[i]) / c
                row[i] = v
                xk[i] = c * xk[i] - s * v
    return -1


@numba.njit(nogil=True, cache=True, error_model="numpy")
def upper_solve_rows(R, X, out):
    """out[k] = R^{-T} X[k] for R (P, P) upper triangular (its strict lower triangle is not read), X and
    out (K, P) (out may be X): the forward substitution R^T z = x, row by row of R, each row read once
    for the K vectors (w <- w - z_j R[j, j+1:] after z_j = w_j / R_jj). O(K P^2), one read of the
    upper triangle: the carried bound's step in ``refbayes.filters.bong.families.FactorBound``."""
    P = R.shape[0]
    K = X.shape[0]
    if out is not X:
        out[:, :] = X
    for j in range(P):
        rj = R[j, j:]
        d = rj[0]
        for k in range(K):
            w = out[k, j:]
            z = w[0] / d
            w[0] = z
            for i in range(1, P - j):
                w[i] -= z * rj[i]
    return out


@numba.njit(cache=True, error_model="numpy")
def lowrank_gershgorin(S, scale, d, Blt, Br, out):
    """out = scale S + diag(d) + Blt Br (as ``lowrank_pass``), and its Gershgorin lower bound
    min_i (2 out_ii - sum_j |out_ij|), each row's sum taken right after the row is written.

    S, out (P, P) (out must not overlap S); d (P,); Blt (P, K), Br (K, P). Symmetric bit for bit
    where ``lowrank_pass``'s output is. A NaN anywhere gives a NaN or -inf bound, never a positive one.
    """
    P = S.shape[0]
    K = Br.shape[0]
    low = np.inf
    if P >= COPY_FIRST_P:  # as lowrank_pass: COPY_ROWS rows at a time, copied, then swept in place
        return copy_first_blocks(S, scale, d, Blt, Br, out, True, 0, copy_blocks(P))
    i = 0
    if K >= QUAD_TERMS:  # as lowrank_pass: four rows at a time, then one
        while i + 4 <= P:
            _lowrank_quad(out, S, i, scale, Blt, Br, K, P)
            for m in range(i, i + 4):
                low = _lower(low, _bound_row(out[m], m, d[m], P))
            i += 4
    while i < P:
        row = out[i]
        _lowrank_row(row, S[i], scale, Blt[i], Br, K, P)
        low = _lower(low, _bound_row(row, i, d[i], P))
        i += 1
    return low


@numba.njit(cache=True, inline="always", error_model="numpy")
def _lower(low, b):
    """min(low, b) that keeps a NaN: once taken it stays (no b < NaN), so a NaN row bound is never lost."""
    return b if (b < low or b != b) else low


@numba.njit(cache=True, inline="always", error_model="numpy")
def _bound_row(row, i, di, P):
    """Adds di to row[i] and returns 2 row[i] - sum_j |row[j]|, the sum in four running sums, so
    that the loop vectorises without reordering."""
    row[i] += di
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    n4 = P - P % 4
    for j in range(0, n4, 4):
        s0 += abs(row[j])
        s1 += abs(row[j + 1])
        s2 += abs(row[j + 2])
        s3 += abs(row[j + 3])
    for j in range(n4, P):
        s0 += abs(row[j])
    return 2.0 * row[i] - ((s0 + s1) + (s2 + s3))


@numba.njit(cache=True, inline="always", error_model="numpy")
def _lowrank_row(row, src, scale, a, Br, K, P):
    """row = scale src + sum_k a[k] Br[k] (row, src (P,); a (K,); Br (K, P)): each element adds the K
    products in the order k = 0, 1, ... after scale src[j], in sweeps of at most four terms (the
    first one fused with the scaling), so that the loop reads each term's row once per sweep and
    vectorises."""
    k = min(K, 4)
    if k == 4:
        a0, a1, a2, a3 = a[0], a[1], a[2], a[3]
        b0, b1, b2, b3 = Br[0], Br[1], Br[2], Br[3]
        for j in range(P):
            row[j] = (((scale * src[j] + a0 * b0[j]) + a1 * b1[j]) + a2 * b2[j]) + a3 * b3[j]
    elif k == 3:
        a0, a1, a2 = a[0], a[1], a[2]
        b0, b1, b2 = Br[0], Br[1], Br[2]
        for j in range(P):
            row[j] = ((scale * src[j] + a0 * b0[j]) + a1 * b1[j]) + a2 * b2[j]
    elif k == 2:
        a0, a1 = a[0], a[1]
        b0, b1 = Br[0], Br[1]
        for j in range(P):
            row[j] = (scale * src[j] + a0 * b0[j]) + a1 * b1[j]
    elif k == 1:
        a0 = a[0]
        b0 = Br[0]
        for j in range(P):
            row[j] = scale * src[j] + a0 * b0[j]
    else:
        for j in range(P):
            row[j] = scale * src[j]
    while k < K:
        if K - k >= 4:
            a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
            b0, b1, b2, b3 = Br[k], Br[k + 1], Br[k + 2], Br[k + 3]
            for j in range(P):
                row[j] = (((row[j] + a0 * b0[j]) + a1 * b1[j]) + a2 * b2[j]) + a3 * b3[j]
            k += 4
        else:
            a0 = a[k]
            b0 = Br[k]
            for j in range(P):
                row[j] = row[j] + a0 * b0[j]
            k += 1


@numba.njit(cache=True, error_model="numpy")
def lowrank_pass(S, scale, d, Blt, Br, out):
    """out = scale S + diag(d) + Blt Br, one read of S and one write of out, O(K P^2).

    S, out (P, P) (out must not overlap S); d (P,); Blt (P, K), Br (K, P). Element (i, j) adds the K
    products Blt[i, k] Br[k, j] in the order k = 0, 1, ... to scale S_ij (and d_i last, on the
    diagonal): where Blt = (signs B)^T and Br = B (signs +-1), the products of (i, j) and (j, i) are
    the same numbers, so a symmetric S gives an out symmetric bit for bit. Plain IEEE arithmetic.
    With K >= QUAD_TERMS, rows are written four at a time (:func:`_lowrank_quad`), the rest one at a
    time; from P = COPY_FIRST_P on, COPY_ROWS rows at a time are copied scaled and then swept in place
    (:func:`_copy_then_sweep`): the same numbers on every route. Returns out.
    """
    P = S.shape[0]
    K = Br.shape[0]
    if P >= COPY_FIRST_P:
        copy_first_blocks(S, scale, d, Blt, Br, out, False, 0, copy_blocks(P))
        return out
    i = 0
    if K >= QUAD_TERMS:
        while i + 4 <= P:
            _lowrank_quad(out, S, i, scale, Blt, Br, K, P)
            for m in range(i, i + 4):  # the diagonal while the rows are in cache, as lowrank_gershgorin
                out[m, m] += d[m]
            i += 4
    while i < P:
        _lowrank_row(out[i], S[i], scale, Blt[i], Br, K, P)
        out[i, i] += d[i]
        i += 1
    return out


@numba.njit(cache=True, inline="always", error_model="numpy")
def _sweep_quad(r0, r1, r2, r3, s0, s1, s2, s3, scale, A, i, Br, k, n, P):
    """r_m[j] = scale s_m[j] + A[i + m, k] Br[k, j] + ... + A[i + m, k + n - 1] Br[k + n - 1, j] for the
    four rows m = 0..3 (n <= 4 terms, added in order): each term's row is read once for four output
    rows. The r_m may be the s_m (with scale 1.0, which changes no number)."""
    if n == 4:
        b0, b1, b2, b3 = Br[k], Br[k + 1], Br[k + 2], Br[k + 3]
        a00, a01, a02, a03 = A[i, k], A[i, k + 1], A[i, k + 2], A[i, k + 3]
        a10, a11, a12, a13 = A[i + 1, k], A[i + 1, k + 1], A[i + 1, k + 2], A[i + 1, k + 3]
        a20, a21, a22, a23 = A[i + 2, k], A[i + 2, k + 1], A[i + 2, k + 2], A[i + 2, k + 3]
        a30, a31, a32, a33 = A[i + 3, k], A[i + 3, k + 1], A[i + 3, k + 2], A[i + 3, k + 3]
        for j in range(P):
            x0, x1, x2, x3 = b0[j], b1[j], b2[j], b3[j]
            r0[j] = (((scale * s0[j] + a00 * x0) + a01 * x1) + a02 * x2) + a03 * x3
            r1[j] = (((scale * s1[j] + a10 * x0) + a11 * x1) + a12 * x2) + a13 * x3
            r2[j] = (((scale * s2[j] + a20 * x0) + a21 * x1) + a22 * x2) + a23 * x3
            r3[j] = (((scale * s3[j] + a30 * x0) + a31 * x1) + a32 * x2) + a33 * x3
    elif n == 3:
        b0, b1, b2 = Br[k], Br[k + 1], Br[k + 2]
        a00, a01, a02 = A[i, k], A[i, k + 1], A[i, k + 2]
        a10, a11, a12 = A[i + 1, k], A[i + 1, k + 1], A[i + 1, k + 2]
        a20, a21, a22 = A[i + 2, k], A[i + 2, k + 1], A[i + 2, k + 2]
        a30, a31, a32 = A[i + 3, k], A[i + 3, k + 1], A[i + 3, k + 2]
        for j in range(P):
            x0, x1, x2 = b0[j], b1[j], b2[j]
            r0[j] = ((scale * s0[j] + a00 * x0) + a01 * x1) + a02 * x2
            r1[j] = ((scale * s1[j] + a10 * x0) + a11 * x1) + a12 * x2
            r2[j] = ((scale * s2[j] + a20 * x0) + a21 * x1) + a22 * x2
            r3[j] = ((scale * s3[j] + a30 * x0) + a31 * x1) + a32 * x2
    elif n == 2:
        b0, b1 = Br[k], Br[k + 1]
        a00, a01, a10, a11 = A[i, k], A[i, k + 1], A[i + 1, k], A[i + 1, k + 1]
        a20, a21, a30, a31 = A[i + 2, k], A[i + 2, k + 1], A[i + 3, k], A[i + 3, k + 1]
        for j in range(P):
            x0, x1 = b0[j], b1[j]
            r0[j] = (scale * s0[j] + a00 * x0) + a01 * x1
            r1[j] = (scale * s1[j] + a10 * x0) + a11 * x1
            r2[j] = (scale * s2[j] + a20 * x0) + a21 * x1
            r3[j] = (scale * s3[j] + a30 * x0) + a31 * x1
    elif n == 1:
        b0 = Br[k]
        a00, a10, a20, a30 = A[i, k], A[i + 1, k], A[i + 2, k], A[i + 3, k]
        for j in range(P):
            x0 = b0[j]
            r0[j] = scale * s0[j] + a00 * x0
            r1[j] = scale * s1[j] + a10 * x0
            r2[j] = scale * s2[j] + a20 * x0
            r3[j] = scale * s3[j] + a30 * x0
    else:
        for j in range(P):
            r0[j] = scale * s0[j]
            r1[j] = scale * s1[j]
            r2[j] = scale * s2[j]
            r3[j] = scale * s3[j]


@numba.njit(cache=True, inline="always", error_model="numpy")
def _lowrank_quad(out, S, i, scale, Blt, Br, K, P):
    """Rows i..i+3 of out = scale S + Blt Br (no diagonal term): the numbers of :func:`_lowrank_row`
    for each row (terms in the order k = 0, 1, ..., after scale S_ij), in sweeps of up to four
    terms over four rows at once, so that each term's row is read once per four rows."""
    r0, r1, r2, r3 = out[i], out[i + 1], out[i + 2], out[i + 3]
    n = min(K, 4)
    _sweep_quad(r0, r1, r2, r3, S[i], S[i + 1], S[i + 2], S[i + 3], scale, Blt, i, Br, 0, n, P)
    k = n
    while k < K:
        n = min(K - k, 4)
        _sweep_quad(r0, r1, r2, r3, r0, r1, r2, r3, 1.0, Blt, i, Br, k, n, P)
        k += n


@numba.njit(cache=True, error_model="numpy")
def copy_blocks(P):
    """The number of blocks of COPY_ROWS rows of the copy-first route (the last one may be shorter)."""
    return (P + COPY_ROWS - 1) // COPY_ROWS


@numba.njit(nogil=True, cache=True, error_model="numpy")
def copy_first_blocks(S, scale, d, Blt, Br, out, bound, b0, b1):
    """The copy-first route of ``lowrank_pass`` over the blocks b0 <= b < b1 of COPY_ROWS rows (each
    block writes its own rows: the kernel threads take contiguous runs of blocks, ``update_pass``).
    bound: also take ``lowrank_gershgorin``'s bound, returned as the smallest row bound over the blocks'
    rows (NaN where a row's is NaN); without it, returns inf."""
    P = S.shape[0]
    K = Br.shape[0]
    low = np.inf
    for b in range(b0, b1):
        i = b * COPY_ROWS
        nb = min(COPY_ROWS, P - i)
        _copy_then_sweep(out, S, i, nb, scale, Blt, Br, K, P)
        for m in range(i, i + nb):
            if bound:  # (_bound_row adds d[m] to the diagonal entry too)
                low = _lower(low, _bound_row(out[m], m, d[m], P))
            else:
                out[m, m] += d[m]
    return low


def update_pass(S, scale, d, Blt, Br, out):
    """``lowrank_pass`` (the same arguments, the same numbers), its copy-first route (P >= COPY_FIRST_P)
    on the kernel threads (``_host.run_chunks`` over blocks of COPY_ROWS rows: each row is made by one
    thread, so the result does not depend on their number). Returns out."""
    P = S.shape[0]
    if P < COPY_FIRST_P:
        return lowrank_pass(S, scale, d, Blt, Br, out)
    _host.run_chunks(copy_first_blocks, copy_blocks(P), S, scale, d, Blt, Br, out, False)
    return out


def update_pass_bound(S, scale, d, Blt, Br, out):
    """``lowrank_gershgorin`` (the same arguments and numbers, the bound returned as a float), on the
    kernel threads as :func:`update_pass`; the bound is the smallest of the threads' (NaN if any is)."""
    P = S.shape[0]
    if P < COPY_FIRST_P:
        return float(lowrank_gershgorin(S, scale, d, Blt, Br, out))
    lows = _host.run_chunks(copy_first_blocks, copy_blocks(P), S, scale, d, Blt, Br, out, True)
    return float(np.min(np.array(lows, dtype=np.float64)))


@numba.njit(cache=True, inline="always", error_model="numpy")
def _copy_then_sweep(out, S, i, nb, scale, Blt, Br, K, P):
    """Rows i..i+nb-1 of out = scale S + Blt Br (no diagonal term), the route from COPY_FIRST_P on: the
    rows' scaled copy, row after row, then the terms added in place, in sweeps of up to four terms
    over four rows at once (:func:`_sweep_quad` with scale 1.0) and one row at a time for the last
    nb % 4 rows (:func:`_lowrank_row`). Each element is the number of the direct sweeps: scale S_ij
    rounded, then the K products added in the order k = 0, 1, ..."""
    for m in range(i, i + nb):
        src = S[m]
        dst = out[m]
        for j in range(P):
            dst[j] = scale * src[j]
    m = i
    while m + 4 <= i + nb:
        r0, r1, r2, r3 = out[m], out[m + 1], out[m + 2], out[m + 3]
        k = 0
        while k < K:
            n = min(K - k, 4)
            _sweep_quad(r0, r1, r2, r3, r0, r1, r2, r3, 1.0, Blt, m, Br, k, n, P)
            k += n
        m += 4
    while m < i + nb:
        row = out[m]
        _lowrank_row(row, row, 1.0, Blt[m], Br, K, P)
        m += 1


@numba.njit(cache=True, fastmath=REDUCE, error_model="numpy")
def sym_lower_times(S, Ut, Ot):
    """Ot (K, P) = (S U)^T for a symmetric S (P, P), reading only its lower triangle, each entry once.

    Ut (K, P) = U^T; Ot is written whole and returned. Entries above the diagonal are not read (S
    must be exactly symmetric, as every covariance the filters build is). Rows are taken SYM_ROWS at
    a time: for a block of rows i <= m < i + SYM_ROWS, the part left of the block, S[m, :i], gives
    (S U)[m] its dot products with U[:i] and, being S[:i, m] too, adds U[m] S[m, j] to (S U)[j] for
    j < i, in one loop over j per column of U while the rows are in cache; the block's own
    SYM_ROWS x SYM_ROWS square is added from its lower triangle. The rows left over at the end are
    taken one at a time the same way. The dot products are summed with reassociation (fastmath
    REDUCE): the numbers are those of S @ U to round-off, not BLAS's bit for bit.
    """
    K, P = Ut.shape
    Ot[:] = 0.0
    i = 0
    while i + SYM_ROWS <= P:
        r0, r1, r2, r3 = S[i, :i], S[i + 1, :i], S[i + 2, :i], S[i + 3, :i]
        r4, r5, r6, r7 = S[i + 4, :i], S[i + 5, :i], S[i + 6, :i], S[i + 7, :i]
        for k in range(K):
            u = Ut[k, :i]
            o = Ot[k, :i]
            w = Ut[k, i:i + SYM_ROWS]
            w0, w1, w2, w3, w4, w5, w6, w7 = w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
            for j in range(i):
                uj = u[j]
                a0, a1, a2, a3, a4, a5, a6, a7 = r0[j], r1[j], r2[j], r3[j], r4[j], r5[j], r6[j], r7[j]
                s0 += a0 * uj
                s1 += a1 * uj
                s2 += a2 * uj
                s3 += a3 * uj
                s4 += a4 * uj
                s5 += a5 * uj
                s6 += a6 * uj
                s7 += a7 * uj
                o[j] += ((a0 * w0 + a1 * w1) + (a2 * w2 + a3 * w3)) + ((a4 * w4 + a5 * w5) + (a6 * w6 + a7 * w7))
            ob = Ot[k, i:i + SYM_ROWS]
            ob[0] += s0
            ob[1] += s1
            ob[2] += s2
            ob[3] += s3
            ob[4] += s4
            ob[5] += s5
            ob[6] += s6
            ob[7] += s7
            for m in range(SYM_ROWS):  # the block's square, from its lower triangle
                acc = 0.0
                for n in range(SYM_ROWS):
                    acc += (S[i + m, i + n] if n <= m else S[i + n, i + m]) * w[n]
                ob[m] += acc
        i += SYM_ROWS
    while i < P:
        row = S[i, :i]
        for k in range(K):
            u = Ut[k, :i]
            o = Ot[k, :i]
            ui = Ut[k, i]
            s = 0.0
            for j in range(i):
                r = row[j]
                s += r * u[j]
                o[j] += r * ui
            Ot[k, i] += s + S[i, i] * ui
        i += 1
    return Ot
