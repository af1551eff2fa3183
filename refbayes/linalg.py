"""Small dense linear algebra used by every filter.

Solves never form explicit inverses. Diagonal-plus-low-rank (DLR) helpers work
with a precision ``diag(ups) + W W^T`` (ups: (P,), W: (P, L)) and never build a
P x P matrix.
"""

from __future__ import annotations

import functools

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
    "column_signs",
    "lowrank_update",
    "sym_matmul",
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

    The draw is a function of the belief, not of how W is signed: W and W diag(s) (s = +-1 per
    column) are the same belief, and the draw is taken for the W whose columns w have c^T w >= 0
    (:func:`column_signs`), by eps -> s * eps (M eps becomes M diag(s) eps). Two implementations
    whose truncations sign a column differently (each SVD route may) then draw the same theta from
    the same Generator. A W rotated otherwise (tied singular values, a user's own W) still gives
    its own draws.
    """
    P, L = W.shape
    x = rng.standard_normal((n, P)) / np.sqrt(ups)
    if L == 0:
        return mean + x
    M = psd_solve(dlr_inner(ups, W), (W / ups[:, None]).T, name="I + W^T diag(1/ups) W").T
    eps = rng.standard_normal((n, L)) * column_signs(W)
    return mean + x - (x @ W) @ M.T + eps @ M.T


GOLDEN = 0.6180339887498949  # phi - 1; frac(i phi) = frac(i (phi - 1))


def column_signs(W: NDArray[np.float64]) -> NDArray[np.float64]:
    """(L,) +1 or -1 per column w of W (P, L): the sign of c^T w for fixed weights c_i = frac(i phi) - 1/2,
    i = 1..P (phi the golden ratio; +1 where c^T w = 0), so that W * column_signs(W) has c^T w >= 0
    in every column. The weights have no symmetry a model's structure could cancel (the sign of a
    column's largest entry would not do: a column (v, -v), as a two-class softmax gives, has two)."""
    return np.where(sign_weights(W.shape[0]) @ W < 0, -1.0, 1.0)


@functools.lru_cache(maxsize=8)
def sign_weights(P: int) -> NDArray[np.float64]:
    """(P,) c_i = frac(i phi) - 1/2 for i = 1..P (:func:`column_signs`); read-only, kept for the
    last few P (every draw from a DLR belief reads it)."""
    c = np.arange(1, P + 1) * GOLDEN % 1.0 - 0.5
    c.setflags(write=False)
    return c


def sym_matmul(S: NDArray[np.float64], U: NDArray[np.float64], *, compiled: bool = False) -> NDArray[np.float64]:
    """S U for a symmetric S (P, P) and U (P,) or (P, K), in O(P^2 K), reading one triangle of S.

    Default (the reference's route): one BLAS symv per column, each reading only the lower
    triangle of S (half the P x P data, the other half being equal), where ``S @ U`` reads all of
    it and a (P, P) x (P, K) product with small K runs well below memory speed. compiled=True
    (the full-covariance filters' ``backend="numba"``): one compiled pass that reads the lower
    triangle once for all K columns (``refbayes.kernels.cpu.cholupdate.sym_lower_times``), the
    same numbers to round-off. S must be exactly symmetric (as every filter-built covariance is);
    entries above the diagonal are not read.
    """
    vec = U.ndim == 1
    U = U[:, None] if vec else U
    P, K = U.shape
    if compiled and P:
        from refbayes.kernels import _host
        from refbayes.kernels.cpu.cholupdate import sym_lower_times

        Ut = _host.as_f64(U, "U", (P, K), transpose=True)
        out = sym_lower_times(_host.as_f64(S, "S", (P, P)), Ut, np.empty((K, P))).T
        return out[:, 0] if vec else out
    out = np.empty((P, K))
    if P:
        # S's transpose as a column-major view (no copy); its upper triangle is S's lower one
        St = np.ascontiguousarray(S).T
        for k in range(K):
            out[:, k] = sla.blas.dsymv(1.0, St, U[:, k], lower=0)
    return out[:, 0] if vec else out


def lowrank_update(S: NDArray[np.float64], B: NDArray[np.float64], sign: float = -1.0, block: int | None = None, *,
                   scale: float = 1.0, diag: NDArray[np.float64] | float | None = None,
                   plus: NDArray[np.float64] | None = None, compiled: bool = False) -> NDArray[np.float64]:
    """scale S + diag(diag) + sign B^T B (+ plus^T plus) as a new (P, P) array, in O(K P^2).

    S (P, P) symmetric; B (K, P); sign -1.0 (downdate) or +1.0 (update); scale a scalar and
    diag None, a scalar or (P,): with them a predict step (gamma^2 Sigma + diag(q)) is folded
    into the update, so that predict + update writes one new P x P array instead of two;
    plus (K2, P) or None: a second, added, low-rank term (Woodbury updates of mixed sign, the
    Joseph form), in the same pass.

    Three routes to the same numbers (to round-off):
      - default (block None): the output written once (scale S, plus diag on its diagonal), then
        the low-rank term added in place by one BLAS gemm (beta = 1), about two copies of S in
        cost: the reference's route;
      - compiled=True (block None): one compiled pass (``refbayes.kernels.cpu.cholupdate.lowrank_pass``)
        that reads S once and writes each row of the output once, about one copy; the route of
        the full-covariance filters' ``backend="numba"``; from P = ``cholupdate.COPY_FIRST_P`` on it
        runs on the kernel threads (``cholupdate.update_pass``, the same numbers on any count);
      - block an int: block of rows by block of rows in NumPy (a (block, P) product, then one
        subtraction).
    Element (i, j) sums the same K products as (j, i) (a sign of -1 is an exact negation):
    for a symmetric S the result is symmetric bit for bit (tests check every route).
    """
    P = S.shape[0]
    if sign not in (-1.0, 1.0):
        raise ValueError(f"sign must be -1.0 or 1.0; got {sign!r}")
    Bl = sign * np.asarray(B, dtype=np.float64)  # rows with their sign: (sign B)^T B
    Br = np.asarray(B, dtype=np.float64)
    if plus is not None:
        Bl = np.concatenate([Bl, plus])
        Br = np.concatenate([Br, plus])
    if block is None and compiled and P:
        from refbayes.kernels import _host
        from refbayes.kernels.cpu.cholupdate import update_pass

        K = Br.shape[0]
        d = np.zeros(P) if diag is None else np.broadcast_to(np.asarray(diag, dtype=np.float64), (P,))
        # as_f64 passes read-only arrays, as a belief's covariance is: one compiled specialisation
        return update_pass(_host.as_f64(S, "S", (P, P)), float(scale), _host.as_f64(d, "diag", (P,)),
                            _host.as_f64(Bl, "B", (K, P), transpose=True), _host.as_f64(Br, "B", (K, P)),
                            np.empty((P, P)))
    out = np.multiply(S, scale) if scale != 1.0 else np.array(S, dtype=np.float64, order="C")
    if P == 0:
        return out
    if diag is not None:
        out.flat[:: P + 1] += np.broadcast_to(diag, (P,))
    if Bl.shape[0] == 0:
        return out
    if block is None:
        # out^T (column-major, the same memory) += Bl^T Br, in place (beta = 1); symmetric, so out += Bl^T Br
        res = sla.blas.dgemm(1.0, np.asfortranarray(Bl.T), np.asfortranarray(Br), beta=1.0, c=out.T, overwrite_c=True)
        if not np.shares_memory(res, out):  # the wrapper worked on a copy (it does not for this layout)
            out[...] = res.T
        return out
    Blt = np.ascontiguousarray(Bl.T)
    Br = np.ascontiguousarray(Br)
    tmp = np.empty((min(block, P), P))
    for r in range(0, P, block):
        e = min(r + block, P)
        t = tmp[: e - r]
        np.matmul(Blt[r:e], Br, out=t)
        np.add(out[r:e], t, out=out[r:e])
    return out
