"""Full-covariance extended Kalman filter (FC-EKF).

Chang, Jones & Murphy (2022), eqs 4-9 (predict and update in covariance
form); the information form and the Joseph form are algebraically equal
alternatives kept for cross-checks and numerical robustness.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import scipy.linalg as sla
from numpy.typing import ArrayLike

from .. import linalg, memory
from ..beliefs import FullCov
from ..errors import DivergenceError, NotPositiveDefiniteError
from ..likelihoods import whiten
from .base import Filter, has_missing, linearize

if TYPE_CHECKING:
    from ..likelihoods import Likelihood
    from ..models import Model

__all__ = ["predict", "update", "predict_update", "FullEKF", "FORMS"]

FORMS = ("covariance", "joseph", "information")


def predict(bel, gamma, q):
    """Predict step: mu <- gamma mu, Sigma <- gamma^2 Sigma + diag(q).

    bel: FullCov (P); gamma scalar; q scalar or (P,). Returns FullCov.
    One pass over the P x P matrix (scale into a new array, add q on the diagonal).
    """
    P = bel.n_params
    cov = np.multiply(bel.cov, gamma**2)
    cov.flat[:: P + 1] += np.broadcast_to(q, (P,))
    return FullCov._from_filter(gamma * bel.mean, cov)


def update(bel, H, R, e, form="covariance", singular=False, compiled=False):
    """EKF update (Chang et al. 2022, eqs 5-9).

    S = H Sigma H^T + R, K = Sigma H^T S^{-1}, mu' = mu + K e,
    Sigma' = Sigma - K S K^T ("covariance"), or the Joseph form
    (I - K H) Sigma (I - K H)^T + K R K^T ("joseph"), or the information form
    Sigma'^{-1} = Sigma^{-1} + H^T R^{-1} H, mu' = mu + Sigma' H^T R^{-1} e
    ("information"). H (C, P), R (C, C), e (C,). ``singular`` uses pseudo-inverses
    (a categorical covariance over all K classes).

    Cost per observation. "covariance": O(P^2 C), a rank-C downdate
    Sigma' = Sigma - B^T B with B = L^{-1} H Sigma, L L^T = S (only the C x C
    innovation covariance is factorised). "joseph": O(P^2 C), the Joseph product
    expanded exactly, Sigma' = Sigma - (K X^T + X K^T) with M = Sigma H^T,
    X = M - K S / 2 (since K H Sigma = K M^T and K (H Sigma H^T + R) K^T = K S K^T).
    Both read Sigma about twice (the C products Sigma H^T over one triangle, linalg.sym_matmul,
    then linalg.lowrank_update) and write the new P x P array once; symmetric by construction.
    "information": O(P^3): FullCov stores the covariance, so this form inverts
    Sigma (Cholesky) and the new precision Sigma^{-1} + G G^T (G G^T = H^T R^{-1} H)
    each step; it is kept as an independent cross-check, not for speed.
    Positive definiteness: the Cholesky of S raises NotPositiveDefiniteError, and a
    non-positive diagonal of Sigma' raises NotPositiveDefiniteError (O(P) test).
    compiled: the compiled passes (``FullEKF(backend="numba")``) instead of the reference's BLAS
    route: Sigma H^T from one read of Sigma's lower triangle for all C columns
    (``linalg.sym_matmul(compiled=True)``, where BLAS symv reads it once per column), and Sigma'
    written by one pass that reads Sigma once (``linalg.lowrank_update(compiled=True)``, where the
    reference's scaled copy and in-place gemm read and write the new array twice).
    """
    return predict_update(bel, H, R, e, 1.0, 0.0, form=form, singular=singular, compiled=compiled)


def predict_update(bel, H, R, e, gamma, q, form="covariance", singular=False, compiled=False):
    """``update(predict(bel, gamma, q), H, R, e, form, singular)`` without forming the predicted covariance.

    The EKF step (Chang et al. 2022, eqs 4-9) from the predicted belief
    N(gamma mu, Sigma_p), Sigma_p = gamma^2 Sigma + diag(q), with H, R, e linearised at
    gamma mu. Sigma_p enters only through Sigma_p H^T = gamma^2 Sigma H^T + diag(q) H^T and
    through the final pass Sigma' = gamma^2 Sigma + diag(q) - B^T B, which writes the one new
    P x P array: the same numbers as predict then update to round-off (Sigma_p H^T is summed
    in another order), at the cost of one update: about two reads of Sigma and one write. Forms "covariance" and
    "joseph" as in :func:`update`; "information" and ``singular`` form Sigma_p first. compiled as
    in :func:`update` (forms "covariance" and "joseph").
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}; got {form!r}")
    if form == "information" or singular:
        return _dense_update(predict(bel, gamma, q) if (gamma != 1.0 or np.any(q)) else bel, H, R, e, form, singular)
    Sigma, mu = bel.cov, bel.mean
    scale = gamma**2
    d = None if not np.any(q) else np.broadcast_to(q, (bel.n_params,))
    M = scale * linalg.sym_matmul(Sigma, H.T, compiled=compiled)  # Sigma_p H^T (P, C), O(P^2 C), one triangle read
    if d is not None:
        M += d[:, None] * H.T
    S = linalg.symmetrize(H @ M + R)
    L = linalg.cholesky(S, "innovation covariance S")
    if not np.all(np.isfinite(M)):
        raise DivergenceError("Sigma H^T is not finite: the filter has diverged", quantity="Sigma H^T")
    P = bel.n_params
    Bw = sla.solve_triangular(L, np.column_stack([M.T, e]), lower=True, check_finite=False)
    B, w = Bw[:, :P], Bw[:, P]  # (C, P) = L^{-1} H Sigma_p and (C,) = L^{-1} e, one solve
    mean = gamma * mu + B.T @ w  # K e = M S^{-1} e
    if form == "covariance":
        cov = linalg.lowrank_update(Sigma, B, scale=scale, diag=d, compiled=compiled)  # Sigma_p - B^T B
    else:
        K = sla.solve_triangular(L, B, lower=True, trans="T", check_finite=False).T  # M S^{-1}
        # Joseph: Sigma_p - (K X^T + X K^T), X = M - K S / 2; K X^T + X K^T = (A A^T - D D^T) / 2
        # with A = K + X, D = K - X: one pass with a subtracted and an added rank-C term
        X = M - 0.5 * (K @ S)
        r = np.sqrt(0.5)
        cov = linalg.lowrank_update(Sigma, r * (K + X).T, scale=scale, diag=d, plus=r * (K - X).T, compiled=compiled)
    return _checked(mean, cov)


