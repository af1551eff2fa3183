"""A LO-FI step for an MLP (or ``rb.Linear``) with the belief on the GPU: predict, forward pass,
Jacobian structure, likelihood moments and update as one chain of kernels, the GPU form of
``refbayes.kernels.cpu.step`` (Chang et al. 2023, eqs 13-25 and 26-43; docs/gpu.md).

The belief stays on the device: mean, ups (P,) and W^T (L, P) row-major, so that every pass over the
parameters reads consecutive addresses in consecutive threads; float64, or float32 (each kernel reads
the belief as stored and computes in float64; pass 2 writes the new belief in the belief's dtype and
checks its outputs as stored). Per step only x (n_0,) goes up and yhat
(C,) comes down, plus numbers that grow with the units of the network, never with P:

1. forward pass at mu_bar = gamma mu, layer by layer (``_fwd_partial`` sums slices of each unit's
   inputs, and of |h_l|^2; ``_fwd_finish`` adds them in slice order, applies the activation and
   writes eta and |h_l|^2 into the mailbox that the host reads);
2. the reverse pass, Dl[c, u] = d f_c / d a_u for every output c and unit u (``rev_partial``,
   ``_rev_finish``; Dl lives in the mailbox); the Jacobian itself (C x P) is never formed;
3. pass 1 (``pass1``, one block per slice of at most SEG rows of one unit): the predict rows,
   the Gram matrices Y0^T Y0, Y0^T D~ Y0 and W^T diag(q D) W (rows staged in shared memory, 2 x 2
   blocks of columns per thread), and the per-unit sums T, TD, Z of ``refbayes.kernels.cpu.step``;
   block partials are added in a fixed order by ``_reduce`` into the mailbox;
4. one copy of the mailbox into page-locked host memory; on the host, the small algebra
   (``refbayes.kernels.cpu.step.lofi_middle``, shared with the CPU kernel: the likelihood
   moments, whitening, the (L + C)-sized Gram matrices, the accuracy guard, the right singular
   vectors) from O(units (L + C)) numbers; its two coefficient matrices go up in one copy;
5. pass 2 (``pass2``, two parameters per thread): W', mu' and ups' (eqs 38-42) from the rows of
   W and the two coefficient matrices, and a flag for any non-finite output.

``lofi_predict`` is the predict step alone (pass 1's Gram sums of W, an L x L factor on the host,
``pred_rows``). New beliefs' arrays come from a pool of arrays of collected beliefs (``_take``,
``adopt``); an array that anything else still refers to is never reused.

Every sum over parameters is a per-block partial added in a fixed order, so results do not depend
on scheduling. Kernels that depend on L (columns of W), rank and C_f are compiled once per triple
(``_kernels``); sizes only change launch geometry.
"""

import functools
import math
import threading
import time

import numba
import numpy as np
from numba import cuda

from .._host import blas_threads
from ..cpu.mlp import _offsets, layer_bias
from ..cpu.step import _likelihood, lofi_middle, raise_status
from . import _device, _launch

__all__ = ["lofi_mlp_step", "lofi_predict", "release_pool", "Workspace", "TRANSFERS", "to_device", "to_host"]

TPB = _device.TPB  # threads per block (a power of two), the same in the simulator and on hardware
WARPS = TPB // 32  # warps per block, for the kernels that give each item one warp
SEG = 2048  # rows of one unit per block of pass 1
FSEG = 4096  # inputs of one unit per block of the forward pass
RSEG = 256  # units of the next layer per block of the reverse pass


# -- host <-> device copies (counted, so that tests can check that no P-sized array crosses) ----------------

class _Transfers:
    """Bytes copied between host and device by this module: ``count``, ``total`` and ``largest`` (one copy)."""

    def __init__(self):
        self.reset()

    def reset(self):
        """Forget the counts."""
        self.count = 0
        self.total = 0
        self.largest = 0

    def add(self, nbytes):
        self.count += 1
        self.total += int(nbytes)
        self.largest = max(self.largest, int(nbytes))


TRANSFERS = _Transfers()

#: a dict while a caller (``refbayes bench``) wants the step's time per phase: each phase then waits for
#: the GPU at its end, and its seconds are added under its name. None (the default): no waiting.
PROFILE = None


def _mark(name):
    if PROFILE is None:
        return
    cuda.synchronize()
    now = time.perf_counter()
    PROFILE[name] = PROFILE.get(name, 0.0) + now - PROFILE.get("_t", now)
    PROFILE["_t"] = now


def to_device(a):
    """A device copy of the host array ``a`` (float64 or int64, C order); counted in TRANSFERS."""
    a = np.ascontiguousarray(a)
    TRANSFERS.add(a.nbytes)
    return cuda.to_device(a)


def to_host(d):
    """A host copy of the device array ``d``; counted in TRANSFERS."""
    TRANSFERS.add(d.nbytes)
    return d.copy_to_host()


# -- device functions ---------------------------------------------------------------------------------------
# _act and _dact repeat kernels/cpu/mlp.py's _act and _dact on purpose: those are @njit dispatchers compiled for
# the CPU, these are CUDA device functions inlined into the kernels (math.* in place of np.*). One body for both
# would mean rewriting the CPU ones with numba.extending.register_jitable, a change to every CPU MLP kernel that
# only a GPU run could check; test_cuda_step.py compares the two through the whole step (tanh, relu, elu).

@cuda.jit(device=True, inline="always")
def _act(code, a):
    """The activations of ``refbayes.kernels.cpu.mlp`` (codes 0 tanh, 1 relu, 2 sigmoid, 3 elu, 4 linear)."""
    if code == 0:
        return math.tanh(a)
    if code == 1:
        return a if a > 0.0 else 0.0
    if code == 2:
        return 0.5 * (math.tanh(0.5 * a) + 1.0)
    if code == 3:
        return a if a > 0.0 else math.expm1(a)
    return a


