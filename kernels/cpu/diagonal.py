"""FD-EKF and VD-EKF updates as Numba kernels (Chang, Jones & Murphy 2022).

Same inputs and outputs as ``refbayes.filters.diagonal.fd_update`` / ``vd_update``,
on plain arrays: (mean (P,), var (P,), H (C, P), R (C, C), e (C,)) -> (mean, var).

Work split: the O(P C^2) passes over H run in Numba, in chunks of ``NBD`` parameters
spread over a few threads (``_host.run_chunks``; per-chunk sums are added in chunk
order, so the numbers do not depend on the thread count); the C x C algebra (the
Cholesky factor of S or R, a few solves) runs in NumPy in the wrapper.

- FD-EKF (eqs 10-12): S = R + H diag(v) H^T (pass 1), then with A^T A = S^{-1}
  and w = S^{-1} e (pass 2): mu'_i = mu_i + v_i h_i^T w, v'_i = v_i - v_i^2 |A h_i|^2.
- VD-EKF (eqs 13-14, 25): with A^T A = R^{-1}, w = R^{-1} e (one pass):
  v'_i = 1 / (1/v_i + |A h_i|^2); mean rule "paper": mu'_i = mu_i + v'_i h_i^T w;
  rule "ekf": the FD-EKF mean (needs pass 1 as well).
"""

import numba
import numpy as np

from .. import _host
from ._blocks import CONTRACT, add_square_rows, combine_rows, row_gram

__all__ = ["fd_update", "vd_update", "diag_range", "gram_rows_range", "VD_MEAN_RULES"]

VD_MEAN_RULES = ("paper", "ekf")
NBD = 2048  # parameters per chunk (the unit of work of one thread)
SBD = 512  # parameters per sweep of the row combinations (fewer, longer vector loops than 256)

# how the pass combines the quadratic term q_i = |A h_i|^2 and the dot d_i = h_i^T w
MODE_FD = 0  # v' = v - v^2 q,    mu' = mu + v d
MODE_VD_PAPER = 1  # v' = 1/(1/v + q), mu' = mu + v' d
MODE_VD_EKF = 2  # v' = 1/(1/v + q), mu' = mu + v d


@numba.njit(nogil=True, cache=True, fastmath=CONTRACT, error_model="numpy")
def diag_range(mean, var, H, A, lower, w2, mode, out_mean, out_var, ch0, ch1):
    """Chunks ch0 <= ch < ch1 of one pass over H (C, P): q_i = |A h_i|^2 (A (k, C), lower
    triangular when ``lower``), d_i = h_i^T w (w2 = w as a (1, C) row).

    Writes out_mean, out_var (P,) according to ``mode`` (MODE_FD, MODE_VD_PAPER,
    MODE_VD_EKF). Returns the number of entries with a non-finite mean or a
    variance that is not > 0.
    """
    C, P = H.shape
    z = np.empty(2 * SBD)  # add_square_rows: partial sums of two rows of A
    q = np.empty(SBD)
    d = np.empty(SBD)
    nbad = 0
    for ch in range(ch0, ch1):
        c1 = min(P, (ch + 1) * NBD)
        for i0 in range(ch * NBD, c1, SBD):
            n = min(SBD, c1 - i0)
            combine_rows(H, w2, 0, C, i0, n, d)
            for j in range(n):
                q[j] = 0.0
            add_square_rows(H, A, lower, i0, n, z, q)
            vv = var[i0:i0 + n]
            mu = mean[i0:i0 + n]
            ov = out_var[i0:i0 + n]
            om = out_mean[i0:i0 + n]
            if mode == 0:
                for j in range(n):
                    ov[j] = vv[j] - vv[j] * vv[j] * q[j]
                    om[j] = mu[j] + vv[j] * d[j]
            elif mode == 1:
                for j in range(n):
                    ov[j] = 1.0 / (1.0 / vv[j] + q[j])
                    om[j] = mu[j] + ov[j] * d[j]
            else:
                for j in range(n):
                    ov[j] = 1.0 / (1.0 / vv[j] + q[j])
                    om[j] = mu[j] + vv[j] * d[j]
            for j in range(n):
                if not (ov[j] > 0.0 and np.isfinite(ov[j]) and np.isfinite(om[j])):
                    nbad += 1
    return nbad


