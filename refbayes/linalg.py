"""Small dense linear algebra used by every filter.

Solves never form explicit inverses. Diagonal-plus-low-rank (DLR) helpers work
with a precision ``diag(ups) + W W^T`` (ups: (P,), W: (P, L)) and never build a
P x P matrix.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla
from numpy.typing import NDArray

from .errors import DivergenceError, NotPositiveDefiniteError

__all__ = [
    "symmetrize",
    "cholesky",
    "psd_solve",
    "rowsumsq",
    "dlr_inner",
    "dlr_solve",
    "dlr_quadratic",
    "dlr_covariance",
    "dlr_precision",
    "dlr_sample",
    "lowrank_update",
]


def symmetrize(A: NDArray[np.float64]) -> NDArray[np.float64]:
    """(A + A^T) / 2."""
    return 0.5 * (A + A.T)


def cholesky(A: NDArray[np.float64], name: str = "matrix") -> NDArray[np.float64]:
    """Lower Cholesky factor of a symmetric positive definite matrix.

    Raises NotPositiveDefiniteError (naming ``name``) instead of returning NaNs, and
    DivergenceError if A holds NaN or inf (a filter's state that has run away).
    """
    A = symmetrize(A)
    if not np.all(np.isfinite(A)):
        raise DivergenceError(f"{name} is not finite: the filter has diverged", quantity=name)
    try:
        return np.linalg.cholesky(A)
    except np.linalg.LinAlgError as exc:
        raise NotPositiveDefiniteError(f"{name} is not positive definite") from exc


def psd_solve(A: NDArray[np.float64], B: NDArray[np.float64], pinv: bool = False, name: str = "matrix") -> NDArray[np.float64]:
    """Solve A X = B for symmetric positive (semi-)definite A.

    pinv=False: Cholesky solve (A must be positive definite).
    pinv=True: minimum-norm least-squares solution, i.e. X = A^+ B, for a
    singular A (e.g. the full-class categorical covariance).
    """
    if pinv:
        if not (np.all(np.isfinite(A)) and np.all(np.isfinite(B))):
            raise DivergenceError(f"a solve with {name} has non-finite entries: the filter has diverged", quantity=name)
        return np.linalg.lstsq(symmetrize(A), B, rcond=None)[0]
    L = cholesky(A, name)
    if not np.all(np.isfinite(B)):
        raise DivergenceError(f"the right-hand side of a solve with {name} is not finite: the filter has diverged",
                              quantity=name)
    return sla.cho_solve((L, True), B, check_finite=False)


def rowsumsq(M: NDArray[np.float64]) -> NDArray[np.float64]:
    """Row sums of M * M: (P, K) -> (P,). The diagonal of M M^T in O(PK)."""
    return np.einsum("ij,ij->i", M, M)


def dlr_inner(ups: NDArray[np.float64], W: NDArray[np.float64]) -> NDArray[np.float64]:
    """I_L + W^T diag(1/ups) W, the L x L core of the DLR Woodbury identity."""
    L = W.shape[1]
    return np.eye(L) + W.T @ (W / ups[:, None])


def dlr_solve(ups: NDArray[np.float64], W: NDArray[np.float64], B: NDArray[np.float64]) -> NDArray[np.float64]:
    """(diag(ups) + W W^T)^{-1} B by Woodbury, in O(P L^2 + P L K).

    ups: (P,), W: (P, L), B: (P,) or (P, K).
    """
    Dinv_B = B / ups if B.ndim == 1 else B / ups[:, None]
    if W.shape[1] == 0:
        return Dinv_B
    Dinv_W = W / ups[:, None]
    core = psd_solve(dlr_inner(ups, W), W.T @ Dinv_B, name="I + W^T diag(1/ups) W")
    return Dinv_B - Dinv_W @ core


def dlr_quadratic(ups: NDArray[np.float64], W: NDArray[np.float64], J: NDArray[np.float64]) -> NDArray[np.float64]:
    """J (diag(ups) + W W^T)^{-1} J^T for J (C, P), without a P x P matrix.

    This is the linearised predictive covariance term (LO-FI paper eq. 63).
    """
    JD = J / ups[None, :]
    out = JD @ J.T
    if W.shape[1] > 0:
        JDW = JD @ W
        out = out - JDW @ psd_solve(dlr_inner(ups, W), JDW.T, name="I + W^T diag(1/ups) W")
    return symmetrize(out)


def dlr_precision(ups: NDArray[np.float64], W: NDArray[np.float64]) -> NDArray[np.float64]:
    """Dense precision diag(ups) + W W^T. For tests and small P only."""
    return np.diag(ups) + W @ W.T


def dlr_covariance(ups: NDArray[np.float64], W: NDArray[np.float64]) -> NDArray[np.float64]:
    """Dense covariance (diag(ups) + W W^T)^{-1} by Woodbury. For tests and small P only."""
    return symmetrize(dlr_solve(ups, W, np.eye(ups.shape[0])))


def dlr_sample(mean: NDArray[np.float64], ups: NDArray[np.float64], W: NDArray[np.float64], rng: np.random.Generator, n: int) -> NDArray[np.float64]:
    """n draws from N(mean, (diag(ups) + W W^T)^{-1}) in O(n P L + P L^2).

    With D = diag(1/ups), M = D W (I + W^T D W)^{-1}, x ~ N(0, D) and
    eps ~ N(0, I_L), the draw mean + x - M W^T x + M eps has exactly the
    wanted covariance (Lambert et al. 2021, Prop. 1). Returns (n, P).
    """
    P, L = W.shape
    x = rng.standard_normal((n, P)) / np.sqrt(ups)
    if L == 0:
        return mean + x
    M = psd_solve(dlr_inner(ups, W), (W / ups[:, None]).T, name="I + W^T diag(1/ups) W").T
    eps = rng.standard_normal((n, L))
    return mean + x - (x @ W) @ M.T + eps @ M.T


def lowrank_update(S: NDArray[np.float64], B: NDArray[np.float64], sign: float = -1.0, block: int = 64) -> NDArray[np.float64]:
    """S + sign * B^T B as a new (P, P) array, for S (P, P) and B (K, P), in O(K P^2).

    Written block of rows by block of rows (a (block, P) product, then one subtraction
    into the output), so the P x P data is read once and written once, about the cost
    of one copy of S. Element (i, j) sums the same K products as (j, i): for a
    symmetric S the result is symmetric to round-off (bit-for-bit with the usual BLAS
    kernels, which tests check). sign: -1.0 (downdate) or +1.0 (update).
    """
    P = S.shape[0]
    out = np.empty((P, P))
    if P == 0:
        return out
    Bt = np.ascontiguousarray(B.T)
    B = np.ascontiguousarray(B)
    tmp = np.empty((min(block, P), P))
    op = np.subtract if sign < 0 else np.add
    for r in range(0, P, block):
        e = min(r + block, P)
        t = tmp[: e - r]
        np.matmul(Bt[r:e], B, out=t)
        op(S[r:e], t, out=out[r:e])
    return out
