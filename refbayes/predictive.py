"""Posterior predictive distributions of the observation y at an input x.

Each function returns (mean, cov) of the observation's natural statistic:
the regression output for Gaussian, the class-probability vector over all K
classes for Categorical (K,), the success probability for Bernoulli and the
rate for Poisson. The cov adds the likelihood's own noise to the parameter
uncertainty (law of total variance).

- plugin: moments of p(y | f(x, mean)).
- linearized: f linearised at the mean; mean m(f(x, mean)),
  cov = Hm Sigma Hm^T + R (docs/diagonal_ekf.md §7; LO-FI paper eq. 63).
- mc: average over theta_s ~ belief of the conditional moments (Monte Carlo).
- linearized-mc: as mc but through f(x, mean) + J (theta_s - mean)
  (Immer et al. 2021).
- probit: classification only; generalised probit, LO-FI paper eqs 64-66:
  p_k = softmax_k(f_k / sqrt(1 + pi sigma_k^2 / 8)), sigma_k^2 = [J Sigma J^T]_kk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit, softmax

if TYPE_CHECKING:
    from .beliefs import Belief
    from .filters.base import Filter
    from .likelihoods import Likelihood
    from .models import Model

__all__ = ["predict_obs", "METHODS", "full_moments", "log_predictive", "prequential_log_likelihood"]

METHODS = ("plugin", "linearized", "mc", "linearized-mc", "probit")


def _kind(likelihood):
    return type(likelihood).__name__


def full_moments(likelihood: Likelihood, eta: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Mean (C,) and covariance (C, C) of the full observation statistic given the output eta,
    with the derivative of the mean with respect to eta (C, C_f)."""
    kind = _kind(likelihood)
    if kind == "Categorical":
        p = softmax(eta)
        cov = np.diag(p) - np.outer(p, p)
        return p, cov, cov
    if kind == "Bernoulli":
        p = expit(eta)
        d = np.diag(p * (1 - p))
        return p, d, d
    return likelihood.mean(eta), likelihood.cov(eta), likelihood.mean_jacobian(eta)


def _mc_moments(likelihood, etas):
    means, covs = zip(*[full_moments(likelihood, eta)[:2] for eta in etas])
    means, covs = np.array(means), np.array(covs)
    m = means.mean(0)
    dev = means - m
    return m, covs.mean(0) + dev.T @ dev / len(etas)


def _is_batch(model, x):
    return model.in_dim is not None and np.ndim(x) == 2


def predict_obs(model: Model, likelihood: Likelihood, bel: Belief, x: ArrayLike, method: str = "linearized",
                rng: np.random.Generator | None = None, n_samples: int = 100) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Predictive (mean, cov) of y at x under belief ``bel``; see the module docstring.

    x: one input (in_dim,) -> mean (K,), cov (K, K); or a batch (N, in_dim) -> mean (N, K),
    cov (N, K, K), the same numbers as N single calls (for "mc" and "linearized-mc" one set
    of parameter samples serves the whole batch).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if _is_batch(model, x):
        return _predict_obs_batch(model, likelihood, bel, model.validate_X(x), method, rng, n_samples)
    x = model.validate_x(x)
    if method == "plugin":
        mean, cov, _ = full_moments(likelihood, model.apply(bel.mean, x))
        return mean, cov
    if method in ("mc", "linearized-mc"):
        _check_mc(method, rng, n_samples)
        thetas = bel.sample(rng, int(n_samples))
        if method == "mc":
            etas = [model.apply(th, x) for th in thetas]
        else:
            eta0, J = model.value_and_jacobian(bel.mean, x)
            etas = eta0 + (thetas - bel.mean) @ J.T
        return _mc_moments(likelihood, etas)
    eta, J = model.value_and_jacobian(bel.mean, x)
    if not (np.all(np.isfinite(eta)) and np.all(np.isfinite(J))):
        from .errors import DivergenceError

        raise DivergenceError("the model output or its Jacobian at the belief's mean is not finite "
                              f"(max |mean| = {np.abs(bel.mean).max():.3g})", quantity="model output")
    if method == "probit":
        if _kind(likelihood) not in ("Categorical", "Bernoulli"):
            raise ValueError(f"method='probit' needs a classification likelihood; got {_kind(likelihood)}")
        s2 = np.diag(bel.project(J))
        scaled = eta / np.sqrt(1.0 + np.pi * s2 / 8.0)
        mean, cov, _ = full_moments(likelihood, scaled)
        return mean, cov
    with np.errstate(over="ignore", invalid="ignore"):
        mean, cov, dmean = full_moments(likelihood, eta)
        H = dmean @ J
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(cov)) and np.all(np.isfinite(H))):
        from .errors import DivergenceError

        raise DivergenceError(f"the likelihood's mean, covariance or mean Jacobian at the model output is not "
                              f"finite (max |eta| = {np.abs(eta).max():.3g}; {_kind(likelihood)})",
                              quantity="likelihood mean")
    return mean, cov + bel.project(H)


