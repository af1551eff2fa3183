"""One BLR inner iteration over the DLR family for an MLP with LIN-HESS, from the per-unit structure of
the estimate's factor (Jones, Chang & Murphy 2024, eqs 293-308).

``bong.dlr_blr`` takes the factor U = H^T A^T (P, k) of LIN-HESS as k dense columns, so its pass,
its two Gram matrices and its output product all run over n = L + R + k columns of
W~ = [sqrt(1 - alpha) W, sqrt(alpha) W_p, sqrt(alpha) U]. For an MLP, U is rank one per output unit
u = (l, j) (``bong_mlp``): parameter i = (l, j, m) has U_{i,r} = h~_m Delta_{r,u}, with h~ = [h_l, 1]
the unit's inputs. Every sum over the parameters that involves U then folds into sums over each
unit's rows, and only the n0 = L + R dense columns Y0 = [sqrt(1 - alpha) W, sqrt(alpha) W_p] are
read as rows of P:

    W~^T W~       = [[Y0^T Y0, ra T Delta^T], [., alpha Delta diag(|h~_u|^2) Delta^T]]
    W~^T D W~     = [[Y0^T D Y0, ra TD Delta^T], [., alpha Delta diag(Z_u) Delta^T]]
    W~^T D rhs    = [Y0^T D rhs; ra Delta Rr]

with D = diag(1 / ups~), ra = sqrt(alpha), T[c, u] = sum_{i in u} h~_i Y0[i, c],
TD[c, u] = sum_{i in u} h~_i Y0[i, c] / ups~_i, Z_u = sum_{i in u} h~_i^2 / ups~_i and
Rr_u = sum_{i in u} h~_i r0_i. The n x n algebra is ``bong.blr_small`` (the same as the dense
step's), and the output product is W~ E = Y0 E0 + (per unit) h~_i (ra Delta^T E_U)[u].

Two passes over the rows, chunk by chunk of the network (``step._chunks``, whole units or a piece
of a wide unit) and block by block of at most BLR_BLOCK rows; nothing of size P is written between
them. Pass 1 (``blr_unit_pass1``) builds each block's rows of Y0 in a block buffer and takes the
per-row numbers of ``bong.blr_load``, the Gram tiles, Y0 r0, W_p^T delta and the per-unit sums
from it while it is in cache. Pass 2 (``blr_unit_pass2``) makes the per-row numbers again, the
block's rows of Y0 E0 from the rows of W^T and W_p^T (``_blocks.tile_matmul``, Y0's scales taken
into E0) and the outputs of ``bong.blr_out``: the new mean, diagonal and W. Both run on the kernel
threads (``_host.run_chunks``) over groups of CHUNK_GROUP chunks, every sum of pass 1 in a slot of
its own (a group's, a unit's chunk's, a piece's), added by the host in a fixed order: the same
numbers on any thread count.

Numbers: those of ``bong.dlr_blr`` (and so of the reference) to round-off. Where the dense step
would end with its small-gap truncation (``bong._blr_fused_truncate``), or any guard fails, this
route returns None and the caller runs the dense step, which decides and names any failure.
Networks without biases (``rb.Linear(bias=False)``): h~ = h and no bias rows.
"""

import numba
import numpy as np

from .. import _host
from ._blocks import CONTRACT, REDUCE, block_buffer, nonfinite_mat, nonfinite_vec, tile_matmul, unit_sums
from ._status import BAD_ESTIMATE, OK
from .bong import DROP_TOL, TRUNC_TOL, blr_mean_ups, blr_rows, blr_small
from .bong_mlp import _hess_units, _unit_offsets
from .lofi import gram_tiles
from .mlp import _offsets, _row_dot, layer_bias
from .step import _layout, n_outputs, unit_input_norms

__all__ = ["mlp_blr_lin_hess_iteration"]

