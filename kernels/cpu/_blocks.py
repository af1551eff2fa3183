"""Numba building blocks shared by the CPU kernels.

The parameter axis (length P) is walked in blocks of ``SB`` entries; a block of a
(P, K) factor is copied, transposed, into a (K, SB) buffer so that every inner
loop runs over contiguous memory and vectorises. Reductions over P keep ``NL``
interleaved partial sums (fastmath is off, so LLVM may not reorder a single
sum); the summation order is fixed, so results do not depend on the machine's
thread count.
"""

import numba
import numpy as np

SB = 256  # parameters per block: a (K, SB) buffer stays in L1/L2 for K <= 64
NL = 8  # interleaved partial sums in reductions over P


@numba.njit(cache=True)
def gram_block(B, wb, n, acc, t):
    """acc[a, b, :] += lanes of sum_j wb[j] B[a, j] B[b, j] for b <= a (j < n).

    B (K, SB) block buffer, wb (SB,) weights, acc (K, K, NL) lane sums, t (SB,) scratch.
    """
    K = B.shape[0]
    nv = n - n % NL
    for a in range(K):
        for j in range(n):
            t[j] = wb[j] * B[a, j]
        for b in range(a + 1):
            ac = acc[a, b]
            for j in range(0, nv, NL):
                for l in range(NL):
                    ac[l] += t[j + l] * B[b, j + l]
            for j in range(nv, n):
                ac[0] += t[j] * B[b, j]


@numba.njit(cache=True)
def dot_block(B, y, n, acc):
    """acc[a, :] += lanes of sum_j B[a, j] y[j] (j < n). B (K, SB), y (SB,), acc (K, NL)."""
    K = B.shape[0]
    nv = n - n % NL
    for a in range(K):
        ac = acc[a]
        for j in range(0, nv, NL):
            for l in range(NL):
                ac[l] += B[a, j + l] * y[j + l]
        for j in range(nv, n):
            ac[0] += B[a, j] * y[j]


@numba.njit(cache=True)
def finish_gram(acc, out):
    """out (K, K) = symmetric matrix from the lane sums of gram_block."""
    K = acc.shape[0]
    for a in range(K):
        for b in range(a + 1):
            s = 0.0
            for l in range(NL):
                s += acc[a, b, l]
            out[a, b] = s
            out[b, a] = s


@numba.njit(cache=True)
def finish_dot(acc, out):
    """out (K,) from the lane sums of dot_block."""
    for a in range(acc.shape[0]):
        s = 0.0
        for l in range(NL):
            s += acc[a, l]
        out[a] = s


@numba.njit(cache=True)
def load_cols_block(X, i0, n, B, row0):
    """B[row0 + a, j] = X[i0 + j, a] for a (P, K) row-major X: the transposed block."""
    K = X.shape[1]
    for j in range(n):
        for a in range(K):
            B[row0 + a, j] = X[i0 + j, a]


@numba.njit(cache=True)
def whiten_block(H, A, i0, n, B, row0, z):
    """B[row0 + r, j] = (A h_{i0+j})_r: the whitened columns H^T A^T, transposed, for one block.

    H (C, P), A (k, C). Zero entries of A (a triangular Cholesky inverse) are skipped.
    z (SB,) scratch.
    """
    C = H.shape[0]
    k = A.shape[0]
    for r in range(k):
        for j in range(n):
            z[j] = 0.0
        for c in range(C):
            a = A[r, c]
            if a == 0.0:
                continue
            for j in range(n):
                z[j] += a * H[c, i0 + j]
        for j in range(n):
            B[row0 + r, j] = z[j]


@numba.njit(cache=True)
def project_block(H, w, i0, n, d):
    """d[j] = h_{i0+j}^T w for H (C, P), w (C,)."""
    C = H.shape[0]
    for j in range(n):
        d[j] = 0.0
    for c in range(C):
        wc = w[c]
        for j in range(n):
            d[j] += wc * H[c, i0 + j]


@numba.njit(cache=True)
def weighted_gram_rows(X, w, out):
    """out = X diag(w) X^T for X (K, P) row-major (e.g. a Jacobian H), w (P,); out (K, K)."""
    K, P = X.shape
    acc = np.zeros((K, K, NL))
    t = np.empty(SB)
    wb = np.empty(SB)
    B = np.empty((K, SB))
    for i0 in range(0, P, SB):
        n = min(SB, P - i0)
        for j in range(n):
            wb[j] = w[i0 + j]
        for a in range(K):
            for j in range(n):
                B[a, j] = X[a, i0 + j]
        gram_block(B, wb, n, acc, t)
    finish_gram(acc, out)


@numba.njit(cache=True)
def weighted_gram_cols(X, w, recip, out):
    """out = X^T diag(w) X (or diag(1/w) if ``recip``) for X (P, K) row-major; out (K, K).

    With w = ups and recip=True this is W^T diag(1/ups) W of a DLR factor W (P, L).
    """
    P, K = X.shape
    acc = np.zeros((K, K, NL))
    t = np.empty(SB)
    wb = np.empty(SB)
    B = np.empty((K, SB))
    for i0 in range(0, P, SB):
        n = min(SB, P - i0)
        for j in range(n):
            wb[j] = 1.0 / w[i0 + j] if recip else w[i0 + j]
        load_cols_block(X, i0, n, B, 0)
        gram_block(B, wb, n, acc, t)
    finish_gram(acc, out)
