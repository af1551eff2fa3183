"""A LO-FI step for an MLP in one host call of five compiled functions: predict, forward pass,
Jacobian structure, likelihood moments, update (Chang et al. 2023, eqs 13-25 and 26-43).

Predict (exact): mu_bar = gamma mu, ubar = ups / (gamma^2 + q ups), D = ubar / ups and
W_bar = Y0 S with Y0 = diag(gamma D) W and S S^T = (I + W^T diag(q D) W)^{-1}. Neither W_bar nor
Y0 is formed: every product with W_bar is a product with W, weighted row by row by gamma D,
followed by S (L x L).

For an MLP the Jacobian never needs to be formed either. With delta^c_l = d f_c / d a_{l+1}
(one reverse pass per output c, at mu_bar) the Jacobian entry of weight W_l[j, k] is
delta^c_{l,j} h_{l,k}, and of bias b_l[j] it is delta^c_{l,j} (write h~_l = [h_l, 1]).
With H = M J (M = dm/deta, the likelihood's mean Jacobian) and A^T A = R^{-1}, the
whitened columns H^T A^T and g = H^T R^{-1} e are then, for parameter i = (l, j, k),

    x_{i,r} = Delta_l[r, j] h~_{l,k},   g_i = Gamma_l[j] h~_{l,k},
    Delta_l = (A M) [delta^1_l ... delta^C_l]^T,   Gamma_l = (M^T R^{-1} e)^T [delta^c_l]_c,

a rank-one block per output unit (l, j). Every sum over parameters that involves these
columns folds into per-unit sums: with T[u, a] = sum_k h~_k W_bar[i, a],
TD[u, a] = sum_k h~_k W_bar[i, a] / ubar_i and Z[u] = sum_k h~_k^2 / ubar_i (u = (l, j)),

    W~^T W~   = [[W_bar^T W_bar, T^T Delta^T], [., Delta diag(|h~|^2) Delta^T]]
    W~^T D~ W~ = [[W_bar^T D~ W_bar, TD^T Delta^T], [., Delta diag(Z) Delta^T]],  D~ = diag(1/ubar)
    W~^T D~ g  = [TD^T Gamma; Delta (Z Gamma)],

so the passes over the parameters cost O(P L^2) plus O(P L), not O(P L C).
The R factor comes from one Gram matrix, as the "gram" route of
``refbayes.kernels.cpu.lofi``; when its accuracy guard fails, the wrappers return None
and the caller takes the general route (materialised H).
The right singular vectors come from the eigenvectors of that Gram matrix where this is as
accurate as an SVD of the R factor (see the kernel; ``_symeig``, Householder plus implicit QL
written out for these small sizes), else from an SVD of R taken by the host (``lofi_middle``).
R's whitener also comes from the host (``_whiten``): LAPACK on a C x C matrix, microseconds.
The outputs (eqs 38-42) are the columns of W~ V and g - W~ c, row by row:
gamma D_i [W S E](i) + h~_k [Delta V_G](u), the product (mm, L) x (L, rows) by ``_blocks.tile_matmul``.

Passes: the parameters are read twice, in chunks of whole units of one layer (or one layer's
biases; ``_chunks``), and the chunks are spread over the kernel threads (``_host.run_chunks``).
Pass 1 computes the predict rows, the three weighted Gram matrices of W and the per-unit
sums; pass 2 computes the predict rows again and writes the outputs (no P-sized buffer passes
from one to the other). Each chunk's sums go to their own slot and are added in
chunk order afterwards, so the numbers are the same for every thread count. The forward
and reverse passes run before pass 1; the small algebra (whitening, the (L + C)-sized Gram
matrices, the guard, the eigen- or singular value decomposition) runs between the passes.

Layout: the kernel reads W^T (L, P) and writes W'^T (rank, P), so every pass over the
parameters runs along contiguous rows; the wrappers return W' as a column-major (P, rank)
view, and the next call reads its transpose without a copy.

Networks without biases (``rb.Linear(bias=False)``, ``bias=False`` below): h~_l = h_l, and the
chunks of biases are absent; nothing else changes.

Likelihoods (codes): 0 Gaussian with a fixed R (passed in, jitter included), 1 Categorical
"drop_last", 2 Categorical "full" (pseudo-inverse when jitter = 0); moments as in
``refbayes.likelihoods``.
"""

import numba
import numpy as np
from scipy.linalg.lapack import dpotrf as _potrf
from scipy.linalg.lapack import dtrtri as _trtri

from refbayes.errors import r_not_positive_definite

from .. import _host
from . import _compile_helper
from ._status import BAD, FALLBACK, NOT_PD_CORE, NOT_PD_PRED, OK
from ._status import raise_status as _raise_status
from ._blocks import (
    CONTRACT,
    EPS,
    REDUCE,
    blas_matmul,
    block_buffer,
    chol_lower,
    chol_solve,
    lower_inverse,
    nonfinite_mat,
    nonfinite_vec,
    scaled_gram,
    tile_matmul,
    unit_sums,
)
from ._symeig import sym_eig
from .dlr import root_of_gram
from .lofi import TAU_GRAM, gram_tiles
from .mlp import _forward, _offsets, _reverse_deltas, layer_bias

__all__ = ["lofi_mlp_step", "lofi_mlp_update", "LIKELIHOOD_CODES"]

LIKELIHOOD_CODES = {"gaussian": 0, "categorical-drop_last": 1, "categorical-full": 2}
NEEDS_SVD = -1  # mlp_lofi_middle's request for the SVD of its R factor (never leaves lofi_middle)
ROWS_PER_CHUNK = 512  # rows per chunk of the passes (whole units), in cache for the output product
WIDE_UNIT = 2048  # a unit with more rows (inputs) than this is cut into pieces, each its own chunk
PIECE_ROWS = 16384  # rows of such a piece (the last one shorter): enough chunks for the threads of a wide layer
BLOCK_ROWS = 512  # a piece is walked by blocks of this many rows, each block's products and sums made in cache


def n_outputs(sizes, likelihood):
    """C, the length of y and yhat for an MLP with layer ``sizes`` under the likelihood code
    ``likelihood``: the last layer's width C_f, less one for "categorical-drop_last" (its last
    class is the reference, with no row of its own). Used by every compiled MLP step's host wrapper."""
    Cf = int(sizes[-1])
    return Cf - 1 if likelihood == LIKELIHOOD_CODES["categorical-drop_last"] else Cf


def arrays_dtype(*arrays):
    """np.float32 when every array is float32 (a float32 belief: the compiled steps read and write
    it in float32 and compute in float64), else np.float64."""
    return np.float32 if all(getattr(a, "dtype", None) == np.float32 for a in arrays) else np.float64


