"""Exact oracles: the Kalman filter, batch Gaussian conditioning and conjugate
Bayesian linear regression.

These import no filter, so they can judge every filter. The model is linear
Gaussian with the same dynamics as the filters,

    theta_t = gamma * theta_{t-1} + N(0, diag(q)),    y_t = H_t theta_t + N(0, R_t),

with prior theta_0 ~ N(mu0, Sigma0); each step t = 1..T first predicts, then
conditions on y_t.

Shapes: Hs (T, C, P), ys (T, C), R (C, C) or (T, C, C).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import linalg
from ._validate import as_float_array, positive_or_vector

__all__ = [
    "KalmanResult",
    "kalman_filter",
    "joint_filtering_posterior",
    "blr_posterior",
    "blr_log_evidence",
    "gaussian_logpdf",
]


@dataclass(frozen=True)
class KalmanResult:
    """Output of :func:`kalman_filter`.

    means (T, P), covs (T, P, P): filtered moments after step t.
    pred_means (T, P), pred_covs (T, P, P): one-step-ahead moments before y_t.
    logliks (T,): log N(y_t | H_t pred_mean_t, H_t pred_cov_t H_t^T + R_t),
    whose sum is the log evidence of y_{1:T} (prequential log-likelihood).
    """

    means: np.ndarray
    covs: np.ndarray
    pred_means: np.ndarray
    pred_covs: np.ndarray
    logliks: np.ndarray

    @property
    def log_evidence(self) -> float:
        """log p(y_{1:T}): the sum of ``logliks``."""
        return float(np.sum(self.logliks))


def gaussian_logpdf(y: NDArray[np.float64], mean: NDArray[np.float64], cov: NDArray[np.float64]) -> float:
    """log N(y | mean, cov) for vectors y, mean (C,) and cov (C, C), via Cholesky."""
    L = linalg.cholesky(cov, "cov")
    z = np.linalg.solve(L, y - mean)
    return float(-0.5 * z @ z - np.log(np.diag(L)).sum() - 0.5 * len(y) * np.log(2 * np.pi))


def _stream(Hs, ys, R):
    Hs = as_float_array(Hs, "Hs", ndim=3)
    T, C, P = Hs.shape
    ys = as_float_array(ys, "ys", shape=(T, C))
    R = as_float_array(R, "R")
    if R.ndim == 2:
        R = np.broadcast_to(R, (T,) + R.shape)
    if R.shape != (T, C, C):
        raise ValueError(f"R must have shape ({C}, {C}) or ({T}, {C}, {C}); got {R.shape}")
    return Hs, ys, R


def kalman_filter(mu0: ArrayLike, Sigma0: ArrayLike, Hs: ArrayLike, ys: ArrayLike, R: ArrayLike,
                  gamma: float = 1.0, q: ArrayLike = 0.0) -> KalmanResult:
    """Kalman filter in covariance form (textbook predict / update).

    mu0 (P,), Sigma0 (P, P), Hs (T, C, P), ys (T, C), R (C, C) or (T, C, C),
    gamma scalar, q scalar or (P,) process-noise variances. Returns KalmanResult.
    """
    Hs, ys, R = _stream(Hs, ys, R)
    T, C, P = Hs.shape
    mu = as_float_array(mu0, "mu0", shape=(P,))
    Sigma = as_float_array(Sigma0, "Sigma0", shape=(P, P))
    Q = np.diag(positive_or_vector(q, "q", P, allow_zero=True))
    out = {k: [] for k in ("means", "covs", "pred_means", "pred_covs", "logliks")}
    for t in range(T):
        mu = gamma * mu
        Sigma = gamma**2 * Sigma + Q
        out["pred_means"].append(mu)
        out["pred_covs"].append(Sigma)
        H = Hs[t]
        S = linalg.symmetrize(H @ Sigma @ H.T + R[t])
        out["logliks"].append(gaussian_logpdf(ys[t], H @ mu, S))
        K = linalg.psd_solve(S, H @ Sigma, name="innovation covariance").T
        mu = mu + K @ (ys[t] - H @ mu)
        Sigma = linalg.symmetrize(Sigma - K @ S @ K.T)
        out["means"].append(mu)
        out["covs"].append(Sigma)
    return KalmanResult(**{k: np.array(v) for k, v in out.items()})


def joint_filtering_posterior(mu0: ArrayLike, Sigma0: ArrayLike, Hs: ArrayLike, ys: ArrayLike, R: ArrayLike,
                              gamma: float = 1.0, q: ArrayLike = 0.0
                              ) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
    """p(theta_T | y_{1:T}) by conditioning the joint Gaussian of theta_{1:T} in one batch.

    Independent of the Kalman recursion: builds the (T P)-dimensional prior of
    theta_1..theta_T implied by the dynamics, conditions on all observations
    at once, and returns (mean (P,), cov (P, P), log evidence). Cost O((T P)^3):
    for tests with small T and P.
    """
    Hs, ys, R = _stream(Hs, ys, R)
    T, C, P = Hs.shape
    mu0 = as_float_array(mu0, "mu0", shape=(P,))
    Sigma0 = as_float_array(Sigma0, "Sigma0", shape=(P, P))
    Q = np.diag(positive_or_vector(q, "q", P, allow_zero=True))
    # Marginal prior moments: m_t = gamma^t mu0, V_t = gamma^2 V_{t-1} + Q;
    # Cov(theta_t, theta_s) = gamma^(t-s) V_s for s <= t.
    means, V = [], [None] * T
    Vt = Sigma0
    for t in range(T):
        Vt = gamma**2 * Vt + Q
        V[t] = Vt
        means.append(gamma ** (t + 1) * mu0)
    m = np.concatenate(means)
    K = np.zeros((T * P, T * P))
    for t in range(T):
        for s in range(t + 1):
            block = gamma ** (t - s) * V[s]
            K[t * P:(t + 1) * P, s * P:(s + 1) * P] = block
            K[s * P:(s + 1) * P, t * P:(t + 1) * P] = block.T
    Hbig = np.zeros((T * C, T * P))
    Rbig = np.zeros((T * C, T * C))
    for t in range(T):
        Hbig[t * C:(t + 1) * C, t * P:(t + 1) * P] = Hs[t]
        Rbig[t * C:(t + 1) * C, t * C:(t + 1) * C] = R[t]
    y = ys.reshape(-1)
    S = linalg.symmetrize(Hbig @ K @ Hbig.T + Rbig)
    logev = gaussian_logpdf(y, Hbig @ m, S)
    last = slice((T - 1) * P, T * P)
    KH = K[last] @ Hbig.T  # Cov(theta_T, y)
    gain = linalg.psd_solve(S, KH.T, name="S").T
    mean = m[last] + gain @ (y - Hbig @ m)
    cov = linalg.symmetrize(K[last, last] - gain @ KH.T)
    return mean, cov, logev


def _design(X, ys, R):
    X = as_float_array(X, "X")
    if X.ndim == 2:
        X = X[:, None, :]
    if X.ndim != 3:
        raise ValueError(f"X must have shape (N, P) or (N, C, P); got {X.shape}")
    N, C, P = X.shape
    ys = as_float_array(ys, "y").reshape(N, -1) if np.size(ys) == N * C else None
    if ys is None:
        raise ValueError(f"y must have {N * C} entries to match X of shape {X.shape}")
    R = as_float_array(R, "R")
    R = R * np.eye(C) if R.ndim == 0 else R
    if R.shape != (C, C):
        raise ValueError(f"R must be a scalar or have shape ({C}, {C}); got {R.shape}")
    return X, ys, R


def blr_posterior(mu0: ArrayLike, Sigma0: ArrayLike, X: ArrayLike, y: ArrayLike,
                  R: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Conjugate Bayesian linear regression posterior (information form).

    y_n = X_n theta + N(0, R), prior N(mu0, Sigma0); X (N, P) or (N, C, P),
    y (N,) or (N, C), R scalar or (C, C). Returns (mean (P,), cov (P, P)) with
    Sigma^{-1} = Sigma0^{-1} + sum_n X_n^T R^{-1} X_n and
    mean = Sigma (Sigma0^{-1} mu0 + sum_n X_n^T R^{-1} y_n).
    """
    X, ys, R = _design(X, y, R)
    P = X.shape[2]
    mu0 = as_float_array(mu0, "mu0", shape=(P,))
    Sigma0 = as_float_array(Sigma0, "Sigma0", shape=(P, P))
    prec0 = linalg.psd_solve(Sigma0, np.eye(P), name="Sigma0")
    RinvX = np.stack([linalg.psd_solve(R, Xn, name="R") for Xn in X])
    prec = linalg.symmetrize(prec0 + np.einsum("ncp,ncq->pq", X, RinvX))
    rhs = prec0 @ mu0 + np.einsum("ncp,nc->p", RinvX, ys)
    cov = linalg.symmetrize(linalg.psd_solve(prec, np.eye(P), name="posterior precision"))
    return cov @ rhs, cov


def blr_log_evidence(mu0: ArrayLike, Sigma0: ArrayLike, X: ArrayLike, y: ArrayLike, R: ArrayLike) -> float:
    """log p(y_{1:N}) = log N(vec y | X mu0, X Sigma0 X^T + I (x) R) for the model of blr_posterior."""
    X, ys, R = _design(X, y, R)
    N, C, P = X.shape
    Xf = X.reshape(N * C, P)
    S = Xf @ as_float_array(Sigma0, "Sigma0", shape=(P, P)) @ Xf.T + np.kron(np.eye(N), R)
    return gaussian_logpdf(ys.reshape(-1), Xf @ as_float_array(mu0, "mu0", shape=(P,)), S)
