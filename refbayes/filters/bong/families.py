"""Variational families of BONG: beliefs, predict steps and the DLR projection.

Jones, Chang & Murphy (2024), Sec. 3 and Appendix E. Five families:

==============  =========  ===============================================
family          belief     parameters the inner steps move
==============  =========  ===============================================
"full-natural"  FullCov    (Lambda mu, -Lambda/2)   (paper App. E.1, "FC")
"full"          FullCov    (mu, Sigma)              (App. E.2, "FC_MOM")
"diag-natural"  Diag       (lambda mu, -lambda/2)   (App. E.3, "DIAG")
"diag"          Diag       (mu, sigma^2)            (App. E.4, "DIAG_MOM")
"dlr"           DLR        Lambda = diag(ups) + W W^T  (App. E.5)
==============  =========  ===============================================

The natural-parameter families store the same beliefs as the moment ones;
only the update differs. Predict steps (paper Alg. 2) use the dynamics
theta_t ~ N(gamma theta_{t-1} + b, diag(q)).
"""

import threading
import weakref

import numpy as np

from ... import linalg
from ...beliefs import DLR, Diag, FullCov
from ...errors import DivergenceError, NotPositiveDefiniteError
from .. import lofi

__all__ = [
    "FAMILIES",
    "BELIEF_TYPES",
    "init_belief",
    "ou_dynamics",
    "predict_full",
    "PredictedFull",
    "full_cov_times",
    "full_cov_update",
    "unformed",
    "predict_diag",
    "predict_dlr",
    "predict",
    "dlr_project",
    "dlr_matvec",
    "full_belief",
    "full_belief_fast",
    "diag_belief",
    "dlr_belief",
    "precision_of",
    "covariance_from_precision",
]

FAMILIES = ("full", "full-natural", "diag", "diag-natural", "dlr")
BELIEF_TYPES = {"full": FullCov, "full-natural": FullCov, "diag": Diag, "diag-natural": Diag, "dlr": DLR}


# --------------------------------------------------------------------------------------------
# checked constructors: numerical failure raises NotPositiveDefiniteError, never NaN


def full_belief(mean, cov, what="covariance"):
    """FullCov(mean, cov) after checking that cov is finite and positive definite (Cholesky)."""
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(cov))):
        raise DivergenceError(f"{what} update produced NaN or inf (overflow)", quantity=what)
    cov = linalg.symmetrize(cov)
    linalg.cholesky(cov, what)
    return FullCov(mean, cov)


def full_belief_fast(mean, cov, what="covariance"):
    """FullCov from a filter-built, exactly symmetric cov, checked in O(P) (no P x P pass).

    The mean must be finite and diag(cov) finite (else DivergenceError) and > 0 (else
    NotPositiveDefiniteError); the belief is marked as checked, so that the filter's finiteness
    check (``base.check_belief_finite``, the same reads) does not read them again.
    Callers guarantee definiteness by their own O(P^2 K) means (a K x K Cholesky) or
    say in their docstring that only this diagonal test guards it.
    """
    d = np.diagonal(cov)
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(d))):
        raise DivergenceError(f"{what} update produced NaN or inf (overflow)", quantity=what)
    if not np.all(d > 0):
        i = int(np.argmin(d))
        raise NotPositiveDefiniteError(f"{what} update made diagonal entry {i} non-positive ({float(d[i])!r})")
    out = FullCov._from_filter(mean, cov)
    # the mean and the diagonal are what base.check_belief_finite reads of a FullCov: checked here
    object.__setattr__(out, "_kernel_checked", True)
    return out


def diag_belief(mean, var, what="variance"):
    """Diag(mean, var) after checking that var is finite and > 0."""
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
        raise DivergenceError(f"{what} update produced NaN or inf (overflow)", quantity=what)
    if np.any(var <= 0):
        i = int(np.argmin(var))
        raise NotPositiveDefiniteError(f"{what} update made entry {i} non-positive ({float(var[i])!r})")
    return Diag(mean, var)