@numba.njit(nogil=True, cache=True, error_model="numpy")
def gram_rows_range(X, w, parts, ch0, ch1):
    """Chunks ch0 <= ch < ch1: parts[ch] (lower triangle) = X diag(w) X^T over the chunk's columns."""
    P = X.shape[1]
    for ch in range(ch0, ch1):
        i0 = ch * NBD
        n = min(NBD, P - i0)
        row_gram(X, w[i0:i0 + n], i0, n, parts[ch])


def _nchunks(P):
    return (P + NBD - 1) // NBD


def _check(mean, var, H, R, e):
    mean = _host.as_f64(mean, "mean", (None,))
    P = mean.shape[0]
    var = _host.as_f64(var, "var", (P,))
    H = _host.as_f64(H, "H", (None, P))
    C = H.shape[0]
    R = _host.check_finite(_host.as_f64(R, "R", (C, C)), "R")
    e = _host.check_finite(_host.as_f64(e, "e", (C,)), "e")
    return mean, var, H, R, e


def _innovation(var, H, R, singular):
    """S = R + H diag(v) H^T (pass 1 over H), its factor A (A^T A = S^{-1}) and S^{-1} solver."""
    C, P = H.shape
    nch = _nchunks(P)
    parts = np.zeros((nch, C, C))
    _host.run_chunks(gram_rows_range, nch, H, var, parts)
    S = parts.sum(axis=0)  # chunk by chunk: the order does not depend on the thread count
    S = np.tril(S) + np.tril(S, -1).T
    if not np.all(np.isfinite(S)):
        _host.raise_nonfinite("H diag(v) H^T", var=var, H=H)
    S += 0.5 * (R + R.T)
    return _host.innovation_factor(S, singular)


def _run(mean, var, H, A, w, mode, what):
    P = mean.shape[0]
    out_mean = np.empty(P)
    out_var = np.empty(P)
    A = np.ascontiguousarray(A)
    lower = A.shape[0] == A.shape[1] and not np.any(np.triu(A, 1))
    w2 = np.ascontiguousarray(w, dtype=np.float64).reshape(1, -1)
    nbad = sum(_host.run_chunks(diag_range, _nchunks(P), mean, var, H, A, lower, w2, mode, out_mean, out_var))
    if nbad:
        if not (np.all(np.isfinite(out_var)) and np.all(np.isfinite(out_mean))):
            _host.raise_nonfinite(what, mean=mean, var=var, H=H)
        _host.raise_variance_roundoff(what, out_var)
    return out_mean, out_var


@_host.one_blas_thread
def fd_update(mean, var, H, R, e, singular=False):
    """FD-EKF update (Chang et al. 2022, eqs 10-12) in two passes over H.

    S = R + H diag(v) H^T, K = diag(v) H^T S^{-1}, mu' = mu + K e,
    v'_i = v_i - v_i^2 h_i^T S^{-1} h_i.
    mean, var: (P,); H: (C, P); R: (C, C); e: (C,). singular: use the
    pseudo-inverse of S. Returns (mean (P,), var (P,)), new arrays.
    Raises NotPositiveDefiniteError if a variance becomes <= 0.
    """
    mean, var, H, R, e = _check(mean, var, H, R, e)
    _host.check_positive(var, "var")
    A, solve = _innovation(var, H, R, singular)
    w = solve(e)
    return _run(mean, var, H, A, w, MODE_FD, "FD-EKF")


@_host.one_blas_thread
def vd_update(mean, var, H, R, e, mean_rule="paper", singular=False):
    """VD-EKF update (Chang et al. 2022, eqs 13-14 and 25).

    1/v'_i = 1/v_i + h_i^T R^{-1} h_i. Mean: "paper" (eq. 25) mu' = mu + v' (H^T R^{-1} e),
    one pass over H; "ekf" the FD-EKF mean mu + diag(v) H^T S^{-1} e, two passes.
    mean, var: (P,); H: (C, P); R: (C, C); e: (C,). singular: R is only positive
    semi-definite (pseudo-inverse). Returns (mean (P,), var (P,)), new arrays.
    """
    if mean_rule not in VD_MEAN_RULES:
        raise ValueError(f"mean_rule must be one of {VD_MEAN_RULES}; got {mean_rule!r}")
    mean, var, H, R, e = _check(mean, var, H, R, e)
    _host.check_positive(var, "var")
    A = _host.whitener(R, singular)
    if mean_rule == "paper":
        w = A.T @ (A @ e)
        return _run(mean, var, H, A, w, MODE_VD_PAPER, "VD-EKF")
    _, solve = _innovation(var, H, R, singular)
    return _run(mean, var, H, A, solve(e), MODE_VD_EKF, "VD-EKF")
