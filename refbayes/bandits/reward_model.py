"""Reward models for bandits: one network output per arm, only the pulled arm observed.

Duran-Martin, Kara & Murphy (2022), section 3.2 and Figure 1. A bandit agent
needs two views of the same network f(s; theta):

- all arms at once, f(s; theta) (N_a,), to choose an action;
- the pulled arm only, a scalar, to condition on the observed reward.

``ArmModel`` gives both. It is a refbayes model whose input is the context s
(N_s,) followed by an arm indicator w (N_a,) (one-hot for arm a), with output
(1,). Any refbayes filter can then run on bandit feedback unchanged.
"""

from __future__ import annotations

import autograd.numpy as anp
import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..models import Model

__all__ = ["ArmModel", "INPUTS"]

INPUTS = ("heads", "blocks")


def _as_int(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {value!r}")
    return int(value)


class ArmModel(Model):
    """The reward of one arm under a multi-arm network.

    network: a refbayes model. input="heads" (Figure 1a): network maps s (N_s,)
    to one reward per arm (N_a = network.out_dim), and
    f(theta, [s, w]) = w^T network(theta, s). input="blocks" (Figure 1c):
    network maps the block input kron(w, s) (N_a N_s,) to one reward (out_dim 1),
    and f(theta, [s, e_a]) = network(theta, (0, .., s, .., 0)); ``n_arms`` is then
    required. Parameters are the network's (P). Output (1,).
    """

    def __init__(self, network: Model, n_arms: int | None = None, input: str = "heads") -> None:
        if not isinstance(network, Model):
            raise TypeError(f"network must be a refbayes Model; got {type(network).__name__}")
        if input not in INPUTS:
            raise ValueError(f"input must be one of {INPUTS}; got {input!r}")
        if network.in_dim is None:
            raise ValueError("network must have a fixed in_dim (a vector context)")
        if input == "heads":
            n_a = network.out_dim
            if n_arms is not None and _as_int(n_arms, "n_arms") != n_a:
                raise ValueError(f"n_arms must equal network.out_dim = {n_a} for input='heads'; got {n_arms}")
            n_s = network.in_dim
        else:
            if n_arms is None:
                raise ValueError("n_arms is required for input='blocks'")
            n_a = _as_int(n_arms, "n_arms")
            if n_a < 1:
                raise ValueError(f"n_arms must be >= 1; got {n_a}")
            if network.out_dim != 1:
                raise ValueError(f"network.out_dim must be 1 for input='blocks'; got {network.out_dim}")
            if network.in_dim % n_a:
                raise ValueError(f"network.in_dim must be a multiple of n_arms = {n_a}; got {network.in_dim}")
            n_s = network.in_dim // n_a
        super().__init__(network.n_params, n_s + n_a, 1)
        object.__setattr__(self, "network", network)
        object.__setattr__(self, "n_arms", n_a)
        object.__setattr__(self, "n_features", n_s)
        object.__setattr__(self, "input", input)

    def __repr__(self):
        return f"ArmModel(network={self.network!r}, n_arms={self.n_arms}, input={self.input!r})"

    def init_params(self, rng: np.random.Generator) -> NDArray[np.float64]:
        return self.network.init_params(rng)

    # -- inputs -----------------------------------------------------------------------------

    def check_context(self, s: ArrayLike) -> NDArray[np.float64]:
        """s as a float64 (N_s,) vector; ValueError otherwise."""
        s = np.asarray(s, dtype=np.float64) if not isinstance(s, np.ndarray) else s
        if s.shape != (self.n_features,):
            raise ValueError(f"context must have shape ({self.n_features},); got {np.shape(s)}")
        if not np.all(np.isfinite(s)):
            raise ValueError("context contains NaN or inf")
        return s.astype(np.float64, copy=False)

    def check_arm(self, a: int) -> int:
        """``a`` as an int in [0, n_arms); ValueError naming ``action`` otherwise."""
        a = _as_int(a, "action")
        if not 0 <= a < self.n_arms:
            raise ValueError(f"action must be in [0, {self.n_arms}); got {a}")
        return a

    def arm_input(self, s: ArrayLike, a: int) -> NDArray[np.float64]:
        """x = [s, e_a] (N_s + N_a,)."""
        s = self.check_context(s)
        x = np.zeros(self.in_dim)
        x[: self.n_features] = s
        x[self.n_features + self.check_arm(a)] = 1.0
        return x

    def arm_inputs(self, S: ArrayLike, actions: ArrayLike) -> NDArray[np.float64]:
        """Rows [s_n, e_{a_n}]: S (N, N_s), actions (N,) -> (N, N_s + N_a)."""
        S = np.asarray(S, dtype=np.float64)
        actions = np.asarray(actions)
        if S.ndim != 2 or S.shape[1] != self.n_features:
            raise ValueError(f"S must have shape (N, {self.n_features}); got {S.shape}")
        if actions.shape != (S.shape[0],) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(f"actions must be {S.shape[0]} integers; got shape {actions.shape}, dtype {actions.dtype}")
        if np.any((actions < 0) | (actions >= self.n_arms)):
            raise ValueError(f"actions must be in [0, {self.n_arms})")
        X = np.zeros((S.shape[0], self.in_dim))
        X[:, : self.n_features] = S
        X[np.arange(S.shape[0]), self.n_features + actions] = 1.0
        return X

    def _block(self, w, s):
        return anp.reshape(anp.outer(w, s), (-1,))

    # -- one arm ----------------------------------------------------------------------------

    def _forward(self, theta, x):
        s, w = x[: self.n_features], x[self.n_features:]
        if self.input == "heads":
            return anp.reshape(anp.dot(w, self.network.apply(theta, s)), (1,))
        return self.network.apply(theta, self._block(w, s))

    def apply_batch(self, theta: ArrayLike, X: ArrayLike) -> NDArray[np.float64]:
        theta = self.validate_theta(theta)
        X = self.validate_X(X)
        S, W = X[:, : self.n_features], X[:, self.n_features:]
        if self.input == "heads":
            return anp.sum(self.network.apply_batch(theta, S) * W, axis=1, keepdims=True)
        B = anp.reshape(W[:, :, None] * S[:, None, :], (X.shape[0], -1))
        return self.network.apply_batch(theta, B)

    def value_and_jacobian(self, theta: ArrayLike, x: ArrayLike,
                           method: str | None = None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(f (1,), J (1, P)) of the weighted arm output, from one network pass."""
        theta = self.validate_theta(theta)
        x = self.validate_x(x)
        s, w = x[: self.n_features], x[self.n_features:]
        if self.input == "heads":
            eta, J = self.network.value_and_jacobian(theta, s, method=method)
            return np.array([w @ eta]), (w @ J)[None, :]
        return self.network.value_and_jacobian(theta, self._block(w, s), method=method)

    def jacobian(self, theta: ArrayLike, x: ArrayLike, method: str | None = None) -> NDArray[np.float64]:
        return self.value_and_jacobian(theta, x, method=method)[1]

    # -- all arms ---------------------------------------------------------------------------

    def arm_values(self, theta: ArrayLike, s: ArrayLike) -> NDArray[np.float64]:
        """f(s; theta) for every arm: (N_a,)."""
        s = self.check_context(s)
        if self.input == "heads":
            return np.asarray(self.network.apply(theta, s), dtype=np.float64)
        eye = np.eye(self.n_arms)
        return np.array([self.network.apply(theta, self._block(eye[a], s))[0] for a in range(self.n_arms)])

    def arm_values_batch(self, theta: ArrayLike, S: ArrayLike) -> NDArray[np.float64]:
        """f(s_n; theta) for every row and arm: S (N, N_s) -> (N, N_a). Works under autograd."""
        if self.input == "heads":
            return self.network.apply_batch(theta, S)
        S = anp.asarray(S) if not hasattr(S, "shape") else S
        N = S.shape[0]
        cols = []
        for a in range(self.n_arms):
            e = np.zeros(self.n_arms)
            e[a] = 1.0
            B = anp.reshape(e[None, :, None] * S[:, None, :], (N, -1))
            cols.append(self.network.apply_batch(theta, B)[:, 0])
        return anp.stack(cols, axis=1)

    def arm_values_and_jacobians(self, theta: ArrayLike,
                                 s: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(f(s; theta) (N_a,), d f / d theta (N_a, P))."""
        s = self.check_context(s)
        if self.input == "heads":
            return self.network.value_and_jacobian(theta, s)
        eye = np.eye(self.n_arms)
        vals, jacs = zip(*[self.network.value_and_jacobian(theta, self._block(eye[a], s)) for a in range(self.n_arms)])
        return np.concatenate(vals), np.concatenate(jacs, axis=0)
