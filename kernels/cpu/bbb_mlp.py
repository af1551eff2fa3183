"""One BBB inner iteration over the DLR family for an MLP with LIN-HESS, from the per-unit structure of
the estimate's factor (Jones, Chang & Murphy 2024, eqs 319-321).

``bong.dlr_bbb`` takes the factor U = H^T A^T (P, k) of LIN-HESS as k dense columns: its sums pass reads
them for W^T D U, and its output pass copies them block by block for the product (U M_k)^T and for the
rows of Sigma U. For an MLP, U is rank one per output unit u = (l, j) (``bong_mlp``): parameter
i = (l, j, m) has U_{i,r} = h~_m Delta_{r,u}, with h~ = [h_l, 1] the unit's inputs. So

    W^T D U = TD Delta^T,   TD[c, u] = sum_{i in u} h~_i W[i, c] / ups_i,
    (U M_k)_i = h~_i (M_k^T Delta)[:, u],   g_i = h~_i Gamma_u   (Gamma = Delta^T A e),

and the iteration never forms U as a P x k array: the sums pass runs over the dense columns [W, W_p]
only (``bong.bbb_sums``) plus one per-unit pass for TD (``unit_cross_sums``), the mean and 1 / ups
come from one pass (``unit_mean``), and the output pass fills each block's rows of U and of
(U M_k)^T from the block's units while the block is in cache (``bbb_unit_out``), then makes the
outputs as the dense step does (``bong.bbb_block``). The small algebra is the dense step's
(``bong.bbb_small``).

Numbers: those of ``bong.dlr_bbb`` (and so of the reference) to round-off; U's entries themselves are
the same products h~_i Delta_{r,u} that ``bong_mlp.mlp_lin_factor`` writes. Where the dense step would
leave its fused route (rank 0, a failed guard, a bad output) this route returns None and the caller
runs the dense step, which decides and names any failure. Networks without biases
(``rb.Linear(bias=False)``): h~ = h and no bias rows.
"""

import numba
import numpy as np

from .. import _host
from ._blocks import block_buffer, nonfinite_vec, tile_matmul
from ._status import OK
from .blr_mlp import CHUNK_GROUP, _block_units, _groups, _per_row, lin_hess_units
from .bong import BBB_BLOCK, _block_rows, bbb_block, bbb_small, bbb_sums
from .bong_mlp import _unit_offsets
from .mlp import _offsets, _row_dot, layer_bias
from .step import _layout, n_outputs

__all__ = ["mlp_bbb_lin_hess_iteration"]


@numba.njit(cache=True, error_model="numpy")
def unit_cross_sums(Wt, dinv, h, sizes, bias, Delta, NW, col0):
    """NW[c, col0 + r] = (W^T D U)[c, r] = sum_u TD[c, u] Delta[r, u] for U_{i,r} = h~_i Delta_{r,u}, with
    TD[c, u] = sum_{i in u} h~_i Wt[c, i] dinv[i] (Wt (R, P), D = diag(dinv)): each unit's rows of W^T
    against its inputs h~ weighted by 1 / ups, then the k x units product."""
    R = Wt.shape[0]
    k, NO = Delta.shape
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, _ = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    hd = np.empty(int(np.max(sizes[:-1])))
    TD = np.empty((R, NO))
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        for j in range(sizes[l + 1]):
            u = os[l] + j
            lo = w0[l] + j * n_in
            dv = dinv[lo:lo + n_in]
            for m in range(n_in):
                hd[m] = hl[m] * dv[m]
            hdv = hd[:n_in]
            for c in range(R):
                TD[c, u] = _row_dot(Wt[c, lo:lo + n_in], hdv)
            if bias:
                ib = b0[l] + j
                for c in range(R):
                    TD[c, u] += Wt[c, ib] * dinv[ib]
    for c in range(R):
        for r in range(k):
            NW[c, col0 + r] = _row_dot(TD[c], Delta[r])


