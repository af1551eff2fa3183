"""Rank-K downdate of an upper Cholesky factor, O(K P^2): the definiteness certificate of BOG over the
full-covariance moment family (``refbayes.filters.bong.algorithms.full_bog``, docs/bong.md §7).

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
the new array twice (docs/bong.md §7).
"""

import numba
import numpy as np

__all__ = ["chol_downdate", "lowrank_gershgorin", "lowrank_pass"]


@numba.njit(cache=True)
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


@numba.njit(cache=True)
def lowrank_gershgorin(S, scale, d, Blt, Br, out):
    """out = scale S + diag(d) + Blt Br (as ``lowrank_pass``), and its Gershgorin lower bound
    min_i (2 out_ii - sum_j |out_ij|), each row's sum taken right after the row is written.

    S, out (P, P) (out must not overlap S); d (P,); Blt (P, K), Br (K, P). Symmetric bit for bit
    where ``lowrank_pass``'s output is. A NaN anywhere gives a NaN or -inf bound, never a positive one.
    """
    P = S.shape[0]
    K = Br.shape[0]
    low = np.inf
    for i in range(P):
        row = out[i]
        _lowrank_row(row, S[i], scale, Blt[i], Br, K, P)
        row[i] += d[i]
        s0 = 0.0  # four running sums, so that the loop vectorises without reordering
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
        b = 2.0 * row[i] - ((s0 + s1) + (s2 + s3))
        if b < low or b != b:  # a NaN, once taken, stays (no b < NaN)
            low = b
    return low


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True)
def lowrank_pass(S, scale, d, Blt, Br, out):
    """out = scale S + diag(d) + Blt Br, one read of S and one write of out, O(K P^2).

    S, out (P, P) (out must not overlap S); d (P,); Blt (P, K), Br (K, P). Element (i, j) adds the K
    products Blt[i, k] Br[k, j] in the order k = 0, 1, ... to scale S_ij (and d_i last, on the
    diagonal): where Blt = (signs B)^T and Br = B (signs +-1), the products of (i, j) and (j, i) are
    the same numbers, so a symmetric S gives an out symmetric bit for bit. Plain IEEE arithmetic.
    Returns out.
    """
    P = S.shape[0]
    K = Br.shape[0]
    for i in range(P):
        _lowrank_row(out[i], S[i], scale, Blt[i], Br, K, P)
        out[i, i] += d[i]
    return out
