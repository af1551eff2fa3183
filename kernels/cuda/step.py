"""A LO-FI step for an MLP (or ``rb.Linear``) with the belief on the GPU: predict, forward pass,
Jacobian structure, likelihood moments and update as one chain of kernels, the GPU form of
``refbayes.kernels.cpu.step`` (Chang et al. 2023, eqs 13-25 and 26-43; docs/gpu.md).

The belief stays on the device: mean, ups (P,) and W^T (L, P) row-major, so that every pass over the
parameters reads consecutive addresses in consecutive threads. Per step only x (n_0,) goes up and yhat
(C,) comes down, plus numbers that grow with the units of the network, never with P:

1. forward pass at mu_bar = gamma mu, layer by layer (``_fwd_partial`` sums slices of each unit's
   inputs, ``_fwd_finish`` adds them in slice order and applies the activation);
2. the reverse pass, Dl[c, u] = d f_c / d a_u for every output c and unit u (``_rev_partial``,
   ``_rev_finish``); the Jacobian itself (C x P) is never formed;
3. pass 1 (``_pass1``, one block per slice of at most SEG rows of one unit): the predict rows,
   the Gram matrices Y0^T Y0, Y0^T D~ Y0 and W^T diag(q D) W (rows staged in shared memory, one
   pair of columns per thread), and the per-unit sums T, TD, Z of ``refbayes.kernels.cpu.step``;
   block partials are added in a fixed order by ``_reduce_pairs`` and ``_reduce_units``;
4. on the host, the small algebra (``refbayes.kernels.cpu.step.mlp_lofi_middle``, shared with the
   CPU kernel: the likelihood moments, whitening, the (L + C)-sized Gram matrices, the accuracy
   guard, the right singular vectors) from what crossed: activations, Dl, the L x L sums and the
   per-unit sums (O(units (L + C)) numbers);
5. pass 2 (``_pass2``, one thread per parameter): W', mu' and ups' (eqs 38-42) from the rows of
   W and two small coefficient matrices, and a flag for any non-finite output.

Every sum over parameters is a per-block partial added in a fixed order, so results do not depend
on scheduling. Kernels that depend on L (columns of W), rank and C_f are compiled once per triple
(``_kernels``); sizes only change launch geometry.
"""

import math
import time

import numba
import numpy as np
from numba import cuda

from ..cpu.mlp import _offsets, layer_bias
from ..cpu.step import (BAD, FALLBACK, NOT_PD_CORE, NOT_PD_PRED, NOT_PD_R, _likelihood, mlp_lofi_middle,
                        n_outputs)
from . import _device

__all__ = ["lofi_mlp_step", "Workspace", "TRANSFERS", "to_device", "to_host"]

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
def _tree(sh, t):
    """Sum sh[0:TPB] into sh[0] (a fixed-order tree); every thread of the block calls it."""
    cuda.syncthreads()
    s = TPB // 2
    while s > 0:
        if t < s:
            sh[t] += sh[t + s]
        cuda.syncthreads()
        s //= 2


# -- kernels that do not depend on L, rank or C_f ----------------------------------------------------------

@cuda.jit
def _fwd_partial(theta, w0l, n_in, h, hin, part):
    """part[r, s] = sum over inputs k of slice s of theta[w0l + r n_in + k] h[hin + k] (grid (units, slices))."""
    sh = cuda.shared.array(TPB, dtype=numba.float64)
    t = cuda.threadIdx.x
    r = cuda.blockIdx.x
    s = cuda.blockIdx.y
    k1 = min((s + 1) * FSEG, n_in)
    base = w0l + r * n_in
    acc = 0.0
    k = s * FSEG + t
    while k < k1:
        acc += theta[base + k] * h[hin + k]
        k += TPB
    sh[t] = acc
    _tree(sh, t)
    if t == 0:
        part[r, s] = sh[0]