def dlr_belief(mean, ups, W, what="DLR precision"):
    """DLR(mean, ups, W) after checking finiteness and ups > 0."""
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(ups)) and np.all(np.isfinite(W))):
        raise DivergenceError(f"{what} update produced NaN or inf (overflow)", quantity=what)
    if np.any(ups <= 0):
        i = int(np.argmin(ups))
        raise NotPositiveDefiniteError(f"{what} update made diagonal entry {i} non-positive ({float(ups[i])!r})")
    return DLR(mean, ups, W)


def precision_of(cov, what="covariance"):
    """Sigma^{-1} (P, P) by Cholesky; raises NotPositiveDefiniteError."""
    return linalg.symmetrize(linalg.psd_solve(cov, np.eye(cov.shape[0]), name=what))


def covariance_from_precision(prec, what="precision"):
    """Lambda^{-1} (P, P) by Cholesky; raises NotPositiveDefiniteError."""
    return precision_of(prec, what)


# --------------------------------------------------------------------------------------------
# initial beliefs and dynamics


def init_belief(family, mean, var, rank=0):
    """Prior N(mean, diag(var)) in the family's belief type (DLR: ups = 1/var, W = 0 (P, rank))."""
    if family in ("full", "full-natural"):
        return FullCov(mean, np.diag(var))
    if family in ("diag", "diag-natural"):
        return Diag(mean, var)
    if family == "dlr":
        return DLR(mean, 1.0 / var, np.zeros((mean.shape[0], rank)))
    raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")


def ou_dynamics(gamma, mean0, var0):
    """The paper's mean-reverting choice (Sec. 3): b = (1 - gamma) mu_0, Q = (1 - gamma^2) diag(var0).

    Returns (b (P,), q (P,)); q = 0 when gamma = 1 (static model).
    """
    return (1.0 - gamma) * mean0, (1.0 - gamma**2) * var0


def predict_full(bel, gamma, q, b=None):
    """Full-covariance predict (Jones et al. 2024, Alg. 2).

    mu_p = gamma mu + b, Sigma_p = gamma^2 Sigma + diag(q). bel: FullCov (P);
    q scalar or (P,); b None or (P,). Returns FullCov.
    """
    P = bel.n_params
    mean = gamma * bel.mean if b is None else gamma * bel.mean + b
    cov = np.multiply(bel.cov, gamma**2)  # one pass over P x P; exactly symmetric if bel.cov is
    cov.flat[:: P + 1] += np.broadcast_to(q, (P,))
    out = FullCov._from_filter(mean, cov)
    carried = carried_factor(bel)
    if carried is not None:  # gamma^2 B <= gamma^2 Sigma + diag(q): the bound goes on
        carry_factor(out, carried.scaled(gamma))
    return out


# Lower bounds B <= Sigma of live FullCov beliefs (FactorBound), carried from one BOG (moment) step to
# the next for its definiteness certificate (algorithms._certify_bog): id(belief) -> (weak reference,
# bound, token). At most FACTORS_KEPT entries; an entry goes when its belief is collected. The beliefs
# of a stream share one P x P factor until a flush writes the next (FactorBound.downdated).
_FACTORS = {}
_FACTORS_LOCK = threading.Lock()
FACTORS_KEPT = 4

# a bound keeps fewer downdate rows than this; the step that would reach it downdates the factor by all
# of them (FactorBound.downdated): one rank-m downdate, O(m P^2), costs less per row for m = 32 than for
# m = 8 (0.17 against 0.22 ms a row at P = 1,410, one thread)
FLUSH_ROWS = 32


