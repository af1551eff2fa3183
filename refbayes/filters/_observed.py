"""The exact log-likelihood of the observed components of y, for filters that integrate it.

NaN components of y are not observed (docs/streams.md §3). Filters that only use the
linearisation (H, R, e) drop rows in ``base.linearize``; filters that evaluate
log p(y | eta), its gradient or its Hessian at parameter draws (BONG's Monte Carlo
estimators, R-VGA's quadrature and Monte Carlo expectations) use the likelihood of the
observed outputs o instead, log p(y_o | eta):

- Bernoulli and Poisson outputs are independent given eta, so it is the sum over o;
- a Gaussian with noise covariance R has the marginal N(y_o | eta_o, R_oo), exact for any
  R (per output when R is diagonal);
- a NaN class label (Categorical) leaves nothing observed: the observation is dropped.

As a function of the whole model output eta (C_f,), its gradient and Hessian are those of
the reduced likelihood embedded with zeros outside o, so the filters' formulas
J^T grad and J^T hess J see exactly the reduced model f_o(theta, x) = f(theta, x)[o].
"""

import numpy as np

from .base import split_missing

__all__ = ["ObservedLikelihood", "observed_terms", "nothing_observed"]


class ObservedLikelihood:
    """log p(y_o | eta_o) of the observed outputs ``observed`` (C_f,) bool, as a function of eta (C_f,).

    likelihood: a refbayes Gaussian, Bernoulli or Poisson (one output per component of eta).
    ``log_prob(y, eta)`` -> float; ``grad(y, eta)`` -> (C_f,); ``hessian(y, eta)`` -> (C_f, C_f);
    y (C_f,) has its missing components filled with placeholders that are never read.
    """

    def __init__(self, likelihood, observed):
        from ..likelihoods import Bernoulli, Gaussian, Poisson

        self.observed = np.asarray(observed, dtype=bool)
        if isinstance(likelihood, Gaussian):
            R = likelihood.obs_var  # a scalar (R = obs_var I), a (C,) vector or a (C, C) matrix
            if R.ndim == 0:
                self.reduced = likelihood
            else:
                R_o = R[self.observed] if R.ndim == 1 else R[np.ix_(self.observed, self.observed)]
                self.reduced = Gaussian(R_o, jitter=likelihood.jitter)
        elif isinstance(likelihood, (Bernoulli, Poisson)):
            self.reduced = likelihood  # independent outputs: the same likelihood on eta_o
        else:
            raise ValueError(f"y contains NaN (missing components); the exact likelihood of the observed "
                             f"components is defined here for Gaussian, Bernoulli and Poisson outputs (and a "
                             f"missing Categorical label skips the update); got {type(likelihood).__name__}")

    def log_prob(self, y, eta):
        o = self.observed
        return self.reduced.log_prob(np.asarray(y)[o], np.asarray(eta)[o])

    def grad(self, y, eta):
        o = self.observed
        out = np.zeros(len(o))
        out[o] = self.reduced.grad(np.asarray(y)[o], np.asarray(eta)[o])
        return out

    def hessian(self, y, eta):
        o = self.observed
        out = np.zeros((len(o), len(o)))
        out[np.ix_(o, o)] = self.reduced.hessian(np.asarray(y)[o], np.asarray(eta)[o])
        return out


def observed_terms(likelihood, xs, ys, out_dim):
    """[(x, likelihood_n, y_n)] for the observations (xs, ys) that have something observed.

    An observation without NaN keeps ``likelihood`` and y as they are; one with some
    components missing gets an :class:`ObservedLikelihood` and y with placeholders; one
    with nothing observed (all NaN, or a NaN class label) is left out.
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys must have the same length; got {len(xs)} and {len(ys)}")
    terms = []
    for x, y in zip(xs, ys):
        filled, observed = split_missing(likelihood, y, out_dim)
        if observed is None:
            terms.append((x, likelihood, y))
        elif observed.any():
            terms.append((x, ObservedLikelihood(likelihood, observed), filled))
    return terms


def nothing_observed(likelihood, ys, out_dim):
    """Whether none of the observations ys has an observed component (a predict-only step)."""
    for y in ys:
        observed = split_missing(likelihood, y, out_dim)[1]
        if observed is None or observed.any():
            return False
    return True
