"""Conjugate Bayesian linear regression for one arm (Duran-Martin et al. 2022, appendix A.1).

Model y = x^T w + N(0, sigma^2). Known sigma^2: Gaussian posterior by batch
Bayes (eqs 5-7), Sherman-Morrison (eq 8) or recursive least squares (eqs 11-15).
Unknown sigma^2: Normal-Inverse-Gamma posterior NIG(w, sigma^2 | mu, Sigma, a, b),
meaning sigma^2 ~ IG(a, b) and w | sigma^2 ~ N(mu, sigma^2 Sigma), by batch
(eqs 16-20), incremental (eqs 21-25) or inverse-free West-Harrison (eqs 31-37)
updates, or from sufficient statistics (Algorithm 3, ``update-bel``).
All forms give the same posterior; the tests check this.

Shapes: D features; mu (D,), Sigma (D, D), x (D,), X (N, D), y (N,).
``ArmPosteriors`` stacks one NIG posterior per arm for the bandit agents.
"""

from dataclasses import dataclass

import numpy as np

from .. import linalg
from .._validate import as_float_array
from ..errors import NotPositiveDefiniteError

__all__ = [
    "blr_batch",
    "sherman_morrison",
    "rls_update",
    "nig_batch",
    "nig_incremental",
    "west_harrison_update",
    "nig_from_stats",
    "ArmPosteriors",
    "sample_nig_weights",
]


def blr_batch(mu0, Sigma0, X, y, obs_var):
    """Known-variance batch posterior (eqs 5-7).

    Sigma = (Sigma0^{-1} + X^T X / sigma^2)^{-1}, mu = Sigma (Sigma0^{-1} mu0 + X^T y / sigma^2).
    """
    D = mu0.shape[0]
    prec0 = linalg.psd_solve(Sigma0, np.eye(D), name="Sigma0")
    prec = linalg.symmetrize(prec0 + X.T @ X / obs_var)
    Sigma = linalg.symmetrize(linalg.psd_solve(prec, np.eye(D), name="posterior precision"))
    return Sigma @ (prec0 @ mu0 + X.T @ y / obs_var), Sigma


def sherman_morrison(Sigma, x, obs_var):
    """Rank-one covariance update without inversion (eq 8).

    (Sigma^{-1} + x x^T / sigma^2)^{-1} = Sigma - Sigma x x^T Sigma / (sigma^2 + x^T Sigma x).
    """
    Sx = Sigma @ x
    return linalg.symmetrize(Sigma - np.outer(Sx, Sx) / (obs_var + x @ Sx))


def rls_update(mu, Sigma, x, y, obs_var):
    """Recursive least squares, the Kalman filter for a static w (eqs 11-15).

    e = y - x^T mu, s = x^T Sigma x + sigma^2, k = Sigma x / s,
    mu' = mu + k e, Sigma' = Sigma - k k^T s.
    """
    e = y - x @ mu
    Sx = Sigma @ x
    s = x @ Sx + obs_var
    k = Sx / s
    return mu + k * e, linalg.symmetrize(Sigma - np.outer(k, k) * s)


def nig_batch(mu0, Sigma0, a0, b0, X, y):
    """Batch Normal-Inverse-Gamma posterior (eqs 16-20).

    Sigma = (Sigma0^{-1} + X^T X)^{-1}, mu = Sigma (Sigma0^{-1} mu0 + X^T y),
    a = a0 + N/2, b = b0 + (y^T y + mu0^T Sigma0^{-1} mu0 - mu^T Sigma^{-1} mu) / 2.
    Returns (mu, Sigma, a, b).
    """
    D = mu0.shape[0]
    X = np.asarray(X, dtype=np.float64).reshape(-1, D)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    return nig_from_stats(mu0, Sigma0, a0, b0, X.T @ X, X.T @ y, float(y @ y), X.shape[0])


def nig_from_stats(mu0, Sigma0, a0, b0, Phi, psi, R2, N):
    """NIG posterior from sufficient statistics (Algorithm 3, ``update-bel``; eqs 39-42).

    Phi = sum x x^T (D, D), psi = sum x y (D,), R2 = sum y^2, N = count.
    Uses Sigma0^{-1} in b (eq 42 drops the inverse, a typo).
    Returns (mu, Sigma, a, b).
    """
    D = mu0.shape[0]
    prec0 = linalg.psd_solve(Sigma0, np.eye(D), name="Sigma0")
    prec = linalg.symmetrize(prec0 + Phi)
    Sigma = linalg.symmetrize(linalg.psd_solve(prec, np.eye(D), name="posterior precision"))
    mu = Sigma @ (prec0 @ mu0 + psi)
    b = b0 + 0.5 * (R2 + mu0 @ prec0 @ mu0 - mu @ prec @ mu)
    return mu, Sigma, a0 + 0.5 * N, b