@cuda.jit(device=True, inline="always")
def _dact(code, a, h):
    """act'(a) given h = act(a), as ``refbayes.kernels.cpu.mlp._dact``."""
    if code == 0:
        return 1.0 - h * h
    if code == 1:
        return 1.0 if a > 0.0 else 0.0
    if code == 2:
        return h * (1.0 - h)
    if code == 3:
        return 1.0 if a > 0.0 else h + 1.0
    return 1.0


@cuda.jit(device=True, inline="always")
def slice_row(rr, nw, rb, k0, hb, bi, h):
    """(parameter i, input h~_k) of row rr of a slice of one unit (``Workspace.tab``: first weight row rb,
    inputs k0 to k0 + nw, h_l from hb, bias row bi; the row after the weights is the bias, h~ = 1)."""
    if rr < nw:
        return rb + k0 + rr, h[hb + k0 + rr]
    return bi, 1.0


@cuda.jit(device=True, inline="always")
def locate(i, lay, h):
    """(h~_k, unit u) of parameter i = (l, j, k); lay (layers, 6): first row, weight rows, inputs n_in,
    start of h_l, first unit, 0 (``Workspace.lay``)."""
    l = 0
    while l + 1 < lay.shape[0] and lay[l + 1, 0] <= i:
        l += 1
    rel = i - lay[l, 0]
    if rel < lay[l, 1]:
        n_in = lay[l, 2]
        jj = rel // n_in
        return h[lay[l, 3] + rel - jj * n_in], lay[l, 4] + jj
    return 1.0, lay[l, 4] + rel - lay[l, 1]


# -- kernels that do not depend on L, rank or C_f ----------------------------------------------------------

@cuda.jit
def _fwd_partial(theta, w0l, n_in, h, hin, part):
    """part[r, s] = sum over inputs k of slice s of theta[w0l + r n_in + k] h[hin + k] for the units r, and
    in the last row (r = units) the slice's sum of h[hin + k]^2 (grid (units + 1, slices))."""
    sh = cuda.shared.array(TPB, dtype=numba.float64)
    t = cuda.threadIdx.x
    r = cuda.blockIdx.x
    s = cuda.blockIdx.y
    k1 = min((s + 1) * FSEG, n_in)
    acc = 0.0
    k = s * FSEG + t
    if r == part.shape[0] - 1:
        while k < k1:
            v = h[hin + k]
            acc += v * v
            k += TPB
    else:
        base = w0l + r * n_in
        while k < k1:
            acc += theta[base + k] * h[hin + k]
            k += TPB
    sh[t] = acc
    _device.tree(sh, t)
    if t == 0:
        part[r, s] = sh[0]


@cuda.jit
def _fwd_finish(part, theta, b0l, gamma, code, last, h, dact, hout, box, Cf, l, bad):
    """h[hout + r] = act(gamma (sum_s part[r, s] + b_r)) and dact = act' there for the units r (last layer:
    linear, and eta = h is also copied to box[:Cf]); box[Cf + l] = |h_l|^2 from the last row of part;
    bad[0] = 0 (layer 0). One warp per row of part: its lanes add strided slices, lane 0 adds the 32 lane
    sums in order."""
    sh = cuda.shared.array(TPB, dtype=numba.float64)
    t = cuda.threadIdx.x
    lane = t % 32
    r = cuda.blockIdx.x * WARPS + t // 32
    nu = part.shape[0] - 1
    acc = 0.0
    if r <= nu:
        s = lane
        while s < part.shape[1]:
            acc += part[r, s]
            s += 32
    sh[t] = acc
    cuda.syncthreads()
    if l == 0 and t == 0 and cuda.blockIdx.x == 0:
        bad[0] = 0
    if lane != 0 or r > nu:
        return
    a = 0.0
    for k in range(32):
        a += sh[t + k]
    if r == nu:
        box[Cf + l] = a
        return
    if b0l >= 0:
        a += theta[b0l + r]
    a *= gamma
    if last:
        h[hout + r] = a
        dact[hout + r] = 1.0
        box[r] = a
    else:
        v = _act(code, a)
        h[hout + r] = v
        dact[hout + r] = _dact(code, a, v)


@cuda.jit
def _rev_finish(part, gamma, dact, hl, Dl, out0):
    """Dl[c, out0 + k] = gamma dact[hl + k] sum_s part[s, c, k]: the sensitivities of the units feeding
    the layer whose partial sums are ``part`` (slices, C_f, n_in)."""
    k = cuda.blockIdx.x * TPB + cuda.threadIdx.x
    if k >= part.shape[2]:
        return
    g = gamma * dact[hl + k]
    for c in range(part.shape[1]):
        a = 0.0
        for s in range(part.shape[0]):
            a += part[s, c, k]
        Dl[c, out0 + k] = g * a


@cuda.jit
def _reduce(part_g, gram, npair, part_u, first, units):
    """Blocks b < npair: gram[b] = sum over pass-1 blocks of part_g[b, :] (block tree, fixed order).
    Later blocks, one warp per (v, u): units[v, u] = sum of part_u[v, s] over the slices s of unit u,
    first[u] <= s < first[u + 1] (lanes take strided slices, lane 0 adds the 32 lane sums in order)."""
    sh = cuda.shared.array(TPB, dtype=numba.float64)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    acc = 0.0
    if b < npair:
        s = t
        while s < part_g.shape[1]:
            acc += part_g[b, s]
            s += TPB
        sh[t] = acc
        _device.tree(sh, t)
        if t == 0:
            gram[b] = sh[0]
        return
    lane = t % 32
    item = (b - npair) * WARPS + t // 32
    NO = units.shape[1]
    valid = item < units.shape[0] * NO
    v = item // NO
    u = item - v * NO
    if valid:
        s = first[u] + lane
        while s < first[u + 1]:
            acc += part_u[v, s]
            s += 32
    sh[t] = acc
    cuda.syncthreads()
    if lane == 0 and valid:
        a = 0.0
        for k in range(32):
            a += sh[t + k]
        units[v, u] = a