@cuda.jit
def _fwd_finish(part, theta, b0l, gamma, code, last, h, dact, hout):
    """h[hout + r] = act(gamma (sum_s part[r, s] + b_r)) and dact = act' there (last layer: linear).
    One warp per unit r: its lanes add strided slices, lane 0 adds the 32 lane sums in order."""
    sh = cuda.shared.array(TPB, dtype=numba.float64)
    t = cuda.threadIdx.x
    lane = t % 32
    r = cuda.blockIdx.x * WARPS + t // 32
    acc = 0.0
    if r < part.shape[0]:
        s = lane
        while s < part.shape[1]:
            acc += part[r, s]
            s += 32
    sh[t] = acc
    cuda.syncthreads()
    if lane == 0 and r < part.shape[0]:
        a = 0.0
        for k in range(32):
            a += sh[t + k]
        if b0l >= 0:
            a += theta[b0l + r]
        a *= gamma
        if last:
            h[hout + r] = a
            dact[hout + r] = 1.0
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
def _reduce_pairs(part, out):
    """out[p] = sum over blocks of part[p, :] (one block per p; fixed order)."""
    sh = cuda.shared.array(TPB, dtype=numba.float64)
    t = cuda.threadIdx.x
    p = cuda.blockIdx.x
    acc = 0.0
    s = t
    while s < part.shape[1]:
        acc += part[p, s]
        s += TPB
    sh[t] = acc
    _tree(sh, t)
    if t == 0:
        out[p] = sh[0]


@cuda.jit
def _reduce_units(part, first, out):
    """out[v, u] = sum of part[v, s] over the slices s of unit u, first[u] <= s < first[u + 1]: one warp per
    (v, u), its lanes add strided slices, lane 0 adds the 32 lane sums in order."""
    sh = cuda.shared.array(TPB, dtype=numba.float64)
    t = cuda.threadIdx.x
    lane = t % 32
    item = cuda.blockIdx.x * WARPS + t // 32
    NO = out.shape[1]
    valid = item < out.shape[0] * NO
    v = item // NO
    u = item - v * NO
    acc = 0.0
    if valid:
        s = first[u] + lane
        while s < first[u + 1]:
            acc += part[v, s]
            s += 32
    sh[t] = acc
    cuda.syncthreads()
    if lane == 0 and valid:
        a = 0.0
        for k in range(32):
            a += sh[t + k]
        out[v, u] = a


# -- kernels compiled for one (L, rank, C_f) ---------------------------------------------------------------

_CACHE = {}


