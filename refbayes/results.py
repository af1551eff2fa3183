"""What a filter run gives back: the per-step results of ``scan`` and the innovation monitor.

``Filter.scan`` returns ``(belief, ScanResult)``. Every array is stacked over the T steps of
the stream, in the order of the observations:

- ``yhat`` (T, C): the filter's one-step-ahead mean of the observation statistic T(y) at the
  predicted mean (the quantity its update uses; for ``Categorical(mode="drop_last")`` the
  first K - 1 class probabilities).
- ``pred_mean`` (T, K), ``pred_cov`` (T, K, K): the one-step-ahead predictive of y for every
  output (all K classes for Categorical), by the ``predictive`` method that ``scan`` was given:
  "plugin" (the model at the predicted mean, from the step's own ``yhat``: costs nothing) or
  "linearized" (the model linearised at the predicted mean, covariance H Sigma H^T + R: one
  Jacobian and one projection of the predicted belief per step).
- ``log_pred`` (T,): log p(y_t | x_t, y_{1:t-1}) under that predictive; ``log_evidence``
  (T,): its running sum, the prequential log evidence. For a linear-Gaussian model with
  ``predictive="linearized"`` the last entry is the exact log marginal likelihood of the
  stream (the Kalman filter's prediction-error decomposition).
- ``means`` (T, P) and ``variances`` (T, P): the filtered mean and marginal variances after
  each step, when asked for (``keep_mean=True``, ``keep_var=True``; off by default, as they
  cost T x P numbers).
- ``seconds`` (T,): the wall time of each step.
- ``callback``: the return values of ``callback`` or ``on_step``, one per step, or None.

For code written against earlier versions, ``result["yhat"]``, ``result["callback"]`` and
``result.get(...)`` still work.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaln

if TYPE_CHECKING:
    from .likelihoods import Likelihood

__all__ = ["ScanResult", "StepResult", "InnovationMonitor", "PREDICTIVES", "plugin_from_mean", "plugin_batch",
           "log_density", "log_density_batch"]

PREDICTIVES = ("plugin", "linearized")


@dataclass(frozen=True)
class StepResult:
    """One step of ``scan``, as passed to ``on_step(t, step)``.

    belief: the posterior after the step; yhat (C,): one-step-ahead mean of T(y);
    pred_mean (K,), pred_cov (K, K): one-step-ahead predictive of y; log_pred: its log
    density at y; x, y: the observation.
    """

    t: int
    belief: object
    yhat: np.ndarray
    pred_mean: np.ndarray
    pred_cov: np.ndarray
    log_pred: float
    x: np.ndarray
    y: object


@dataclass(frozen=True)
class ScanResult:
    """Per-step results of ``Filter.scan``, stacked over the T steps (see the module docstring)."""

    yhat: np.ndarray
    pred_mean: np.ndarray
    pred_cov: np.ndarray
    log_pred: np.ndarray
    log_evidence: np.ndarray
    seconds: np.ndarray
    predictive: str = "plugin"
    means: np.ndarray = None
    variances: np.ndarray = None
    callback: list = None

    def __len__(self):
        return len(self.log_pred)

    def __getitem__(self, key):
        """``result["yhat"]`` and ``result["callback"]``, as the dict of earlier versions."""
        if key == "callback" and self.callback is None:
            raise KeyError(key)
        if key in ("yhat", "callback"):
            return getattr(self, key)
        raise KeyError(key)

    def __contains__(self, key):
        return key == "yhat" or (key == "callback" and self.callback is not None)

    def get(self, key: str, default: Any = None) -> Any:
        """``result.get("yhat")`` / ``result.get("callback", [])``, as the dict of earlier versions."""
        return self[key] if key in self else default

    def keys(self) -> list[str]:
        """The keys of the earlier dict form: "yhat" (and "callback" when one was given)."""
        return ["yhat"] + (["callback"] if self.callback is not None else [])

    @property
    def total_log_evidence(self) -> float:
        """The prequential log evidence of the whole stream, sum_t log p(y_t | y_{1:t-1})."""
        return float(self.log_evidence[-1]) if len(self.log_evidence) else 0.0


def _kind(likelihood):
    return type(likelihood).__name__


def plugin_from_mean(likelihood: Likelihood, yhat: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Plug-in predictive (mean (K,), cov (K, K)) of y from the mean statistic ``yhat`` (C,).

    The model's output at the predicted mean fixes the predictive: a Gaussian with the
    likelihood's noise, a categorical distribution over all K classes (the dropped last
    class's probability is 1 minus the others), independent Bernoulli or Poisson outputs.
    """
    kind = _kind(likelihood)
    yhat = np.asarray(yhat, dtype=np.float64)
    if kind == "Gaussian":
        return yhat, likelihood.cov(yhat)
    if kind == "Categorical":
        p = np.append(yhat, 1.0 - yhat.sum()) if likelihood.mode == "drop_last" else yhat
        p = np.clip(p, 0.0, 1.0)
        return p, np.diag(p) - np.outer(p, p)
    if kind == "Bernoulli":
        return yhat, np.diag(yhat * (1.0 - yhat))
    if kind == "Poisson":
        return yhat, np.diag(yhat)
    return yhat, likelihood.cov(yhat)


