"""Host side of the device reductions: launch, copy the (pairs, blocks) partials, add them."""

import numpy as np
from numba import cuda

from . import _device


def _pairs(K):
    a, b = np.tril_indices(K)
    return np.ascontiguousarray(a, dtype=np.int64), np.ascontiguousarray(b, dtype=np.int64)


def _assemble(K, pa, pb, part):
    sums = part.sum(axis=1)
    out = np.zeros((K, K))
    out[pa, pb] = sums
    out[pb, pa] = sums
    return out


def gram_rows(dX, dw, K, P):
    """X diag(w) X^T (K, K) for a device X (K, P) and device w (P,)."""
    if K == 0:
        return np.zeros((0, 0))
    pa, pb = _pairs(K)
    nb = _device.blocks_for(P, _device.MAX_BLOCKS)
    dpart = cuda.device_array((pa.shape[0], nb))
    _device.gram_rows_partial[(nb, pa.shape[0]), _device.TPB](dX, dw, cuda.to_device(pa), cuda.to_device(pb), dpart)
    return _assemble(K, pa, pb, dpart.copy_to_host())


def gram_cols(dX, dw, recip, K, P):
    """X^T diag(w) X (or diag(1/w)) (K, K) for a device X (P, K) and device w (P,)."""
    if K == 0:
        return np.zeros((0, 0))
    pa, pb = _pairs(K)
    nb = _device.blocks_for(P, _device.MAX_BLOCKS)
    dpart = cuda.device_array((pa.shape[0], nb))
    _device.gram_cols_partial[(nb, pa.shape[0]), _device.TPB](dX, dw, recip, cuda.to_device(pa), cuda.to_device(pb), dpart)
    return _assemble(K, pa, pb, dpart.copy_to_host())
