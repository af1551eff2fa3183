"""Numba building blocks shared by the CPU kernels.

The parameter axis (length P) is walked in blocks of ``SB`` entries; a block of a
(P, K) factor is copied, transposed, into a (K, SB) buffer so that every inner
loop runs over contiguous memory and vectorises. The older reductions over P keep
``NL`` interleaved partial sums in memory; the faster ones (``row_gram``, and
``gram_tiles`` in lofi.py) keep register tiles and are compiled with fastmath
``REDUCE`` = {"reassoc", "contract"} only, so that LLVM may vectorise the sums (see
below). Either way the summation order is fixed by the code, so results do not depend
on the machine's thread count.

Loops index arrays from 0 (slices for offsets): Numba adds a wraparound test to an
index it cannot prove non-negative, and LLVM then turns vector loads into gathers.
"""

import numba
import numpy as np

SB = 256  # parameters per block: a (K, SB) buffer stays in L1/L2 for K <= 64
NL = 8  # interleaved partial sums in reductions over P


@numba.njit(cache=True, error_model="numpy")
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


@numba.njit(cache=True, error_model="numpy")
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


@numba.njit(cache=True, error_model="numpy")
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


@numba.njit(cache=True, error_model="numpy")
def finish_dot(acc, out):
    """out (K,) from the lane sums of dot_block."""
    for a in range(acc.shape[0]):
        s = 0.0
        for l in range(NL):
            s += acc[a, l]
        out[a] = s


@numba.njit(cache=True, error_model="numpy")
def load_cols_block(X, i0, n, B, row0):
    """B[row0 + a, j] = X[i0 + j, a] for a (P, K) row-major X: the transposed block."""
    K = X.shape[1]
    for j in range(n):
        for a in range(K):
            B[row0 + a, j] = X[i0 + j, a]


@numba.njit(cache=True, error_model="numpy")
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
            hc = H[c, i0:i0 + n]
            for j in range(n):
                z[j] += a * hc[j]
        for j in range(n):
            B[row0 + r, j] = z[j]


@numba.njit(cache=True, error_model="numpy")
def project_block(H, w, i0, n, d):
    """d[j] = h_{i0+j}^T w for H (C, P), w (C,)."""
    C = H.shape[0]
    for j in range(n):
        d[j] = 0.0
    for c in range(C):
        wc = w[c]
        hc = H[c, i0:i0 + n]
        for j in range(n):
            d[j] += wc * hc[j]


@numba.njit(cache=True, error_model="numpy")
def weighted_gram_rows(X, w, out):
    """out = X diag(w) X^T for X (K, P) row-major (e.g. a Jacobian H), w (P,); out (K, K)."""
    K, P = X.shape
    acc = np.zeros((K, K, NL))
    t = np.empty(SB)
    wb = np.empty(SB)
    B = np.empty((K, SB))
    for i0 in range(0, P, SB):
        n = min(SB, P - i0)
        wv = w[i0:i0 + n]
        for j in range(n):
            wb[j] = wv[j]
        for a in range(K):
            xa = X[a, i0:i0 + n]
            for j in range(n):
                B[a, j] = xa[j]
        gram_block(B, wb, n, acc, t)
    finish_gram(acc, out)


@numba.njit(cache=True, error_model="numpy")
def weighted_cross_sum(X, Y, w, recip):
    """X^T diag(w) Y (or diag(1/w) if ``recip``) (a, b) for X (P, a), Y (P, b) row-major: block by block
    of SB rows, the block's rows of diag(w) X formed in a small buffer, then one BLAS product with Y's
    rows added to the sum (the Woodbury passes of ``dlr``: at P = 123,610 and a = b = 10, 2.0 ms against
    5.9 ms for a row loop, one thread)."""
    P, ka = X.shape
    acc = np.zeros((ka, Y.shape[1]))
    Xb = np.empty((SB, ka))
    for i0 in range(0, P, SB):
        n = min(SB, P - i0)
        for j in range(n):
            wi = 1.0 / w[i0 + j] if recip else w[i0 + j]
            for a in range(ka):
                Xb[j, a] = X[i0 + j, a] * wi
        acc += np.dot(Xb[:n].T, Y[i0:i0 + n])
    return acc


