"""LO-FI update on an NVIDIA GPU (numba.cuda); same arguments and results as
``refbayes.kernels.cpu.lofi_update`` (Chang et al. 2023, eqs 26-43). Host arrays in and out.

W~ = [W, H^T A^T] (P, K), A^T A = R^{-1} (eq. 31), is never stored; the GPU streams over the
rows of Y = [W, H^T] (P, L + C) and everything K x K stays on the host, in the CPU module's
small functions (``setup``, ``plan``, ``finish_cholqr2``, ``coefficients``):

- pass 1 (GPU): [Y^T Y | Y^T D Y], D = diag(1/ups), as per-block sums added on the host in a
  fixed order (``lofi_tile_gram``, mode 0). ``plan`` forms G = W~^T W~, N = W~^T D W~ and
  b = W~^T D g from them and picks the route from the conditioning of the column-scaled G
  (the accuracy guard of the CPU kernel):
  "gram": R = chol(G) (no further pass);
  "cholqr2": a second GPU pass over the whitened rows (mode 1) gives Q1^T Q1 with
  Q1 = W~ R1^{-1}, R = chol(Q1^T Q1)^T R1, and N, b again from the whitened rows;
  "tsqr" (W~ too ill-conditioned for CholeskyQR2, or Q1^T Q1 not positive definite): the
  update runs on the CPU, ``refbayes.kernels.cpu.lofi_update(..., method="tsqr")`` (the
  inputs are host arrays already).
- pass 2 (GPU, one thread per row): W' = W~ V[:, :L] (eq. 40), ups' = ups + rowsumsq(W~ V[:, L:])
  (eqs 41-42) and mu' (eq. 38), all as products of y_i with small coefficient matrices.

Launch geometry depends on P and K only, so results are the same on every call.
"""

import numpy as np
from numba import cuda

from refbayes.errors import NotPositiveDefiniteError, r_not_positive_definite

from .. import _host
from ..cpu import lofi as _cpu
from . import _device

__all__ = ["lofi_update", "METHODS"]

METHODS = _cpu.METHODS
SHARED_BYTES = 32768  # dynamic shared memory per block for the staged rows of pass 1


def _lower_pairs(n, off):
    """Positions (off + a, off + b), a >= b, of the lower triangle of an n x n block."""
    a, b = np.tril_indices(n)
    return a + off, b + off