def _dense_update(bel, H, R, e, form, singular):
    """The information form (O(P^3)) and the pseudo-inverse (singular R) updates of :func:`update`."""
    Sigma, mu = bel.cov, bel.mean
    if form == "information":
        G, g = whiten(H, R, e, singular=singular)
        prec = linalg.symmetrize(linalg.psd_solve(Sigma, np.eye(bel.n_params), name="prior covariance") + G @ G.T)
        cov = linalg.symmetrize(linalg.psd_solve(prec, np.eye(bel.n_params), name="posterior precision"))
        return _checked(mu + cov @ g, cov)
    M = linalg.sym_matmul(Sigma, H.T)  # (P, C), O(P^2 C)
    S = linalg.symmetrize(H @ M + R)
    K = linalg.psd_solve(S, M.T, pinv=True, name="innovation covariance S").T
    mean = mu + K @ e
    if form == "covariance":
        cov = Sigma - K @ (S @ K.T)
        cov = np.add(cov, cov.T, out=None)
        cov *= 0.5
    else:
        cov = _joseph(Sigma, K, M, S)
    return _checked(mean, cov)


def _joseph(Sigma, K, M, S):
    """(I - K H) Sigma (I - K H)^T + K R K^T = Sigma - (K X^T + X K^T), X = M - K S / 2; O(P^2 C)."""
    X = M - 0.5 * (K @ S)
    # K X^T + X K^T = (A A^T - D D^T) / 2 with A = K + X, D = K - X: one pass, two symmetric rank-C terms
    r = np.sqrt(0.5)
    return linalg.lowrank_update(Sigma, r * (K + X).T, plus=r * (K - X).T)