@numba.njit(cache=True, error_model="numpy")
def weighted_gram_cols(X, w, recip, out):
    """out = X^T diag(w) X (or diag(1/w) if ``recip``) for X (P, K) row-major; out (K, K), symmetric.

    With w = ups and recip=True this is W^T diag(1/ups) W of a DLR factor W (P, L): ``weighted_cross_sum``
    with Y = X, its lower triangle copied to the upper one (at P = 123,610, K = 10: 1.65 against 3.6 ms
    for the lane sums of ``gram_block``, one thread).
    """
    K = X.shape[1]
    acc = weighted_cross_sum(X, X, w, recip)
    for a in range(K):
        for b in range(a + 1):
            out[a, b] = acc[a, b]
            out[b, a] = acc[a, b]


# -- small dense algebra (K x K, K = L + C) inside compiled drivers ----------------------------
# Hand-written so that a failure is a return value, not an exception, and so that small
# products need no contiguous copies; the SVD and symmetric eigenproblems stay in LAPACK.

EPS = np.finfo(np.float64).eps


@numba.njit(cache=True, error_model="numpy")
def chol_lower(S, Lc, shift=0.0):
    """Lc (n, n) = lower Cholesky factor of the symmetric S + shift I (only S's lower triangle is read;
    S is not changed; shift = 1 gives the factor of I + S without forming it).

    Returns False (Lc undefined) when a pivot is not a finite positive number.
    """
    n = S.shape[0]
    for i in range(n):
        for j in range(i + 1):
            s = S[i, j] + shift if i == j else S[i, j]
            for k in range(j):
                s -= Lc[i, k] * Lc[j, k]
            if i == j:
                if not (s > 0.0 and np.isfinite(s)):
                    return False
                Lc[i, i] = np.sqrt(s)
            else:
                Lc[i, j] = s / Lc[j, j]
        for j in range(i + 1, n):
            Lc[i, j] = 0.0
    return True


@numba.njit(cache=True, error_model="numpy")
def lower_inverse(Lc, out):
    """out = Lc^{-1} for a lower triangular Lc with a nonzero diagonal (forward substitution)."""
    n = Lc.shape[0]
    for j in range(n):
        for i in range(n):
            out[i, j] = 0.0
        out[j, j] = 1.0 / Lc[j, j]
        for i in range(j + 1, n):
            s = 0.0
            for k in range(j, i):
                s -= Lc[i, k] * out[k, j]
            out[i, j] = s / Lc[i, i]


@numba.njit(cache=True, error_model="numpy")
def chol_inverse_factor(S):
    """(A, ok): A = chol(S)^{-1} (C, C), so A^T A = S^{-1}, for a symmetric S (C, C); ok is False
    (A undefined) when S is not positive definite. The non-singular branch of ``whitener`` and
    of the compiled diagonal MLP step's S^{-1} factor."""
    C = S.shape[0]
    Lc = np.empty((C, C))
    A = np.empty((C, C))
    if not chol_lower(S, Lc):
        return A, False
    lower_inverse(Lc, A)
    return A, True


@numba.njit(cache=True, error_model="numpy")
def eig_inverse_factor(w, V, cut):
    """A (k, C) = diag(w_i^{-1/2}) V[:, i]^T over the k eigenpairs (w (C,) ascending, V (C, C)
    columns) with w_i > cut: A^T A is the pseudo-inverse over the kept directions (the singular
    branch of ``whitener`` and of the compiled diagonal MLP step)."""
    C = w.shape[0]
    k = 0
    for i in range(C):
        if w[i] > cut:
            k += 1
    A = np.empty((k, C))
    r = 0
    for i in range(C):
        if w[i] > cut:
            s = 1.0 / np.sqrt(w[i])
            for c in range(C):
                A[r, c] = V[c, i] * s
            r += 1
    return A


@numba.njit(cache=True, error_model="numpy")
def chol_solve(Lc, b, x):
    """x = (Lc Lc^T)^{-1} b for the lower Cholesky factor Lc (n, n); b, x (n,)."""
    n = Lc.shape[0]
    for i in range(n):
        s = b[i]
        for k in range(i):
            s -= Lc[i, k] * x[k]
        x[i] = s / Lc[i, i]
    for i in range(n - 1, -1, -1):
        s = x[i]
        for k in range(i + 1, n):
            s -= Lc[k, i] * x[k]
        x[i] = s / Lc[i, i]