def log_density(likelihood: Likelihood, y: ArrayLike, mean: NDArray[np.float64], cov: NDArray[np.float64]) -> float:
    """log p(y) under the predictive (mean, cov) of ``plugin_from_mean`` or ``predict_obs``.

    NaN components of y are missing: the density is that of the observed components'
    marginal (0.0 when nothing was observed).

    Gaussian: log N(y | mean, cov). Categorical: log mean[y]. Bernoulli: sum of
    log mean or log(1 - mean) over the outputs. Poisson: the Poisson log mass at rate mean.
    """
    kind = _kind(likelihood)
    if kind == "Categorical":
        if isinstance(y, float) and y != y:  # a missing label: nothing observed
            return 0.0
        p = mean[int(y)]
        return math.log(p) if p > 0 else -math.inf
    y = np.atleast_1d(np.asarray(y, dtype=np.float64)).ravel()
    observed = ~np.isnan(y)
    if not observed.all():  # the marginal of the observed components
        y, mean, cov = y[observed], mean[observed], cov[np.ix_(observed, observed)]
    with np.errstate(divide="ignore"):
        if kind == "Bernoulli":
            return float(np.sum(np.where(y > 0.5, np.log(mean), np.log1p(-mean))))
        if kind == "Poisson":
            return float(np.sum(y * np.log(mean) - mean - gammaln(y + 1.0)))
    return float(_gaussian_logpdf_shared(y[None, :], np.asarray(mean)[None, :], cov)[0])