def _tile_sums(dW, dH, dups, P, Aw, Mt, mode, stride, pa, pb, pw):
    """Launch ``lofi_tile_gram``; returns the pair sums (npairs,), or None when a tile of one
    row does not fit in the shared memory budget."""
    tr = min(_device.TPB, SHARED_BYTES // (8 * (stride + 1)))
    if tr < 1:
        return None
    nb = min(max(1, (P + tr - 1) // tr), _device.MAX_BLOCKS)
    pa = np.ascontiguousarray(pa, dtype=np.int64)
    dpart = cuda.device_array((pa.shape[0], nb))
    _device.lofi_tile_gram[nb, _device.TPB, 0, 8 * (tr * stride + tr)](
        dW, dH, dups, cuda.to_device(np.ascontiguousarray(Aw)), cuda.to_device(np.ascontiguousarray(Mt)),
        mode, tr, stride, cuda.to_device(pa), cuda.to_device(np.ascontiguousarray(pb, dtype=np.int64)),
        cuda.to_device(np.ascontiguousarray(pw, dtype=np.int64)), dpart)
    return dpart.copy_to_host().sum(axis=1)


def _gram_pass(dW, dH, dups, P, L, C):
    """Pass 1: [Y^T Y | Y^T D Y] (Ky, 2 Ky), Ky = L + C, as ``plan`` reads it (one part)."""
    Ky = L + C
    a, b = _lower_pairs(Ky, 0)
    n = a.shape[0]
    sums = _tile_sums(dW, dH, dups, P, np.zeros((1, max(C, 1))), np.zeros((1, 1)), 0, Ky,
                      np.concatenate([a, a]), np.concatenate([b, b]), np.repeat([0, 1], n))
    if sums is None:
        return None
    M = np.zeros((1, Ky, 2 * Ky))
    M[0, a, b] = M[0, b, a] = sums[:n]
    M[0, a, Ky + b] = M[0, b, Ky + a] = sums[n:]
    return M


def _cholqr2_pass(dW, dH, dups, P, L, C, A, w, Mt):
    """Second pass: Q1^T Q1 (nz, nz) with Q1 = W~ Mt^T, and [W~^T D W~ | W~^T D g] (K, K + 1)
    from the whitened rows; each with a leading axis of one part, as ``finish_cholqr2`` reads them."""
    nz, K = Mt.shape
    qa, qb = _lower_pairs(nz, 0)
    na, nb_ = _lower_pairs(K, nz)
    ga = np.full(K, nz + K)
    gb = np.arange(nz, nz + K)
    pa = np.concatenate([qa, na, ga])
    pb = np.concatenate([qb, nb_, gb])
    pw = np.concatenate([np.zeros(qa.shape[0]), np.ones(na.shape[0] + K)])
    Aw = np.vstack([A, w[None, :]])
    sums = _tile_sums(dW, dH, dups, P, Aw, Mt, 1, nz + K + 1 + C, pa, pb, pw)
    if sums is None:
        return None
    G2 = np.zeros((1, nz, nz))
    G2[0, qa, qb] = G2[0, qb, qa] = sums[:qa.shape[0]]
    Nb = np.zeros((1, K, K + 1))
    s = sums[qa.shape[0]:]
    nn = na.shape[0]
    Nb[0, na - nz, nb_ - nz] = Nb[0, nb_ - nz, na - nz] = s[:nn]
    Nb[0, :, K] = s[nn:]
    return G2, Nb


@_host.one_blas_thread
def lofi_update(mean, ups, W, H, R, e, rank=None, singular=False, method="auto", return_route=False):
    """LO-FI update step (Chang et al. 2023, eqs 26-43) on the GPU.

    W~ = [W, H^T A^T] (A^T A = R^{-1}); mu' = mu + (diag(ups) + W~ W~^T)^{-1} H^T R^{-1} e
    (eq. 38); thin SVD W~ = U diag(s) V^T, W' = U[:, :L] diag(s[:L]) (eqs 39-40, zero columns
    when fewer than L components), ups' = ups + rowsumsq(U[:, L:] diag(s[L:])) (eqs 41-42).

    mean, ups: (P,); W: (P, L0); H: (C, P); R: (C, C); e: (C,); rank: L >= 0 (default L0);
    singular: R only positive semi-definite (pseudo-inverse).
    method: "auto" (default; the accuracy guard of ``refbayes.kernels.cpu.lofi_update``
    picks "gram" or "cholqr2" on the GPU), or force a route (tests). The "tsqr" route,
    taken when W~ is too ill-conditioned for CholeskyQR2 (or when C = 0, or when the
    staged rows of a pass would not fit in shared memory), is not a GPU route: the update
    is then computed by the CPU kernel, ``refbayes.kernels.cpu.lofi_update(..., method="tsqr")``.
    Returns (mean (P,), ups (P,), W (P, L)), new host arrays, plus the route taken when
    ``return_route``. W is defined up to a right orthogonal factor: compare W W^T, not W.
    """
    mean, ups, W, H, R, e, rank = _cpu.check_update_args(mean, ups, W, H, R, e, rank, method)
    P, L = W.shape
    C = H.shape[0]

    def on_cpu():
        out = _cpu.lofi_update(mean, ups, W, H, R, e, rank, singular=bool(singular), method="tsqr")
        return out + ("tsqr",) if return_route else out

    if L + C == 0:
        out = (mean.copy(), ups.copy(), np.zeros((P, rank)))
        return out + ("tsqr",) if return_route else out
    A, w, ok = _cpu.setup(R, e, bool(singular))
    if not ok:
        if not singular:
            raise r_not_positive_definite(R)
        raise NotPositiveDefiniteError("R is not positive semi-definite")
    if method == "tsqr" or C == 0 or P == 0:
        return on_cpu()
    dW, dH, dups = cuda.to_device(W), cuda.to_device(H), cuda.to_device(ups)
    parts = _gram_pass(dW, dH, dups, P, L, C)
    if parts is None:
        return on_cpu()
    status, route, _, T, y0, N, b, idx, Rf, Mt = _cpu.plan(parts, A, w, L, METHODS.index(method))
    if status != _cpu.OK:
        _host.raise_nonfinite("LO-FI update", ups=ups, W=W, H=H)
    if route == _cpu.ROUTE_CHOLQR2:
        sums = _cholqr2_pass(dW, dH, dups, P, L, C, A, w, np.ascontiguousarray(Mt))
        if sums is None:
            return on_cpu()
        Rf, N, b, ok = _cpu.finish_cholqr2(sums[0], sums[1], Rf)
        if not ok:
            route = _cpu.ROUTE_TSQR
    if route == _cpu.ROUTE_TSQR:
        return on_cpu()
    if not (np.all(np.isfinite(Rf)) and np.all(np.isfinite(N)) and np.all(np.isfinite(b))):
        _host.raise_nonfinite("LO-FI update", ups=ups, W=W, H=H)
    ok, EW, ERt = _cpu.coefficients(Rf, N, b, idx, T, y0, rank)
    if not ok:
        raise NotPositiveDefiniteError("I + W~^T diag(1/ups) W~ is not positive definite")
    dout_m, dout_u, dout_W = cuda.device_array(P), cuda.device_array(P), cuda.device_array((P, rank))
    blocks, threads = _device.launch_1d(P)
    _device.lofi_output_rows[blocks, threads](cuda.to_device(mean), dups, dW, dH, cuda.to_device(EW),
                                              cuda.to_device(ERt), dout_m, dout_u, dout_W)
    out_m, out_u, out_W = dout_m.copy_to_host(), dout_u.copy_to_host(), dout_W.copy_to_host()
    if not (np.all(np.isfinite(out_m)) and np.all(np.isfinite(out_u)) and np.all(np.isfinite(out_W))):
        _host.raise_nonfinite("LO-FI update", mean=mean, ups=ups, W=W, H=H)
    out = (out_m, out_u, out_W)
    return out + (("gram", "cholqr2")[route],) if return_route else out