@numba.njit(cache=True, error_model="numpy")
def blas_matmul(A, B):
    """A @ B by BLAS, also when a dimension is 0 (then zeros): for products too large for the scalar
    loops of :func:`matmul` (the fused steps' products over the units, BBB's blocks of rows)."""
    if A.shape[0] == 0 or A.shape[1] == 0 or B.shape[1] == 0:
        return np.zeros((A.shape[0], B.shape[1]))
    return np.dot(A, B)


@numba.njit(cache=True, error_model="numpy")
def matmul(A, B, out, ta=False, tb=False):
    """out = op(A) op(B) with op(X) = X or X^T (small matrices; any strides)."""
    m, n = out.shape
    kk = A.shape[0] if ta else A.shape[1]
    for i in range(m):
        for j in range(n):
            s = 0.0
            for k in range(kk):
                a = A[k, i] if ta else A[i, k]
                b = B[j, k] if tb else B[k, j]
                s += a * b
            out[i, j] = s


@numba.njit(cache=True, error_model="numpy")
def whitener(R, singular):
    """A (k, C) with A^T A = R^{-1} (or R^+ when ``singular``), as ``refbayes.kernels._host.whitener``.

    singular=False: A = chol(R)^{-1} (k = C); returns (A, False) if R is not positive definite.
    singular=True: A = diag(w^{-1/2}) V^T over the eigenpairs of R with w > 10 C eps max(w);
    returns (A, False) if R has an eigenvalue below -1e-8 max(w).
    """
    C = R.shape[0]
    Rs = np.empty((C, C))
    for i in range(C):
        for j in range(C):
            Rs[i, j] = 0.5 * (R[i, j] + R[j, i])
    if C == 0:
        return np.zeros((0, 0)), True
    if not singular:
        return chol_inverse_factor(Rs)
    w, V = np.linalg.eigh(Rs)
    if w[C - 1] <= 0.0:
        return np.zeros((0, C)), True
    if w[0] < -1e-8 * w[C - 1]:
        return np.zeros((0, C)), False
    return eig_inverse_factor(w, V, 10.0 * C * EPS * w[C - 1]), True


# -- vectorised reductions over P and elementwise row combinations -------------------------------
# LLVM vectorises a floating-point sum only when it may reorder it. The reduction kernels
# below are compiled with fastmath REDUCE = {"reassoc", "contract"} and nothing else (NaN and
# infinity keep their meaning): the order of each sum is fixed by the compiled code, the
# same on every call and for every thread count (as inside BLAS), not the left-to-right order.
# Elementwise kernels only allow "contract" (fused multiply-add).

REDUCE = {"reassoc", "contract"}
CONTRACT = {"contract"}


