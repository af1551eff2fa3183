"""Eigenvalues and eigenvectors of a small symmetric matrix, in compiled code without LAPACK.

For the n <= 64 matrices of the LO-FI step (n = L + C), LAPACK's ``dsyevd`` spends most of
its time in the calls of its level-2 BLAS building blocks: on a 20 x 20 matrix it takes
about 40 us, of which 20 us are the eigenvalues alone. ``sym_eig`` does the same two
classical stages with every loop inline:

1. Householder reduction to tridiagonal form, A = Q T Q^T (Golub and Van Loan, Matrix
   Computations, 4th ed., section 8.3.1), with Q accumulated from the reflectors;
2. the implicit QL iteration with Wilkinson's shift on T (ibid. section 8.3.3, run from the
   bottom of the matrix up), whose plane rotations are applied to the rows of Q^T.

Both stages are backward stable: the computed pairs are exact for A + E with |E|_2 a modest
multiple of eps |A|_2, and the eigenvectors are orthonormal to a modest multiple of eps;
LAPACK's ``dsyev`` (the same algorithm) gives the same guarantees. The tests check the
residual, the orthogonality and the eigenvalues against ``numpy.linalg.eigvalsh``.
"""

import math

import numba
import numpy as np

__all__ = ["sym_eig"]

_EPS = np.finfo(np.float64).eps
MAX_SWEEPS_PER_EIGENVALUE = 30
# after this many sweeps on one eigenvalue, a coupling below eps |T| also splits the block: in a
# cluster of (near) zero eigenvalues the couplings stall at rounding level, eps |T|, which is never
# small against neighbours that are themselves at rounding level (the test of LAPACK's dsteqr);
# splitting there is still backward stable (a perturbation of at most eps |T| per split)
STALL_SWEEPS = 10
SAFE_SQ = 1e-290  # f^2 + g^2 above this is computed to full relative accuracy
# on the scaled matrix (largest entry in [1/2, 1)), entries below this are far below eps |A| and are
# dropped: a backward error of at most n * 1e-145, and no square of an entry left to underflow
NEGLIGIBLE = 1e-145


@numba.njit(cache=True, inline="always", error_model="numpy")
def _tridiagonalize(a, d, e, Q):
    """Reduce the symmetric a (n, n) (both triangles; overwritten) to T = Q^T a Q with diagonal
    d (n,) and sub-diagonal e (n,) (e[i] couples d[i] and d[i + 1]; e[n - 1] = 0); writes Q (n, n).

    a must be scaled so that its largest entry is O(1): squares of its entries then cannot
    overflow, and a column whose norm is below NEGLIGIBLE is left as it is (its entries below the
    sub-diagonal dropped) rather than reflected. Step k reflects rows and columns k + 1.. with
    H_k = I - tau v v^T so that column k below its sub-diagonal entry becomes zero; v is kept
    in row k of a (right of the diagonal), which later steps no longer read.
    """
    n = a.shape[0]
    taus = np.zeros(n)
    p = np.empty(n)
    for k in range(n - 2):
        m = n - k - 1
        v = a[k, k + 1:]  # x = a[k + 1:, k] by symmetry; becomes v
        ss = 0.0
        for i in range(m):
            ss += v[i] * v[i]
        x1 = v[0]
        if ss == x1 * x1 or ss <= NEGLIGIBLE * NEGLIGIBLE:  # (numerically) zero below the sub-diagonal
            e[k] = x1
            continue
        alpha = -np.sqrt(ss) if x1 >= 0.0 else np.sqrt(ss)  # H x = alpha e_1, no cancellation in x1 - alpha
        v[0] = x1 - alpha
        tau = 1.0 / (alpha * alpha - alpha * x1)  # 2 / |v|^2, |v|^2 = 2 (alpha^2 - alpha x1)
        e[k] = alpha
        # a22 <- H a22 H = a22 - v w^T - w v^T with p = tau a22 v, w = p - (tau p.v / 2) v;
        # p is summed as columns of the symmetric a22 so that the inner loops run along rows
        pp = p[:m]
        for i in range(m):
            pp[i] = 0.0
        for j in range(m):
            vj = tau * v[j]
            aj = a[k + 1 + j, k + 1:]
            for i in range(m):
                pp[i] += aj[i] * vj
        pv = 0.0
        for i in range(m):
            pv += pp[i] * v[i]
        half = 0.5 * tau * pv
        for i in range(m):
            pp[i] -= half * v[i]
        for i in range(m):
            vi = v[i]
            pi = pp[i]
            ai = a[k + 1 + i, k + 1:]
            for j in range(m):
                ai[j] -= vi * pp[j] + pi * v[j]
        taus[k] = tau
    for i in range(n):
        d[i] = a[i, i]
    if n >= 2:
        e[n - 2] = a[n - 1, n - 2]
    if n >= 1:
        e[n - 1] = 0.0
    # Q = H_0 H_1 ... H_{n-3}, applied to I from the last reflector to the first; H_k touches rows
    # and columns k + 1.. only, and rows k + 1.. of H_{k+1} ... H_{n-3} are zero left of column k + 1
    for i in range(n):
        for j in range(n):
            Q[i, j] = 0.0
        Q[i, i] = 1.0
    w = np.empty(n)
    for k in range(n - 3, -1, -1):
        tau = taus[k]
        if tau == 0.0:
            continue
        m = n - k - 1
        v = a[k, k + 1:]
        ww = w[:m]
        for j in range(m):
            ww[j] = 0.0
        for i in range(m):  # w = tau Q22^T v, as a sum of rows
            vi = tau * v[i]
            qi = Q[k + 1 + i, k + 1:]
            for j in range(m):
                ww[j] += vi * qi[j]
        for i in range(m):  # Q22 <- Q22 - v w^T
            vi = v[i]
            qi = Q[k + 1 + i, k + 1:]
            for j in range(m):
                qi[j] -= vi * ww[j]