def _check_mc(method, rng, n_samples):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"method={method!r} needs rng, a numpy.random.Generator; got {type(rng).__name__}")
    if int(n_samples) < 2:
        raise ValueError(f"n_samples must be >= 2; got {n_samples}")


def _predict_obs_batch(model, likelihood, bel, X, method, rng, n_samples, chunk=None):
    """predict_obs over the rows of X (N, in_dim): mean (N, K), cov (N, K, K).

    "plugin" evaluates the network on the whole batch at once; "mc" passes each parameter
    sample through the whole batch; "linearized" and "probit" project the stacked Jacobians of
    a chunk of inputs through the belief in one call (one pass over the belief's factors per
    chunk instead of per input), keeping the diagonal blocks.
    """
    N = X.shape[0]
    if method == "plugin":
        ETA = model.apply_batch(bel.mean, X)
        out = [full_moments(likelihood, eta)[:2] for eta in ETA]
    elif method in ("mc", "linearized-mc"):
        _check_mc(method, rng, n_samples)
        thetas = bel.sample(rng, int(n_samples))
        if method == "mc":
            ETAS = np.stack([model.apply_batch(th, X) for th in thetas], axis=1)  # (N, S, C_f)
        else:
            ETAS = []
            for x in X:
                eta0, J = model.value_and_jacobian(bel.mean, x)
                ETAS.append(eta0 + (thetas - bel.mean) @ J.T)
        out = [_mc_moments(likelihood, etas) for etas in ETAS]
    else:
        out = []
        C_f = model.out_dim
        chunk = chunk or max(1, 256 // max(C_f, 1))
        for lo in range(0, N, chunk):
            rows = X[lo:lo + chunk]
            pieces = [model.value_and_jacobian(bel.mean, x) for x in rows]
            if method == "probit":
                if _kind(likelihood) not in ("Categorical", "Bernoulli"):
                    raise ValueError(f"method='probit' needs a classification likelihood; got {_kind(likelihood)}")
                s2 = np.diag(bel.project(np.concatenate([J for _, J in pieces])))
                for i, (eta, _) in enumerate(pieces):
                    scaled = eta / np.sqrt(1.0 + np.pi * s2[i * C_f:(i + 1) * C_f] / 8.0)
                    out.append(full_moments(likelihood, scaled)[:2])
                continue
            moments = [full_moments(likelihood, eta) for eta, _ in pieces]
            HJ = [dmean @ J for (_, _, dmean), (_, J) in zip(moments, pieces)]
            K = HJ[0].shape[0]
            proj = bel.project(np.concatenate(HJ))
            for i, (mean, cov, _) in enumerate(moments):
                out.append((mean, cov + proj[i * K:(i + 1) * K, i * K:(i + 1) * K]))
    means = np.array([m for m, _ in out], dtype=np.float64)
    covs = np.array([c for _, c in out], dtype=np.float64)
    return means.reshape(N, -1), covs.reshape(N, means.shape[-1] if N else 0, -1)


def log_predictive(likelihood: Likelihood, y: ArrayLike, mean: NDArray[np.float64], cov: NDArray[np.float64]) -> float:
    """log p(y) under a predictive (mean, cov) from :func:`predict_obs`.

    Gaussian: log N(y | mean, cov). Categorical: log mean[y]. Bernoulli:
    log of the predicted probability of the observed outcomes. Others: not defined.
    """
    kind = _kind(likelihood)
    if kind == "Gaussian":
        from .exact import gaussian_logpdf

        return gaussian_logpdf(np.atleast_1d(np.asarray(y, dtype=float)), mean, cov)
    if kind == "Categorical":
        return float(np.log(mean[int(y)]))
    if kind == "Bernoulli":
        y = np.atleast_1d(np.asarray(y, dtype=float))
        return float(np.sum(y * np.log(mean) + (1 - y) * np.log1p(-mean)))
    raise ValueError(f"log_predictive is not defined for {kind}")


def prequential_log_likelihood(filt: Filter, bel: Belief, X: ArrayLike, Y: ArrayLike, method: str = "linearized",
                               rng: np.random.Generator | None = None, n_samples: int = 100) -> tuple[float, Belief]:
    """Sum over t of log p(y_t | x_t, y_{1:t-1}), each from the one-step-ahead
    (predicted) belief; returns (total, final belief).

    For a linear-Gaussian model with gamma = 1 and q = 0 and the "linearized"
    method this equals the log evidence of the whole stream.
    """
    terms = []

    def record(t, bel_pred, bel_post, x, y):
        mean, cov = filt.predict_obs(bel_pred, x, method=method, rng=rng, n_samples=n_samples)
        terms.append(log_predictive(filt.likelihood, y, mean, cov))

    bel, _ = filt.scan(bel, X, Y, callback=record)
    return float(np.sum(terms)), bel