@numba.njit(cache=True, error_model="numpy")
def block_buffer(m, n):
    """An uninitialised (m, n) float64 array, C-contiguous, whose first entry sits on a 64-byte boundary:
    the block buffers of ``tile_matmul`` and the passes around it. numba's own np.empty mostly starts
    an array 32 bytes past such a boundary, and with AVX-512 every vector load and store of its rows
    then spans two cache lines: ``tile_matmul`` on (21, 10) x (10, 512) blocks took 0.92-1.10 ms per
    100,000 columns against 0.62 ms from aligned rows (docs/bong.md §6, "The blocks' products"). The
    rows of a block of n = 512 or 256 columns all start on such a boundary."""
    raw = np.empty(m * n + 7)
    off = (-(raw.ctypes.data >> 3)) & 7  # doubles to the next 64-byte boundary
    return raw[off:off + m * n].reshape((m, n))


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def tile_matmul(A, B, j0, n, out, add=False):
    """out[:, :n] = A @ B[:, j0:j0 + n] (``add``: out[:, :n] += that): A (m, k) small, B (k, >= j0 + n) rows
    of a factor (any row stride, each row contiguous), out (m, >= n). The blocks' products of the fused
    passes, (m, k) x (k, a few hundred rows), with m, k <= a few dozen: four rows of out at a time, each
    updated from four rows of B at once (16 multiply-adds per four loads and four stores), where BLAS's
    general product, or one row of B at a time, stores every partial sum (2x slower on these shapes,
    docs/bong.md §6).

    The numbers: out[c, t] is its start (0, or out[c, t] with ``add``) plus, group after group of four
    rows r of B in the order of r, the group's four products A[c, r] B[r, j0 + t] summed first; then the
    k % 4 rows left over, added one after the other. Each row of out is stored once per group, and
    once for all the rows left over (``_tail4``, ``_tail1``); without ``add`` the first group writes
    0 + its sum (the number that zeroing out and adding the sum gives, -0 included), so out is never
    zeroed first. Non-finite entries of A or B give what the dense sums give."""
    m, k = A.shape
    k4 = k - k % 4
    m4 = m - m % 4
    for c in range(0, m4, 4):
        z0 = out[c, :n]
        z1 = out[c + 1, :n]
        z2 = out[c + 2, :n]
        z3 = out[c + 3, :n]
        for r in range(0, k4, 4):
            y0 = B[r, j0:j0 + n]
            y1 = B[r + 1, j0:j0 + n]
            y2 = B[r + 2, j0:j0 + n]
            y3 = B[r + 3, j0:j0 + n]
            # the 4 x 4 block of A in scalars: sixteen products per four loads and four stores
            e00, e01, e02, e03 = A[c, r], A[c, r + 1], A[c, r + 2], A[c, r + 3]
            e10, e11, e12, e13 = A[c + 1, r], A[c + 1, r + 1], A[c + 1, r + 2], A[c + 1, r + 3]
            e20, e21, e22, e23 = A[c + 2, r], A[c + 2, r + 1], A[c + 2, r + 2], A[c + 2, r + 3]
            e30, e31, e32, e33 = A[c + 3, r], A[c + 3, r + 1], A[c + 3, r + 2], A[c + 3, r + 3]
            if r == 0 and not add:
                for t in range(n):
                    a0 = y0[t]
                    a1 = y1[t]
                    a2 = y2[t]
                    a3 = y3[t]
                    z0[t] = 0.0 + (e00 * a0 + e01 * a1 + e02 * a2 + e03 * a3)
                    z1[t] = 0.0 + (e10 * a0 + e11 * a1 + e12 * a2 + e13 * a3)
                    z2[t] = 0.0 + (e20 * a0 + e21 * a1 + e22 * a2 + e23 * a3)
                    z3[t] = 0.0 + (e30 * a0 + e31 * a1 + e32 * a2 + e33 * a3)
            else:
                for t in range(n):
                    a0 = y0[t]
                    a1 = y1[t]
                    a2 = y2[t]
                    a3 = y3[t]
                    z0[t] += e00 * a0 + e01 * a1 + e02 * a2 + e03 * a3
                    z1[t] += e10 * a0 + e11 * a1 + e12 * a2 + e13 * a3
                    z2[t] += e20 * a0 + e21 * a1 + e22 * a2 + e23 * a3
                    z3[t] += e30 * a0 + e31 * a1 + e32 * a2 + e33 * a3
        _tail4(A, B, j0, n, c, k4, add or k4 > 0, z0, z1, z2, z3)
    for c in range(m4, m):
        z0 = out[c, :n]
        for r in range(0, k4, 4):
            y0 = B[r, j0:j0 + n]
            y1 = B[r + 1, j0:j0 + n]
            y2 = B[r + 2, j0:j0 + n]
            y3 = B[r + 3, j0:j0 + n]
            e0, e1, e2, e3 = A[c, r], A[c, r + 1], A[c, r + 2], A[c, r + 3]
            if r == 0 and not add:
                for t in range(n):
                    z0[t] = 0.0 + (e0 * y0[t] + e1 * y1[t] + e2 * y2[t] + e3 * y3[t])
            else:
                for t in range(n):
                    z0[t] += e0 * y0[t] + e1 * y1[t] + e2 * y2[t] + e3 * y3[t]
        _tail1(A, B, j0, n, c, k4, add or k4 > 0, z0)