def nig_incremental(mu, prec, a, b, x, y):
    """One-observation NIG update in precision form (eqs 21-25).

    Lambda' = Lambda + x x^T, mu' = Lambda'^{-1} (Lambda mu + x y), a' = a + 1/2,
    b' = b + (y^2 + mu^T Lambda mu - mu'^T Lambda' mu') / 2. Returns (mu', Lambda', a', b').
    """
    prec_new = prec + np.outer(x, x)
    mu_new = linalg.psd_solve(prec_new, prec @ mu + x * y, name="posterior precision")
    b_new = b + 0.5 * (y * y + mu @ prec @ mu - mu_new @ prec_new @ mu_new)
    return mu_new, prec_new, a + 0.5, b_new


def west_harrison_update(mu, Sigma_star, nu, nu_tau, x, y):
    """Inverse-free update with unknown observation variance (West & Harrison 1997; eqs 31-37).

    e = y - x^T mu, s* = x^T Sigma* x + 1, k = Sigma* x / s*, mu' = mu + k e,
    Sigma*' = Sigma* - k k^T s*, nu' = nu + 1, (nu tau)' = nu tau + e^2 / s*.
    The NIG parameters are a = nu / 2, b = nu tau / 2 and Sigma = Sigma*.
    Returns (mu', Sigma*', nu', (nu tau)').
    """
    e = y - x @ mu
    Sx = Sigma_star @ x
    s = x @ Sx + 1.0
    k = Sx / s
    return mu + k * e, linalg.symmetrize(Sigma_star - np.outer(k, k) * s), nu + 1.0, nu_tau + e * e / s


@dataclass(frozen=True, eq=False)
class ArmPosteriors:
    """One NIG posterior per arm: mu (K, D), cov (K, D, D) (= Sigma, scaled by sigma^2), a (K,), b (K,)."""

    mu: np.ndarray
    cov: np.ndarray
    a: np.ndarray
    b: np.ndarray

    def __post_init__(self):
        mu = as_float_array(self.mu, "mu", ndim=2)
        K, D = mu.shape
        cov = as_float_array(self.cov, "cov", shape=(K, D, D))
        a = as_float_array(self.a, "a", shape=(K,))
        b = as_float_array(self.b, "b", shape=(K,))
        if np.any(a <= 0) or np.any(b <= 0):
            raise NotPositiveDefiniteError(f"inverse-gamma parameters must be > 0; got min a {a.min()}, min b {b.min()}")
        for name, arr in (("mu", mu), ("cov", cov), ("a", a), ("b", b)):
            arr = np.array(arr, copy=True)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    @property
    def n_arms(self):
        return self.mu.shape[0]

    @property
    def n_features(self):
        return self.mu.shape[1]

    def replace_arm(self, k, mu, cov, a, b):
        """A new ArmPosteriors with arm k replaced."""
        M, C, A, B = self.mu.copy(), self.cov.copy(), self.a.copy(), self.b.copy()
        M[k], C[k], A[k], B[k] = mu, cov, a, b
        return ArmPosteriors(M, C, A, B)

    @classmethod
    def stack(cls, posts):
        """From a list of per-arm (mu, Sigma, a, b)."""
        mu, cov, a, b = zip(*posts)
        return cls(np.stack(mu), np.stack(cov), np.array(a, dtype=float), np.array(b, dtype=float))


def _batched_cholesky(cov):
    try:
        return np.linalg.cholesky(0.5 * (cov + np.swapaxes(cov, -1, -2)))
    except np.linalg.LinAlgError as exc:
        raise NotPositiveDefiniteError("an arm's posterior covariance is not positive definite") from exc


def sample_nig_weights(post, rng, known_var=None):
    """Thompson draw for every arm: sigma_k^2 ~ IG(a_k, b_k), w_k ~ N(mu_k, sigma_k^2 Sigma_k).

    With ``known_var`` the variance is not sampled (w_k ~ N(mu_k, known_var Sigma_k)).
    Returns (K, D).
    """
    L = _batched_cholesky(post.cov)
    if known_var is None:
        var = 1.0 / rng.gamma(post.a, 1.0 / post.b)
    else:
        var = np.full(post.n_arms, float(known_var))
    xi = rng.standard_normal(post.mu.shape)
    return post.mu + np.sqrt(var)[:, None] * np.einsum("kij,kj->ki", L, xi)