@numba.njit(cache=True, error_model="numpy")
def unit_mean(g, mean, mean_p, ups, ups_p, Wpt, a, out_mean, dinv):
    """The mean of ``bong.dlr_bbb``, out_mean = mean + a v with v = g + ups_p delta + W_p (W_p^T delta)
    (delta = mean_p - mean, Wpt = W_p^T (Rp, P)), and dinv = 1 / ups, in one compiled pass after the
    Rp sums W_p^T delta. Returns whether every entry of out_mean is finite."""
    Rp, P = Wpt.shape
    delta = np.empty(P)
    for i in range(P):
        delta[i] = mean_p[i] - mean[i]
    wv = np.zeros(P)  # W_p (W_p^T delta), one row of W_p^T after the other
    for r in range(Rp):
        w = Wpt[r]
        cr = _row_dot(w, delta)
        for i in range(P):
            wv[i] += w[i] * cr
    for i in range(P):
        out_mean[i] = mean[i] + a * (g[i] + (ups_p[i] * delta[i] + wv[i]))
        dinv[i] = 1.0 / ups[i]
    return not nonfinite_vec(out_mean)


@numba.njit(cache=True, error_model="numpy")
def _fill_unit_rows(V, seg, ns, hb, nb, out):
    """out[r, t] = hb[t] V[r, u] for each run (first, end, u) of seg and each row r of V (rows, units).
    (Each run's loop indexes slices from 0: see ``_blocks.row_gram``.)"""
    for r in range(V.shape[0]):
        o = out[r]
        for s in range(ns):
            lo, hi = seg[s, 0], seg[s, 1]
            v = V[r, seg[s, 2]]
            orun = o[lo:hi]
            hrun = hb[lo:hi]
            for t in range(hi - lo):
                orun[t] = hrun[t] * v


@numba.njit(nogil=True, cache=True, error_model="numpy")
def bbb_unit_out(EwT, Cp, F, Delta, h, hs, chunks, sizes, Wt, Wpt, ups, ups_p, dinv, a, out_ups, out_Wt, g0, g1):
    """``bong.bbb_out`` with U's rows made from the units: over the chunks of rows of the network
    (``step._chunks``) in the groups g0 <= g < g1 of ``blr_mlp.CHUNK_GROUP`` chunks (each chunk writes
    its own rows; the kernel threads take contiguous runs of groups), block by block of at most
    BBB_BLOCK rows, the block's rows of U^T
    (Uc[r, i] = h~_i Delta[r, u]) and of (U M_k)^T (Zu[c, i] = h~_i F[c, u], F = M_k^T Delta) are filled
    from its units, the products with W^T and W_p^T are ``_blocks.tile_matmul`` on the block's rows, and
    ``bong.bbb_block`` writes the outputs. Returns the number of rows with ups+ non-finite or <= 0, plus
    one when W+ holds NaN or inf."""
    R = Wt.shape[0]
    K = Delta.shape[0]
    os = _unit_offsets(sizes)
    BS = BBB_BLOCK
    zw = np.empty(BS)
    yw = np.empty(BS)
    ss = np.empty(BS)
    hb = np.empty(BS)
    seg = np.empty((BS, 3), np.int64)
    # block buffers, written and read over their first nb columns (bbb_block reads no further)
    Uc = block_buffer(K, BS)
    Zu = block_buffer(R, BS)
    Wc = block_buffer(R, BS)
    Zw = block_buffer(EwT.shape[0], BS)
    Zp = block_buffer(R, BS)
    bad_w = False
    nbad = 0
    for ch in range(g0 * CHUNK_GROUP, min(g1 * CHUNK_GROUP, chunks.shape[0])):
        chunk = chunks[ch]
        r0, nr = chunk[0], chunk[1]
        for b0 in range(0, nr, BS):
            nb = min(BS, nr - b0)
            i0 = r0 + b0
            ns = _block_units(chunk, b0, nb, sizes, h, hs, os, hb, seg)
            _fill_unit_rows(Delta, seg, ns, hb, nb, Uc)
            _fill_unit_rows(F, seg, ns, hb, nb, Zu)
            _block_rows(Wt, i0, nb, Wc)
            tile_matmul(EwT, Wc, 0, nb, Zw)
            tile_matmul(Cp, Wpt, i0, nb, Zp)
            n, bw = bbb_block(Wc, Zw, Zp, Zu, Uc, Wpt, i0, nb, ups, ups_p, dinv, a, out_ups, out_Wt, zw, yw, ss)
            nbad += n
            bad_w = bad_w or bw
    return nbad + (1 if bad_w else 0)


