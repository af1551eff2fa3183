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
"""

import numba
import numpy as np

__all__ = ["chol_downdate", "lowrank_gershgorin"]


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
    """out = scale S + diag(d) + Blt Br, and its Gershgorin lower bound min_i (2 out_ii - sum_j |out_ij|).

    S, out (P, P) (out must not overlap S); d (P,); Blt (P, K), Br (K, P). Element (i, j) adds the K
    products Blt[i, k] Br[k, j] in the order k = 0, 1, ... after scale S_ij (+ d_i on the diagonal),
    the order of ``refbayes.linalg.lowrank_update``: where Blt = (signs B)^T and Br = B (signs +-1), a
    symmetric S gives an out symmetric bit for bit. Plain IEEE arithmetic. A NaN anywhere gives a NaN
    or -inf bound, never a positive one.
    """
    P = S.shape[0]
    K = Br.shape[0]
    low = np.inf
    for i in range(P):
        row = out[i]
        src = S[i]
        for j in range(P):
            row[j] = scale * src[j]
        row[i] += d[i]
        for k in range(K):
            a = Blt[i, k]
            bk = Br[k]
            for j in range(P):
                row[j] += a * bk[j]
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