class FactorBound:
    """A lower bound B = a^2 (R^T R - X^T X) <= Sigma of a FullCov belief's covariance: the
    definiteness certificate of BOG over "full-moment" (``algorithms._certify_bog``, docs/bong.md §7).

    R (P, P): upper triangular, positive diagonal, zeros below; shared by the bounds of a stream and
    never written. a > 0. X (m, P): the rows of the downdates taken since R was made (m <
    ``FLUSH_ROWS``); Z (m, P): Z^T = R^{-T} X^T; G = Z Z^T (m, m). Since X^T X = R^T Z^T Z R,
    B = a^2 R^T (I_P - Z^T Z) R, positive definite exactly when I_m - G is: a step's downdate is
    certified by an m x m eigenvalue problem after one triangular solve, O(K P^2), that only reads R
    (:meth:`downdated`), where downdating R itself reads it and writes a new P x P factor.
    """

    __slots__ = ("R", "a", "X", "Z", "G")

    def __init__(self, R, a=1.0, X=None, Z=None, G=None):
        P = R.shape[0]
        self.R = R
        self.a = float(a)
        self.X = np.empty((0, P)) if X is None else X
        self.Z = np.empty((0, P)) if Z is None else Z
        self.G = np.empty((0, 0)) if G is None else G

    def scaled(self, f):
        """The bound f^2 B (f > 0): the predict step's gamma^2 Sigma + diag(q) >= gamma^2 B."""
        return FactorBound(self.R, f * self.a, self.X, self.Z, self.G)

    def downdated(self, f, Y, tol):
        """The bound f^2 B - Y^T Y (f > 0, Y (K, P)), or None where it is not shown positive definite
        with margin tol (the caller then decides another way).

        f^2 B - Y^T Y = a'^2 (R^T R - X'^T X'), a' = f a, X' = [X; Y / a']. Below ``FLUSH_ROWS`` rows the
        new rows' Z comes from one forward substitution (``kernels.cpu.cholupdate.upper_solve_rows``, one
        read of R's upper triangle), G' from G and K (m + K) P products, and the bound is shown when the
        smallest eigenvalue of I - G' exceeds tol (f^2 B - Y^T Y >= tol a'^2 R^T R). The step that
        reaches FLUSH_ROWS rows downdates R by all of them instead (``kernels.cpu.cholupdate.chol_downdate``,
        R'^T R' = R^T R - X'^T X', each pivot r^2 above tol of its R_jj^2), and the bound a'^2 R'^T R'
        starts with no rows.
        """
        from ...kernels.cpu.cholupdate import chol_downdate, upper_solve_rows

        a = f * self.a
        Xn = np.ascontiguousarray(Y, dtype=np.float64) / a
        X = np.concatenate([self.X, Xn])
        if X.shape[0] >= FLUSH_ROWS:
            R = np.empty_like(self.R)
            return FactorBound(R, a) if chol_downdate(self.R, 1.0, X, R, tol) < 0 else None
        Zn = upper_solve_rows(self.R, Xn, np.empty_like(Xn))
        if not np.all(np.isfinite(Zn)):
            return None
        cross = Zn @ self.Z.T  # (K, m)
        G = np.block([[self.G, cross.T], [cross, Zn @ Zn.T]])
        if G.shape[0] and not np.linalg.eigvalsh(np.eye(G.shape[0]) - G)[0] > tol:  # no rows: B itself
            return None
        return FactorBound(self.R, a, X, np.concatenate([self.Z, Zn]), G)

    def dense(self):
        """B as a (P, P) array (for tests: O(P^3))."""
        return self.a**2 * (self.R.T @ self.R - self.X.T @ self.X)


def carried_factor(bel):
    """The FactorBound carried for ``bel`` (its bound B <= bel.cov), or None."""
    with _FACTORS_LOCK:
        entry = _FACTORS.get(id(bel))
    return entry[1] if entry is not None and entry[0]() is bel else None