@numba.njit(cache=True, fastmath=CONTRACT, inline="always", error_model="numpy")
def _tail4(A, B, j0, n, c, r, acc, z0, z1, z2, z3):
    """``tile_matmul``'s rows r <= s < k of B (k - r <= 3) for out rows c..c + 3 (z0..z3), in one sweep:
    z = ((z + A[., r] B[r]) + A[., r + 1] B[r + 1]) + ..., each sum rounded in that order; z starts
    from 0 where not acc (and is only written, all zero, when there are no such rows)."""
    nt = A.shape[1] - r
    if nt == 0:
        if not acc:
            for t in range(n):
                z0[t] = 0.0
                z1[t] = 0.0
                z2[t] = 0.0
                z3[t] = 0.0
        return
    y0 = B[r, j0:j0 + n]
    e00, e10, e20, e30 = A[c, r], A[c + 1, r], A[c + 2, r], A[c + 3, r]
    if nt == 1:
        if acc:
            for t in range(n):
                a0 = y0[t]
                z0[t] += e00 * a0
                z1[t] += e10 * a0
                z2[t] += e20 * a0
                z3[t] += e30 * a0
        else:
            for t in range(n):
                a0 = y0[t]
                z0[t] = 0.0 + e00 * a0
                z1[t] = 0.0 + e10 * a0
                z2[t] = 0.0 + e20 * a0
                z3[t] = 0.0 + e30 * a0
        return
    y1 = B[r + 1, j0:j0 + n]
    e01, e11, e21, e31 = A[c, r + 1], A[c + 1, r + 1], A[c + 2, r + 1], A[c + 3, r + 1]
    if nt == 2:
        if acc:
            for t in range(n):
                a0 = y0[t]
                a1 = y1[t]
                z0[t] = (z0[t] + e00 * a0) + e01 * a1
                z1[t] = (z1[t] + e10 * a0) + e11 * a1
                z2[t] = (z2[t] + e20 * a0) + e21 * a1
                z3[t] = (z3[t] + e30 * a0) + e31 * a1
        else:
            for t in range(n):
                a0 = y0[t]
                a1 = y1[t]
                z0[t] = (0.0 + e00 * a0) + e01 * a1
                z1[t] = (0.0 + e10 * a0) + e11 * a1
                z2[t] = (0.0 + e20 * a0) + e21 * a1
                z3[t] = (0.0 + e30 * a0) + e31 * a1
        return
    y2 = B[r + 2, j0:j0 + n]
    e02, e12, e22, e32 = A[c, r + 2], A[c + 1, r + 2], A[c + 2, r + 2], A[c + 3, r + 2]
    if acc:
        for t in range(n):
            a0 = y0[t]
            a1 = y1[t]
            a2 = y2[t]
            z0[t] = ((z0[t] + e00 * a0) + e01 * a1) + e02 * a2
            z1[t] = ((z1[t] + e10 * a0) + e11 * a1) + e12 * a2
            z2[t] = ((z2[t] + e20 * a0) + e21 * a1) + e22 * a2
            z3[t] = ((z3[t] + e30 * a0) + e31 * a1) + e32 * a2
    else:
        for t in range(n):
            a0 = y0[t]
            a1 = y1[t]
            a2 = y2[t]
            z0[t] = ((0.0 + e00 * a0) + e01 * a1) + e02 * a2
            z1[t] = ((0.0 + e10 * a0) + e11 * a1) + e12 * a2
            z2[t] = ((0.0 + e20 * a0) + e21 * a1) + e22 * a2
            z3[t] = ((0.0 + e30 * a0) + e31 * a1) + e32 * a2