@numba.njit(cache=True, inline="always", error_model="numpy")
def _tridiagonal_ql(d, e, Zt):
    """Diagonalise the symmetric tridiagonal (d, e) in place by implicit QL sweeps; the rotations
    are applied to the rows of Zt. Returns False if an eigenvalue needs more than
    MAX_SWEEPS_PER_EIGENVALUE sweeps (d, e, Zt are then partly transformed)."""
    n = d.shape[0]
    nz = Zt.shape[1]
    tnorm = 0.0  # |T|_inf, at least |T|_2
    for i in range(n):
        tnorm = max(tnorm, abs(d[i]) + abs(e[i]) + (abs(e[i - 1]) if i > 0 else 0.0))
    for l in range(n):
        sweeps = 0
        while True:
            # the first negligible coupling at or below l splits off the block d[l..m]: small
            # against its neighbours on the diagonal, or against the whole (scaled) matrix; after
            # STALL_SWEEPS sweeps, also any coupling below eps |T|
            floor = NEGLIGIBLE if sweeps < STALL_SWEEPS else max(NEGLIGIBLE, _EPS * tnorm)
            m = l
            while m < n - 1:
                if abs(e[m]) <= _EPS * (abs(d[m]) + abs(d[m + 1])) + floor:
                    break
                m += 1
            if m == l:
                break
            sweeps += 1
            if sweeps > MAX_SWEEPS_PER_EIGENVALUE:
                return False
            # Wilkinson shift: the eigenvalue of the leading 2 x 2 block nearer d[l]
            g = (d[l + 1] - d[l]) / (2.0 * e[l])
            r = math.hypot(g, 1.0)
            g = d[m] - d[l] + e[l] / (g + (r if g >= 0.0 else -r))
            s = 1.0
            c = 1.0
            p = 0.0
            underflow = False
            for i in range(m - 1, l - 1, -1):
                f = s * e[i]
                b = c * e[i]
                # f and g are of the order of |T| <= n on the scaled matrix, so f^2 + g^2 cannot
                # overflow; where it could underflow (below SAFE_SQ) math.hypot takes over
                rr = f * f + g * g
                r = np.sqrt(rr) if rr >= SAFE_SQ else math.hypot(f, g)
                e[i + 1] = r
                if r == 0.0:  # the bulge vanished: the block splits at i + 1
                    d[i + 1] -= p
                    e[m] = 0.0
                    underflow = True
                    break
                rinv = 1.0 / r
                s = f * rinv
                c = g * rinv
                g = d[i + 1] - p
                r = (d[i] - g) * s + 2.0 * c * b
                p = s * r
                d[i + 1] = g + p
                g = c * r - b
                zi = Zt[i]
                zj = Zt[i + 1]
                for k in range(nz):
                    t = zj[k]
                    zj[k] = s * zi[k] + c * t
                    zi[k] = c * zi[k] - s * t
            if underflow:
                continue
            d[l] -= p
            e[l] = g
            e[m] = 0.0
    return True


@numba.njit(cache=True, inline="always", error_model="numpy")
def _ascending_order(d):
    """Indices that sort d (n,) ascending, by insertion sort (stable; NaN last): n is at most L + C here,
    and this compiles in a fraction of the time of numba's ``np.argsort`` (a quicksort, about 1 s)."""
    n = d.shape[0]
    order = np.empty(n, np.int64)
    for i in range(n):
        j = i
        while j > 0 and (d[order[j - 1]] > d[i] or (d[order[j - 1]] != d[order[j - 1]] and d[i] == d[i])):
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
    return order


@numba.njit(cache=True, error_model="numpy")
def sym_eig(A):
    """Eigen-decomposition of the symmetric A (n, n) (only its lower triangle is read).

    Returns (w (n,), V (n, n), ok): eigenvalues in ascending order and orthonormal eigenvectors
    in the columns of V, as ``numpy.linalg.eigh`` gives them (up to the sign of each column);
    ok is False if the QL iteration did not converge (w and V are then meaningless).
    """
    n = A.shape[0]
    amax = 0.0
    for i in range(n):
        for j in range(i + 1):
            amax = max(amax, abs(A[i, j]))
    # scale by a power of two so that the largest entry lies in [1/2, 1): two factors, each of them
    # representable for any amax (subnormal or near overflow), and exact wherever the result is normal
    ex = 0 if amax == 0.0 or not np.isfinite(amax) else math.frexp(amax)[1]
    s1 = math.ldexp(1.0, -(ex // 2))
    s2 = math.ldexp(1.0, ex // 2 - ex)
    a = np.empty((n, n))
    for i in range(n):
        for j in range(i + 1):
            a[i, j] = A[i, j] * s1 * s2
            a[j, i] = a[i, j]
    d = np.empty(n)
    e = np.empty(n)
    Q = np.empty((n, n))
    _tridiagonalize(a, d, e, Q)
    Zt = np.ascontiguousarray(Q.T)
    ok = _tridiagonal_ql(d, e, Zt)
    order = _ascending_order(d)
    w = np.empty(n)
    V = np.empty((n, n))
    for j in range(n):
        w[j] = d[order[j]] / s1 / s2
        for i in range(n):
            V[i, j] = Zt[order[j], i]
    return w, V, ok
