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
"""

import numba
import numpy as np

__all__ = ["chol_downdate"]


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