def host_inputs(sizes, likelihood, mean, q, bias):
    """What every compiled MLP step's host wrapper reads first from its arguments: (P, bias, C, qv,
    qstride) with P = len(mean), bias the layers' bias flag (None: read from P, ``mlp.layer_bias``),
    C = ``n_outputs(sizes, likelihood)`` and q (scalar or (P,)) as ``_host.as_process_noise`` gives it."""
    P = mean.shape[0]
    bias = layer_bias(sizes, P, bias)
    C = n_outputs(sizes, likelihood)
    qv, qstride = _host.as_process_noise(q, P)
    return P, bias, C, qv, qstride


@numba.njit(cache=True, error_model="numpy")
def log_sum_exp(eta):
    """log sum_i exp(eta_i) for eta (n,), n >= 1, shifted by max(eta) (a loop: numba's eta.max()
    compiles a reduction of its own). Shared by the categorical moments here and BONG's MC-EF."""
    mx = eta[0]
    for i in range(1, eta.shape[0]):
        mx = max(mx, eta[i])
    s = 0.0
    for i in range(eta.shape[0]):
        s += np.exp(eta[i] - mx)
    return np.log(s) + mx


@numba.njit(cache=True, error_model="numpy")
def _likelihood(code, eta, Rc, jitter):
    """(yhat (C,), M = dm/deta (C, C_f), R (C, C)) for the likelihood ``code`` at eta (C_f,)."""
    Cf = eta.shape[0]
    if code == 0:
        return eta.copy(), np.eye(Cf), Rc.copy()
    lse = log_sum_exp(eta)
    p = np.empty(Cf)
    for i in range(Cf):
        p[i] = np.exp(eta[i] - lse)
    kmax = np.argmax(p)
    full = np.empty((Cf, Cf))
    for i in range(Cf):
        for j in range(Cf):
            full[i, j] = -p[i] * p[j]
    for i in range(Cf):
        if i == kmax:
            qi = 0.0
            for j in range(Cf):
                if j != kmax:
                    qi += p[j]
        else:
            qi = 1.0 - p[i]
        full[i, i] = p[i] * qi
    C = Cf - 1 if code == 1 else Cf
    R = full[:C, :C].copy()
    for i in range(C):
        R[i, i] += jitter
    return p[:C].copy(), full[:C].copy(), R


@numba.njit(cache=True, error_model="numpy")
def mlp_front(theta, x, sizes, act, lik, Rc, jitter, yhat, bias=True):
    """Forward pass at theta, the reverse-pass sensitivities of every output unit and the
    likelihood moments; writes yhat (C,). Returns (h, os, Dl, yh, M, R): activations h (with
    mlp._offsets' layout), unit offsets os (nl + 1,), Dl (C_f, units) = d f_c / d a_u,
    yhat, M = dm/deta (C, C_f) and R (C, C). bias: whether the layers have biases."""
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, nh = _offsets(sizes, bias)
    h = np.empty(nh)
    dact = np.empty(nh)
    _forward(theta, x, sizes, act, w0, b0, hs, h, dact)
    Cf = sizes[nl]
    eta = h[hs[nl]:hs[nl] + Cf].copy()
    os = np.zeros(nl + 1, np.int64)
    for l in range(nl):
        os[l + 1] = os[l] + sizes[l + 1]
    Dl = np.empty((Cf, os[nl]))
    _reverse_deltas(theta, sizes, w0, hs, dact, os, Dl)
    yh, M, R = _likelihood(lik, eta, Rc, jitter)
    for c in range(yh.shape[0]):
        yhat[c] = yh[c]
    return h, os, Dl, yh, M, R


def r_at(sizes, activation, likelihood, Rc, jitter, theta, x, bias):
    """The likelihood's observation covariance R (C, C) at the network's output for parameters theta
    (``mlp_front``'s): what a kernel that reported NOT_PD_R failed on, rebuilt by its wrapper for the
    reference's error message (``errors.r_not_positive_definite``). One forward pass."""
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    return mlp_front(theta, x, sizes, activation, likelihood, Rc, float(jitter),
                     np.empty(n_outputs(sizes, likelihood)), bias)[5]


@numba.njit(cache=True, error_model="numpy")
def unit_input_norms(h, sizes, os, bias=True):
    """|h~_l|^2 = 1 + |h_l|^2 (|h_l|^2 without biases) for every output unit u = os[l] + j of
    layer l: (units,)."""
    nl = sizes.shape[0] - 1
    _, _, hs, _, _ = _offsets(sizes, bias)
    out = np.empty(os[nl])
    for l in range(nl):
        s = 1.0 if bias else 0.0
        for kk in range(sizes[l]):
            v = h[hs[l] + kk]
            s += v * v
        for j in range(sizes[l + 1]):
            out[os[l] + j] = s
    return out


@numba.njit(cache=True, error_model="numpy")
def _symmetric_from_lower(A):
    n = A.shape[0]
    for a in range(n):
        for c in range(a):
            A[c, a] = A[a, c]


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def _chunk_product(ESt, Wt, scale, r0, nr, Zc, Wc):
    """Zc[:, :nr] = ESt (mm, L) @ (Wt[:, r0:r0 + nr] diag(scale[:nr])): ``_blocks.tile_matmul`` on a
    row-scaled copy of the block's rows in Wc (L, >= nr) (in cache); scale holds the block's row scales.
    Zc (mm, >= nr) and Wc: a chunk's block buffers (``_blocks.block_buffer``). Returns Zc."""
    L = Wt.shape[0]
    sc = scale[:nr]
    for a in range(L):
        wa = Wt[a, r0:r0 + nr]
        wc = Wc[a]
        for t in range(nr):
            wc[t] = wa[t] * sc[t]
    tile_matmul(ESt, Wc, 0, nr, Zc)  # (zeros where L = 0)
    return Zc


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def _combine_unit(Zc, z0, Fu, hl, i0, n, rank, dinv, ubar, out_mean, out_ups, out_Wt, acc):
    """Rows i0 <= i < i0 + n of one unit (h~ = hl[:n]; Zc column z0 + i - i0 holds row i of
    diag(scale) W S E, and dinv = 1 / ubar, ubar at index z0 + i - i0 that row's predict): column c
    of W~ V is Zc[c] + h~ Fu[c]. Writes W' (columns c < rank) into out_Wt, mu' = mu + (g - W~ c)_i /
    ubar_i (column ``rank``; out_mean holds mu) and ups' = ubar + the squares of the discarded
    columns (c > rank) into out_ups."""
    mm = Zc.shape[0]
    for c in range(rank):
        zr = Zc[c, z0:z0 + n]
        orow = out_Wt[c, i0:i0 + n]
        f = Fu[c]
        for kk in range(n):
            orow[kk] = zr[kk] + hl[kk] * f
    for kk in range(n):
        acc[kk] = 0.0
    for c in range(rank + 1, mm):
        zr = Zc[c, z0:z0 + n]
        f = Fu[c]
        for kk in range(n):
            z = zr[kk] + hl[kk] * f
            acc[kk] += z * z
    zr = Zc[rank, z0:z0 + n]
    f = Fu[rank]
    om = out_mean[i0:i0 + n]
    ou = out_ups[i0:i0 + n]
    dv = dinv[z0:z0 + n]
    ub = ubar[z0:z0 + n]
    for kk in range(n):
        om[kk] += (zr[kk] + hl[kk] * f) * dv[kk]
        ou[kk] = ub[kk] + acc[kk]