# -- kernels compiled for one (L, rank, C_f) ---------------------------------------------------------------

_CACHE = {}


def _kernels(L, rank, Cf):
    """The reverse-pass, pass-1 and pass-2 kernels for W with L columns, output rank ``rank`` and C_f
    network outputs (sizes of their local and shared arrays), compiled once per triple."""
    key = (int(L), int(rank), int(Cf))
    if key in _CACHE:
        return _CACHE[key]
    L1 = max(L, 1)
    NBK = (L + 1) // 2  # blocks of two columns of W (the last padded with a zero column when L is odd)
    LP = 2 * NBK
    STAGE = LP + 3  # a staged row of pass 1: W[i, :] (padded), then the weights w1, w2, wq
    NPB = NBK * (NBK + 1) // 2  # block pairs (A, B), A >= B
    NPBD = max(NPB, 1)
    PPT = 1 if NPB <= TPB else (NPB + TPB - 1) // TPB  # block pairs per thread
    G = max(1, TPB // NPBD) if PPT == 1 else 1  # groups of threads sharing a tile's rows
    NP1 = L * (L + 1) // 2  # entries of one of the three Gram matrices
    NPAIR = 3 * NP1
    MMAX = rank + L + Cf + 1  # output columns: rank + (nz - kept) + 1 <= rank + L + C + 1
    ESZ = max(MMAX * L, 1)
    FOFF = MMAX * L  # where F starts in the upload buffer of pass 2

    @cuda.jit
    def rev_partial(theta, w0l, n_in, n_out, gamma, Dl, osl, part):
        """part[s, c, k] = sum over units r of slice s of Dl[c, osl + r] theta[w0l + r n_in + k]
        (grid (ceil(n_in / TPB), slices))."""
        acc = cuda.local.array(Cf, dtype=numba.float64)
        k = cuda.blockIdx.x * TPB + cuda.threadIdx.x
        s = cuda.blockIdx.y
        if k >= n_in:
            return
        for c in range(Cf):
            acc[c] = 0.0
        r1 = min((s + 1) * RSEG, n_out)
        for r in range(s * RSEG, r1):
            w = theta[w0l + r * n_in + k]
            for c in range(Cf):
                acc[c] += Dl[c, osl + r] * w
        for c in range(Cf):
            part[s, c, k] = acc[c]

    @cuda.jit
    def pass1(tab, ups, Wt, q, qstride, qs, gamma, h, pa, pb, part_g, part_u):
        """One block per slice tab[b] = (first weight row of the unit, k0, k1, start of h_l, bias row or -1):
        the predict rows and, over the slice's rows, part_g[p, b] (the lower triangles of
        [W^T diag(w1) W | W^T diag(w2) W | W^T diag(wq) W], entry (a, c), a >= c, of matrix m at
        p = m L (L + 1) / 2 + a (a + 1) / 2 + c) and part_u[:, b] = (T (L), TD (L), Z) of the unit.

        The rows of a tile are staged in shared memory; each Gram entry pair is computed by 2 x 2
        blocks of columns (block pair (pa[j], pb[j])): a thread of group g takes one block pair over the
        tile rows g, g + G, ... (12 sums: 4 entries x 3 weights), and the groups' sums are added in
        group order at the end."""
        shw = cuda.shared.array((TPB, STAGE), dtype=numba.float64)
        red = cuda.shared.array((TPB, 12), dtype=numba.float64)
        sh = cuda.shared.array(TPB, dtype=numba.float64)
        accT = cuda.local.array(L1, dtype=numba.float64)
        accD = cuda.local.array(L1, dtype=numba.float64)
        acc = cuda.local.array((PPT, 12), dtype=numba.float64)
        t = cuda.threadIdx.x
        b = cuda.blockIdx.x
        rb = tab[b, 0]
        k0 = tab[b, 1]
        k1 = tab[b, 2]
        hb = tab[b, 3]
        bi = tab[b, 4]
        nw = k1 - k0
        nrow = nw + (1 if bi >= 0 else 0)
        g2 = gamma * gamma
        grp = t // NPBD if PPT == 1 else 0
        for a in range(L):
            accT[a] = 0.0
            accD[a] = 0.0
        for k in range(PPT):
            for e in range(12):
                acc[k, e] = 0.0
        accZ = 0.0
        for tile in range(0, nrow, TPB):
            rr = tile + t
            if rr < nrow:
                i, hk = slice_row(rr, nw, rb, k0, hb, bi, h)
                u = ups[i]
                qi = q[i] if qstride else qs
                den = g2 + qi * u
                d = 1.0 / den
                dinv = den / u
                sc = gamma * d
                for a in range(L):
                    wa = Wt[a, i]
                    y = sc * wa
                    accT[a] += hk * y
                    accD[a] += hk * y * dinv
                    shw[t, a] = wa
                for a in range(L, LP):
                    shw[t, a] = 0.0
                accZ += hk * hk * dinv
                w1 = sc * sc
                shw[t, LP] = w1
                shw[t, LP + 1] = w1 * dinv
                shw[t, LP + 2] = qi * d
            else:
                for a in range(STAGE):
                    shw[t, a] = 0.0
            cuda.syncthreads()
            n = min(TPB, nrow - tile)
            if NPB > 0 and grp < G:
                for k in range(PPT):
                    j = t - grp * NPB if PPT == 1 else t + k * TPB
                    if j < NPB:
                        a0 = 2 * pa[j]
                        c0 = 2 * pb[j]
                        for r in range(grp, n, G):
                            x0 = shw[r, a0]
                            x1 = shw[r, a0 + 1]
                            y0 = shw[r, c0]
                            y1 = shw[r, c0 + 1]
                            p00 = x0 * y0
                            p01 = x0 * y1
                            p10 = x1 * y0
                            p11 = x1 * y1
                            for m in range(3):
                                wm = shw[r, LP + m]
                                acc[k, 4 * m] += wm * p00
                                acc[k, 4 * m + 1] += wm * p01
                                acc[k, 4 * m + 2] += wm * p10
                                acc[k, 4 * m + 3] += wm * p11
            cuda.syncthreads()
        # the Gram sums: groups added in order (PPT == 1), or each thread's block pairs as they are
        if PPT == 1:
            for e in range(12):
                red[t, e] = acc[0, e]
            cuda.syncthreads()
        for k in range(PPT):
            j = t if PPT == 1 else t + k * TPB
            if j < NPB and (PPT > 1 or t < NPB):
                A = pa[j]
                B = pb[j]
                for e in range(12):
                    v = acc[k, e]
                    if PPT == 1:
                        v = 0.0
                        for gg in range(G):
                            v += red[gg * NPB + j, e]
                    m = e // 4
                    a = 2 * A + (e % 4) // 2
                    c = 2 * B + e % 2
                    if a < L and c <= a:
                        part_g[m * NP1 + a * (a + 1) // 2 + c, b] = v
        for a in range(2 * L + 1):
            if a < L:
                sh[t] = accT[a]
            elif a < 2 * L:
                sh[t] = accD[a - L]
            else:
                sh[t] = accZ
            _device.tree(sh, t)
            if t == 0:
                part_u[a, b] = sh[0]
            cuda.syncthreads()

    @cuda.jit(device=True, inline="always")
    def row(i, lay, h, ups, q, qstride, qs, gamma, mm):
        """For parameter i = (l, j, k): (h~_k, where F[u] starts in ``up``, scale_i, 1 / ubar_i, ubar_i)
        (``locate``)."""
        hk, unit = locate(i, lay, h)
        u = ups[i]
        qi = q[i] if qstride else qs
        den = gamma * gamma + qi * u
        d = 1.0 / den
        return hk, FOFF + unit * mm, gamma * d, den / u, u * d

    @cuda.jit
    def pass2(theta, ups, Wt, q, qstride, qs, gamma, lay, h, up, mm, out_mean, out_ups, out_Wt, bad):
        """Parameters i0 and i1 = i0 + TPB per thread: column c of [W' | g - W~ c | discarded] at row i is
        scale_i W[i] ESt[c] + h~_k F[u, c], with ESt (mm, L) = up[:mm L] and F (units, mm) from up[FOFF:];
        writes W' (c < rank), mu' = mu_bar + column rank / ubar_i and ups' = ubar_i + the discarded
        columns' squares; bad[0] = 1 where an output as stored (rounded, for float32 outputs) is not finite,
        or ups' not positive. Computed in float64 whatever the arrays' dtype. The two rows' values live in
        separate scalars and arrays indexed by constants only, so that they can stay in registers."""
        she = cuda.shared.array(ESZ, dtype=numba.float64)
        w0 = cuda.local.array(L1, dtype=numba.float64)
        w1 = cuda.local.array(L1, dtype=numba.float64)
        t = cuda.threadIdx.x
        j = t
        while j < mm * L:
            she[j] = up[j]
            j += TPB
        cuda.syncthreads()
        P = theta.shape[0]
        i0 = cuda.blockIdx.x * 2 * TPB + t
        if i0 >= P:
            return
        i1 = i0 + TPB
        two = i1 < P
        ib = i1 if two else i0  # the second row read (its outputs are written only when it exists)
        hk0, f0, sc0, dv0, ub0 = row(i0, lay, h, ups, q, qstride, qs, gamma, mm)
        hk1, f1, sc1, dv1, ub1 = row(ib, lay, h, ups, q, qstride, qs, gamma, mm)
        for a in range(L):
            w0[a] = Wt[a, i0]
            w1[a] = Wt[a, ib]
        acc0 = 0.0
        acc1 = 0.0
        ok = True
        for c in range(mm):
            z0 = 0.0
            z1 = 0.0
            for a in range(L):
                e = she[c * L + a]
                z0 += w0[a] * e
                z1 += w1[a] * e
            v0 = sc0 * z0 + hk0 * up[f0 + c]
            v1 = sc1 * z1 + hk1 * up[f1 + c]
            if c < rank:
                out_Wt[c, i0] = v0
                ok = ok and math.isfinite(out_Wt[c, i0])
                if two:
                    out_Wt[c, i1] = v1
                    ok = ok and math.isfinite(out_Wt[c, i1])
            elif c == rank:
                out_mean[i0] = gamma * theta[i0] + v0 * dv0
                ok = ok and math.isfinite(out_mean[i0])
                if two:
                    out_mean[i1] = gamma * theta[i1] + v1 * dv1
                    ok = ok and math.isfinite(out_mean[i1])
            else:
                acc0 += v0 * v0
                acc1 += v1 * v1
        out_ups[i0] = ub0 + acc0
        v0 = out_ups[i0]
        ok = ok and math.isfinite(v0) and v0 > 0.0
        if two:
            out_ups[i1] = ub1 + acc1
            v1 = out_ups[i1]
            ok = ok and math.isfinite(v1) and v1 > 0.0
        if not ok:
            bad[0] = 1

    @cuda.jit
    def pred_rows(mean, ups, Wt, q, qstride, qs, gamma, S, out_mean, out_ups, out_Wt, bad):
        """The predict step row by row (eqs 13-25): out_mean = gamma mu, out_ups = ups / (gamma^2 + q ups)
        and out_W = diag(gamma D) W S, D = 1 / (gamma^2 + q ups), S (L, L); bad[0] = 1 where an output as
        stored is not finite, or ups' not positive."""
        wl = cuda.local.array(L1, dtype=numba.float64)
        i = cuda.blockIdx.x * TPB + cuda.threadIdx.x
        if i >= mean.shape[0]:
            return
        u = ups[i]
        qi = q[i] if qstride else qs
        d = 1.0 / (gamma * gamma + qi * u)
        m = gamma * mean[i]
        v = u * d
        out_mean[i] = m
        out_ups[i] = v
        v = out_ups[i]
        ok = math.isfinite(out_mean[i]) and math.isfinite(v) and v > 0.0
        sc = gamma * d
        for a in range(L):
            wl[a] = Wt[a, i]
        for c in range(L):
            z = 0.0
            for a in range(L):
                z += wl[a] * S[a, c]
            z *= sc
            out_Wt[c, i] = z
            ok = ok and math.isfinite(out_Wt[c, i])
        if not ok:
            bad[0] = 1

    out = (rev_partial, pass1, pass2, NPAIR, MMAX, FOFF, pred_rows)
    _CACHE[key] = out
    return out


# -- host side -------------------------------------------------------------------------------------------------

class Workspace:
    """Device tables and scratch buffers of the step for one network (sizes, bias) and one (L, rank);
    built once (their upload is the only copy that grows with the network, and it happens once).

    Attributes: sizes, bias, P, L, rank, Cf, the layer offsets (w0, b0, hs, os) on the host and, on
    the device, the slice table of pass 1 (``tab``), each unit's first slice (``first``), the layer
    table of pass 2 (``lay``), the Gram block-pair indices, the buffers h, dact and the partials, and
    the two mailboxes: ``box`` (what the host reads after pass 1: eta, the layers' |h_l|^2, Dl, the
    Gram sums and the unit sums, one copy into page-locked ``hbox``) and ``up`` (what pass 2 reads:
    ESt and F, one copy from page-locked ``hup``).
    """

    def __init__(self, sizes, bias, L, rank):
        sizes = np.asarray(sizes, dtype=np.int64)
        self.sizes, self.bias, self.L, self.rank = sizes, bool(bias), int(L), int(rank)
        nl = sizes.shape[0] - 1
        self.nl = nl
        self.Cf = Cf = int(sizes[nl])
        w0, b0, hs, P, nh = _offsets(sizes, self.bias)
        self.w0, self.b0, self.hs, self.P, self.nh = w0, b0, hs, int(P), int(nh)
        os = np.zeros(nl + 1, np.int64)
        for l in range(nl):
            os[l + 1] = os[l] + sizes[l + 1]
        self.os = os
        self.NO = NO = int(os[nl])
        rows, first = [], [0]
        for l in range(nl):
            n_in, n_out = int(sizes[l]), int(sizes[l + 1])
            for j in range(n_out):
                for s, k0 in enumerate(range(0, max(n_in, 1), SEG)):
                    bi = int(b0[l]) + j if (s == 0 and b0[l] >= 0) else -1
                    rows.append((int(w0[l]) + j * n_in, k0, min(k0 + SEG, n_in), int(hs[l]), bi))
                first.append(len(rows))
        self.nslices = len(rows)
        lay = np.zeros((nl, 6), np.int64)
        for l in range(nl):
            lay[l] = (w0[l], sizes[l + 1] * sizes[l], sizes[l], hs[l], os[l], 0)
        (self.rev_partial, self.pass1, self.pass2, self.npair, self.mmax,
         self.foff, _) = _kernels(self.L, self.rank, Cf)
        self.tab = to_device(np.array(rows, dtype=np.int64).reshape(-1, 5))
        self.first = to_device(np.array(first, dtype=np.int64))
        self.lay = to_device(lay)
        self.tril = np.tril_indices(self.L)
        self.h = cuda.device_array(self.nh)
        self.dact = cuda.device_array(self.nh)
        # the mailbox read by the host: [eta (Cf) | |h_l|^2 (nl) | Dl (Cf, NO) | Gram sums | unit sums]
        self.o_dl = Cf + nl
        self.o_gram = self.o_dl + Cf * NO
        self.o_units = self.o_gram + self.npair
        nbox = self.o_units + (2 * self.L + 1) * NO
        box = np.zeros(nbox)
        box[self.o_dl:self.o_gram].reshape(Cf, NO)[:, os[nl - 1]:] = np.eye(Cf)  # d f_c / d a_c = 1
        self.box = to_device(box)
        self.hbox = cuda.pinned_array(nbox)
        self.Dl = self.box[self.o_dl:self.o_gram].reshape(Cf, NO)
        self.gram = self.box[self.o_gram:self.o_units]
        self.units = self.box[self.o_units:].reshape(2 * self.L + 1, NO)
        # the mailbox read by pass 2: [ESt (<= MMAX, L) | F (NO, <= MMAX)]
        self.up = cuda.device_array(self.foff + NO * self.mmax)
        self.hup = cuda.pinned_array(self.foff + NO * self.mmax)
        self.hx = self.h[:int(sizes[0])]  # where x goes (a view, made once)
        self.up_views = {}  # n -> (up[:n], hup[:n])
        # forward partials: a row per unit of layer l, and a last row for |h_l|^2
        self.fwd = [cuda.device_array((int(sizes[l + 1]) + 1, _nslices(int(sizes[l]), FSEG))) for l in range(nl)]
        self.rev = [cuda.device_array((_nslices(int(sizes[l + 1]), RSEG), Cf, int(sizes[l])))
                    for l in range(1, nl)]
        _pass1_buffers(self, self.L, self.nslices, self.npair)
        # launch grids (they depend on the sizes alone). Kernels are configured at each launch: a
        # configured kernel kept for later is not safe to reuse in the simulator, where configuring
        # sets the grid on the kernel object itself
        self.g_fwd = [((int(sizes[l + 1]) + 1, self.fwd[l].shape[1]), _warp_blocks(int(sizes[l + 1]) + 1))
                      for l in range(nl)]
        self.g_rev = [((_blocks(int(sizes[l])), self.rev[l - 1].shape[0]), _blocks(int(sizes[l]))) for l in range(1, nl)]
        self.g_reduce = self.npair + _warp_blocks((2 * self.L + 1) * NO)
        self.g_pass2 = max(1, (self.P + 2 * TPB - 1) // (2 * TPB))

    def matches(self, sizes, bias, L, rank):
        """Whether this workspace serves (sizes, bias, L, rank)."""
        return (self.bias == bool(bias) and self.L == L and self.rank == rank
                and np.array_equal(self.sizes, np.asarray(sizes, dtype=np.int64)))


def _pass1_buffers(obj, L, nslices, npair):
    """What pass 1 needs beside its slice table, on ``obj`` (a Workspace or the predict step's space): the
    2 x 2 column-block pairs (pa, pb), the block partials (part_g, part_u), the overflow flag (bad on the
    device, hbad page-locked) and q's place when q is a scalar (dq0)."""
    nbk = (L + 1) // 2
    A, B = np.tril_indices(nbk)
    obj.pa = to_device(A.astype(np.int64) if nbk else np.zeros(1, np.int64))
    obj.pb = to_device(B.astype(np.int64) if nbk else np.zeros(1, np.int64))
    obj.part_g = cuda.device_array((max(npair, 1), nslices))
    obj.part_u = cuda.device_array((2 * L + 1, nslices))
    obj.bad = cuda.device_array(1, dtype=np.int64)
    obj.hbad = cuda.pinned_array(1, dtype=np.int64)
    obj.dq0 = cuda.device_array(1)


def _nslices(n, seg):
    return max(1, (n + seg - 1) // seg)


def _blocks(n):
    return max(1, (n + TPB - 1) // TPB)


def _warp_blocks(n):
    return max(1, (n + WARPS - 1) // WARPS)


_WS = []  # the most recent workspaces (a few networks at a time)

# The workspaces, mailboxes and the pool are shared by every filter of the process: one step at a
# time uses them (a second thread's step waits for the first), so that steps from several threads
# never write into each other's buffers.
_LOCK = threading.RLock()


def _one_at_a_time(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with _LOCK:
            return func(*args, **kwargs)

    return wrapper


def workspace(sizes, bias, L, rank):
    """The cached ``Workspace`` of (sizes, bias, L, rank) (built on first use)."""
    for ws in _WS:
        if ws.matches(sizes, bias, L, rank):
            return ws
    ws = Workspace(sizes, bias, L, rank)
    _WS.insert(0, ws)
    del _WS[4:]
    return ws


# -- the new belief's arrays: recycled from beliefs that no one holds any more ----------------------------------

_POOL = {}  # (shape, dtype.str) -> device arrays whose belief was collected and that nothing else refers to
_PENDING = []  # the arrays of collected beliefs, not yet checked
POOL_DEPTH = 2  # arrays kept per shape


def _recycle(arrays):
    """Finalizer of a belief on the device: its arrays wait in _PENDING until the next ``_take``
    (the belief's own attributes still refer to them while its finalizers run)."""
    _PENDING.extend(arrays)


def _collect():
    """Move the pending arrays that nothing refers to any more into the pool; drop the others (a caller
    that kept ``bel.device_mean``, say, owns that array now). The references counted are the local name's
    and getrefcount's own."""
    import sys

    while _PENDING:
        a = _PENDING.pop()
        if sys.getrefcount(a) <= 2:
            free = _POOL.setdefault((a.shape, a.dtype.str), [])
            if len(free) < POOL_DEPTH:
                free.append(a)
        del a


def _take(shape, dtype):
    """A device array of ``shape`` and ``dtype``: a recycled one where the pool has it, else a new one."""
    _collect()
    dtype = np.dtype(dtype)
    free = _POOL.get((shape, dtype.str))
    if free:
        return free.pop()
    if PROFILE is not None:
        PROFILE["_pool_misses"] = PROFILE.get("_pool_misses", 0) + 1
    return cuda.device_array(shape, dtype=dtype)


def belief_dtype(*arrays):
    """The dtype of a belief's device arrays (float64 or float32; they must agree)."""
    dt = np.dtype(arrays[0].dtype)
    if dt not in (np.float64, np.float32) or any(a.dtype != dt for a in arrays):
        raise ValueError("the belief's device arrays must all be float64 or all float32; got "
                         + ", ".join(str(a.dtype) for a in arrays))
    return dt


def q_args(q, dq, placeholder):
    """(qstride, qs, dq) for the kernels: a (P,) device array dq read per parameter, or the scalar q (then
    ``placeholder``, any device array, stands in for the q array that is not read)."""
    if dq is not None:
        return 1, 0.0, dq
    return 0, float(q), placeholder


def release_pool():
    """Drop the recycled arrays and the step workspaces, so that their GPU memory can be freed (they
    hold at most two arrays per shape, plus one network's tables and buffers per (sizes, L, rank)), and
    the recorded kernel launches (``_launch.forget``: a new CUDA context records them again)."""
    with _LOCK:
        _POOL.clear()
        _PENDING.clear()
        _WS.clear()
        _PS.clear()
        _launch.forget()


def adopt(belief, *arrays):
    """Return ``arrays`` to the pool when ``belief`` is collected (``weakref.finalize``)."""
    import weakref

    weakref.finalize(belief, _recycle, arrays)


def network_passes(ws, dmean, gamma, x):
    """x up, then the forward pass at gamma mu (h, dact, eta and the layers' |h_l|^2 into the mailbox)
    and the reverse pass (Dl), launched without waiting; resets the overflow flag ws.bad."""
    nl = ws.nl
    _mark("_start")
    # straight from the caller's array, the driver staging it: at every size measured (800 B to 8 MB) faster
    # than a copy into page-locked memory first (docs/gpu.md §2c)
    xs = np.ascontiguousarray(x, dtype=np.float64).reshape(ws.hx.shape)
    _launch.to_device(ws.hx, xs)
    TRANSFERS.add(xs.nbytes)
    _mark("x up")
    g = float(gamma)
    for l in range(nl):
        grid, grid2 = ws.g_fwd[l]
        _launch.launch(_fwd_partial, grid, TPB, dmean, int(ws.w0[l]), int(ws.sizes[l]), ws.h, int(ws.hs[l]), ws.fwd[l])
        _launch.launch(_fwd_finish, grid2, TPB, ws.fwd[l], dmean, int(ws.b0[l]), g, ws.code, l == nl - 1, ws.h,
                       ws.dact, int(ws.hs[l + 1]), ws.box, ws.Cf, l, ws.bad)
    _mark("forward pass")
    for l in range(nl - 1, 0, -1):
        grid, grid2 = ws.g_rev[l - 1]
        _launch.launch(ws.rev_partial, grid, TPB, dmean, int(ws.w0[l]), int(ws.sizes[l]), int(ws.sizes[l + 1]), g,
                       ws.Dl, int(ws.os[l]), ws.rev[l - 1])
        _launch.launch(_rev_finish, grid2, TPB, ws.rev[l - 1], g, ws.dact, int(ws.hs[l]), ws.Dl, int(ws.os[l - 1]))
    _mark("reverse pass")


def _front(ws, dmean, dups, dWt, dq, qstride, qs, gamma, x):
    """Forward and reverse passes and pass 1, launched without waiting, then one copy of the mailbox
    (eta, |h_l|^2, Dl, the Gram sums and the per-unit sums) to the host."""
    network_passes(ws, dmean, gamma, x)
    g = float(gamma)
    _launch.launch(ws.pass1, ws.nslices, TPB, ws.tab, dups, dWt, dq, qstride, qs, g, ws.h, ws.pa, ws.pb, ws.part_g,
                   ws.part_u)
    _mark("pass 1")
    _launch.launch(_reduce, ws.g_reduce, TPB, ws.part_g, ws.gram, ws.npair, ws.part_u, ws.first, ws.units)
    _mark("reductions")
    _launch.to_host(ws.hbox, ws.box)
    TRANSFERS.add(ws.hbox.nbytes)
    _mark("copy down")
    return ws.hbox


@_one_at_a_time
def lofi_mlp_step(spec, dmean, dups, dWt, x, target, rank, gamma=1.0, q=0.0, dq=None, force=False, spherical=False):
    """LO-FI predict then update of an MLP's DLR belief held on the GPU (Chang et al. 2023, eqs 13-43).

    spec: ``refbayes.filters.base.mlp_kernel_spec`` (sizes, activation code, likelihood code, Rc,
    jitter); dmean, dups (P,) and dWt (L, P): device arrays (W transposed, row-major), all float64 or all
    float32 (read as stored, computed in float64, the new arrays written in the same dtype); x (n_0,) and the
    encoded target (C,): host arrays; rank >= 0; gamma > 0 and q >= 0 (a scalar; or dq, a (P,) device
    array of per-parameter q). force: take the one-Gram route whatever its guard says (tests).
    spherical: the spherical variant (ups = eta * 1, discarded directions dropped; as
    ``refbayes.kernels.cpu.step.lofi_mlp_step``): the same chain with fewer output columns.

    Returns (mean, ups, Wt (rank, P)) as new device arrays and yhat (C,) on the host, or None when the
    one-Gram route would not be accurate (the caller takes the general route). Raises
    NotPositiveDefiniteError or DivergenceError (naming the quantity) on numerical failure; the inputs
    are never written.
    """
    from refbayes.errors import DivergenceError

    sizes, code, lik, Rc, jitter = spec
    L, P = dWt.shape
    dt = belief_dtype(dmean, dups, dWt)
    bias = layer_bias(sizes, P)
    ws = workspace(sizes, bias, L, rank)
    ws.code = int(code)
    qstride, qs, dq = q_args(q, dq, ws.dq0)
    anyq = L > 0 and (qstride == 1 or qs > 0.0)
    box = _front(ws, dmean, dups, dWt, dq, qstride, qs, gamma, x)
    Cf, nl, NO = ws.Cf, ws.nl, ws.NO
    if not np.all(np.isfinite(box[:ws.o_units])):
        raise DivergenceError("LO-FI step: the forward or reverse pass left the floating-point range (the "
                              "model output or its Jacobian at the predicted mean is not finite)",
                              quantity="model output")
    eta = box[:Cf].copy()
    hn2 = np.repeat(box[Cf:Cf + nl] + (1.0 if ws.bias else 0.0), np.diff(ws.os))
    Dl = box[ws.o_dl:ws.o_gram].reshape(Cf, NO).copy()
    units = box[ws.o_units:].reshape(2 * L + 1, NO)
    G0, N0, Mq = (np.zeros((L, L)) for _ in range(3))
    a, b = ws.tril
    npl = a.shape[0]
    for mat, m in ((G0, 0), (N0, 1), (Mq, 2)):
        mat[a, b] = box[ws.o_gram + m * npl:ws.o_gram + (m + 1) * npl]
    info = np.zeros(2)
    target = np.ascontiguousarray(target, dtype=np.float64)
    with blas_threads(1):  # small products: a multi-threaded BLAS spends more time waking its threads
        yh, M, R = _likelihood(lik, eta, Rc, float(jitter))
        ESt, F = lofi_middle(G0, N0, Mq, units[:L].copy(), units[L:2 * L].copy(), units[2 * L].copy(), anyq,
                                 Dl, hn2, yh, M, R, lik, float(jitter), target, rank, bool(force), info,
                                 bool(spherical))
    if raise_status(int(info[0]), x=np.asarray(x, dtype=np.float64)):  # the belief on the GPU is finite
        return None
    mm = ESt.shape[0]
    hup = ws.hup
    hup[:mm * L] = ESt.ravel()
    hup[ws.foff:ws.foff + NO * mm] = F.ravel()
    n_up = ws.foff + NO * mm
    if n_up not in ws.up_views:
        ws.up_views[n_up] = (ws.up[:n_up], hup[:n_up])
    dst, src = ws.up_views[n_up]
    _launch.to_device(dst, src)
    TRANSFERS.add(8 * n_up)
    _mark("host algebra")
    out_mean, out_ups, out_Wt = _take((P,), dt), _take((P,), dt), _take((rank, P), dt)
    _mark("allocate outputs")
    _launch.launch(ws.pass2, ws.g_pass2, TPB, dmean, dups, dWt, dq, qstride, qs, float(gamma), ws.lay, ws.h, ws.up,
                   mm, out_mean, out_ups, out_Wt, ws.bad)
    _launch.to_host(ws.hbad, ws.bad)
    TRANSFERS.add(8)
    _mark("pass 2")
    if ws.hbad[0]:
        _recycle((out_mean, out_ups, out_Wt))
        raise DivergenceError("LO-FI step produced a non-finite mean, ups or W from finite inputs (overflow: "
                              "the belief left the floating-point range)", quantity="LO-FI step")
    return out_mean, out_ups, out_Wt, yh.copy()


class _PredictSpace:
    """Tables and buffers of the predict step for (P, L): pass 1 over one pseudo-unit of P rows with inputs
    h = 1 (only its third Gram matrix, W^T diag(q D) W, is used), built once."""

    def __init__(self, P, L):
        self.P, self.L = P, L
        self.pass1, self.npair, self.pred_rows = (lambda k: (k[1], k[3], k[6]))(_kernels(L, L, 1))
        rows = [(0, k0, min(k0 + SEG, P), 0, -1) for k0 in range(0, max(P, 1), SEG)]
        self.nslices = len(rows)
        self.tab = to_device(np.array(rows, dtype=np.int64).reshape(-1, 5))
        self.first = to_device(np.array([0, self.nslices], dtype=np.int64))
        self.ones = cuda.device_array(P)
        _launch.launch(_fill, max(1, (P + TPB - 1) // TPB), TPB, self.ones, 1.0)
        _pass1_buffers(self, L, self.nslices, self.npair)
        self.gram = cuda.device_array(max(self.npair, 1))
        self.units = cuda.device_array((2 * L + 1, 1))
        self.hgram = cuda.pinned_array(max(self.npair, 1))
        self.S = cuda.device_array((max(L, 1), max(L, 1)))
        self.hS = cuda.pinned_array((max(L, 1), max(L, 1)))


@cuda.jit
def _fill(a, v):
    i = cuda.blockIdx.x * TPB + cuda.threadIdx.x
    if i < a.shape[0]:
        a[i] = v


_PS = []


@_one_at_a_time
def lofi_predict(dmean, dups, dWt, gamma=1.0, q=0.0, dq=None):
    """LO-FI predict step (Chang et al. 2023, eqs 13-25) of a DLR belief held on the GPU: mu_bar = gamma mu,
    ups_bar = ups / (gamma^2 + q ups), W_bar = diag(gamma D) W S with S S^T = (I + W^T diag(q D) W)^{-1},
    D = 1 / (gamma^2 + q ups). dmean, dups (P,), dWt (L, P): device arrays, all float64 or all float32 (the
    new arrays in the same dtype, computed in float64); q a scalar, or dq a (P,) device
    array. Returns new device arrays (mean, ups, Wt); only L x L numbers cross the bus (the Gram matrix
    down, S up). Raises NotPositiveDefiniteError or DivergenceError on numerical failure."""
    from refbayes.errors import DivergenceError, NotPositiveDefiniteError

    from ..cpu.dlr import root_of_gram

    L, P = dWt.shape
    dt = belief_dtype(dmean, dups, dWt)
    ps = next((p for p in _PS if p.P == P and p.L == L), None)
    if ps is None:
        ps = _PredictSpace(P, L)
        _PS.insert(0, ps)
        del _PS[2:]
    qstride, qs, dq = q_args(q, dq, ps.dq0)
    anyq = L > 0 and (qstride == 1 or qs > 0.0)
    g = float(gamma)
    S = np.eye(L)
    if anyq:
        _launch.launch(ps.pass1, ps.nslices, TPB, ps.tab, dups, dWt, dq, qstride, qs, g, ps.ones, ps.pa, ps.pb,
                       ps.part_g, ps.part_u)
        _launch.launch(_reduce, ps.npair + _warp_blocks(2 * L + 1), TPB, ps.part_g, ps.gram, ps.npair, ps.part_u,
                       ps.first, ps.units)
        _launch.to_host(ps.hgram, ps.gram)
        TRANSFERS.add(ps.hgram.nbytes)
        a, b = np.tril_indices(L)
        Mq = np.zeros((L, L))
        Mq[a, b] = ps.hgram[2 * a.shape[0]:3 * a.shape[0]]
        Li = np.empty((L, L))
        status = root_of_gram(Mq, Li)
        if status == 1:
            raise DivergenceError("LO-FI predict: W^T diag(q D) W is not finite (the belief left the "
                                  "floating-point range)", quantity="LO-FI predict")
        if status == 2:
            raise NotPositiveDefiniteError("I + q W^T diag(D) W is not positive definite")
        S = Li.T
    out_mean, out_ups, out_Wt = _take((P,), dt), _take((P,), dt), _take((L, P), dt)
    if L:
        ps.hS[:L, :L] = S
        _launch.to_device(ps.S, ps.hS)
        TRANSFERS.add(ps.hS.nbytes)
    _launch.to_device(ps.bad, np.zeros(1, np.int64))
    TRANSFERS.add(8)
    _launch.launch(ps.pred_rows, max(1, (P + TPB - 1) // TPB), TPB, dmean, dups, dWt, dq, qstride, qs, g, ps.S,
                   out_mean, out_ups, out_Wt, ps.bad)
    _launch.to_host(ps.hbad, ps.bad)
    TRANSFERS.add(8)
    if ps.hbad[0]:
        _recycle((out_mean, out_ups, out_Wt))
        raise DivergenceError("LO-FI predict produced a non-finite mean, ups or W (overflow: the belief left "
                              "the floating-point range)", quantity="LO-FI predict")
    return out_mean, out_ups, out_Wt