@numba.njit(cache=True, fastmath=CONTRACT, inline="always", error_model="numpy")
def _tail1(A, B, j0, n, c, r, acc, z0):
    """``_tail4`` for one row c of out (z0)."""
    nt = A.shape[1] - r
    if nt == 0:
        if not acc:
            for t in range(n):
                z0[t] = 0.0
        return
    y0 = B[r, j0:j0 + n]
    e0 = A[c, r]
    if nt == 1:
        if acc:
            for t in range(n):
                z0[t] += e0 * y0[t]
        else:
            for t in range(n):
                z0[t] = 0.0 + e0 * y0[t]
        return
    y1 = B[r + 1, j0:j0 + n]
    e1 = A[c, r + 1]
    if nt == 2:
        if acc:
            for t in range(n):
                z0[t] = (z0[t] + e0 * y0[t]) + e1 * y1[t]
        else:
            for t in range(n):
                z0[t] = (0.0 + e0 * y0[t]) + e1 * y1[t]
        return
    y2 = B[r + 2, j0:j0 + n]
    e2 = A[c, r + 2]
    if acc:
        for t in range(n):
            z0[t] = ((z0[t] + e0 * y0[t]) + e1 * y1[t]) + e2 * y2[t]
    else:
        for t in range(n):
            z0[t] = ((0.0 + e0 * y0[t]) + e1 * y1[t]) + e2 * y2[t]


@numba.njit(cache=True, fastmath=REDUCE, error_model="numpy")
def nonfinite_vec(a):
    """True when the vector ``a`` holds NaN or inf (x * 0 is 0 only for finite x)."""
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i] * 0.0
    return s != 0.0


@numba.njit(cache=True, error_model="numpy")
def nonfinite_mat(a):
    """True when the matrix ``a`` holds NaN or inf."""
    for r in range(a.shape[0]):
        if nonfinite_vec(a[r]):
            return True
    return False


@numba.njit(nogil=True, cache=True, fastmath=REDUCE, error_model="numpy")
def row_gram(X, w, i0, n, out):
    """out[a, b] += sum_{j < n} X[a, i0 + j] w[j] X[b, i0 + j] for b <= a (X (K, P) rows; w (>= n,)
    the weights of the block's n columns, from index 0); some b > a are written too. Two rows against four at a time, over sub-blocks of
    SB entries that stay in L1; rows past K - 1 are read as row K - 1 and their sums dropped.

    (Loops index slices from 0: an index Numba cannot prove non-negative gets a wraparound
    test that turns vector loads into gathers.)
    """
    K = X.shape[0]
    for s0 in range(i0, i0 + n, SB):
        m = min(SB, i0 + n - s0)
        ww = w[s0 - i0:s0 - i0 + m]
        for a in range(0, K, 2):
            xa0 = X[a, s0:s0 + m]
            xa1 = X[min(a + 1, K - 1), s0:s0 + m]
            for b in range(0, a + 1, 4):
                x0 = X[b, s0:s0 + m]
                x1 = X[min(b + 1, K - 1), s0:s0 + m]
                x2 = X[min(b + 2, K - 1), s0:s0 + m]
                x3 = X[min(b + 3, K - 1), s0:s0 + m]
                g00 = g01 = g02 = g03 = g10 = g11 = g12 = g13 = 0.0
                for j in range(m):
                    u0 = ww[j] * xa0[j]
                    u1 = ww[j] * xa1[j]
                    g00 += u0 * x0[j]
                    g01 += u0 * x1[j]
                    g02 += u0 * x2[j]
                    g03 += u0 * x3[j]
                    g10 += u1 * x0[j]
                    g11 += u1 * x1[j]
                    g12 += u1 * x2[j]
                    g13 += u1 * x3[j]
                g = (g00, g01, g02, g03, g10, g11, g12, g13)
                for t in range(8):
                    r = a + t // 4
                    c = b + t % 4
                    if r < K and c < K:
                        out[r, c] += g[t]


@numba.njit(nogil=True, cache=True, fastmath=CONTRACT, error_model="numpy")
def combine_rows(X, A, r, cmax, i0, n, z):
    """z[j] = sum_{c < cmax} A[r, c] X[c, i0 + j] for j < n (X (C, P) rows), four rows per sweep."""
    for j in range(n):
        z[j] = 0.0
    c = 0
    # four-row sweep as in add_square_rows: deliberate, each loop keeps one store stream so LLVM vectorises it
    while c < cmax:
        m = min(4, cmax - c)
        a0, a1, a2, a3 = _coefs(A, r, c, c + m)
        x0, x1, x2, x3 = _four_rows(X, c, cmax, i0, n)
        for j in range(n):
            z[j] = z[j] + a0 * x0[j] + a1 * x1[j] + a2 * x2[j] + a3 * x3[j]
        c += m