def carry_factor(bel, bound):
    """Carry ``bound`` (a FactorBound, B <= bel.cov) for the steps that start from ``bel``."""
    key = id(bel)
    token = object()  # names this entry for the finalizer, which must not keep the bound alive
    with _FACTORS_LOCK:
        _FACTORS.pop(key, None)
        while len(_FACTORS) >= FACTORS_KEPT:
            _FACTORS.pop(next(iter(_FACTORS)))  # the oldest entry
        _FACTORS[key] = (weakref.ref(bel), bound, token)
    weakref.finalize(bel, _drop_factor, key, token)


def _drop_factor(key, token):
    with _FACTORS_LOCK:
        entry = _FACTORS.get(key)
        if entry is not None and entry[2] is token:
            del _FACTORS[key]


class PredictedFull:
    """The predicted full-covariance belief of Alg. 2, held without forming its covariance.

    mean = gamma mu + b (P,) and Sigma_p = gamma^2 Sigma + diag(q), kept as (Sigma, gamma^2, q)
    of the FullCov ``bel``: the factor-curvature steps of the full families touch Sigma_p only
    through products Sigma_p U (:func:`full_cov_times`) and one low-rank update
    (:func:`full_cov_update`), so predict + update writes one new P x P array
    (``Bong.predict_update``, LIN estimators). ``cov`` forms Sigma_p (:func:`predict_full`)
    for the steps that need it dense. Not a belief: internal to one step. compiled: the products and
    the update pass are the compiled ones (``linalg.sym_matmul(compiled=True)``,
    ``linalg.lowrank_update(compiled=True)``; ``Bong(backend="numba")``).
    """

    def __init__(self, bel, gamma, q, b=None, compiled=False):
        P = bel.n_params
        self.compiled = bool(compiled)
        self.base = bel
        self.n_params = P
        self.scale = gamma**2
        self.q = np.broadcast_to(np.asarray(q, dtype=np.float64), (P,)) if np.any(q) else None
        self.mean = gamma * bel.mean if b is None else gamma * bel.mean + b
        self._gamma, self._q, self._b = gamma, q, b
        self._cov = None

    @property
    def cov(self):
        """Sigma_p (P, P), formed on first use (one pass, as :func:`predict_full`)."""
        if self._cov is None:
            self._cov = predict_full(self.base, self._gamma, self._q, self._b).cov
        return self._cov


def unformed(prior):
    """Whether ``prior`` is a PredictedFull whose covariance Sigma_p has not been formed: then a step
    reads Sigma_p through (Sigma, gamma^2, q) and never writes it out."""
    return isinstance(prior, PredictedFull) and prior._cov is None


def full_cov_times(prior, U):
    """Sigma_p U for a FullCov or PredictedFull ``prior`` and U (P,) or (P, K), in O(P^2 K).

    Reads one triangle of the stored covariance (linalg.sym_matmul; a PredictedFull made with
    ``compiled=True`` reads it once for all K columns, the compiled product); for a PredictedFull,
    Sigma_p U = gamma^2 (Sigma U) + diag(q) U.
    """
    compiled = getattr(prior, "compiled", False)
    if not unformed(prior):
        return linalg.sym_matmul(prior.cov, U, compiled=compiled)
    out = prior.scale * linalg.sym_matmul(prior.base.cov, U, compiled=compiled)
    if prior.q is not None:
        out += prior.q * U if U.ndim == 1 else prior.q[:, None] * U
    return out


def full_cov_update(prior, B, sign=-1.0, plus=None):
    """Sigma_p + sign B^T B (+ plus^T plus) as a new (P, P) array (linalg.lowrank_update), O(K P^2).

    For a PredictedFull the predict step is folded in: gamma^2 Sigma + diag(q) + sign B^T B
    in one pass over the stored covariance. Symmetric by construction. A PredictedFull made with
    ``compiled=True`` takes the compiled pass (its formed Sigma_p too), any other prior the reference's route.
    """
    compiled = getattr(prior, "compiled", False)
    if not unformed(prior):
        return linalg.lowrank_update(prior.cov, B, sign, plus=plus, compiled=compiled)
    return linalg.lowrank_update(prior.base.cov, B, sign, scale=prior.scale, diag=prior.q, plus=plus,
                                 compiled=compiled)