def mlp_bbb_lin_hess_iteration(sizes, activation, likelihood, Rc, jitter, mean, ups, W, mean_p, ups_p, W_p, x,
                               target, alpha, bias=None):
    """One BBB inner iteration (alpha > 0) over the DLR family with LIN-HESS for an MLP: the estimate at
    ``mean`` (no factor formed) and the step of ``bong.dlr_bbb`` from it, by the per-unit sums above.

    sizes, activation, likelihood, Rc, jitter: the MLP spec of ``bong_mlp.mlp_lin_factor``; mean, ups (P,),
    W (P, R): the current iterate; mean_p, ups_p (P,), W_p (P, Rp): the prior; x (n_0,), target (C,).
    Returns (mean, ups, W (P, R) column-major, yhat (C,)), or None when this route does not apply (rank 0,
    a failed estimate, a non-finite mean, a failed guard of the fused step, a bad output): the caller then
    runs the estimate and ``bong.dlr_bbb``, which decide and name any failure.
    """
    a = float(alpha)
    P = mean.shape[0]
    bias = layer_bias(sizes, P, bias)
    Wt = _host.as_f64(W, "W", (P, None), transpose=True)
    Wpt = _host.as_f64(W_p, "W_p", (P, None), transpose=True)
    R, Rp = Wt.shape[0], Wpt.shape[0]
    if R == 0 or not a > 0.0:
        return None
    yhat = np.empty(n_outputs(sizes, likelihood))
    info = np.zeros(1)
    with _host.blas_threads(1):  # the small BLAS products (bbb_small's algebra, M_k^T Delta)
        h, Delta, gam = lin_hess_units(mean, x, target, sizes, bias, activation, likelihood, Rc, float(jitter), yhat,
                                        info)
        if info[0] != OK:
            return None
        K = Delta.shape[0]
        g = np.empty(P)
        _per_row(sizes, bias, h, gam, g, False, False)
        out_mean = np.empty(P)
        dinv = np.empty(P)
        if not unit_mean(g, mean, mean_p, ups, ups_p, Wpt, a, out_mean, dinv):
            return None
        NW = np.empty((R, R + Rp + K))  # W^T D [W, W_p, U]: the dense columns' sums, then U's from the units
        N2w = np.empty((R, R))
        bbb_sums(Wt, Wpt, np.empty((0, P)), dinv, ups_p, NW, N2w)
        unit_cross_sums(Wt, dinv, h, sizes, bias, Delta, NW, R + Rp)
        ok, EwT, Cp, MkT = bbb_small(NW, N2w, Rp)
        if not ok:
            return None
        hs, chunks = _layout(sizes, bias)
        out_ups = np.empty(P)
        out_Wt = np.empty((R, P))
        ng, rows = _groups(chunks)
        F = np.dot(MkT, Delta)  # (R, units)
        if sum(_host.run_chunks(bbb_unit_out, ng, EwT, Cp, F, Delta, h, hs, chunks, sizes, Wt, Wpt, ups, ups_p, dinv, a,
                                out_ups, out_Wt, rows=rows)):
            return None
    return out_mean, out_ups, out_Wt.T, yhat