def _chunks(sizes, w0, b0):
    """The chunks of the passes over the parameters, each a run of contiguous rows of one layer:
    whole units' weights (about ROWS_PER_CHUNK rows; kind 0), all of the layer's biases (kind 1; none
    where b0[l] = -1, a network without biases), or, for a unit with more than WIDE_UNIT inputs, a piece
    of PIECE_ROWS of its rows (kind 2). Rows (nch, 6): first row r0, rows nr, layer l, first unit j0,
    kind, and the piece's first row within its unit (0 for kinds 0 and 1). The chunks depend on
    ``sizes`` alone, so that sums added in chunk order do not depend on the threads. Plain Python, run
    once per network (``_layout``): compiled, it cost the first step about 2 s of compile time."""
    sizes = [int(s) for s in sizes]
    rows = []
    for l in range(len(sizes) - 1):
        n_in, n_out = sizes[l], sizes[l + 1]
        if n_in > WIDE_UNIT:
            for j in range(n_out):
                for k0 in range(0, n_in, PIECE_ROWS):
                    rows.append((int(w0[l]) + j * n_in + k0, min(PIECE_ROWS, n_in - k0), l, j, 2, k0))
        else:
            per = max(1, ROWS_PER_CHUNK // max(1, n_in))
            for j0 in range(0, n_out, per):
                rows.append((int(w0[l]) + j0 * n_in, min(per, n_out - j0) * n_in, l, j0, 0, 0))
        if b0[l] >= 0:
            rows.append((int(b0[l]), n_out, l, 0, 1, 0))
    return np.array(rows, dtype=np.int64).reshape(len(rows), 6)


@numba.njit(nogil=True, cache=True, fastmath=CONTRACT, error_model="numpy")
def _predict_scale(ups, gamma, q, qstride, i0, n, rb):
    """Rows i0 <= i < i0 + n of the exact DLR predict (Chang et al. 2023, eqs 13-25), into the
    block-sized buffer rb (>= 4, >= n), row i at column i - i0: rb[0] = ubar = ups / (gamma^2 + q ups),
    rb[1] = dinv = 1 / ubar, rb[2] = scale = gamma D (the row scale of W) and rb[3] = D, with
    D = ubar / ups = 1 / (gamma^2 + q ups). q is q[0] (qstride 0: a scalar) or q[i] (qstride 1).
    Pass 2 reads these; pass 1 adds the Gram weights (``_predict_rows``). Both passes call it for
    their block, so that no P-sized buffer is written in pass 1 and read in pass 2."""
    g2 = gamma * gamma
    ubar, dinv, scale, dd = rb[0], rb[1], rb[2], rb[3]
    # the rows as views from 0, and q read as qv[t] or qv[0]: LLVM vectorises this loop, which it did
    # not do when it was indexed by i0 + t and (i0 + t) * qstride
    uv = ups[i0:i0 + n]
    qv = q[i0:i0 + n] if qstride else q[:1]
    for t in range(n):
        u = uv[t]
        den = g2 + (qv[t] if qstride else qv[0]) * u
        d = 1.0 / den
        ubar[t] = u * d
        dinv[t] = den / u
        scale[t] = gamma * d
        dd[t] = d


@numba.njit(nogil=True, cache=True, fastmath=CONTRACT, error_model="numpy")
def _predict_rows(ups, gamma, q, qstride, i0, n, rb):
    """``_predict_scale`` into rb (6, >= n), then the Gram weights of pass 1 over the same rows:
    rb[3] = wq = q D (in place of D), rb[4] = w1 = scale^2 and rb[5] = w2 = scale^2 / ubar."""
    _predict_scale(ups, gamma, q, qstride, i0, n, rb)
    dinv, scale, wq, w1, w2 = rb[1], rb[2], rb[3], rb[4], rb[5]
    qv = q[i0:i0 + n] if qstride else q[:1]
    for t in range(n):
        wq[t] = (qv[t] if qstride else qv[0]) * wq[t]
        s = scale[t]
        w1[t] = s * s
        w2[t] = w1[t] * dinv[t]


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _pass1_chunk(ch, chunks, ups, gamma, q, qstride, Wt, anyq, h, hs, sizes, os, parts, Tt, TDt, Z, piece):
    """Chunk ``ch`` of pass 1: its predict rows (``_predict_rows``, block by block); parts[ch] (L, 3 L) = [W^T diag(w1) W | W^T diag(w2) W |
    W^T diag(wq) W] over its rows (lower triangles; the last only when anyq); and its share of the
    per-unit sums over the rows of Y0 = diag(scale) W, in slot 0 (weights) or 1 (biases) of
    Tt[s, a, u] = sum_k h~_k Y0[i, a], TDt[s, a, u] = sum_k h~_k Y0[i, a] / ubar_i and
    Z[s, u] = sum_k h~_k^2 / ubar_i, or, for a piece of a wide unit (kind 2), in its own row of
    piece (nch, 2 L + 1) = [Tt | TDt | Z] (``_pass1_sums`` adds the pieces in chunk order). parts,
    Tt, TDt, Z and piece are zero on entry. A piece is walked by blocks of BLOCK_ROWS rows, each block's
    predict rows, Gram tiles and sums made while its rows are in cache, and added block by block."""
    r0, nr, l, j0, kind, k0 = chunks[ch, 0], chunks[ch, 1], chunks[ch, 2], chunks[ch, 3], chunks[ch, 4], chunks[ch, 5]
    L = Wt.shape[0]
    n_in = sizes[l]
    wide = kind == 2
    step = BLOCK_ROWS if wide else nr
    tile = np.zeros((L, 3 * L))
    part = parts[ch]
    hl = h[hs[l]:hs[l] + n_in]
    nseg = min(step, n_in) if kind != 1 else 1
    h1 = np.empty(nseg)  # h~_k scale_i over a unit's rows (or a block of them)
    h2 = np.empty(nseg)  # h~_k scale_i / ubar_i
    rb = np.empty((6, min(step, nr)))
    dinv, scale, wq, w1, w2 = rb[1], rb[2], rb[3], rb[4], rb[5]
    for b0 in range(0, nr, step):
        nk = min(step, nr - b0)
        i0 = r0 + b0
        _predict_rows(ups, gamma, q, qstride, i0, nk, rb)
        if L > 0:
            if anyq:  # the three Gram matrices in one sweep of W's rows
                gram_tiles(Wt, w1, w2, i0, nk, tile, wq)
            else:
                gram_tiles(Wt, w1, w2, i0, nk, tile[:, :2 * L])
            for a in range(L):
                for b in range(a + 1):
                    part[a, b] += tile[a, b]
                    part[a, L + b] += tile[a, L + b]
                    part[a, 2 * L + b] += tile[a, 2 * L + b]
        if kind == 1:  # the layer's biases: h~ = 1
            for jj in range(nk):
                i = i0 + jj
                u = os[l] + j0 + jj
                Z[1, u] = dinv[jj]
                for a in range(L):
                    Tt[1, a, u] = Wt[a, i] * scale[jj]
                    TDt[1, a, u] = Wt[a, i] * scale[jj] * dinv[jj]
            continue
        # segments of one unit each: whole units, or the block of a wide unit's piece
        seg = nk if wide else n_in
        for s0 in range(0, nk, seg):
            u = os[l] + j0 + (0 if wide else s0 // n_in)
            base = i0 + s0
            hk = hl[k0 + b0:k0 + b0 + seg] if wide else hl
            dv = dinv[s0:s0 + seg]
            sv = scale[s0:s0 + seg]
            for kk in range(seg):
                h1[kk] = hk[kk] * sv[kk]
                h2[kk] = h1[kk] * dv[kk]
            z = _sum_sq_weighted(hk, dv)
            if wide:
                piece[ch, 2 * L] += z
            else:
                Z[0, u] = z
            for a in range(L):
                d1, d2 = _row_dot2(h1[:seg], h2[:seg], Wt[a, base:base + seg])
                if wide:
                    piece[ch, a] += d1
                    piece[ch, L + a] += d2
                else:
                    Tt[0, a, u] = d1
                    TDt[0, a, u] = d2


@numba.njit(cache=True, fastmath=REDUCE, error_model="numpy")
def _row_dot2(x1, x2, w):
    """(sum_k x1_k w_k, sum_k x2_k w_k) in one pass over w."""
    s1 = 0.0
    s2 = 0.0
    for k in range(w.shape[0]):
        s1 += x1[k] * w[k]
        s2 += x2[k] * w[k]
    return s1, s2


@numba.njit(cache=True, fastmath=REDUCE, error_model="numpy")
def _sum_sq_weighted(h, d):
    """sum_k h_k^2 d_k."""
    z = 0.0
    for kk in range(h.shape[0]):
        z += h[kk] * h[kk] * d[kk]
    return z


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _pass1_range(chunks, ups, gamma, q, qstride, Wt, anyq, h, hs, sizes, os, parts, Tt, TDt, Z, piece, ch0, ch1):
    """``_pass1_chunk`` over the chunks ch0 <= ch < ch1 (each chunk writes its own slots; the threads of
    ``_host.run_chunks`` each take a contiguous range)."""
    for ch in range(ch0, ch1):
        _pass1_chunk(ch, chunks, ups, gamma, q, qstride, Wt, anyq, h, hs, sizes, os, parts, Tt, TDt, Z, piece)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _pass2_chunk(ch, chunks, ups, gamma, q, qstride, ESt, Wt, F, h, hs, sizes, os, rank, out_mean, out_ups, out_Wt,
                 bad):
    """Chunk ``ch`` of the outputs (eqs 38-42): the predict rows again (``_predict_scale``, the same
    numbers as pass 1's), the product with W (``_chunk_product``), then the rows of its units
    (``_combine_unit``); a piece of a wide unit (kind 2) by blocks of BLOCK_ROWS rows, so that each
    block's product stays in cache. bad[ch] = whether the chunk's outputs hold NaN or inf (each block
    checked while it is in cache)."""
    r0, nr, l, j0, kind, k0 = chunks[ch, 0], chunks[ch, 1], chunks[ch, 2], chunks[ch, 3], chunks[ch, 4], chunks[ch, 5]
    n_in = sizes[l]
    step = BLOCK_ROWS if kind == 2 else nr
    hl = h[hs[l]:hs[l] + n_in]
    acc = np.empty(min(step, n_in) if kind != 1 else nr)
    rb = np.empty((4, min(step, nr)))
    ubar, dinv, scale = rb[0], rb[1], rb[2]
    Zbuf = block_buffer(ESt.shape[0], min(step, nr))  # the blocks' product and scaled rows, allocated once
    Wc = block_buffer(Wt.shape[0], min(step, nr))
    b = False
    for b0 in range(0, nr, step):
        nk = min(step, nr - b0)
        i0 = r0 + b0
        _predict_scale(ups, gamma, q, qstride, i0, nk, rb)
        Zc = _chunk_product(ESt, Wt, scale, i0, nk, Zbuf, Wc)
        if kind == 1:  # the layer's biases (h~ = 1): each unit's F row into its column of Zc, then one pass
            mm = Zc.shape[0]
            for c in range(mm):
                zc = Zc[c]
                for jj in range(nr):
                    zc[jj] += F[os[l] + j0 + jj, c]
            _combine_unit(Zc, np.int64(0), np.zeros(mm), np.zeros(nr), r0, nr, rank, dinv, ubar, out_mean, out_ups,
                          out_Wt, acc)
        elif kind == 2:
            _combine_unit(Zc, np.int64(0), F[os[l] + j0], hl[k0 + b0:k0 + b0 + nk], i0, nk, rank, dinv, ubar,
                          out_mean, out_ups, out_Wt, acc)
        else:
            for jj in range(nr // n_in):
                _combine_unit(Zc, jj * n_in, F[os[l] + j0 + jj], hl, r0 + jj * n_in, n_in, rank, dinv, ubar,
                              out_mean, out_ups, out_Wt, acc)
        b = b or nonfinite_vec(out_mean[i0:i0 + nk]) or nonfinite_vec(out_ups[i0:i0 + nk])
        for c in range(rank):
            b = b or nonfinite_vec(out_Wt[c, i0:i0 + nk])
    bad[ch] = b


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _pass2_range(chunks, ups, gamma, q, qstride, ESt, Wt, F, h, hs, sizes, os, rank, out_mean, out_ups, out_Wt, bad,
                 ch0, ch1):
    """``_pass2_chunk`` over the chunks ch0 <= ch < ch1 (each chunk writes its own rows)."""
    for ch in range(ch0, ch1):
        _pass2_chunk(ch, chunks, ups, gamma, q, qstride, ESt, Wt, F, h, hs, sizes, os, rank, out_mean, out_ups,
                     out_Wt, bad)


def middle_work(L, k, units):
    """The workspace of ``mlp_lofi_middle`` for L columns of W, a (k, C) whitener and ``units`` units:
    (G, N (K, K), b (K,), S (L, L), DeT (units, k), Gam (units,)), K = L + k, C-contiguous views of
    one allocation."""
    K = L + k
    e = _WORK_ENDS.get((L, k, units))
    if e is None:
        e = _WORK_ENDS[(L, k, units)] = [int(v) for v in np.cumsum([0, K * K, K * K, K, L * L, units * k, units])]
    buf = np.empty(e[6])
    return (buf[e[0]:e[1]].reshape(K, K), buf[e[1]:e[2]].reshape(K, K), buf[e[2]:e[3]], buf[e[3]:e[4]].reshape(L, L),
            buf[e[4]:e[5]].reshape(units, k), buf[e[5]:e[6]])


_WORK_ENDS = {}  # (L, k, units) -> the ends of middle_work's six arrays in its one allocation


@numba.njit(cache=True, error_model="numpy")
def _middle_sums(G0, N0, Mq, Tt, TDt, Z, anyq, Dl, hn2, yh, M, A, target, G, N, b, S, DeT, Gam):
    """The assembly of ``mlp_lofi_middle``: G = W~^T W~, N = W~^T D~ W~, b = W~^T D~ g (K = L + k),
    the predict's square root S (anyq), the whitened unit coefficients Delta^T (units, k) and Gamma
    (units,), written into the workspace (``middle_work``). Returns OK, BAD (non-finite) or NOT_PD_PRED."""
    L = G0.shape[0]
    NO = Z.shape[0]
    Cf = Dl.shape[0]
    C = yh.shape[0]
    k = A.shape[0]
    _symmetric_from_lower(G0)
    _symmetric_from_lower(N0)
    # the square root S (S S^T = (I + M)^{-1}) from M = W^T diag(q D) W; then G_W = W_bar^T W_bar =
    # S^T (Y0^T Y0) S and N_W = W_bar^T D~ W_bar likewise; the unit sums of W_bar are S^T times those
    # of Y0, applied below to their (L, k) products rather than to the (L, units) sums
    Li = np.empty((L, L))
    if anyq:
        status = root_of_gram(Mq, Li)
        if status:
            return BAD if status == 1 else NOT_PD_PRED
        for a in range(L):  # S^T = Li
            for c in range(L):
                S[a, c] = Li[c, a]
        G0 = blas_matmul(Li, blas_matmul(G0, S))
        N0 = blas_matmul(Li, blas_matmul(N0, S))

    # the whitened unit coefficients Delta (k, NO), Gamma (NO,)
    e = target - yh
    Ae = np.zeros(k)
    for r in range(k):
        for c in range(C):
            Ae[r] += A[r, c] * e[c]
    w = np.zeros(C)
    for c in range(C):
        for r in range(k):
            w[c] += A[r, c] * Ae[r]
    AM = np.zeros((k, Cf))
    for r in range(k):
        for cf in range(Cf):
            s = 0.0
            for c in range(C):
                s += A[r, c] * M[c, cf]
            AM[r, cf] = s
    wt = np.zeros(Cf)
    for cf in range(Cf):
        for c in range(C):
            wt[cf] += M[c, cf] * w[c]
    Delta = blas_matmul(AM, Dl)  # (k, NO)
    for u in range(NO):
        Gam[u] = 0.0
    for cf in range(Cf):
        wc = wt[cf]
        dl = Dl[cf]
        for u in range(NO):
            Gam[u] += wc * dl[u]
    for u in range(NO):
        for r in range(k):
            DeT[u, r] = Delta[r, u]

    # G, N and b over W~ = [W_bar, X]: the sums over units as dot products of rows; the (k, k) blocks
    # from their lower triangle, mirrored, so that G and N are exactly symmetric
    for a in range(L):
        for c in range(L):
            G[a, c] = G0[a, c]
            N[a, c] = N0[a, c]
    GX = np.empty((L, k))
    NX = np.empty((L, k))
    GXX = np.empty((k, k))
    NXX = np.empty((k, k))
    unit_sums(Tt, TDt, Delta, hn2, Z, GX, NX, GXX, NXX)
    bW = np.zeros((L, 1))  # TD^T Gamma
    for a in range(L):
        for u in range(NO):
            bW[a, 0] += TDt[a, u] * Gam[u]
    if anyq:  # the sums of W_bar = Y0 S: S^T times those of Y0
        GX = blas_matmul(Li, GX)
        NX = blas_matmul(Li, NX)
        bW = blas_matmul(Li, bW)
    for r in range(k):
        for a in range(L):
            G[a, L + r] = G[L + r, a] = GX[a, r]
            N[a, L + r] = N[L + r, a] = NX[a, r]
        for s2 in range(r + 1):
            G[L + r, L + s2] = G[L + s2, L + r] = GXX[r, s2]
            N[L + r, L + s2] = N[L + s2, L + r] = NXX[r, s2]
        s = 0.0
        for u in range(NO):
            s += Delta[r, u] * Z[u] * Gam[u]
        b[L + r] = s
    for a in range(L):
        b[a] = bW[a, 0]
    if nonfinite_mat(G) or nonfinite_mat(N) or nonfinite_vec(b):
        return BAD
    return OK


@numba.njit(cache=True, error_model="numpy")
def mlp_lofi_middle(G0, N0, Mq, Tt, TDt, Z, anyq, Dl, hn2, yh, M, A, target, rank, force, drop, G, N, b, S, DeT,
                    Gam, Vt_in, info):
    """The small algebra of the one-call MLP step between its two passes over the parameters, compiled
    (called through ``lofi_middle``, which the CPU kernel and the GPU step share).

    Inputs, the sums of pass 1: G0 = Y0^T Y0, N0 = Y0^T D~ Y0, Mq = W^T diag(q D) W (L, L; lower
    triangles, anyq: whether Mq is used), the per-unit sums Tt, TDt (L, units) and Z (units,); and the
    forward/reverse pass: Dl (C_f, units) and |h~_l|^2 of each unit's inputs, hn2 (units,)
    (``unit_input_norms``); the likelihood moments yh (C,), M (C, C_f), the whitener A (k, C) of R
    (A^T A = R^{-1} or R^+, ``_whiten``) and the target (C,). drop: leave the discarded directions
    out of the outputs, so that ups' = ubar (spherical LO-FI, eqs 116-118; else they go into ups',
    eqs 41-42). G, N, b, S, DeT, Gam: the workspace ``middle_work(L, k, units)``.
    Vt_in: the right singular vectors of W~'s R factor (nz, nz) when the host computed them (after a
    NEEDS_SVD), else an empty (0, 0).
    Returns (ESt (mm, L), F (units, mm)): row i = (l, j, k) of the outputs [W' | g - W~ c | discarded]
    (no discarded columns with drop) is scale_i W[i] ESt^T + h~_k F[u] (``_combine_unit``). info[0] =
    OK or a failure code (the outputs are then empty), or NEEDS_SVD: the eigenvectors of G are not
    accurate enough here, and the first output is the R factor (nz, nz) whose SVD the host computes
    before calling again with it as Vt_in and the same workspace: that call reads the sums over the
    units from the workspace instead of forming them again (the inputs before it are then not read);
    info[1] = the guard's eps * cond^2.
    """
    L = G0.shape[0]
    NO = Z.shape[0]
    k = A.shape[0]
    K = L + k
    if Vt_in.shape[0] == 0:
        status = _middle_sums(G0, N0, Mq, Tt, TDt, Z, anyq, Dl, hn2, yh, M, A, target, G, N, b, S, DeT, Gam)
        if status != OK:
            info[0] = status
            return np.zeros((0, 0)), np.zeros((0, 0))

    # the one-Gram route and its guard (eps * cond^2 of the column-scaled W~)
    d, idx, Gs = scaled_gram(G)
    nz = idx.shape[0]
    L1 = np.empty((nz, nz))
    err = np.inf
    if nz > 0 and chol_lower(Gs, L1):
        # cond(Gs) <= |Gs|_F |Gs^{-1}|_F <= |Gs|_F |L1^{-1}|_F^2 (an upper bound, within a factor K)
        Li1 = np.empty((nz, nz))
        lower_inverse(L1, Li1)
        err = EPS * np.sqrt(np.sum(Gs * Gs)) * np.sum(Li1 * Li1)
    info[1] = err
    if not (err <= TAU_GRAM or (force and np.isfinite(err))):
        info[0] = FALLBACK
        return np.zeros((0, 0)), np.zeros((0, 0))

    # mean (eq. 38) and right singular vectors (eq. 39)
    Lk = np.empty((K, K))
    if not chol_lower(N, Lk, 1.0):  # I + N
        info[0] = NOT_PD_CORE
        return np.zeros((0, 0)), np.zeros((0, 0))
    cvec = np.empty(K)
    chol_solve(Lk, b, cvec)
    # the right singular vectors of W~ (eq. 39). The R factor carries the errors of G itself,
    # |dG_ab| <~ eps sqrt(G_aa G_bb), i.e. about eps in the column-scaled Gs; an eigensolver on G adds a
    # backward error of a small multiple of eps |G|_2 <= eps |G|_F, i.e. eps |G|_F / min_a G_aa in Gs.
    # Its error in V is then at most |G|_F / min_a G_aa times the guard's err (>= eps |Gs^{-1}|). Where
    # that product still passes the guard, V comes from the eigenvectors of G (sym_eig: a third of the
    # time of an SVD on these sizes); elsewhere, or if sym_eig does not converge, from dgesvd on R.
    fro = 0.0
    gmin = np.inf
    for i in range(nz):
        gmin = min(gmin, G[idx[i], idx[i]])
        for j in range(nz):
            fro += G[idx[i], idx[j]] * G[idx[i], idx[j]]
    by_eig = err * (np.sqrt(fro) / gmin) <= TAU_GRAM
    given = Vt_in.shape[0] == nz and nz > 0
    Vt = Vt_in if given else np.empty((nz, nz))
    by_eig = by_eig and not given
    if by_eig:
        Gz = np.empty((nz, nz))
        for i in range(nz):
            for j in range(i + 1):
                Gz[i, j] = G[idx[i], idx[j]]
        _, ev, by_eig = sym_eig(Gz)  # ascending eigenvalues; by_eig False if QL did not converge
        for j in range(nz):
            for i in range(nz):
                Vt[j, i] = ev[i, nz - 1 - j]
    if not by_eig and not given:  # the host takes the SVD of the R factor and calls again
        Rf = np.zeros((nz, nz))
        for i in range(nz):
            for j in range(i, nz):
                Rf[i, j] = L1[j, i] * d[idx[j]]
        info[0] = NEEDS_SVD
        return Rf, np.zeros((0, 0))
    Vf = np.zeros((K, nz))
    for i in range(nz):
        for j in range(nz):
            Vf[idx[i], j] = Vt[j, i]
    keep = min(rank, nz)
    m = 0 if drop else nz - keep
    mm = rank + m + 1

    # output coefficients: column c of W~ V at row i = (l, j, k) is W_bar[i] EW[:, c] + h~_k F[u, c]
    # over the columns [W' (rank) | g - W~ c | discarded (m)]
    EW = np.zeros((L, mm))
    for a in range(L):
        for j in range(keep + m):
            EW[a, j if j < keep else rank + 1 + j - keep] = Vf[a, j]
        EW[a, rank] = -cvec[a]
    Vm = np.zeros((k, mm))  # the whitened rows of V and of -c, in the output columns
    for r in range(k):
        for j in range(keep + m):
            Vm[r, j if j < keep else rank + 1 + j - keep] = Vf[L + r, j]
        Vm[r, rank] = -cvec[L + r]
    F = blas_matmul(DeT, Vm)  # (NO, mm)
    for u in range(NO):
        F[u, rank] += Gam[u]
    if anyq:
        EW = blas_matmul(S, EW)
    ESt = np.ascontiguousarray(EW.T)
    info[0] = OK
    return ESt, F


_NO_VT = np.zeros((0, 0))  # "no singular vectors given" (empty, so never written)


def middle_signature():
    """The argument types with which ``mlp_lofi_kernel`` calls ``mlp_lofi_middle`` (through ``lofi_middle``):
    the same for every network, likelihood and q, as ``tests/test_threads.py`` checks."""
    m2 = numba.types.Array(numba.types.float64, 2, "C")
    m1 = numba.types.Array(numba.types.float64, 1, "C")
    b = numba.types.boolean
    return (m2, m2, m2, m2, m2, m1, b, m2, m1, m1, m2, m2, m1, numba.types.int64, b, b, m2, m2, m1, m2, m2, m1,
            m2, m1)


def compile_middle():
    """Compile ``mlp_lofi_middle`` for ``middle_signature()`` into the kernel cache (the helper process of
    ``_compile_helper``)."""
    mlp_lofi_middle.compile(middle_signature())


def _start_helper():
    """Whether this step started the helper process that compiles ``mlp_lofi_middle`` (``_compile_helper``):
    only when the kernel cache of these sources did not exist when ``refbayes.kernels.cpu`` was imported
    and the function has not been compiled or loaded in this process yet (nor replaced by a plain Python
    function, as tests do)."""
    from . import FIRST_USE

    if not FIRST_USE:  # every later step of a process that found the cache: one check (the list of
        return False   # compiled signatures took about 15 microseconds per step)
    done = getattr(mlp_lofi_middle, "signatures", None)
    return done is not None and not done and _compile_helper.start()


def _whiten(R, singular):
    """A (k, C) with A^T A = R^{-1} (A = chol(R)^{-1}, k = C) or, ``singular``, R^+ over the
    eigenvalues above 10 C eps max(w) (as ``_host.whitener``). Raises the reference's
    NotPositiveDefiniteError if R is not positive (semi-)definite (``errors.r_not_positive_definite``:
    its message names a variance <= 0, what a saturated probability gives). On the host: LAPACK on
    a C x C matrix takes microseconds, and kept out of the compiled step it takes nothing from the
    first call's compile time."""
    C = R.shape[0]
    if C == 0:
        return np.zeros((0, 0))
    key = None
    if not singular:  # a Gaussian's R is the same every step: its whitener is kept (a few, by R's bytes)
        key = R.tobytes()
        A = _WHITENERS.get(key)
        if A is not None:
            return A
    Rs = 0.5 * (R + R.T)
    if not singular:
        Lc, status = _potrf(Rs, lower=1, clean=1)
        if status == 0:
            A, status = _trtri(Lc, lower=1)
        if status != 0:
            raise r_not_positive_definite(Rs)
        if len(_WHITENERS) >= 16:
            _WHITENERS.clear()
        A.setflags(write=False)
        _WHITENERS[key] = A
        return A
    return _host.whitener(Rs, singular=True)


_WHITENERS = {}  # bytes of R (C, C) -> its whitener, read-only: the callers copy it (lofi_middle)


def lofi_middle(G0, N0, Mq, Tt, TDt, Z, anyq, Dl, hn2, yh, M, R, lik, jitter, target, rank, force, info, drop=False):
    """The small algebra of the one-call LO-FI MLP step (``mlp_lofi_middle``), shared by the CPU kernel
    and the GPU step: whitens R (``_whiten``, which raises the reference's error if R is not positive
    definite), runs the
    compiled algebra and, where the eigenvectors of G are not accurate enough for the right singular
    vectors of W~ (eq. 39), takes the SVD of its R factor here and runs it again. Arguments as
    ``mlp_lofi_middle``, with R (C, C), the likelihood code lik and its jitter instead of A (drop: the
    spherical variant's outputs); returns
    (ESt, F), or (None, None) with the failure code in info[0]."""
    A = _whiten(R, lik == 2 and jitter == 0.0)  # raises the reference's error for R
    A = np.array(A, order="C")  # one argument type (LAPACK's factors come column-major): one compilation
    drop = bool(drop)
    work = middle_work(G0.shape[0], A.shape[0], Z.shape[0])
    ESt, F = mlp_lofi_middle(G0, N0, Mq, Tt, TDt, Z, anyq, Dl, hn2, yh, M, A, target, rank, force, drop, *work, _NO_VT,
                             info)
    if info[0] == NEEDS_SVD:
        try:
            Vt = np.array(np.linalg.svd(ESt)[2], order="C")  # the type of _NO_VT: no second compilation
        except np.linalg.LinAlgError:  # the SVD did not converge: the general route decides
            info[0] = FALLBACK
            return None, None
        # the second call reads the sums over the units from work: only the decomposition is done again
        ESt, F = mlp_lofi_middle(G0, N0, Mq, Tt, TDt, Z, anyq, Dl, hn2, yh, M, A, target, rank, force, drop, *work,
                                 Vt, info)
    return (ESt, F) if info[0] == OK else (None, None)


_LAYOUTS = {}  # (sizes, bias) -> (hs, chunks), read-only: the passes' layout depends on the network alone


def _layout(sizes, bias):
    """(hs (nl + 1,), chunks (nch, 6)) of a network: the start of each layer's activations and the
    chunks of the passes (``_chunks``), computed once per network."""
    key = (sizes.tobytes(), bool(bias))
    lay = _LAYOUTS.get(key)
    if lay is None:
        # _offsets' Python code: its compiled form is built for the compiled callers' argument types
        w0, b0, hs, _, _ = _offsets.py_func(sizes, bool(bias))
        chunks = _chunks(sizes, w0, b0)
        hs.setflags(write=False)
        chunks.setflags(write=False)
        lay = _LAYOUTS[key] = (hs, chunks)
    return lay


def _pass1_sums(parts, Tt2, TDt2, Z2, piece, chunks, h, sizes, os, bias):
    """Pass 1's chunk sums added in chunk order (so that the numbers do not depend on the threads):
    (G0, N0, Mq) (L, L) lower triangles (upper zero) from parts (nch, L, 3 L), and Tt, TDt
    (L, units), Z (units,), each the weights' slot (where the pieces of a wide unit, ``piece``, are
    added in chunk order) plus the biases' slot; last, |h~|^2 of each unit's inputs
    (``unit_input_norms``). NumPy: a few microseconds per step, and no compile time."""
    L = parts.shape[1]
    sums = np.add.reduce(parts, axis=0)  # row after row of chunks, in chunk order
    pieces = np.flatnonzero(chunks[:, 4] == 2)
    if pieces.size:
        units = os[chunks[pieces, 2]] + chunks[pieces, 3]
        np.add.at(Tt2[0].T, units, piece[pieces, :L])  # np.add.at adds repeated indices one after the other
        np.add.at(TDt2[0].T, units, piece[pieces, L:2 * L])
        np.add.at(Z2[0], units, piece[pieces, 2 * L])
    sums[_upper_mask(L)] = 0.0  # the three blocks' lower triangles, upper parts zero (np.tril's numbers)
    return (np.ascontiguousarray(sums[:, :L]), np.ascontiguousarray(sums[:, L:2 * L]),
            np.ascontiguousarray(sums[:, 2 * L:]), Tt2[0] + Tt2[1], TDt2[0] + TDt2[1], Z2[0] + Z2[1],
            unit_input_norms(h, sizes, os, bias))


_MASKS = {}


def _upper_mask(L):
    """(L, 3 L) bool: three copies of the strictly upper-triangular (L, L) mask side by side (read-only,
    cached per L)."""
    m = _MASKS.get(L)
    if m is None:
        m = _MASKS[L] = np.tile(~np.tri(L, dtype=bool), 3)
        m.setflags(write=False)
    return m


def mlp_lofi_kernel(theta, ups, Wt, x, target, sizes, bias, act, lik, Rc, jitter, rank, force, gamma, q, qstride,
                    out_mean, out_ups, out_Wt, yhat, info, drop=False):
    """Predict (gamma, q) then update; writes out_mean, out_ups (P,), out_Wt (rank, P) = W'^T and
    yhat (C,). Wt (L, P) is the prior factor transposed; bias: whether the layers have biases.

    Called one after the other from the host: ``mlp_front`` (forward and reverse passes and likelihood
    moments at the predicted mean gamma mu), pass 1 over chunks of rows (``_pass1_range``: the predict rows,
    and the Gram matrices and per-unit sums; W_bar = Y0 S with Y0 = diag(gamma D) W, eq. P5, is never
    formed), ``_pass1_sums`` (the chunk sums, NumPy), ``lofi_middle`` (the small algebra; its whitening
    of R and its rare SVD on the host) and pass 2 (``_pass2_range``: the predict rows again, and the
    outputs). Both passes compute the predict rows block by block into cache-sized buffers: writing
    them to P-sized arrays in pass 1 and reading them back in pass 2 cost more memory traffic than the
    division per row that recomputing them takes. The passes go to ``_host.run_chunks``'s threads when the step may use several
    (``refbayes.threads``); each chunk writes its own slots and the sums are added in chunk order, so the
    numbers do not depend on the threads. (Calls from Python rather than one compiled function: a
    compiled caller generates the machine code of all its callees again, about 4 s of the first call's
    compile time, against a few microseconds per step for the extra calls.)

    info[0] = OK, FALLBACK (the one-Gram route fails its guard; the outputs are then undefined
    but for yhat), NOT_PD_CORE, NOT_PD_PRED (I + q W^T D W) or BAD (non-finite); an R that is not
    positive definite raises the reference's error (``_whiten``); info[1] = eps * cond^2 of the
    column-scaled W~. force: take the one-Gram route whatever its
    guard says (tests). gamma = 1, q = 0 is the update alone. drop: the spherical variant (the discarded
    directions are dropped, ups' = ubar).
    """
    L, P = Wt.shape
    # the first step of a fresh installation: the small algebra compiles in a helper process meanwhile
    helper = _start_helper()
    hs, chunks = _layout(sizes, bias)
    nch = chunks.shape[0]
    np.multiply(theta, gamma, out=out_mean)  # the predicted mean gamma mu, where the network is linearised
    # (a float32 belief's in float64, so that the forward and reverse passes compile once, for float64)
    lin = out_mean if out_mean.dtype == np.float64 else np.multiply(theta, gamma, dtype=np.float64)
    h, os, Dl, yh, M, R = mlp_front(lin, x, sizes, act, lik, Rc, jitter, yhat, bias)
    NO = int(os[-1])
    anyq = L > 0 and bool(np.any(q[:1 if qstride == 0 else P] > 0.0))
    parts = np.zeros((nch, L, 3 * L))
    Tt2, TDt2 = np.zeros((2, 2, L, NO))
    Z2 = np.zeros((2, NO))
    piece = np.zeros((nch, 2 * L + 1))
    rows = chunks[:, 1]
    _host.run_chunks(_pass1_range, nch, chunks, ups, gamma, q, qstride, Wt, anyq, h, hs, sizes, os, parts, Tt2, TDt2,
                     Z2, piece, rows=rows)
    G0, N0, Mq, Tt, TDt, Z, hn2 = _pass1_sums(parts, Tt2, TDt2, Z2, piece, chunks, h, sizes, os, bias)
    if helper:  # compile pass 2 while the helper compiles the small algebra, then load that from the cache
        _pass2_range.compile(tuple(numba.typeof(v) for v in (
            chunks, ups, gamma, q, qstride, np.empty((1, 1)), Wt, np.empty((1, 1)), h, hs, sizes, os, rank, out_mean,
            out_ups, out_Wt, np.zeros(1, np.bool_), 0, 1)))
        _compile_helper.wait()
    ESt, F = lofi_middle(G0, N0, Mq, Tt, TDt, Z, anyq, Dl, hn2, yh, M, R, lik, jitter, target, rank, force, info,
                         drop)
    if info[0] != OK:
        return
    bad = np.zeros(nch, np.bool_)
    _host.run_chunks(_pass2_range, nch, chunks, ups, gamma, q, qstride, ESt, Wt, F, h, hs, sizes, os, rank, out_mean,
                     out_ups, out_Wt, bad, rows=rows)
    info[0] = BAD if bad.any() else OK


def lofi_mlp_step(sizes, activation, likelihood, Rc, jitter, mean, ups, W, x, target, rank, gamma=1.0, q=0.0,
                  force=False, bias=None, spherical=False):
    """LO-FI predict then update (Chang et al. 2023, eqs 13-25 and 26-43) of an MLP's DLR belief for
    one observation, in one call (five compiled functions, ``mlp_lofi_kernel``).

    sizes: the layer sizes (n_0, ..., n_L); activation: code from ``mlp.ACTIVATION_CODES``;
    likelihood: code from ``LIKELIHOOD_CODES``; Rc (C, C): the Gaussian noise covariance
    (jitter included; ignored otherwise); jitter: added to a categorical R.
    mean, ups: (P,); W: (P, L0); x: (n_0,); target: T(y) (C,); rank L >= 0;
    gamma > 0, q >= 0 (scalar or (P,)): the dynamics (gamma = 1, q = 0: update only);
    bias: whether the layers have biases (None: read from P, see ``mlp.layer_bias``; False for
    ``rb.Linear(bias=False)``).
    spherical: the spherical variant (Chang et al. 2023, eqs 110-118) for ups = eta * 1 and W with
    orthogonal columns (what this step returns): its predict is the exact DLR predict above (eqs
    110-111 are that predict for such a W), its mean (eq. 116) the diagonal variant's (both use the
    untruncated precision), W' the same, and the discarded directions are dropped (eq. 118), so
    ups' = ubar = eta / (gamma^2 + q eta), the same for every parameter.
    Returns (mean (P,), ups (P,), W (P, rank), yhat (C,)) as new arrays — W column-major, so
    that the next call reads W^T without a copy — or None when the one-Gram route would not be
    accurate (the caller then takes the general route). Raises NotPositiveDefiniteError on
    numerical failure.
    """

    P, bias, C, qv, qstride = host_inputs(sizes, likelihood, mean, q, bias)
    dt = arrays_dtype(mean, ups, W)
    mean = _host.as_f64(mean, "mean", (P,), dtype=dt)
    ups = _host.as_f64(ups, "ups", (P,), dtype=dt)
    out_mean = np.empty(P, dt)
    out_ups = np.empty(P, dt)
    out_Wt = np.empty((rank, P), dt)
    yhat = np.empty(C)
    info = np.zeros(2)
    with _host.blas_threads(1):
        # W^T (L, P) read-only: free for a column-major W (what the step returns), and one argument
        # type whether W is a belief's (read-only) or a prior's, so the kernel compiles once
        Wt = _host.as_f64(W, "W", (P, None), transpose=True, dtype=dt)
        mlp_lofi_kernel(mean, ups, Wt, x, target, sizes, bias, activation, likelihood, Rc, float(jitter), rank,
                        bool(force), float(gamma), qv, qstride, out_mean, out_ups, out_Wt, yhat, info, bool(spherical))
    if raise_status(int(info[0]), mean=mean, ups=ups, W=W, x=x):
        return None
    return out_mean, out_ups, out_Wt.T, yhat


def raise_status(status, **inputs):
    """The error of a failed one-call LO-FI MLP step (this kernel's or the GPU's) for ``status``
    (``_status.raise_status`` for "LO-FI step"); True for FALLBACK (the caller takes the general
    route), False for OK. ``inputs`` name the arrays checked for a bad input before an overflow is reported."""
    return _raise_status(status, "LO-FI step", **inputs)


def lofi_mlp_update(sizes, activation, likelihood, Rc, jitter, mean, ups, W, x, target, rank, force=False, bias=None):
    """The LO-FI update alone (Chang et al. 2023, eqs 26-43): ``lofi_mlp_step`` with gamma = 1, q = 0."""
    return lofi_mlp_step(sizes, activation, likelihood, Rc, jitter, mean, ups, W, x, target, rank, force=force,
                         bias=bias)