def full_cov_downdate_bound(prior, B):
    """(Sigma_p - B^T B as a new (P, P) array, its Gershgorin lower bound min_i (2 S_ii - sum_j |S_ij|)).

    The array of ``full_cov_update(prior, B)`` (equal to round-off, and symmetric bit for bit),
    written with its bound in one pass over the stored covariance
    (``kernels.cpu.cholupdate.lowrank_gershgorin``; from ``cholupdate.COPY_FIRST_P`` on, on the kernel
    threads: ``update_pass_bound``), where bounding it afterwards reads the new array a second time.
    B (K, P).
    """
    from refbayes.kernels.cpu.cholupdate import update_pass_bound

    S, scale, d = (prior.base.cov, prior.scale, prior.q) if unformed(prior) else (prior.cov, 1.0, None)
    P = S.shape[0]
    B = np.ascontiguousarray(B, dtype=np.float64)
    d = np.zeros(P) if d is None else np.ascontiguousarray(np.broadcast_to(d, (P,)), dtype=np.float64)
    out = np.empty((P, P))
    low = update_pass_bound(np.ascontiguousarray(S), float(scale), d, np.ascontiguousarray(-B.T), B, out)
    return out, low


def predict_diag(bel, gamma, q, b=None):
    """Diagonal predict (Jones et al. 2024, Alg. 2 with F = gamma I, Q = diag(q)).

    mu_p = gamma mu + b, s_p = gamma^2 s + q. bel: Diag (P). Returns Diag.
    """
    mean = gamma * bel.mean if b is None else gamma * bel.mean + b
    return Diag(mean, gamma**2 * bel.var + q)


def predict_dlr(bel, gamma, q, b=None):
    """Exact DLR predict (Jones et al. 2024, Alg. 2 with F = gamma I, Q = diag(q)).

    The predicted precision (gamma^2 Lambda^{-1} + diag(q))^{-1} is again DLR
    with the same rank; this is LO-FI's predict step (refbayes.filters.lofi.predict),
    plus the optional mean offset b of the OU dynamics. Returns DLR.
    """
    out = lofi.predict(bel, gamma, q)
    return out if b is None else out.replace(mean=out.mean + b)


def predict(family, bel, gamma, q, b=None):
    """Dispatch to the predict step of ``family``."""
    if family in ("full", "full-natural"):
        return predict_full(bel, gamma, q, b)
    if family in ("diag", "diag-natural"):
        return predict_diag(bel, gamma, q, b)
    return predict_dlr(bel, gamma, q, b)


# --------------------------------------------------------------------------------------------
# DLR helpers


def dlr_matvec(ups, W, X):
    """Lambda X = ups * X + W (W^T X) for X (P,) or (P, K), in O(P R K)."""
    if X.ndim == 1:
        return ups * X + W @ (W.T @ X)
    return ups[:, None] * X + W @ (W.T @ X)


def dlr_project(ups, W, rank):
    """Project diag(ups) + W W^T, W (P, L), onto rank ``rank`` (Jones et al. 2024, eqs 284-286).

    The paper's eigendecomposition of W^T W gives the same projection as a thin
    SVD of W, which is what LO-FI's truncation (refbayes.filters.lofi.truncate)
    computes without squaring the condition number: W_new holds the top
    singular directions times singular values, and the dropped part goes to
    the diagonal: ups_new = ups + rowsumsq(dropped part), so
    diag(ups_new + W_new W_new^T) = diag(ups + W W^T) exactly. If L < rank the
    factor is padded with zero columns. Cost O(P L^2 + L^3). Returns (ups_new, W_new (P, rank)).
    """
    return lofi.truncate(ups, W, rank, svd="svd")