#: rows per block of both passes: the block's rows of Y0 (n0 = L + R of them, 4 KB each) stay in the L2
#: cache while the Gram tiles, the per-unit sums and the output product read them; a chunk of whole
#: units (``step.ROWS_PER_CHUNK`` rows) is one block
BLR_BLOCK = 512
#: chunks per slot of pass 1's Gram sums: the slots' count, and the host's sum over them, stay small
#: (a chunk is about 512 rows), and the threads split the passes at group boundaries
CHUNK_GROUP = 8
_GROUPS = {}


def _groups(chunks):
    """(number of groups of CHUNK_GROUP chunks, rows of each group (ng,)), cached per chunk table."""
    key = chunks.tobytes()
    g = _GROUPS.get(key)
    if g is None:
        nch = chunks.shape[0]
        ng = -(-nch // CHUNK_GROUP)
        rows = np.add.reduceat(chunks[:, 1], np.arange(0, nch, CHUNK_GROUP)) if nch else np.zeros(0, np.int64)
        rows.setflags(write=False)
        g = _GROUPS[key] = (ng, rows)
    return g


@numba.njit(cache=True, error_model="numpy")
def lin_hess_units(theta, x, target, sizes, bias, act, lik, Rc, jitter, yhat, info):
    """The LIN-HESS estimate at ``theta`` without its factor: (h, Delta (k, units), Gamma (units,)), so
    that U_{i,r} = h~_i Delta_{r,u} and g_i = h~_i Gamma_u (Gamma = Delta^T A e, the numbers of
    ``bong_mlp.mlp_lin_factor``'s g); writes yhat (C,). info[0] = OK or the status of
    ``bong_mlp.mlp_lin_factor_kernel`` (NOT_PD_R, BAD_MODEL, BAD_ESTIMATE)."""
    h, Delta, gam, Ae, status = _hess_units(theta, x, target, sizes, bias, act, lik, Rc, jitter, yhat)
    if status == OK and (nonfinite_vec(gam) or nonfinite_mat(Delta)):
        status = BAD_ESTIMATE
    info[0] = status
    return h, Delta, gam


@numba.njit(cache=True, error_model="numpy")
def _per_row(sizes, bias, h, val, out, square, add):
    """out[i] = h~_i val[u] (``square``: h~_i^2 val[u]; ``add``: added to out[i]) for every parameter i
    of unit u; val (units,), out (P,)."""
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, _ = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        for j in range(sizes[l + 1]):
            v = val[os[l] + j]
            o = out[w0[l] + j * n_in:w0[l] + (j + 1) * n_in]
            for m in range(n_in):
                t = hl[m] * hl[m] * v if square else hl[m] * v
                o[m] = o[m] + t if add else t
            if bias:
                out[b0[l] + j] = out[b0[l] + j] + v if add else v


@numba.njit(cache=True, error_model="numpy")
def _block_units(chunk, b0, nb, sizes, h, hs, os, hb, seg):
    """The units of rows b0 <= t < b0 + nb of one chunk (``step._chunks``: whole units, a layer's biases
    or a piece of a wide unit): hb[t - b0] = h~ of that row, and seg[s] = (first row, end, unit) of each
    run of rows of one unit, relative to the block. Returns the number of runs."""
    l, j0, kind, k0 = chunk[2], chunk[3], chunk[4], chunk[5]
    n_in = sizes[l]
    hl = h[hs[l]:hs[l] + n_in]
    u0 = os[l] + j0
    if kind == 1:  # the layer's biases: h~ = 1, one unit per row
        for t in range(nb):
            hb[t] = 1.0
            seg[t, 0] = t
            seg[t, 1] = t + 1
            seg[t, 2] = u0 + b0 + t
        return nb
    if kind == 2:  # a piece of one wide unit, from its input k0
        for t in range(nb):
            hb[t] = hl[k0 + b0 + t]
        seg[0, 0] = 0
        seg[0, 1] = nb
        seg[0, 2] = u0
        return 1
    ns = 0  # whole units of n_in rows from the chunk's first row
    t = 0
    while t < nb:
        off = b0 + t
        m = off % n_in
        run = min(n_in - m, nb - t)
        seg[ns, 0] = t
        seg[ns, 1] = t + run
        seg[ns, 2] = u0 + off // n_in
        for s in range(run):
            hb[t + s] = hl[m + s]
        ns += 1
        t += run
    return ns


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def _load_block(Wt, Wpt, i0, nb, ra1, ra, Yb):
    """Yb[:, :nb] = the block's rows of Y0 = [sqrt(1 - a) W, sqrt(a) W_p]^T (ra1 = sqrt(1 - a), ra = sqrt(a))."""
    L = Wt.shape[0]
    for c in range(L):
        yr = Yb[c, :nb]
        wr = Wt[c, i0:i0 + nb]
        for t in range(nb):
            yr[t] = ra1 * wr[t]
    for c in range(Wpt.shape[0]):
        yr = Yb[L + c, :nb]
        wr = Wpt[c, i0:i0 + nb]
        for t in range(nb):
            yr[t] = ra * wr[t]


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def _row_numbers(i0, nb, hb, seg, ns, gam, mean, ups, mean_p, ups_p, a, rb):
    """The per-row numbers of ``bong.blr_load`` (``bong.blr_rows``) for the block's rows i0 <= i < i0 + nb,
    row i at column i - i0 of rb (5, >= nb), with g_i = h~_i gam_u: rb[0] = ups~ = (1 - a) ups + a ups_p,
    rb[1] = 1 / ups~, rb[2] = r0 = (g + ups_p delta) / ups~, rb[3] = delta = mu_p - mu and rb[4] = g. Both
    passes call it for their block, so that no P-sized array is written in pass 1 and read in pass 2."""
    g = rb[4]
    for s in range(ns):
        lo, hi, u = seg[s, 0], seg[s, 1], seg[s, 2]
        gv = gam[u]
        gr = g[lo:hi]
        hr = hb[lo:hi]
        for t in range(hi - lo):
            gr[t] = hr[t] * gv
    j = slice(i0, i0 + nb)
    blr_rows(g[:nb], ups[j], ups_p[j], mean[j], mean_p[j], a, rb[0, :nb], rb[1, :nb], rb[3, :nb], rb[2, :nb])


@numba.njit(cache=True, fastmath=REDUCE, error_model="numpy")
def _block_sums(Yb, nb, i0, hb, seg, ns, Wpt, rb, hd, bd, wpd, T, TD, ZD, Rr):
    """The block's shares of b = Y0 r0 (bd), W_p^T delta (wpd) and the per-unit sums T, TD, ZD, Rr of
    ``blr_unit_pass1``, added to them; rb: the block's rows (``_row_numbers``); hd: a (>= nb,) buffer."""
    n0 = Yb.shape[0]
    db = rb[1, :nb]
    r0 = rb[2, :nb]
    for c in range(n0):
        bd[c] += _row_dot(Yb[c, :nb], r0)
    for c in range(Wpt.shape[0]):
        wpd[c] += _row_dot(Wpt[c, i0:i0 + nb], rb[3, :nb])
    for s in range(ns):
        lo, hi, u = seg[s, 0], seg[s, 1], seg[s, 2]
        hr = hb[lo:hi]
        dr = db[lo:hi]
        hdv = hd[lo:hi]
        for t in range(hi - lo):
            hdv[t] = hr[t] * dr[t]
        ZD[u] += _row_dot(hdv, hr)
        Rr[u] += _row_dot(hr, r0[lo:hi])
        for c in range(n0):
            yr = Yb[c, lo:hi]
            T[c, u] += _row_dot(yr, hr)
            TD[c, u] += _row_dot(yr, hdv)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def blr_unit_pass1(Wt, Wpt, gam, h, hs, chunks, sizes, mean, ups, mean_p, ups_p, a, parts, bparts, wparts, T2, TD2,
                   ZD2, Rr2, piece, g0, g1):
    """Pass 1 over the rows of the chunk groups g0 <= g < g1 (CHUNK_GROUP chunks of the network each,
    ``step._chunks``), block by block of at most BLR_BLOCK rows: each block's rows of
    Y0 (n0, P) = [sqrt(1 - a) W, sqrt(a) W_p]^T (from Wt (L, P) and Wpt (Rp, P)) and of ``_row_numbers``
    are made in block buffers and used while in cache, for the group's shares of the lower triangles
    of [Y0 Y0^T | Y0 D Y0^T] (parts[g] (n0, 2 n0), ``lofi.gram_tiles`` on each block), of Y0 r0
    (bparts[g] (n0,)) and of W_p^T delta (wparts[g] (Rp,)), and the per-unit sums
    T[c, u] = sum_{i in u} h~_i Y0[c, i], TD[c, u] (the same with 1 / ups~_i), ZD[u] = sum h~_i^2 / ups~_i
    and Rr[u] = sum h~_i r0_i, with g_i = h~_i gam_u: in slot 0 (a unit's weights) or 1 (its bias) of
    T2, TD2 (2, n0, units), ZD2, Rr2 (2, units), or, for a piece of a wide unit, in its chunk's row of
    piece (nch, 2 n0 + 2) = [T | TD | ZD | Rr]. Every slot is written by one chunk (zeros on entry), so
    the caller's sums, taken in group and chunk order, do not depend on the threads. Nothing P-sized
    is written."""
    L, P = Wt.shape
    Rp = Wpt.shape[0]
    n0 = L + Rp
    nch = chunks.shape[0]
    os = _unit_offsets(sizes)
    ra1 = np.sqrt(1.0 - a)
    ra = np.sqrt(a)
    BS = BLR_BLOCK
    Yb = np.empty((n0, BS))
    rb = np.empty((5, BS))
    hb = np.empty(BS)
    hd = np.empty(BS)
    seg = np.empty((BS, 3), np.int64)
    tmp = np.zeros((n0, 2 * n0))
    Tk, TDk = np.empty((2, n0, 1))  # a piece's sums (its one unit at index 0)
    ZRk = np.empty((2, 1))
    for g in range(g0, g1):
        M0 = parts[g]
        for ch in range(g * CHUNK_GROUP, min((g + 1) * CHUNK_GROUP, nch)):
            chunk = chunks[ch]
            c0, nr, kind = chunk[0], chunk[1], chunk[4]
            if kind == 2:
                Tk[:] = 0.0
                TDk[:] = 0.0
                ZRk[:] = 0.0
                T, TD, ZD, Rr = Tk, TDk, ZRk[0], ZRk[1]
            else:
                T, TD, ZD, Rr = T2[kind], TD2[kind], ZD2[kind], Rr2[kind]
            for b0 in range(0, nr, BS):
                nb = min(BS, nr - b0)
                i0 = c0 + b0
                ns = _block_units(chunk, b0, nb, sizes, h, hs, os, hb, seg)
                _load_block(Wt, Wpt, i0, nb, ra1, ra, Yb)
                _row_numbers(i0, nb, hb, seg, ns, gam, mean, ups, mean_p, ups_p, a, rb)
                gram_tiles(Yb, None, rb[1], 0, nb, tmp)
                for p in range(n0):
                    for q in range(p + 1):
                        M0[p, q] += tmp[p, q]
                        M0[p, n0 + q] += tmp[p, n0 + q]
                if kind == 2:
                    seg[0, 2] = 0  # the piece's unit, at index 0 of its own sums
                _block_sums(Yb, nb, i0, hb, seg, ns, Wpt, rb, hd, bparts[g], wparts[g], T, TD, ZD, Rr)
            if kind == 2:
                pr = piece[ch]
                for c in range(n0):
                    pr[c] = Tk[c, 0]
                    pr[n0 + c] = TDk[c, 0]
                pr[2 * n0] = ZRk[0, 0]
                pr[2 * n0 + 1] = ZRk[1, 0]


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def _block_out(Zb, nb, i0, hb, seg, ns, F, du, Wt, Wpt, ra1, ra, rb, mean, a, out_mean, out_ups, out_Wt):
    """The outputs of the block's rows (``bong.blr_out`` on them): Zb (m, >= nb) holds the dense part
    E0^T Y0 of each row; U's part h~_i F[c, u] is added, then W+ = rows c < R (R = m - 1) of Z into
    out_Wt, ups+ = ups~ + s2 - |W+_i|^2 with s2 = |W~_i|^2 (the rows of Y0 from Wt, Wpt, then U's
    a h~_i^2 |Delta_u|^2 = h~_i^2 du[u], as ``bong.blr_load`` and the units add them) and
    mu+ = mu + a (r0 + Z[R] / ups~); rb: the block's rows (``_row_numbers``). Returns (rows with a
    non-finite output or ups+ <= 0, whether W+ holds NaN or inf)."""
    m = Zb.shape[0]
    R = m - 1
    L = Wt.shape[0]
    for s in range(ns):
        lo, hi, u = seg[s, 0], seg[s, 1], seg[s, 2]
        hr = hb[lo:hi]
        for c in range(m):
            f = F[c, u]
            zr = Zb[c, lo:hi]
            for t in range(hi - lo):
                zr[t] = zr[t] + hr[t] * f
    ou = out_ups[i0:i0 + nb]
    for t in range(nb):
        ou[t] = 0.0
    for c in range(L):
        wr = Wt[c, i0:i0 + nb]
        for t in range(nb):
            y = ra1 * wr[t]
            ou[t] += y * y
    for c in range(Wpt.shape[0]):
        wr = Wpt[c, i0:i0 + nb]
        for t in range(nb):
            y = ra * wr[t]
            ou[t] += y * y
    for s in range(ns):
        lo, hi, u = seg[s, 0], seg[s, 1], seg[s, 2]
        v = du[u]
        orr = ou[lo:hi]
        hr = hb[lo:hi]
        for t in range(hi - lo):
            orr[t] += hr[t] * hr[t] * v
    bad_w = False
    for c in range(R):
        zr = Zb[c, :nb]
        ow = out_Wt[c, i0:i0 + nb]
        for t in range(nb):
            w = zr[t]
            ow[t] = w
            ou[t] -= w * w
        bad_w = bad_w or nonfinite_vec(ow)
    nbad = blr_mean_ups(rb[0, :nb], ou, mean[i0:i0 + nb], rb[2, :nb], Zb[R, :nb], rb[1, :nb], a,
                        out_mean[i0:i0 + nb])
    return nbad, bad_w


@numba.njit(cache=True, error_model="numpy")
def blr_unit_assemble(M0, bd, T, TD, Zh, ZD, Rr, Delta, ra):
    """(M (n, 2n), b0 (n,)): the lower triangles of G = W~^T W~ and N = W~^T D W~ and b0 = W~^T D rhs
    over all n = n0 + k columns, from the dense rows' M0 (n0, 2 n0) (``gram_blocks``), bd = Y0 r0 (n0,)
    and the per-unit sums (``blr_unit_sums``); U's columns are ra h~_i Delta_{r,u}."""
    n0 = M0.shape[0]
    k, NO = Delta.shape
    n = n0 + k
    M = np.zeros((n, 2 * n))
    b0 = np.empty(n)
    for i in range(n0):
        b0[i] = bd[i]
        for j in range(i + 1):
            M[i, j] = M0[i, j]
            M[i, n + j] = M0[i, n0 + j]
    a = ra * ra
    GX = np.empty((n0, k))
    NX = np.empty((n0, k))
    GXX = np.empty((k, k))
    NXX = np.empty((k, k))
    unit_sums(T, TD, Delta, Zh, ZD, GX, NX, GXX, NXX)
    for r in range(k):
        for c in range(n0):
            M[n0 + r, c] = ra * GX[c, r]
            M[n0 + r, n + c] = ra * NX[c, r]
        for r2 in range(r + 1):
            M[n0 + r, n0 + r2] = a * GXX[r, r2]
            M[n0 + r, n + n0 + r2] = a * NXX[r, r2]
        b0[n0 + r] = ra * _row_dot(Delta[r], Rr)
    return M, b0


@numba.njit(nogil=True, cache=True, error_model="numpy")
def blr_unit_pass2(E, Delta, gam, Wt, Wpt, h, hs, chunks, sizes, mean, ups, mean_p, ups_p, a, out_mean, out_ups,
                   out_Wt, g0, g1):
    """Pass 2 over the same chunk groups g0 <= g < g1 and blocks as ``blr_unit_pass1`` (each chunk writes
    its own rows of the outputs): each block's rows of Z = E^T W~^T (E (n0 + k, m), ``bong.blr_small``'s):
    the dense part E[:n0]^T Y0 from the block's rows of Wt and Wpt
    (``_blocks.tile_matmul``, Y0's scales sqrt(1 - a) and sqrt(a) taken into E), plus U's part
    h~_i F[c, u] with F[c, u] = sqrt(a) sum_r Delta[r, u] E[n0 + r, c]; then the outputs of
    ``bong.blr_out`` (``_block_out``, from the block's rows of ``_row_numbers`` made again): out_Wt (m - 1, P),
    out_ups, out_mean (P,). Returns the number of rows with a non-finite output or ups+ <= 0, plus one
    when W+ holds NaN or inf."""
    L, P = Wt.shape
    n0 = L + Wpt.shape[0]
    k, NO = Delta.shape
    m = E.shape[1]
    os = _unit_offsets(sizes)
    ra1 = np.sqrt(1.0 - a)
    ra = np.sqrt(a)
    du = np.zeros(NO)  # a |Delta_u|^2: U's part of each row's squared norm s2
    for u in range(NO):
        for r in range(k):
            du[u] += Delta[r, u] * Delta[r, u]
        du[u] *= a
    Ew = ra1 * np.ascontiguousarray(E[:L].T)  # Y0's scales moved onto E: Y0 is not formed
    Ep = ra * np.ascontiguousarray(E[L:n0].T)
    F = np.empty((m, NO))
    for c in range(m):
        for u in range(NO):
            f = 0.0
            for r in range(k):
                f += Delta[r, u] * E[n0 + r, c]
            F[c, u] = ra * f
    BS = BLR_BLOCK
    Zb = block_buffer(m, BS)
    rb = np.empty((5, BS))
    hb = np.empty(BS)
    seg = np.empty((BS, 3), np.int64)
    nbad = 0
    bad_w = False
    for ch in range(g0 * CHUNK_GROUP, min(g1 * CHUNK_GROUP, chunks.shape[0])):
        chunk = chunks[ch]
        c0, nr = chunk[0], chunk[1]
        for b0 in range(0, nr, BS):
            nb = min(BS, nr - b0)
            i0 = c0 + b0
            ns = _block_units(chunk, b0, nb, sizes, h, hs, os, hb, seg)
            _row_numbers(i0, nb, hb, seg, ns, gam, mean, ups, mean_p, ups_p, a, rb)
            tile_matmul(Ew, Wt, i0, nb, Zb, False)
            tile_matmul(Ep, Wpt, i0, nb, Zb, True)
            n, bw = _block_out(Zb, nb, i0, hb, seg, ns, F, du, Wt, Wpt, ra1, ra, rb, mean, a, out_mean, out_ups,
                               out_Wt)
            nbad += n
            bad_w = bad_w or bw
    return nbad + (1 if bad_w else 0)


def mlp_blr_lin_hess_iteration(sizes, activation, likelihood, Rc, jitter, mean, ups, W, mean_p, ups_p, W_p, x,
                               target, alpha, bias=None):
    """One BLR inner iteration (0 < alpha < 1) over the DLR family with LIN-HESS for an MLP: the estimate at
    ``mean`` (no factor formed) and the step of ``bong.dlr_blr`` from it, by the per-unit sums above.

    sizes, activation, likelihood, Rc, jitter: the MLP spec of ``bong_mlp.mlp_lin_factor``; mean, ups (P,),
    W (P, L): the current iterate; mean_p, ups_p (P,), W_p (P, R): the prior (its rank R is the
    projection's); x (n_0,), target (C,). Returns (mean, ups, W (P, R) column-major, yhat (C,)), or None
    when this route does not apply (rank 0, alpha = 1, a failed estimate or guard, a small eigen-gap at
    the cut, a bad output): the caller then runs the estimate and ``bong.dlr_blr``, which decide and
    name any failure.
    """
    a = float(alpha)
    if not 0.0 < a < 1.0:
        return None
    P = mean.shape[0]
    bias = layer_bias(sizes, P, bias)
    Wt = _host.as_f64(W, "W", (P, None), transpose=True)
    Wpt = _host.as_f64(W_p, "W_p", (P, None), transpose=True)
    L, Rp = Wt.shape[0], Wpt.shape[0]
    yhat = np.empty(n_outputs(sizes, likelihood))
    info = np.zeros(1)
    with _host.blas_threads(1), np.errstate(all="ignore"):
        h, Delta, gam = lin_hess_units(mean, x, target, sizes, bias, activation, likelihood, Rc, float(jitter), yhat,
                                        info)
        k = Delta.shape[0]
        n0 = L + Rp
        if info[0] != OK or Rp == 0 or n0 + k <= Rp:
            return None
        hs, chunks = _layout(sizes, bias)
        ng, rows = _groups(chunks)
        NO = Delta.shape[1]
        parts = np.zeros((ng, n0, 2 * n0))
        bparts = np.zeros((ng, n0))
        wparts = np.zeros((ng, Rp))
        T2, TD2 = np.zeros((2, 2, n0, NO))
        ZD2, Rr2 = np.zeros((2, 2, NO))
        piece = np.zeros((chunks.shape[0], 2 * n0 + 2))
        _host.run_chunks(blr_unit_pass1, ng, Wt, Wpt, gam, h, hs, chunks, sizes, mean, ups, mean_p, ups_p, a, parts,
                         bparts, wparts, T2, TD2, ZD2, Rr2, piece, rows=rows)
        M0, bd, wpd = np.add.reduce(parts, axis=0), np.add.reduce(bparts, axis=0), np.add.reduce(wparts, axis=0)
        pieces = np.flatnonzero(chunks[:, 4] == 2)
        if pieces.size:  # a wide unit's pieces, added in chunk order (np.add.at: repeated units one by one)
            units = _unit_offsets(sizes)[chunks[pieces, 2]] + chunks[pieces, 3]
            np.add.at(T2[0].T, units, piece[pieces, :n0])
            np.add.at(TD2[0].T, units, piece[pieces, n0:2 * n0])
            np.add.at(ZD2[0], units, piece[pieces, 2 * n0])
            np.add.at(Rr2[0], units, piece[pieces, 2 * n0 + 1])
        T, TD, ZD, Rr = T2[0] + T2[1], TD2[0] + TD2[1], ZD2[0] + ZD2[1], Rr2[0] + Rr2[1]
        Zh = unit_input_norms(h, sizes, _unit_offsets(sizes), bias)
        M, b0 = blr_unit_assemble(M0, bd, T, TD, Zh, ZD, Rr, Delta, np.sqrt(a))
        status, _, _, _, _, E = blr_small(M, b0, wpd, L, Rp, np.sqrt(a), Rp, DROP_TOL, TRUNC_TOL)
        if status != 0:
            return None
        out_mean = np.empty(P)
        out_ups = np.empty(P)
        out_Wt = np.empty((Rp, P))
        if sum(_host.run_chunks(blr_unit_pass2, ng, E, Delta, gam, Wt, Wpt, h, hs, chunks, sizes, mean, ups, mean_p,
                                ups_p, a, out_mean, out_ups, out_Wt, rows=rows)):
            return None
    return out_mean, out_ups, out_Wt.T, yhat
