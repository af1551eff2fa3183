"""Full-covariance extended Kalman filter (FC-EKF).

Chang, Jones & Murphy (2022), eqs 4-9 (predict and update in covariance
form); the information form and the Joseph form are algebraically equal
alternatives kept for cross-checks and numerical robustness.
"""

import numpy as np

from .. import linalg, memory
from ..beliefs import FullCov
from ..errors import NotPositiveDefiniteError
from ..likelihoods import whiten
from .base import Filter

__all__ = ["predict", "update", "FullEKF", "FORMS"]

FORMS = ("covariance", "joseph", "information")


def predict(bel, gamma, q):
    """Predict step: mu <- gamma mu, Sigma <- gamma^2 Sigma + diag(q).

    bel: FullCov (P); gamma scalar; q scalar or (P,). Returns FullCov.
    """
    P = bel.n_params
    cov = gamma**2 * bel.cov + np.diag(np.broadcast_to(q, (P,)))
    return FullCov(gamma * bel.mean, cov)


def update(bel, H, R, e, form="covariance", singular=False):
    """EKF update (Chang et al. 2022, eqs 5-9).

    S = H Sigma H^T + R, K = Sigma H^T S^{-1}, mu' = mu + K e,
    Sigma' = Sigma - K S K^T ("covariance"), or the Joseph form
    (I - K H) Sigma (I - K H)^T + K R K^T ("joseph"), or the information form
    Sigma'^{-1} = Sigma^{-1} + H^T R^{-1} H, mu' = mu + Sigma' H^T R^{-1} e
    ("information"). H (C, P), R (C, C), e (C,). ``singular`` uses pseudo-inverses
    (a categorical covariance over all K classes).
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}; got {form!r}")
    Sigma, mu = bel.cov, bel.mean
    if form == "information":
        G, g = whiten(H, R, e, singular=singular)
        prec = linalg.symmetrize(linalg.psd_solve(Sigma, np.eye(bel.n_params), name="prior covariance") + G @ G.T)
        cov = linalg.symmetrize(linalg.psd_solve(prec, np.eye(bel.n_params), name="posterior precision"))
        return _checked(mu + cov @ g, cov)
    SHt = Sigma @ H.T
    S = linalg.symmetrize(H @ SHt + R)
    K = linalg.psd_solve(S, SHt.T, pinv=singular, name="innovation covariance S").T
    mean = mu + K @ e
    if form == "covariance":
        cov = Sigma - K @ S @ K.T
    else:
        A = np.eye(bel.n_params) - K @ H
        cov = A @ Sigma @ A.T + K @ R @ K.T
    return _checked(mean, linalg.symmetrize(cov))


def _checked(mean, cov):
    if not np.all(np.diag(cov) > 0):
        raise NotPositiveDefiniteError("EKF posterior covariance has a non-positive diagonal entry")
    return FullCov(mean, cov)


class FullEKF(Filter):
    """Full-covariance EKF over all P parameters (Chang, Jones & Murphy 2022, eqs 4-9); O(P^2) memory.

    Call ``FullEKF(model, likelihood, *, gamma=1.0, q=0.0, form="covariance", backend="numpy")``.
    Belief: FullCov, mean (P,) and covariance (P, P). gamma, q: dynamics
    theta_t = gamma theta_{t-1} + N(0, q I) (q a scalar or (P,)).
    form: the covariance algebra of the update, "covariance" (default), "joseph" or
    "information" (see :func:`update`); the same numbers up to round-off.
    """

    belief_type = FullCov
    handles_missing = True

    def __init__(self, model, likelihood, *, gamma=1.0, q=0.0, form="covariance", backend="numpy"):
        super().__init__(model, likelihood, gamma=gamma, q=q, backend=backend)
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}; got {form!r}")
        self.form = form
        P, C = self.n_params, self.likelihood.obs_dim(model.out_dim)
        memory.require("FullEKF", 2.0 * P * P + C * P, "two P x P matrices (the belief and the step's new one)", P, C)

    def init(self, mean, prior_var=1.0):
        mean, var = self._init_mean_var(mean, prior_var)
        return FullCov(mean, np.diag(var))

    def _predict(self, bel):
        return predict(bel, self.gamma, self.q)

    def _update(self, bel, lin):
        return update(bel, lin.H, lin.R, lin.e, form=self.form, singular=lin.singular)