@numba.njit(nogil=True, cache=True, fastmath=CONTRACT, error_model="numpy")
def add_square_rows(X, A, lower, i0, n, z, q):
    """q[j] += sum_r (sum_c A[r, c] X[c, i0 + j])^2 for j < n: the squared norms of the columns
    of A X (A (k, C), lower triangular when ``lower``; X (C, P) rows); z (>= 2 n) scratch.

    Rows r of A are taken two at a time (:func:`_square_pair`), each sweep over the block adding four
    rows of X to both, so that X's rows are read once per pair of A's rows; a last odd row alone
    (:func:`_square_one`). Each t_r = sum_c A[r, c] x_c is summed in groups of four c in the order of c,
    and q gets t_0^2, t_1^2, ... in the order of r, pairs or not (the same numbers as one row at a time).
    """
    k = A.shape[0]
    r = 0
    while r + 2 <= k:
        _square_pair(X, A, lower, i0, n, z[:n], z[n:2 * n], q, r)
        r += 2
    if r < k:
        _square_one(X, A, lower, i0, n, z[:n], q, r)


@numba.njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _coefs(A, r, c, end):
    """A[r, c], ..., A[r, c + 3] of a four-row sweep, 0.0 from column ``end`` on (a term past the row's
    last column, or past the sweep's, adds exactly 0)."""
    return (A[r, c], A[r, c + 1] if c + 1 < end else 0.0, A[r, c + 2] if c + 2 < end else 0.0,
            A[r, c + 3] if c + 3 < end else 0.0)


@numba.njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _four_rows(X, c, end, i0, n):
    """Rows c..c + 3 of X over columns i0..i0 + n - 1, the rows from ``end`` on read as row end - 1 (their
    coefficients are 0.0, ``_coefs``)."""
    return (X[c, i0:i0 + n], X[min(c + 1, end - 1), i0:i0 + n], X[min(c + 2, end - 1), i0:i0 + n],
            X[min(c + 3, end - 1), i0:i0 + n])


@numba.njit(nogil=True, cache=True, fastmath=CONTRACT, error_model="numpy")
def _square_pair(X, A, lower, i0, n, z0, z1, q, r):
    """``add_square_rows`` for rows r and r + 1 of A in one set of sweeps over four rows of X each:
    row r's columns end at m0 (r + 1 when lower), row r + 1's at m1 >= m0; a sweep that reaches past
    m0 gives row r zero coefficients there, which changes none of its sums (z0, z1: the partial sums)."""
    C = A.shape[1]
    m0 = min(r + 1, C) if lower else C
    m1 = min(r + 2, C) if lower else C
    c = 0
    # four-row sweeps as in combine_rows: one loop per case, each with the stores LLVM vectorises
    while c < m1:
        m = min(4, m1 - c)
        x0, x1, x2, x3 = _four_rows(X, c, m1, i0, n)
        a0, a1, a2, a3 = _coefs(A, r, c, min(m0, c + m))
        b0, b1, b2, b3 = _coefs(A, r + 1, c, c + m)
        first = c == 0
        last = c + m >= m1
        if first and last:
            for j in range(n):
                u0, u1, u2, u3 = x0[j], x1[j], x2[j], x3[j]
                t = a0 * u0 + a1 * u1 + a2 * u2 + a3 * u3
                s = b0 * u0 + b1 * u1 + b2 * u2 + b3 * u3
                q[j] = (q[j] + t * t) + s * s
        elif first:
            for j in range(n):
                u0, u1, u2, u3 = x0[j], x1[j], x2[j], x3[j]
                z0[j] = a0 * u0 + a1 * u1 + a2 * u2 + a3 * u3
                z1[j] = b0 * u0 + b1 * u1 + b2 * u2 + b3 * u3
        elif last:
            for j in range(n):
                u0, u1, u2, u3 = x0[j], x1[j], x2[j], x3[j]
                t = z0[j] + a0 * u0 + a1 * u1 + a2 * u2 + a3 * u3
                s = z1[j] + b0 * u0 + b1 * u1 + b2 * u2 + b3 * u3
                q[j] = (q[j] + t * t) + s * s
        else:
            for j in range(n):
                u0, u1, u2, u3 = x0[j], x1[j], x2[j], x3[j]
                z0[j] = z0[j] + a0 * u0 + a1 * u1 + a2 * u2 + a3 * u3
                z1[j] = z1[j] + b0 * u0 + b1 * u1 + b2 * u2 + b3 * u3
        c += m


