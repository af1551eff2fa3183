"""LO-FI update as a fused two-pass Numba kernel (Chang et al. 2023, eqs 26-43).

Belief N(mu, (diag(ups) + W W^T)^{-1}), ups (P,), W (P, L). The new factor is
W~ = [W, H^T A^T] (P, K), K = L + C, with A^T A = R^{-1} (eq. 31). W~ is never
stored: each pass rebuilds a block of its rows from W and H.

Pass 1 (reads W, H, ups once) accumulates
  - the R factor of a Householder QR of W~, streamed block by block as a
    tall-skinny QR (R <- qr([R; W~_block])); Q is never formed;
  - N = W~^T diag(1/ups) W~ and b = W~^T diag(1/ups) g with g = H^T R^{-1} e.
Small algebra (NumPy): the SVD R = U_r diag(s) V^T gives W~ = (Q U_r) diag(s) V^T,
so U diag(s) = W~ V needs no division by s; c = (I + N)^{-1} b (eq. 38).
Pass 2 (reads W, H, ups, mu; writes the outputs)
  W' = W~ V[:, :L] (eqs 39-40), ups' = ups + rowsumsq(W~ V[:, L:]) (eqs 41-42),
  mu' = mu + (g - W~ c) / ups (eq. 38, the untruncated precision).

Accuracy: the singular vectors come from R, not from the Gram matrix W~^T W~,
so the condition number is not squared; the tall-skinny QR is Householder-based
and needs no full column rank (zero columns, P < K and rank-deficient W~ are fine).
"""

import numba
import numpy as np
import scipy.linalg as sla

from refbayes.errors import NotPositiveDefiniteError

from .. import _host
from ._blocks import (
    NL,
    SB,
    dot_block,
    finish_dot,
    finish_gram,
    gram_block,
    load_cols_block,
    project_block,
    whiten_block,
)

__all__ = ["lofi_update", "lofi_pass1", "lofi_pass2", "householder_block"]


