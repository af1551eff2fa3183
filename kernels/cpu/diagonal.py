"""FD-EKF and VD-EKF updates as Numba kernels (Chang, Jones & Murphy 2022).

Same inputs and outputs as ``refbayes.filters.diagonal.fd_update`` / ``vd_update``,
on plain arrays: (mean (P,), var (P,), H (C, P), R (C, C), e (C,)) -> (mean, var).

Work split: the O(P C^2) passes over H run in Numba; the C x C algebra (the
Cholesky factor of S or R, a few solves) runs in NumPy in the wrapper.

- FD-EKF (eqs 10-12): S = R + H diag(v) H^T (pass 1), then with A^T A = S^{-1}
  and w = S^{-1} e (pass 2): mu'_i = mu_i + v_i h_i^T w, v'_i = v_i - v_i^2 |A h_i|^2.
- VD-EKF (eqs 13-14, 25): with A^T A = R^{-1}, w = R^{-1} e (one pass):
  v'_i = 1 / (1/v_i + |A h_i|^2); mean rule "paper": mu'_i = mu_i + v'_i h_i^T w;
  rule "ekf": the FD-EKF mean (needs pass 1 as well).
"""

import numba
import numpy as np

from refbayes.errors import NotPositiveDefiniteError

from .. import _host
from ._blocks import SB, project_block, weighted_gram_rows

__all__ = ["fd_update", "vd_update", "diag_pass", "VD_MEAN_RULES"]

VD_MEAN_RULES = ("paper", "ekf")

# how the pass combines the quadratic term q_i = |A h_i|^2 and the dot d_i = h_i^T w
MODE_FD = 0  # v' = v - v^2 q,    mu' = mu + v d
MODE_VD_PAPER = 1  # v' = 1/(1/v + q), mu' = mu + v' d
MODE_VD_EKF = 2  # v' = 1/(1/v + q), mu' = mu + v d


@numba.njit(cache=True)
def diag_pass(mean, var, H, A, w, mode, out_mean, out_var):
    """One pass over H (C, P): q_i = |A h_i|^2 (A (k, C)), d_i = h_i^T w (w (C,)).

    Writes out_mean, out_var (P,) according to ``mode`` (MODE_FD, MODE_VD_PAPER,
    MODE_VD_EKF). Returns the number of entries with a non-finite mean or a
    variance that is not > 0.
    """
    C, P = H.shape
    k = A.shape[0]
    z = np.empty(SB)
    q = np.empty(SB)
    d = np.empty(SB)
    nbad = 0
    for i0 in range(0, P, SB):
        n = min(SB, P - i0)
        project_block(H, w, i0, n, d)
        for j in range(n):
            q[j] = 0.0
        for r in range(k):
            for j in range(n):
                z[j] = 0.0
            for c in range(C):
                a = A[r, c]
                if a == 0.0:
                    continue
                for j in range(n):
                    z[j] += a * H[c, i0 + j]
            for j in range(n):
                q[j] += z[j] * z[j]
        for j in range(n):
            i = i0 + j
            v = var[i]
            if mode == 0:
                vn = v - v * v * q[j]
                mn = mean[i] + v * d[j]
            elif mode == 1:
                vn = 1.0 / (1.0 / v + q[j])
                mn = mean[i] + vn * d[j]
            else:
                vn = 1.0 / (1.0 / v + q[j])
                mn = mean[i] + v * d[j]
            out_var[i] = vn
            out_mean[i] = mn
            if not (vn > 0.0 and np.isfinite(vn) and np.isfinite(mn)):
                nbad += 1
    return nbad


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
    C = H.shape[0]
    S = np.empty((C, C))
    weighted_gram_rows(H, var, S)
    if not np.all(np.isfinite(S)):
        _host.raise_nonfinite("H diag(v) H^T", var=var, H=H)
    S += 0.5 * (R + R.T)
    return _host.innovation_factor(S, singular)


def _run(mean, var, H, A, w, mode, what):
    P = mean.shape[0]
    out_mean = np.empty(P)
    out_var = np.empty(P)
    nbad = diag_pass(mean, var, H, np.ascontiguousarray(A), np.ascontiguousarray(w), mode, out_mean, out_var)
    if nbad:
        if not (np.all(np.isfinite(out_var)) and np.all(np.isfinite(out_mean))):
            _host.raise_nonfinite(what, mean=mean, var=var, H=H)
        i = int(np.argmin(out_var))
        raise NotPositiveDefiniteError(
            f"{what} variance {i} became {out_var[i]!r} (round-off); use a larger prior or observation noise"
        )
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