def plugin_batch(likelihood: Likelihood, yhat: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``plugin_from_mean`` over the rows of yhat (T, C): means (T, K), covs (T, K, K)."""
    kind = _kind(likelihood)
    yhat = np.asarray(yhat, dtype=np.float64)
    T = yhat.shape[0]
    if kind == "Gaussian":
        R = likelihood.cov(np.zeros(yhat.shape[1]))
        return yhat, np.broadcast_to(R, (T,) + R.shape).copy()
    if kind == "Categorical":
        p = np.concatenate([yhat, 1.0 - yhat.sum(1, keepdims=True)], axis=1) if likelihood.mode == "drop_last" else yhat
        p = np.clip(p, 0.0, 1.0)
        K = p.shape[1]
        covs = -p[:, :, None] * p[:, None, :]
        covs[:, np.arange(K), np.arange(K)] += p
        return p, covs
    if kind == "Bernoulli":
        v = yhat * (1.0 - yhat)
    elif kind == "Poisson":
        v = yhat
    else:
        return yhat, np.array([likelihood.cov(row) for row in yhat]).reshape(T, yhat.shape[1], yhat.shape[1])
    covs = np.zeros((T,) + (yhat.shape[1],) * 2)
    idx = np.arange(yhat.shape[1])
    covs[:, idx, idx] = v
    return yhat, covs


def log_density_batch(likelihood: Likelihood, Y: ArrayLike, means: NDArray[np.float64], covs: NDArray[np.float64]) -> NDArray[np.float64]:
    """``log_density`` of each of T steps: Y (T observations), means (T, K), covs (T, K, K) -> (T,)."""
    kind = _kind(likelihood)
    T = len(means)
    if kind == "Categorical":
        labels = np.asarray(Y, dtype=np.float64).reshape(T)
        out = np.zeros(T)
        seen = ~np.isnan(labels)
        p = means[np.flatnonzero(seen), labels[seen].astype(np.int64)]
        with np.errstate(divide="ignore"):
            out[seen] = np.log(p)
        return out
    Yf = np.asarray(Y, dtype=np.float64).reshape(means.shape)
    missing = np.isnan(Yf).any(axis=1)
    out = np.empty(T)
    full = ~missing
    with np.errstate(divide="ignore"):
        if kind == "Bernoulli":
            out[full] = np.sum(np.where(Yf[full] > 0.5, np.log(means[full]), np.log1p(-means[full])), axis=1)
        elif kind == "Poisson":
            out[full] = np.sum(Yf[full] * np.log(means[full]) - means[full] - gammaln(Yf[full] + 1.0), axis=1)
        else:
            out[full] = [log_density(likelihood, y, m, c) for y, m, c in zip(Yf[full], means[full], covs[full])] \
                if not np.any(full) or not _same_cov(covs[full]) else _gaussian_logpdf_shared(Yf[full], means[full], covs[full][0])
    for t in np.flatnonzero(missing):
        out[t] = log_density(likelihood, Yf[t], means[t], covs[t])
    return out


def _same_cov(covs):
    return bool(np.all(covs == covs[0]))


def _gaussian_logpdf_shared(Y, means, cov):
    """log N(y_t | mean_t, cov) for every row, with one covariance (-inf if it is singular)."""
    try:
        L = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        return np.full(len(Y), -math.inf)
    Linv = np.linalg.inv(L)
    # einsum sums each row in the same order whatever the number of rows: one step or a whole
    # stream give the same numbers, bit for bit
    Z = np.einsum("ij,tj->ti", Linv, Y - means)
    quad = np.einsum("ti,ti->t", Z, Z)
    return -0.5 * quad - np.log(np.diag(L)).sum() - 0.5 * Y.shape[1] * math.log(2 * math.pi)


class InnovationMonitor:
    """Opt-in check that the filter's one-step-ahead predictions stay plausible.

    At each step the normalised innovation squared, nis_t = e^T S^-1 e / d with
    e = T(y) - yhat and S the linearised predictive covariance of T(y) (d its dimension),
    has mean 1 under the filter's own model. A run of ``patience`` consecutive steps with
    nis_t > ``threshold`` means the filter is far more confident than its errors allow
    (overconfident or diverging): ``action="warn"`` issues a ``RuntimeWarning`` (once per
    run of implausible steps), ``action="raise"`` raises ``DivergenceError``.

    Pass it to ``scan(..., monitor=InnovationMonitor())``; scan then computes the
    linearised predictive. ``history`` holds every nis_t seen.
    """

    def __init__(self, threshold: float = 25.0, patience: int = 5, action: str = "warn") -> None:
        if not (isinstance(threshold, (int, float)) and threshold > 0 and math.isfinite(threshold)):
            raise ValueError(f"threshold must be a positive finite number; got {threshold!r}")
        if isinstance(patience, bool) or not isinstance(patience, (int, np.integer)) or patience < 1:
            raise ValueError(f"patience must be an integer >= 1; got {patience!r}")
        if action not in ("warn", "raise"):
            raise ValueError(f"action must be 'warn' or 'raise'; got {action!r}")
        self.threshold, self.patience, self.action = float(threshold), int(patience), action
        self.history = []
        self._run = 0

    def observe(self, t: int, e: ArrayLike, S: ArrayLike) -> float:
        """Record step t's innovation e (d,) with predictive covariance S (d, d); act on a long run."""
        from .errors import DivergenceError

        e = np.atleast_1d(np.asarray(e, dtype=np.float64))
        S = np.atleast_2d(np.asarray(S, dtype=np.float64))
        nis = float(e @ np.linalg.lstsq(S, e, rcond=None)[0]) / max(len(e), 1)
        self.history.append(nis)
        self._run = self._run + 1 if nis > self.threshold else 0
        if self._run == self.patience:
            msg = (f"the normalised innovation has exceeded {self.threshold:g} for {self.patience} steps "
                   f"(last: {nis:.3g} at step {t}): the filter is overconfident or diverging")
            if self.action == "raise":
                raise DivergenceError(msg, quantity="innovation", step=t)
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
        return nis
