"""Replay-buffer SGD baselines: SGD-RB and online gradient descent (OGD).

The gradient baselines of Chang et al. 2023 (section 4): a FIFO buffer holds
the last B observations; after each new observation the parameters take
``n_iter`` optimiser steps ("sgd" or "adam") on the mean negative
log-likelihood over the filled buffer slots,

    loss(theta) = -(1/n) sum_{(x, y) in buffer} log p(y | f(theta, x)),
    grad        = -(1/n) sum J(theta, x)^T d log p(y | eta) / d eta |_{eta = f(theta, x)}.

OGD is SGD-RB with B = 1. There is no covariance, so only the plug-in
predictive exists. The classes mirror the filters' API (init / predict /
update / update_batch / scan / predict_obs) so the same experiment code runs
them; the belief is an immutable :class:`ReplayBelief`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import predictive
from .._validate import as_float_array, int_at_least, positive_int, positive_scalar
from ..errors import ConvergenceError
from ..likelihoods import Categorical
from ._compat import keyword_renamed, positional_deprecated
from .base import Filter

if TYPE_CHECKING:
    from ..likelihoods import Likelihood
    from ..models import Model

__all__ = ["ReplayBelief", "push", "nll_and_grad", "sgd_step", "adam_step", "SGDRB", "OGD", "OPTIMIZERS"]

OPTIMIZERS = ("sgd", "adam")


def _frozen(arr):
    arr = np.array(arr, dtype=np.float64, copy=True)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class ReplayBelief:
    """State of a replay-SGD learner.

    mean (P,): the parameters theta; inputs / targets: tuples (oldest first, at
    most the buffer size) of the buffered x and y; opt_m, opt_v (P,): Adam's
    first and second moments (zeros for sgd); n_steps: optimiser steps taken.
    """

    mean: np.ndarray
    inputs: tuple = ()
    targets: tuple = ()
    opt_m: np.ndarray = None
    opt_v: np.ndarray = None
    n_steps: int = 0

    def __post_init__(self):
        mean = as_float_array(self.mean, "ReplayBelief.mean", shape=(None,))
        P = mean.shape[0]
        object.__setattr__(self, "mean", _frozen(mean))
        for name in ("opt_m", "opt_v"):
            value = getattr(self, name)
            value = np.zeros(P) if value is None else as_float_array(value, f"ReplayBelief.{name}", shape=(P,))
            object.__setattr__(self, name, _frozen(value))
        if len(self.inputs) != len(self.targets):
            raise ValueError(f"ReplayBelief needs one target per input; got {len(self.inputs)} and {len(self.targets)}")
        object.__setattr__(self, "inputs", tuple(_frozen(x) for x in self.inputs))
        object.__setattr__(self, "targets", tuple(_frozen(y) for y in self.targets))
        object.__setattr__(self, "n_steps", int_at_least(self.n_steps, "ReplayBelief.n_steps", 0))

    @property
    def n_params(self) -> int:
        """P, the number of parameters."""
        return self.mean.shape[0]

    @property
    def count(self) -> int:
        """Number of filled buffer slots."""
        return len(self.inputs)

    def replace(self, **changes: Any) -> ReplayBelief:
        """A new belief with some fields replaced (validated again)."""
        kw = {f: getattr(self, f) for f in ("mean", "inputs", "targets", "opt_m", "opt_v", "n_steps")}
        kw.update(changes)
        return ReplayBelief(**kw)

    def __repr__(self):
        return f"ReplayBelief(P={self.n_params}, buffered={self.count}, steps={self.n_steps})"


def push(bel, xs, ys, buffer_size):
    """FIFO push: append (x, y) pairs and keep the newest ``buffer_size``. Returns a new belief."""
    inputs = (bel.inputs + tuple(xs))[-buffer_size:]
    targets = (bel.targets + tuple(ys))[-buffer_size:]
    return bel.replace(inputs=inputs, targets=targets)


def nll_and_grad(model, likelihood, theta, inputs, targets):
    """Mean negative log-likelihood over a buffer and its gradient in theta.

    theta (P,); inputs, targets: sequences of n pairs. Returns (loss float, grad (P,)).
    The gradient is -(1/n) sum_n J_n^T g_n with J_n = d f(theta, x_n) / d theta and
    g_n = likelihood.grad(y_n, f(theta, x_n)).
    """
    return _nll_and_grad(model, likelihood, theta, inputs, targets, with_loss=True)


def _nll_and_grad(model, likelihood, theta, inputs, targets, with_loss):
    n = len(inputs)
    if n == 0:
        raise ValueError("the buffer is empty; push an observation first")
    loss, grad = 0.0, np.zeros(theta.shape[0])
    for x, y in zip(inputs, targets):
        eta, J = model.value_and_jacobian(theta, x)
        if with_loss:
            loss -= likelihood.log_prob(y, eta)
        grad -= J.T @ likelihood.grad(y, eta)
    return loss / n, grad / n


def sgd_step(theta, grad, lr):
    """theta - lr * grad."""
    return theta - lr * grad


def adam_step(theta, grad, m, v, t, lr, b1=0.9, b2=0.999, eps=1e-8):
    """One Adam step (Kingma & Ba 2015, Algorithm 1), t = 1, 2, ... the step number.

    m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;
    theta <- theta - lr * m_hat / (sqrt(v_hat) + eps) with m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t).
    Returns (theta, m, v).
    """
    m = b1 * m + (1.0 - b1) * grad
    v = b2 * v + (1.0 - b2) * grad**2
    m_hat = m / (1.0 - b1**t)
    v_hat = v / (1.0 - b2**t)
    return theta - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


class SGDRB(Filter):
    """Replay-buffer SGD (SGD-RB, the baseline of Chang et al. 2023, section 4): a FIFO buffer of
    ``buffer_size`` observations and ``n_iter`` optimiser steps on its mean NLL after each new
    observation.

    Call ``SGDRB(model, likelihood, *, buffer_size=10, lr=1e-2, ...)``: hyper-parameters are
    keyword-only (positional ones still work in this release, with a DeprecationWarning).

    buffer_size: B >= 1, observations kept (the newest B).
    lr: > 0, the optimiser's step size.
    optimizer: "sgd" or "adam" (b1, b2 in [0, 1), eps > 0 as in Adam).
    n_iter: >= 1, optimiser steps after each new observation (or minibatch); the name of
        the same idea in :class:`refbayes.Bong` (inner iterations per step). ``n_inner=`` is
        its deprecated 0.1 spelling.

    The belief is a :class:`ReplayBelief` (parameters theta (P,), the buffer and the optimiser
    state); there are no dynamics (predict returns the belief unchanged) and no covariance:
    ``predict_obs`` supports method="plugin" only.
    """

    belief_type = ReplayBelief

    @positional_deprecated("buffer_size", "lr", "optimizer", "n_iter")
    @keyword_renamed("n_inner", "n_iter")
    def __init__(self, model: Model, likelihood: Likelihood, *, buffer_size: int = 10, lr: float = 1e-2,
                 optimizer: str = "sgd", n_iter: int = 1, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8) -> None:
        super().__init__(model, likelihood)
        self.buffer_size = positive_int(buffer_size, "buffer_size")
        self.lr = positive_scalar(lr, "lr")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}; got {optimizer!r}")
        self.optimizer = optimizer
        self.n_iter = positive_int(n_iter, "n_iter")
        for name, value in (("b1", b1), ("b2", b2)):
            value = float(value)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1); got {value}")
        self.b1, self.b2 = float(b1), float(b2)
        self.eps = positive_scalar(eps, "eps")

    def init(self, mean: ArrayLike, prior_var: ArrayLike = 1.0) -> ReplayBelief:
        """Start at theta = mean (P,) with an empty buffer.

        prior_var: no role here (the learner keeps no covariance); it is in the signature so
        that the same experiment code calls every learner alike. Only the default 1.0 (or None)
        is accepted: any other value raises ValueError rather than being silently ignored.
        """
        if prior_var is not None and not (np.ndim(prior_var) == 0 and prior_var == 1.0):
            raise ValueError(f"prior_var has no role in {type(self).__name__} (no covariance); leave it at its "
                             f"default; got {prior_var!r}")
        mean = as_float_array(mean, "mean", shape=(self.n_params,))
        return ReplayBelief(mean)

    def _predict(self, bel):
        return bel

    def _target(self, y):
        self.likelihood.encode(y, self.model.out_dim)  # validates y
        if isinstance(self.likelihood, Categorical):
            return np.asarray(y, dtype=np.float64).reshape(())
        return np.asarray(y, dtype=np.float64).reshape(self.model.out_dim)

    def _optimise(self, bel):
        theta, m, v, t = bel.mean, bel.opt_m, bel.opt_v, bel.n_steps
        with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported below
            for _ in range(self.n_iter):
                _, g = _nll_and_grad(self.model, self.likelihood, theta, bel.inputs, bel.targets, with_loss=False)
                t += 1
                if self.optimizer == "sgd":
                    theta = sgd_step(theta, g, self.lr)
                else:
                    theta, m, v = adam_step(theta, g, m, v, t, self.lr, self.b1, self.b2, self.eps)
                if not np.all(np.isfinite(theta)):
                    break
        if not np.all(np.isfinite(theta)):
            raise ConvergenceError("SGD-RB diverged (non-finite parameters); use a smaller lr")
        return bel.replace(mean=theta, opt_m=m, opt_v=v, n_steps=t)

    def update(self, bel: ReplayBelief, x: ArrayLike, y: ArrayLike, *, obs_var: ArrayLike | None = None) -> ReplayBelief:
        """Push (x, y) into the buffer, then take n_iter optimiser steps. Returns a new belief.

        obs_var: Gaussian noise for this call's loss where it differs (see ``with_noise``).
        """
        if obs_var is not None:
            return self.with_noise(obs_var=obs_var).update(bel, x, y)
        self._check_belief(bel)
        x = self.model.validate_x(x)
        return self._optimise(push(bel, [x], [self._target(y)], self.buffer_size))

    def update_batch(self, bel: ReplayBelief, X: ArrayLike, Y: ArrayLike) -> ReplayBelief:
        """Minibatch step: push N observations (the buffer keeps the newest B), then take n_iter
        optimiser steps on the buffer's mean NLL. X (N, in_dim); Y N observations."""
        self._check_belief(bel)
        X, Y = self._check_stream(X, Y)
        return self._optimise(push(bel, list(X), [self._target(y) for y in Y], self.buffer_size))

    def loss(self, bel: ReplayBelief) -> float:
        """Mean NLL over the current buffer at bel.mean."""
        self._check_belief(bel)
        return nll_and_grad(self.model, self.likelihood, bel.mean, bel.inputs, bel.targets)[0]

    def _step(self, bel, x, y):
        yhat = self.likelihood.mean(self.model.apply(bel.mean, x))
        return self.update(bel, x, y), yhat

    def predict_obs(self, bel: ReplayBelief, x: ArrayLike, method: str = "plugin", rng: np.random.Generator | None = None,
                    n_samples: int = 100) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Plug-in predictive (mean, cov) of y at x; the only method without a covariance."""
        self._check_belief(bel)
        if method != "plugin":
            raise ValueError(f"{type(self).__name__} has no parameter covariance; method must be 'plugin', got {method!r}")
        return predictive.predict_obs(self.model, self.likelihood, bel, x, "plugin")

    def __repr__(self):
        return (f"{type(self).__name__}(model={self.model!r}, likelihood={self.likelihood!r}, "
                f"buffer_size={self.buffer_size}, lr={self.lr}, optimizer={self.optimizer!r}, n_iter={self.n_iter})")


class OGD(SGDRB):
    """Online gradient descent (Chang et al. 2023, section 4): SGD-RB with a buffer of one
    observation. Keyword-only ``lr``, ``optimizer``, ``n_iter``, ``b1``, ``b2``, ``eps`` as in
    :class:`SGDRB` (positional ones deprecated)."""

    @positional_deprecated("lr", "optimizer", "n_iter")
    @keyword_renamed("n_inner", "n_iter")
    def __init__(self, model: Model, likelihood: Likelihood, *, lr: float = 1e-2, optimizer: str = "sgd",
                 n_iter: int = 1, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
        super().__init__(model, likelihood, buffer_size=1, lr=lr, optimizer=optimizer, n_iter=n_iter,
                         b1=b1, b2=b2, eps=eps)