@numba.njit(nogil=True, cache=True, fastmath=CONTRACT, error_model="numpy")
def _square_one(X, A, lower, i0, n, z, q, r):
    """``add_square_rows`` for row r of A alone (z: its partial sums)."""
    C = A.shape[1]
    cmax = min(r + 1, C) if lower else C
    c = 0
    while c < cmax:
        m = min(4, cmax - c)
        a0, a1, a2, a3 = _coefs(A, r, c, c + m)
        x0, x1, x2, x3 = _four_rows(X, c, cmax, i0, n)
        first = c == 0
        last = c + m >= cmax
        if first and last:
            for j in range(n):
                t = a0 * x0[j] + a1 * x1[j] + a2 * x2[j] + a3 * x3[j]
                q[j] += t * t
        elif first:
            for j in range(n):
                z[j] = a0 * x0[j] + a1 * x1[j] + a2 * x2[j] + a3 * x3[j]
        elif last:
            for j in range(n):
                t = z[j] + a0 * x0[j] + a1 * x1[j] + a2 * x2[j] + a3 * x3[j]
                q[j] += t * t
        else:
            for j in range(n):
                z[j] = z[j] + a0 * x0[j] + a1 * x1[j] + a2 * x2[j] + a3 * x3[j]
        c += m


@numba.njit(cache=True, error_model="numpy")
def scaled_gram(G):
    """Column scaling of a Gram matrix G (K, K): d (K,) = sqrt(diag G) (0 for zero columns),
    idx (nz,) the columns with diag > 0, and Gs (nz, nz) = G[idx, idx] / (d d^T), whose
    condition number decides how accurate a Gram-based factorisation can be."""
    K = G.shape[0]
    d = np.zeros(K)
    nz = 0
    for a in range(K):
        if G[a, a] > 0.0:
            d[a] = np.sqrt(G[a, a])
            nz += 1
    idx = np.empty(nz, np.int64)
    j = 0
    for a in range(K):
        if G[a, a] > 0.0:
            idx[j] = a
            j += 1
    Gs = np.empty((nz, nz))
    for i in range(nz):
        for jj in range(nz):
            Gs[i, jj] = G[idx[i], idx[jj]] / (d[idx[i]] * d[idx[jj]])
    return d, idx, Gs


@numba.njit(cache=True, fastmath=REDUCE, error_model="numpy")
def unit_sums(Tt, TDt, Delta, hn2, Z, GX, NX, GXX, NXX):
    """The sums over the units u of the fused MLP steps' small algebra (``step._middle_sums``,
    ``blr_mlp.blr_unit_assemble``), each a dot product of contiguous rows:
    GX[a, r] = sum_u Tt[a, u] Delta[r, u], NX likewise with TDt (L, k), and for s <= r
    GXX[r, s] = sum_u Delta[r, u] hn2[u] Delta[s, u], NXX likewise with Z (k, k; lower triangles).
    (Two vectorised loops in one function: a BLAS call on these shapes, (L, units) x (units, k), took
    several times longer, and one compiled loop nest keeps the callers' compile time down.)"""
    L = Tt.shape[0]
    k = Delta.shape[0]
    NO = Delta.shape[1]
    for r in range(k):
        d = Delta[r]
        for a in range(L):
            t = Tt[a]
            td = TDt[a]
            s1 = 0.0
            s2 = 0.0
            for u in range(NO):
                s1 += t[u] * d[u]
                s2 += td[u] * d[u]
            GX[a, r] = s1
            NX[a, r] = s2
        for c in range(r + 1):
            e = Delta[c]
            s1 = 0.0
            s2 = 0.0
            for u in range(NO):
                de = d[u] * e[u]
                s1 += de * hn2[u]
                s2 += de * Z[u]
            GXX[r, c] = s1
            NXX[r, c] = s2
