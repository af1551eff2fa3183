"""numba.cuda kernels (float64). One thread per parameter i for the elementwise parts;
per-block partial sums (shared-memory tree) for reductions over P, added on the host
in a fixed order so that results do not depend on scheduling.

Layouts: H (C, P) row-major, so threads of a warp read consecutive H[c, i] (coalesced);
W (P, L) row-major, one thread per row.
"""

import math

import numba
from numba import cuda

# threads per block (a power of two: the tree reduction needs it). The CUDA simulator
# uses the same launch configuration as the hardware, so that the simulator tests exercise
# the block boundaries, tile sizes and reductions the GPU runs (with tiny problem sizes).
TPB = 128
MAX_BLOCKS = 256  # blocks per reduction; the partial sums are (pairs, blocks)


def blocks_for(P, cap=None):
    """Blocks of TPB threads to cover P entries (at most ``cap``)."""
    n = max(1, (P + TPB - 1) // TPB)
    return n if cap is None else min(n, cap)


@cuda.jit(device=True, inline="always")
def tree(sh, t):
    """Sum sh[0:TPB] into sh[0] (a fixed-order tree: deterministic); every thread of the block
    calls it. Inlined into its callers, so that they compile to PTX without asking a driver for
    the device."""
    cuda.syncthreads()
    s = TPB // 2
    while s > 0:
        if t < s:
            sh[t] += sh[t + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True, inline="always")
def _block_sum_to(acc, sh, t, out, p):
    """Tree-sum each thread's ``acc`` over the block in shared memory ``sh`` (TPB,) and
    write the block's total to out[p, blockIdx.x] (``tree``)."""
    sh[t] = acc
    tree(sh, t)
    if t == 0:
        out[p, cuda.blockIdx.x] = sh[0]


@cuda.jit
def gram_rows_partial(X, w, pa, pb, out):
    """out[p, blk] = sum over this block's i of w[i] X[pa[p], i] X[pb[p], i]; X (K, P).

    Launch with grid (blocks, n_pairs), TPB threads per block.
    """
    # same shape as gram_cols_partial: deliberate kernel specialisation (row-major X (K, P) here, so
    # consecutive threads read consecutive addresses; a shared kernel would need a branch per element)
    sh = cuda.shared.array(TPB, dtype=numba.float64)
    t = cuda.threadIdx.x
    p = cuda.blockIdx.y
    a = pa[p]
    b = pb[p]
    P = X.shape[1]
    acc = 0.0
    i = cuda.blockIdx.x * cuda.blockDim.x + t
    stride = cuda.gridDim.x * cuda.blockDim.x
    while i < P:
        acc += w[i] * X[a, i] * X[b, i]
        i += stride
    _block_sum_to(acc, sh, t, out, p)


@cuda.jit
def gram_cols_partial(X, w, recip, pa, pb, out):
    """out[p, blk] = partial sum of v_i X[i, pa[p]] X[i, pb[p]], v = w or 1/w; X (P, K)."""
    # same shape as gram_rows_partial: deliberate kernel specialisation (column layout X (P, K), 1/w option)
    sh = cuda.shared.array(TPB, dtype=numba.float64)
    t = cuda.threadIdx.x
    p = cuda.blockIdx.y
    a = pa[p]
    b = pb[p]
    P = X.shape[0]
    acc = 0.0
    i = cuda.blockIdx.x * cuda.blockDim.x + t
    stride = cuda.gridDim.x * cuda.blockDim.x
    while i < P:
        v = 1.0 / w[i] if recip else w[i]
        acc += v * X[i, a] * X[i, b]
        i += stride
    _block_sum_to(acc, sh, t, out, p)


@cuda.jit
def diag_pass(mean, var, H, A, w, mode, out_mean, out_var):
    """Per parameter i: q = |A h_i|^2, d = h_i^T w; then mode 0 (FD): v' = v - v^2 q,
    mu' = mu + v d; mode 1 (VD, eq. 25): v' = 1/(1/v + q), mu' = mu + v' d;
    mode 2 (VD, EKF mean): v' = 1/(1/v + q), mu' = mu + v d.
    """
    i = cuda.grid(1)
    C = H.shape[0]
    P = H.shape[1]
    k = A.shape[0]
    if i >= P:
        return
    d = 0.0
    for c in range(C):
        d += w[c] * H[c, i]
    q = 0.0
    for r in range(k):
        z = 0.0
        for c in range(C):
            z += A[r, c] * H[c, i]
        q += z * z
    v = var[i]
    if mode == 0:
        vn = v - v * v * q
        mn = mean[i] + v * d
    elif mode == 1:
        vn = 1.0 / (1.0 / v + q)
        mn = mean[i] + vn * d
    else:
        vn = 1.0 / (1.0 / v + q)
        mn = mean[i] + v * d
    out_var[i] = vn
    out_mean[i] = mn


@cuda.jit
def rowsumsq(M, out):
    """out[i] = sum_k M[i, k]^2 for M (P, K)."""
    i = cuda.grid(1)
    if i < M.shape[0]:
        s = 0.0
        for k in range(M.shape[1]):
            s += M[i, k] * M[i, k]
        out[i] = s


@cuda.jit
def dlr_predict_diag(ups, gamma2, q, qstride, out_ups, weight):
    """ups' = ups / (gamma^2 + q ups) (eq. P2) and weight = q D with D = ups' / ups."""
    i = cuda.grid(1)
    if i < ups.shape[0]:
        u = ups[i]
        qi = q[i * qstride]
        up = u / (gamma2 + qi * u)
        out_ups[i] = up
        weight[i] = qi * (up / u)


@cuda.jit
def dlr_predict_rows(mean, ups, out_ups, W, gamma, S, identity, out_mean, out_W):
    """out_W[i] = gamma D_i W[i] S (eq. P5), out_mean = gamma mean; one thread per row."""
    i = cuda.grid(1)
    P = W.shape[0]
    L = W.shape[1]
    if i >= P:
        return
    out_mean[i] = gamma * mean[i]
    s = gamma * (out_ups[i] / ups[i])
    for l in range(L):
        if identity:
            out_W[i, l] = s * W[i, l]
        else:
            acc = 0.0
            for a in range(L):
                acc += W[i, a] * S[a, l]
            out_W[i, l] = s * acc


def launch_1d(P):
    """(blocks, threads) for one thread per entry."""
    return max(1, math.ceil(P / TPB)), TPB


# -- LO-FI update (Chang et al. 2023, eqs 31-42); host side in lofi.py ----------------------------
# Rows are staged in dynamic shared memory, tile by tile: tr rows of ``stride`` doubles, then
# 1/ups for those rows. The W block of a tile is one contiguous run and each row of H is
# contiguous, so the loads are coalesced.


@cuda.jit
def lofi_tile_gram(W, H, ups, Aw, Mt, mode, tr, stride, pa, pb, pw, out):
    """out[p, blk] = sum over this block's rows i of v_i z_i[pa[p]] z_i[pb[p]] with v_i = 1/ups[i]
    when pw[p] != 0, else 1. W (P, L), H (C, P), ups (P,).

    mode 0: z_i = y_i = [W[i], H[:, i]] (the unwhitened row, L + C entries).
    mode 1: z_i = [Mt x_i (nz), x_i (K + 1), h_i (C)], x_i = [W[i], Aw h_i], Aw = [A; w^T]
    (k + 1, C): the whitened row of W~ and g_i = h_i^T w; Mt (nz, K).
    Blocks take tiles of ``tr`` rows in turn (tile = blockIdx.x + j gridDim.x); each thread owns
    the pairs p = t, t + blockDim.x, ... and adds them row by row (a fixed order). Dynamic
    shared memory: (tr * stride + tr) float64.
    """
    sh = cuda.shared.array(0, dtype=numba.float64)
    t = cuda.threadIdx.x
    nt = cuda.blockDim.x
    blk = cuda.blockIdx.x
    P = W.shape[0]
    L = W.shape[1]
    C = H.shape[0]
    nz = Mt.shape[0]
    K = Mt.shape[1]
    k1 = Aw.shape[0]
    ox = nz if mode == 1 else 0  # where W[i] starts in z_i
    oh = nz + K + 1 if mode == 1 else L  # where h_i starts
    dv = tr * stride  # where 1/ups starts
    npairs = pa.shape[0]
    for p in range(t, npairs, nt):
        out[p, blk] = 0.0
    ntiles = (P + tr - 1) // tr
    tile = blk
    while tile < ntiles:
        i0 = tile * tr
        nr = min(tr, P - i0)
        f = t
        while f < nr * L:
            r = f // L
            sh[r * stride + ox + f - r * L] = W[i0 + r, f - r * L]
            f += nt
        for c in range(C):
            for r in range(t, nr, nt):
                sh[r * stride + oh + c] = H[c, i0 + r]
        for r in range(t, nr, nt):
            sh[dv + r] = 1.0 / ups[i0 + r]
        cuda.syncthreads()
        if mode == 1:
            for r in range(t, nr, nt):
                base = r * stride
                for j in range(k1):
                    s = 0.0
                    for c in range(C):
                        s += Aw[j, c] * sh[base + oh + c]
                    sh[base + ox + L + j] = s
                for j in range(nz):
                    s = 0.0
                    for a in range(K):
                        s += Mt[j, a] * sh[base + ox + a]
                    sh[base + j] = s
            cuda.syncthreads()
        for p in range(t, npairs, nt):
            a = pa[p]
            b = pb[p]
            s = 0.0
            if pw[p] != 0:
                for r in range(nr):
                    s += sh[dv + r] * sh[r * stride + a] * sh[r * stride + b]
            else:
                for r in range(nr):
                    s += sh[r * stride + a] * sh[r * stride + b]
            out[p, blk] += s
        cuda.syncthreads()
        tile += cuda.gridDim.x


@cuda.jit
def lofi_output_rows(mean, ups, W, H, EW, ERt, out_mean, out_ups, out_W):
    """One thread per row i, with y_i = [W[i], H[:, i]] (Ky = L + C): out_W[i] = y_i EW
    (EW (Ky, rank), eq. 40); z = ERt y_i (ERt (m + 1, Ky)); out_ups[i] = ups[i] + sum of
    z[:m]^2 (eqs 41-42); out_mean[i] = mean[i] + z[m] / ups[i] (eq. 38).
    """
    i = cuda.grid(1)
    P = W.shape[0]
    L = W.shape[1]
    C = H.shape[0]
    m1 = ERt.shape[0]
    if i >= P:
        return
    for l in range(EW.shape[1]):
        s = 0.0
        for a in range(L):
            s += W[i, a] * EW[a, l]
        for c in range(C):
            s += H[c, i] * EW[L + c, l]
        out_W[i, l] = s
    disc = 0.0
    zm = 0.0
    for j in range(m1):
        s = 0.0
        for a in range(L):
            s += W[i, a] * ERt[j, a]
        for c in range(C):
            s += H[c, i] * ERt[j, L + c]
        if j < m1 - 1:
            disc += s * s
        else:
            zm = s
    u = ups[i]
    out_ups[i] = u + disc
    out_mean[i] = mean[i] + zm / u