@numba.njit(cache=True)
def householder_block(Rq, B, n):
    """Rq <- R factor of [Rq; B[:, :n]^T] by Householder reflections (B is overwritten).

    Rq (K, K) upper triangular (a running R, zeros to start), B (K, SB) holds the
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


@numba.njit(cache=True)
def lofi_pass1(ups, W, H, A, w, Rq, N, bvec):
    """Pass 1 over the data: Rq (K, K) = R of W~ (start from zeros), N = W~^T diag(1/ups) W~,
    bvec = W~^T diag(1/ups) g with g_i = h_i^T w. Shapes: ups (P,), W (P, L), H (C, P), A (k, C),
    w (C,), K = L + k.
    """
    P, L = W.shape
    K = Rq.shape[0]
    B = np.empty((K, SB))
    z = np.empty(SB)
    d = np.empty(SB)
    dinv = np.empty(SB)
    y = np.empty(SB)
    t = np.empty(SB)
    accN = np.zeros((K, K, NL))
    accb = np.zeros((K, NL))
    for i0 in range(0, P, SB):
        n = min(SB, P - i0)
        load_cols_block(W, i0, n, B, 0)
        whiten_block(H, A, i0, n, B, L, z)
        project_block(H, w, i0, n, d)
        for j in range(n):
            dinv[j] = 1.0 / ups[i0 + j]
            y[j] = dinv[j] * d[j]
        gram_block(B, dinv, n, accN, t)
        dot_block(B, y, n, accb)
        householder_block(Rq, B, n)
    finish_gram(accN, N)
    finish_dot(accb, bvec)


@numba.njit(cache=True)
def lofi_pass2(mean, ups, W, H, A, w, V, c, out_mean, out_ups, out_W):
    """Pass 2: out_W = W~ V[:, :L'] (zero columns past K), out_ups = ups + rowsumsq(W~ V[:, L':]),
    out_mean = mean + (g - W~ c) / ups; L' = out_W.shape[1]. Returns the count of non-finite outputs.
    """
    P, L = W.shape
    K = V.shape[0]
    rank = out_W.shape[1]
    keep = min(rank, K)
    B = np.empty((K, SB))
    z = np.empty(SB)
    d = np.empty(SB)
    tmp = np.empty(SB)
    disc = np.empty(SB)
    nbad = 0
    for i0 in range(0, P, SB):
        n = min(SB, P - i0)
        load_cols_block(W, i0, n, B, 0)
        whiten_block(H, A, i0, n, B, L, z)
        project_block(H, w, i0, n, d)
        for l in range(K):
            for j in range(n):
                tmp[j] = 0.0
            for a in range(K):
                va = V[a, l]
                for j in range(n):
                    tmp[j] += va * B[a, j]
            if l < keep:
                for j in range(n):
                    out_W[i0 + j, l] = tmp[j]
            elif l == keep:
                for j in range(n):
                    disc[j] = tmp[j] * tmp[j]
            else:
                for j in range(n):
                    disc[j] += tmp[j] * tmp[j]
        if keep == K:
            for j in range(n):
                disc[j] = 0.0
        for l in range(keep, rank):
            for j in range(n):
                out_W[i0 + j, l] = 0.0
        for j in range(n):
            tmp[j] = d[j]
        for a in range(K):
            ca = c[a]
            for j in range(n):
                tmp[j] -= ca * B[a, j]
        for j in range(n):
            i = i0 + j
            u = ups[i] + disc[j]
            m = mean[i] + tmp[j] / ups[i]
            out_ups[i] = u
            out_mean[i] = m
            if not (np.isfinite(u) and np.isfinite(m)):
                nbad += 1
    return nbad


def _rank(rank, default):
    if rank is None:
        return default
    if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"rank must be a non-negative integer; got {rank!r}")
    if rank < 0:
        raise ValueError(f"rank must be >= 0; got {rank}")
    return int(rank)


@_host.one_blas_thread
def lofi_update(mean, ups, W, H, R, e, rank=None, singular=False):
    """LO-FI update step (Chang et al. 2023, eqs 26-43) in two passes over the data.

    W~ = [W, H^T A^T] (A^T A = R^{-1}); mu' = mu + (diag(ups) + W~ W~^T)^{-1} H^T R^{-1} e
    (eq. 38); thin SVD W~ = U diag(s) V^T, W' = U[:, :L] diag(s[:L]) (eqs 39-40, zero
    columns when fewer than L components), ups' = ups + rowsumsq(U[:, L:] diag(s[L:]))
    (eqs 41-42).

    mean, ups: (P,); W: (P, L0); H: (C, P); R: (C, C); e: (C,); rank: L >= 0
    (default L0); singular: R only positive semi-definite (pseudo-inverse).
    Returns (mean (P,), ups (P,), W (P, L)), new arrays. W is defined up to a
    right orthogonal factor: compare W W^T, not W.
    """
    mean = _host.as_f64(mean, "mean", (None,))
    P = mean.shape[0]
    ups = _host.check_positive(_host.as_f64(ups, "ups", (P,)), "ups")
    W = _host.as_f64(W, "W", (P, None))
    H = _host.as_f64(H, "H", (None, P))
    C = H.shape[0]
    R = _host.check_finite(_host.as_f64(R, "R", (C, C)), "R")
    e = _host.check_finite(_host.as_f64(e, "e", (C,)), "e")
    rank = _rank(rank, W.shape[1])

    A = np.ascontiguousarray(_host.whitener(R, singular))
    w = A.T @ (A @ e)
    K = W.shape[1] + A.shape[0]
    Rq = np.zeros((K, K))
    N = np.empty((K, K))
    bvec = np.empty(K)
    lofi_pass1(ups, W, H, A, w, Rq, N, bvec)
    if not (np.all(np.isfinite(Rq)) and np.all(np.isfinite(N))):
        _host.raise_nonfinite("LO-FI update", ups=ups, W=W, H=H)
    try:
        c = sla.cho_solve(sla.cho_factor(np.eye(K) + N, lower=True), bvec) if K else bvec
    except np.linalg.LinAlgError as exc:
        raise NotPositiveDefiniteError("I + W~^T diag(1/ups) W~ is not positive definite") from exc
    V = np.ascontiguousarray(np.linalg.svd(Rq)[2].T) if K else np.zeros((0, 0))
    out_mean = np.empty(P)
    out_ups = np.empty(P)
    out_W = np.empty((P, rank))
    nbad = lofi_pass2(mean, ups, W, H, A, w, V, c, out_mean, out_ups, out_W)
    if nbad:
        _host.raise_nonfinite("LO-FI update", mean=mean, ups=ups, W=W, H=H)
    return out_mean, out_ups, out_W