def _kernels(L, rank, Cf):
    """The reverse-pass, pass-1 and pass-2 kernels for W with L columns, output rank ``rank`` and C_f
    network outputs (sizes of their local and shared arrays), compiled once per triple."""
    key = (int(L), int(rank), int(Cf))
    if key in _CACHE:
        return _CACHE[key]
    L1 = max(L, 1)
    STAGE = L + 3  # a staged row of pass 1: W[i, :], then the weights w1, w2, wq
    NPAIR = 3 * (L * (L + 1) // 2)
    NPT = max(1, (NPAIR + TPB - 1) // TPB)  # Gram entries per thread
    NP1 = max(NPAIR // 3, 1)  # entries of one of the three Gram matrices
    MMAX = rank + L + Cf + 1  # output columns: rank + (nz - kept) + 1 <= rank + L + C + 1
    ESZ = max(MMAX * L, 1)

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
    def pass1(tab, ups, Wt, q, qstride, qs, gamma, h, pa, pb, npair, part_g, part_u):
        """One block per slice tab[b] = (first weight row of the unit, k0, k1, start of h_l, bias row or -1):
        the predict rows and, over the slice's rows, part_g[p, b] (Gram entries p < npair, lower
        triangles of [W^T diag(w1) W | W^T diag(w2) W | W^T diag(wq) W]) and part_u[:, b] = (T (L),
        TD (L), Z) of the unit."""
        shw = cuda.shared.array((TPB, STAGE), dtype=numba.float64)
        sh = cuda.shared.array(TPB, dtype=numba.float64)
        accT = cuda.local.array(L1, dtype=numba.float64)
        accD = cuda.local.array(L1, dtype=numba.float64)
        gacc = cuda.local.array(NPT, dtype=numba.float64)
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
        for a in range(L):
            accT[a] = 0.0
            accD[a] = 0.0
        for pp in range(NPT):
            gacc[pp] = 0.0
        accZ = 0.0
        for tile in range(0, nrow, TPB):
            rr = tile + t
            if rr < nrow:
                if rr < nw:
                    i = rb + k0 + rr
                    hk = h[hb + k0 + rr]
                else:
                    i = bi
                    hk = 1.0
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
                accZ += hk * hk * dinv
                w1 = sc * sc
                shw[t, L] = w1
                shw[t, L + 1] = w1 * dinv
                shw[t, L + 2] = qi * d
            else:
                for a in range(STAGE):
                    shw[t, a] = 0.0
            cuda.syncthreads()
            n = min(TPB, nrow - tile)
            for pp in range(NPT):
                p = t + pp * TPB
                if p < npair:
                    kind = L + p // NP1
                    ca = pa[p]
                    cb = pb[p]
                    s = 0.0
                    for r in range(n):
                        s += shw[r, kind] * shw[r, ca] * shw[r, cb]
                    gacc[pp] += s
            cuda.syncthreads()
        for pp in range(NPT):
            p = t + pp * TPB
            if p < npair:
                part_g[p, b] = gacc[pp]
        for a in range(2 * L + 1):
            if a < L:
                sh[t] = accT[a]
            elif a < 2 * L:
                sh[t] = accD[a - L]
            else:
                sh[t] = accZ
            _tree(sh, t)
            if t == 0:
                part_u[a, b] = sh[0]
            cuda.syncthreads()

    @cuda.jit
    def pass2(theta, ups, Wt, q, qstride, qs, gamma, lay, h, ESt, F, mm, out_mean, out_ups, out_Wt, bad):
        """One thread per parameter i = (l, j, k): column c of [W' | g - W~ c | discarded] at row i is
        scale_i W[i] ESt[c] + h~_k F[u, c]; writes W' (c < rank), mu' = mu_bar + column rank / ubar_i and
        ups' = ubar_i + the discarded columns' squares; bad[0] = 1 where an output is not finite.
        lay (layers, 6): first row, weight rows, inputs n_in, start of h_l, first unit, and 0."""
        she = cuda.shared.array(ESZ, dtype=numba.float64)
        wl = cuda.local.array(L1, dtype=numba.float64)
        t = cuda.threadIdx.x
        j = t
        while j < mm * L:
            she[j] = ESt[j // L1, j % L1]
            j += TPB
        cuda.syncthreads()
        i = cuda.blockIdx.x * TPB + t
        if i >= theta.shape[0]:
            return
        l = 0
        while l + 1 < lay.shape[0] and lay[l + 1, 0] <= i:
            l += 1
        rel = i - lay[l, 0]
        if rel < lay[l, 1]:
            n_in = lay[l, 2]
            jj = rel // n_in
            kk = rel - jj * n_in
            hk = h[lay[l, 3] + kk]
        else:
            jj = rel - lay[l, 1]
            hk = 1.0
        unit = lay[l, 4] + jj
        u = ups[i]
        qi = q[i] if qstride else qs
        den = gamma * gamma + qi * u
        d = 1.0 / den
        dinv = den / u
        sc = gamma * d
        for a in range(L):
            wl[a] = Wt[a, i]
        acc = 0.0
        ok = True
        for c in range(mm):
            z = 0.0
            for a in range(L):
                z += wl[a] * she[c * L + a]
            z = sc * z + hk * F[unit, c]
            if c < rank:
                out_Wt[c, i] = z
                ok = ok and math.isfinite(z)
            elif c == rank:
                m = gamma * theta[i] + z * dinv
                out_mean[i] = m
                ok = ok and math.isfinite(m)
            else:
                acc += z * z
        v = u * d + acc
        out_ups[i] = v
        if not (ok and math.isfinite(v) and v > 0.0):
            bad[0] = 1

    out = (rev_partial, pass1, pass2, NPAIR)
    _CACHE[key] = out
    return out


# -- host side -------------------------------------------------------------------------------------------------

class Workspace:
    """Device tables and scratch buffers of the step for one network (sizes, bias) and one (L, rank);
    built once (their upload is the only copy that grows with the network, and it happens once).

    Attributes: sizes, bias, P, L, rank, Cf, the layer offsets (w0, b0, hs, os) on the host and, on
    the device, the slice table of pass 1 (``tab``), each unit's first slice (``first``), the layer
    table of pass 2 (``lay``), the Gram pair indices, and the buffers h, dact, Dl and the partials.
    """

    def __init__(self, sizes, bias, L, rank):
        sizes = np.asarray(sizes, dtype=np.int64)
        self.sizes, self.bias, self.L, self.rank = sizes, bool(bias), int(L), int(rank)
        nl = sizes.shape[0] - 1
        self.nl = nl
        self.Cf = int(sizes[nl])
        w0, b0, hs, P, nh = _offsets(sizes, self.bias)
        self.w0, self.b0, self.hs, self.P, self.nh = w0, b0, hs, int(P), int(nh)
        os = np.zeros(nl + 1, np.int64)
        for l in range(nl):
            os[l + 1] = os[l] + sizes[l + 1]
        self.os = os
        self.NO = int(os[nl])
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
        self.rev_partial, self.pass1, self.pass2, self.npair = _kernels(self.L, self.rank, self.Cf)
        a, b = np.tril_indices(self.L)
        self.tab = to_device(np.array(rows, dtype=np.int64).reshape(-1, 5))
        self.first = to_device(np.array(first, dtype=np.int64))
        self.lay = to_device(lay)
        self.pa = to_device(np.tile(a, 3).astype(np.int64) if self.L else np.zeros(1, np.int64))
        self.pb = to_device(np.tile(b, 3).astype(np.int64) if self.L else np.zeros(1, np.int64))
        self.h = cuda.device_array(self.nh)
        self.dact = cuda.device_array(self.nh)
        Dl = np.zeros((self.Cf, self.NO))
        Dl[:, os[nl - 1]:] = np.eye(self.Cf)  # the output units: d f_c / d a_c = 1
        self.Dl = to_device(Dl)
        self.fwd = [cuda.device_array((int(sizes[l + 1]), _nslices(int(sizes[l]), FSEG))) for l in range(nl)]
        self.rev = [cuda.device_array((_nslices(int(sizes[l + 1]), RSEG), self.Cf, int(sizes[l])))
                    for l in range(1, nl)]
        self.part_g = cuda.device_array((max(self.npair, 1), self.nslices))
        self.part_u = cuda.device_array((2 * self.L + 1, self.nslices))
        self.gram = cuda.device_array(max(self.npair, 1))
        self.units = cuda.device_array((2 * self.L + 1, self.NO))
        self.bad = cuda.device_array(1, dtype=np.int64)
        self.dq0 = cuda.device_array(1)  # q's place when q is a scalar

    def matches(self, sizes, bias, L, rank):
        """Whether this workspace serves (sizes, bias, L, rank)."""
        return (self.bias == bool(bias) and self.L == L and self.rank == rank
                and np.array_equal(self.sizes, np.asarray(sizes, dtype=np.int64)))


def _nslices(n, seg):
    return max(1, (n + seg - 1) // seg)


def _blocks(n):
    return max(1, (n + TPB - 1) // TPB)


def _warp_blocks(n):
    return max(1, (n + WARPS - 1) // WARPS)


_WS = []  # the most recent workspaces (a few networks at a time)


def workspace(sizes, bias, L, rank):
    """The cached ``Workspace`` of (sizes, bias, L, rank) (built on first use)."""
    for ws in _WS:
        if ws.matches(sizes, bias, L, rank):
            return ws
    ws = Workspace(sizes, bias, L, rank)
    _WS.insert(0, ws)
    del _WS[4:]
    return ws


def _front(ws, dmean, dups, dWt, dq, qstride, qs, gamma, x):
    """Forward and reverse passes and pass 1, launched without waiting; then the host copies of the
    activations, Dl, the Gram sums and the per-unit sums."""
    nl, sizes = ws.nl, ws.sizes
    _mark("_start")
    ws.h[:int(sizes[0])].copy_to_device(np.ascontiguousarray(x, dtype=np.float64))
    TRANSFERS.add(8 * int(sizes[0]))
    _mark("x up")
    for l in range(nl):
        n_in, n_out = int(sizes[l]), int(sizes[l + 1])
        part = ws.fwd[l]
        _fwd_partial[(n_out, part.shape[1]), TPB](dmean, int(ws.w0[l]), n_in, ws.h, int(ws.hs[l]), part)
        _fwd_finish[_warp_blocks(n_out), TPB](part, dmean, int(ws.b0[l]), float(gamma), ws.code, l == nl - 1, ws.h,
                                         ws.dact, int(ws.hs[l + 1]))
    _mark("forward pass")
    for l in range(nl - 1, 0, -1):
        n_in, n_out = int(sizes[l]), int(sizes[l + 1])
        part = ws.rev[l - 1]
        ws.rev_partial[(_blocks(n_in), part.shape[0]), TPB](dmean, int(ws.w0[l]), n_in, n_out, float(gamma), ws.Dl,
                                                            int(ws.os[l]), part)
        _rev_finish[_blocks(n_in), TPB](part, float(gamma), ws.dact, int(ws.hs[l]), ws.Dl, int(ws.os[l - 1]))
    _mark("reverse pass")
    npair = ws.npair if ws.anyq else 2 * ws.npair // 3
    ws.pass1[ws.nslices, TPB](ws.tab, dups, dWt, dq, qstride, qs, float(gamma), ws.h, ws.pa, ws.pb, npair,
                              ws.part_g, ws.part_u)
    _mark("pass 1")
    if npair:
        _reduce_pairs[npair, TPB](ws.part_g, ws.gram)
    _reduce_units[_warp_blocks(ws.units.shape[0] * ws.NO), TPB](ws.part_u, ws.first, ws.units)
    _mark("reductions")
    h, Dl, units = to_host(ws.h), to_host(ws.Dl), to_host(ws.units)
    gram = to_host(ws.gram)[:npair] if npair else np.zeros(0)
    _mark("copies down")
    return h, Dl, units, gram


def _lower_sums(gram, L, npair_one, which):
    """The L x L lower triangle ``which`` (0, 1, 2) of the pair sums, as a full symmetric-ready array."""
    out = np.zeros((L, L))
    if L == 0 or gram.shape[0] < (which + 1) * npair_one:
        return out
    a, b = np.tril_indices(L)
    out[a, b] = gram[which * npair_one:(which + 1) * npair_one]
    return out


def lofi_mlp_step(spec, dmean, dups, dWt, x, target, rank, gamma=1.0, q=0.0, dq=None, force=False):
    """LO-FI predict then update of an MLP's DLR belief held on the GPU (Chang et al. 2023, eqs 13-43).

    spec: ``refbayes.filters.base.mlp_kernel_spec`` (sizes, activation code, likelihood code, Rc,
    jitter); dmean, dups (P,) and dWt (L, P): device arrays (W transposed, row-major); x (n_0,) and the
    encoded target (C,): host arrays; rank >= 0; gamma > 0 and q >= 0 (a scalar; or dq, a (P,) device
    array of per-parameter q). force: take the one-Gram route whatever its guard says (tests).

    Returns (mean, ups, Wt (rank, P)) as new device arrays and yhat (C,) on the host, or None when the
    one-Gram route would not be accurate (the caller takes the general route). Raises
    NotPositiveDefiniteError or DivergenceError (naming the quantity) on numerical failure; the inputs
    are never written.
    """
    from refbayes.errors import NotPositiveDefiniteError

    from .. import _host

    sizes, code, lik, Rc, jitter = spec
    L, P = dWt.shape
    bias = layer_bias(sizes, P)
    ws = workspace(sizes, bias, L, rank)
    ws.code = int(code)
    if dq is not None:
        qstride, qs = 1, 0.0
        ws.anyq = L > 0
    else:
        qstride, qs, dq = 0, float(q), ws.dq0
        ws.anyq = L > 0 and qs > 0.0
    h, Dl, units, gram = _front(ws, dmean, dups, dWt, dq, qstride, qs, gamma, x)
    npl = L * (L + 1) // 2
    G0, N0, Mq = (_lower_sums(gram, L, npl, w) for w in range(3))
    nl = ws.nl
    eta = h[ws.hs[nl]:ws.hs[nl] + ws.Cf].copy()
    if not (np.all(np.isfinite(h)) and np.all(np.isfinite(Dl))):
        _host.raise_nonfinite("LO-FI step (forward pass)", x=np.asarray(x, dtype=np.float64))
    yh, M, R = _likelihood(lik, eta, Rc, float(jitter))
    info = np.zeros(2)
    target = np.ascontiguousarray(target, dtype=np.float64)
    ESt, F = mlp_lofi_middle(G0, N0, Mq, np.ascontiguousarray(units[:L]), np.ascontiguousarray(units[L:2 * L]),
                             units[2 * L].copy(), ws.anyq, Dl, h, ws.sizes, ws.os, ws.bias, yh, M, R, lik,
                             float(jitter), target, rank, bool(force), info)
    status = int(info[0])
    if status == FALLBACK:
        return None
    if status == NOT_PD_R:
        raise NotPositiveDefiniteError("the observation covariance R is not positive (semi-)definite")
    if status == NOT_PD_CORE:
        raise NotPositiveDefiniteError("I + W~^T diag(1/ups) W~ is not positive definite")
    if status == NOT_PD_PRED:
        raise NotPositiveDefiniteError("I + q W^T diag(D) W is not positive definite")
    if status == BAD:
        _host.raise_nonfinite("LO-FI step", x=np.asarray(x, dtype=np.float64))
    mm = ESt.shape[0]
    _mark("host algebra")
    out_mean, out_ups, out_Wt = cuda.device_array(P), cuda.device_array(P), cuda.device_array((rank, P))
    _mark("allocate outputs")
    ws.bad[:1].copy_to_device(np.zeros(1, np.int64))
    TRANSFERS.add(8)
    ws.pass2[_blocks(P), TPB](dmean, dups, dWt, dq, qstride, qs, float(gamma), ws.lay, ws.h,
                              to_device(ESt if L else np.zeros((mm, 1))), to_device(F), mm, out_mean, out_ups,
                              out_Wt, ws.bad)
    bad = to_host(ws.bad)[0]
    _mark("pass 2")
    if bad:
        from refbayes.errors import DivergenceError

        raise DivergenceError("LO-FI step produced a non-finite mean, ups or W from finite inputs (overflow: "
                              "the belief left the floating-point range)", quantity="LO-FI step")
    return out_mean, out_ups, out_Wt, yh.copy()


def n_out(spec):
    """C, the length of yhat for ``spec``."""
    return n_outputs(spec[0], spec[2])