def _checked(mean, cov):
    d = np.diagonal(cov)
    if not np.all(d > 0):
        if not np.all(np.isfinite(d)):
            raise DivergenceError("EKF posterior covariance is not finite: the filter has diverged",
                                  quantity="belief cov")
        raise NotPositiveDefiniteError("EKF posterior covariance has a non-positive diagonal entry")
    return FullCov._from_filter(mean, cov)


class FullEKF(Filter):
    """Full-covariance EKF over all P parameters (Chang, Jones & Murphy 2022, eqs 4-9); O(P^2) memory.

    Call ``FullEKF(model, likelihood, *, gamma=1.0, q=0.0, form="covariance", backend="numpy")``.
    Belief: FullCov, mean (P,) and covariance (P, P). gamma, q: dynamics
    theta_t = gamma theta_{t-1} + N(0, q I) (q a scalar or (P,)).
    form: the covariance algebra of the update, "covariance" (default), "joseph" or
    "information" (see :func:`update`); the same numbers up to round-off.
    backend: "numpy" (the reference) or "numba": the same algebra, with Sigma H^T of forms
    "covariance" and "joseph" from one read of Sigma's lower triangle
    (``refbayes.kernels.cpu.cholupdate.sym_lower_times``) instead of one BLAS symv per output,
    and the new covariance written by one compiled pass (``cholupdate.lowrank_pass``, on the kernel
    threads from P = ``cholupdate.COPY_FIRST_P`` on) instead of a scaled copy and BLAS's in-place
    gemm; the same numbers to round-off. The information form and singular R
    (pseudo-inverses) run the reference's code on either backend.

    Cost of ``predict_update`` (and of each ``scan`` step), forms "covariance" and "joseph":
    O(P^2 C) with only C x C factorisations; the predict step is folded into the update
    (:func:`predict_update`), so a step reads the covariance in the products Sigma H^T over one
    triangle (BLAS: C symv calls, each a read of the triangle; numba: one read) and in the pass
    that writes the one new P x P array (BLAS: a scaled copy and an in-place gemm; numba: one
    pass). ``validation/bench_full.py`` times both backends next to one
    copy of the covariance (docs/bong.md §7).
    """

    belief_type = FullCov
    backends = ("numpy", "numba")
    handles_missing = True

    def __init__(self, model: Model, likelihood: Likelihood, *, gamma: float = 1.0, q: ArrayLike = 0.0,
                 form: str = "covariance", backend: str = "numpy") -> None:
        super().__init__(model, likelihood, gamma=gamma, q=q, backend=backend)
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}; got {form!r}")
        self.form = form
        P, C = self.n_params, self.likelihood.obs_dim(model.out_dim)
        memory.require("FullEKF", 2.0 * P * P + C * P, "two P x P matrices (the belief and the step's new one)", P, C)

    def init(self, mean: ArrayLike, prior_var: ArrayLike = 1.0) -> FullCov:
        mean, var = self._init_mean_var(mean, prior_var)
        return FullCov._from_filter(np.array(mean, dtype=np.float64), np.diag(var))

    def _thread_size(self):
        """backend "numba": P^2, the entries its update pass writes (on the kernel threads from
        ``cholupdate.COPY_FIRST_P`` on); the reference keeps P (docs/threads.md)."""
        return self.n_params ** 2 if self.backend == "numba" else self.n_params

    def _predict(self, bel):
        return predict(bel, self.gamma, self.q)

    def _update(self, bel, lin):
        return update(bel, lin.H, lin.R, lin.e, form=self.form, singular=lin.singular,
                      compiled=self.backend == "numba")

    def _predict_step(self, bel, x, y, **options):
        """Predict and update in one pass over the covariance (:func:`predict_update`): the model is
        linearised at the predicted mean gamma mu, which is all the linearisation needs."""
        if options or has_missing(y):
            return super()._predict_step(bel, x, y, **options)
        lin = linearize(self.model, self.likelihood, self.gamma * bel.mean, x, y, self._value_and_jacobian())
        return predict_update(bel, lin.H, lin.R, lin.e, self.gamma, self.q, form=self.form,
                              singular=lin.singular, compiled=self.backend == "numba"), lin.yhat
