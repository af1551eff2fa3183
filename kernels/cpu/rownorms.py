"""rowsumsq: the diagonal of M M^T in O(P K) (Chang et al. 2023, footnote 5)."""

import numba
import numpy as np

from .. import _host

__all__ = ["rowsumsq", "rowsumsq_into"]


@numba.njit(cache=True, error_model="numpy")
def rowsumsq_into(M, out):
    """out[i] = sum_k M[i, k]^2 for M (P, K) row-major; out (P,). Sums in column order."""
    P, K = M.shape
    for i in range(P):
        s = 0.0
        for k in range(K):
            s += M[i, k] * M[i, k]
        out[i] = s


def rowsumsq(M):
    """Row sums of M * M: (P, K) -> (P,), as ``refbayes.linalg.rowsumsq``."""
    M = _host.as_f64(M, "M", (None, None))
    out = np.empty(M.shape[0])
    rowsumsq_into(M, out)
    return out
