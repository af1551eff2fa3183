"""Observation models, seen by the filters as moment-matched Gaussians.

A model maps parameters and an input to ``eta`` (C_f,): a regression mean, logits or log-rates.
Every filter treats an observation ``y`` as Gaussian in a sufficient statistic T(y),

    T(y) | eta  ~  N(m(eta), R(eta)),

with the exact mean ``m = E[T(y) | eta]`` and covariance ``R = Cov[T(y) | eta]`` of the true
distribution (Chang, Jones & Murphy 2022, section 2.3; Chang et al. 2023, eqs 8-10). The EKF
linearises ``m`` in the parameters, so ``H = mean_jacobian(eta) @ J_f`` with ``J_f`` the model
Jacobian. ``C = obs_dim(C_f)`` is the dimension of T(y):

==============  ===============  =====================  ==============================  =====
likelihood      T(y)             m(eta)                 R(eta)                          C
==============  ===============  =====================  ==============================  =====
Gaussian        y                eta                    obs_var                         C_f
Bernoulli       y in {0,1}^C_f   sigmoid(eta)           diag(p (1 - p))                 C_f
Poisson         y in N^C_f       exp(eta)               diag(exp(eta))                  C_f
Categorical     onehot(y)        softmax(eta)           diag(p) - p p^T                 K - 1 or K
==============  ===============  =====================  ==============================  =====

For the canonical links above ``mean_jacobian == R`` (Categorical drop_last: the first K-1 rows of
the K x K matrix), so ``H = R J_f``.

The categorical covariance is singular (null vector ``1``). Mode ``"drop_last"`` (default) drops
the last class from T, m, H and R, leaving a K-1 dimensional, positive definite problem. Mode
``"full"`` keeps all K classes; solves must then use the pseudo-inverse (``singular`` is True, and
``whiten(..., singular=True)`` does this). Both give the same ``H^T R^+ H = J_f^T (diag(p) - p p^T) J_f``
and ``H^T R^+ (T(y) - m) = J_f^T (onehot(y) - p)`` (Chang et al. 2023, footnote 2).
``logits_factor`` gives a square root of ``diag(p) - p p^T`` for the equivalent "logits form".

``log_prob``, ``grad`` and ``hessian`` use the true distribution, not the Gaussian surrogate.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import scipy.linalg as sla
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit, gammaln

from ._validate import as_float_array, nonnegative_scalar, positive_scalar
from .errors import NotPositiveDefiniteError, r_not_positive_definite

__all__ = [
    "Likelihood",
    "Gaussian",
    "Bernoulli",
    "Categorical",
    "Poisson",
    "logits_factor",
    "whiten",
]

_LOG_2PI = float(np.log(2.0 * np.pi))


# ---------------------------------------------------------------------------------------------
# helpers


def _size_shape(size):
    """Leading shape of a batch of draws: () for size=None."""
    if size is None:
        return ()
    if isinstance(size, (numbers.Integral, np.integer)):
        size = (int(size),)
    size = tuple(int(s) for s in size)
    if any(s < 0 for s in size):
        raise ValueError(f"size must be non-negative; got {size}")
    return size


def _logsumexp(eta, axis=-1, keepdims=False):
    """log sum exp(eta) along ``axis``, shifted by the maximum (finite eta)."""
    m = np.max(eta, axis=axis, keepdims=True)
    out = m + np.log(np.sum(np.exp(eta - m), axis=axis, keepdims=True))
    return out if keepdims else np.squeeze(out, axis=axis)


def _softmax(eta):
    """Softmax along the last axis, via log-sum-exp."""
    return np.exp(eta - _logsumexp(eta, axis=-1, keepdims=True))


def _one_minus(p):
    """1 - p (K,) for a probability vector, without cancellation at the largest entry."""
    q = 1.0 - p
    k = int(np.argmax(p))
    q[k] = np.sum(np.delete(p, k))
    return q


def _categorical_cov_full(p):
    """diag(p) - p p^T (K, K), with the diagonal computed as p_i * sum_{j != i} p_j.

    Rows then sum to zero to round-off relative to their own size, which keeps the null space
    clean even when one class has probability close to 1.
    """
    R = -np.outer(p, p)
    R[np.diag_indices_from(R)] = p * _one_minus(p)
    return R


def logits_factor(eta: ArrayLike) -> NDArray[np.float64]:
    """Square root of the categorical covariance in the "logits form".

    B = diag(sqrt(p)) - p sqrt(p)^T with p = softmax(eta), so that B B^T = diag(p) - p p^T
    (this uses sum(p) = 1). With J_f the (K, P) Jacobian of the logits, J_f^T B B^T J_f is the
    Gauss-Newton matrix that the drop-last and pseudo-inverse forms of Chang et al. 2023
    (footnote 2) also give, and J_f^T B can serve as the new low-rank columns.

    eta: (K,) logits. Returns B: (K, K).
    """
    eta = as_float_array(eta, "eta", ndim=1)
    p = _softmax(eta)
    s = np.sqrt(p)
    return np.diag(s) - np.outer(p, s)


def whiten(H: ArrayLike, R: ArrayLike, e: ArrayLike, singular: bool = False,
           rtol: float | None = None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Whitened observation terms: G (P, C') and g (P,) with

        G G^T = H^T R^+ H        g = H^T R^+ e.

    These are the new low-rank columns and the information-form innovation of an EKF / LO-FI
    update (Chang et al. 2023, eqs 34-36: ``H^T A^T`` with ``A = chol(R)^{-1}``).

    singular=False: R must be positive definite. With R = L L^T (lower Cholesky), A = L^{-1}
    and G = H^T A^T = (L^{-1} H)^T, g = G (L^{-1} e); both come from triangular solves, no
    inverse is formed. C' = C.

    singular=True: R is symmetric positive semi-definite (e.g. the full-class categorical
    covariance). With R = V diag(w) V^T, eigenvalues w_i <= rtol * max(w) are treated as zero
    (default rtol = 10 * C * machine epsilon, a little above the round-off of a computed zero
    eigenvalue); the k others give G = H^T V_k diag(w_k^{-1/2}) and
    g = G diag(w_k^{-1/2}) V_k^T e. Then C' = k, the numerical rank of R. An eigenvalue below
    -1e-8 * max(w) means R is indefinite, and raises.

    H: (C, P). R: (C, C). e: (C,). Returns (G (P, C'), g (P,)).
    Raises NotPositiveDefiniteError when singular=False and R is not positive definite.
    """
    H = as_float_array(H, "H", ndim=2)
    C = H.shape[0]
    R = as_float_array(R, "R", shape=(C, C))
    e = as_float_array(e, "e", shape=(C,))
    R = 0.5 * (R + R.T)
    P = H.shape[1]
    if C == 0:
        return np.zeros((P, 0)), np.zeros(P)
    if not singular:
        try:
            L = sla.cholesky(R, lower=True)
        except np.linalg.LinAlgError as exc:
            raise r_not_positive_definite(R) from exc
        AH = sla.solve_triangular(L, H, lower=True)  # A H, (C, P)
        Ae = sla.solve_triangular(L, e, lower=True)  # A e, (C,)
        G = AH.T
        return G, G @ Ae
    rtol = 10.0 * C * np.finfo(np.float64).eps if rtol is None else nonnegative_scalar(rtol, "rtol")
    w, V = np.linalg.eigh(R)
    if w[-1] <= 0.0:
        return np.zeros((P, 0)), np.zeros(P)
    if w[0] < -1e-8 * w[-1]:  # clearly indefinite, not round-off
        raise NotPositiveDefiniteError(f"R is not positive semi-definite; smallest eigenvalue {w[0]:.3e}")
    keep = w > rtol * w[-1]
    s = 1.0 / np.sqrt(w[keep])
    Vk = V[:, keep]
    G = (H.T @ Vk) * s
    g = G @ (s * (Vk.T @ e))
    return G, g


# ---------------------------------------------------------------------------------------------
# base class


class Likelihood:
    """Base class. Subclasses define the moments of T(y) and the exact log-likelihood.

    Shapes: eta (C_f,) is the model output; C = obs_dim(C_f) is the dimension of T(y).
    ``jitter`` (>= 0, default 0) adds ``jitter * I`` to ``cov`` only; it exists for comparison
    with implementations that regularise R this way.
    """

    is_classification = False
    n_classes = None

    def __init__(self, jitter: float = 0.0) -> None:
        self.jitter = nonnegative_scalar(jitter, "jitter")

    def _repr_args(self) -> list[str]:
        """The constructor arguments that ``repr`` shows (subclasses add theirs)."""
        return []

    def __repr__(self) -> str:
        args = self._repr_args() + ([f"jitter={self.jitter!r}"] if self.jitter else [])
        return f"{type(self).__name__}({', '.join(args)})"

    # --- dimensions --------------------------------------------------------------------------

    @property
    def singular(self) -> bool:
        """True when ``cov`` is singular by construction, so solves need a pseudo-inverse."""
        return False

    def check_out_dim(self, out_dim: int) -> int:
        """Raise ValueError if a model output of dimension ``out_dim`` cannot feed this likelihood."""
        if type(out_dim) is not int and (isinstance(out_dim, (bool, np.bool_))
                                         or not isinstance(out_dim, (numbers.Integral, np.integer))):
            raise ValueError(f"out_dim must be a positive integer; got {out_dim!r}")
        if out_dim < 1:
            raise ValueError(f"out_dim must be >= 1; got {out_dim}")
        return int(out_dim)

    def obs_dim(self, out_dim: int) -> int:
        """C, the dimension of T(y), for a model output of dimension ``out_dim`` (C_f)."""
        return self.check_out_dim(out_dim)

    def _eta(self, eta):
        eta = as_float_array(eta, "eta", ndim=1)
        self.check_out_dim(eta.shape[0])
        return eta

    def _eta_batch(self, ETA):
        ETA = as_float_array(ETA, "ETA", ndim=2)
        self.check_out_dim(ETA.shape[1])
        return ETA

    # --- moments -------------------------------------------------------------------------------

    def encode(self, y: ArrayLike, out_dim: int) -> NDArray[np.float64]:
        """T(y): (C,) float64, after checking y."""
        raise NotImplementedError

    def mean(self, eta: ArrayLike) -> NDArray[np.float64]:
        """m(eta) = E[T(y) | eta]: (C,)."""
        raise NotImplementedError

    def mean_jacobian(self, eta: ArrayLike) -> NDArray[np.float64]:
        """d m / d eta: (C, C_f)."""
        raise NotImplementedError

    def _cov(self, eta):
        raise NotImplementedError

    def cov(self, eta: ArrayLike) -> NDArray[np.float64]:
        """R(eta) = Cov[T(y) | eta] (+ jitter * I): (C, C)."""
        R = self._cov(self._eta(eta))
        if self.jitter > 0:
            R = R + self.jitter * np.eye(R.shape[0])
        return R

    # --- exact likelihood ----------------------------------------------------------------------

    def log_prob(self, y: ArrayLike, eta: ArrayLike) -> float:
        """log p(y | eta) under the true distribution: float."""
        raise NotImplementedError

    def log_prob_batch(self, Y: ArrayLike, ETA: ArrayLike) -> NDArray[np.float64]:
        """log p(y_n | eta_n) for a batch. ETA: (N, C_f). Returns (N,)."""
        ETA = self._eta_batch(ETA)
        Y = np.asarray(Y)
        if Y.shape[:1] != (ETA.shape[0],):
            raise ValueError(f"Y must have {ETA.shape[0]} rows (one per row of ETA); got shape {Y.shape}")
        return np.array([self.log_prob(y, eta) for y, eta in zip(Y, ETA)], dtype=np.float64)

    def _elementwise_batch(self, Y, ETA, check=None):
        """(Y, ETA) checked, for a likelihood whose y has one entry per output (ETA (N, C_f), Y the
        same shape); ``check(values, name)`` validates the entries (binary, counts)."""
        ETA = self._eta_batch(ETA)
        Y = _elementwise_Y(Y, ETA.shape[0], ETA.shape[1])
        if check is not None:
            check(Y, "Y")
        return Y, ETA

    def _elementwise(self, y, eta, check=None):
        """(y, eta) checked, for one observation of a likelihood whose y has one entry per output (eta
        (C_f,), y the same shape); ``check(values, name)`` validates the entries (binary, counts)."""
        eta = self._eta(eta)
        y = _elementwise_y(y, eta.shape[0])
        if check is not None:
            check(y, "y")
        return y, eta

    def _elementwise_encode(self, y, out_dim, check=None):
        """``encode`` of an elementwise likelihood: y as a checked (out_dim,) float vector."""
        y = _elementwise_y(y, self.check_out_dim(out_dim))
        if check is not None:
            check(y, "y")
        return y

    def _elementwise_log_prob(self, y, eta, check=None):
        """``log_prob`` of an elementwise likelihood: its ``log_prob_batch`` on one row."""
        y, eta = self._elementwise(y, eta, check)
        return float(self.log_prob_batch(y[None], eta[None])[0])

    def grad(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        """Gradient of log p(y | eta) with respect to eta: (C_f,)."""
        raise NotImplementedError

    def hessian(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        """Hessian of log p(y | eta) with respect to eta: (C_f, C_f)."""
        raise NotImplementedError

    def sample(self, eta: ArrayLike, rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> NDArray[Any]:
        """Draw y ~ p(y | eta). size=None gives one y; otherwise a leading batch shape ``size``."""
        raise NotImplementedError

    @staticmethod
    def _rng(rng):
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
        return rng


# ---------------------------------------------------------------------------------------------
# elementwise likelihoods share target checks


def _elementwise_y(y, out_dim, name="y"):
    """A finite (out_dim,) float vector; a scalar is accepted when out_dim == 1."""
    arr = as_float_array(y, name)
    if arr.ndim == 0 and out_dim == 1:
        arr = arr.reshape(1)
    if arr.shape != (out_dim,):
        raise ValueError(f"{name} must have shape ({out_dim},); got {arr.shape}")
    return arr


def _elementwise_Y(Y, n, out_dim, name="Y"):
    """A finite (n, out_dim) float array; (n,) is accepted when out_dim == 1."""
    arr = as_float_array(Y, name)
    if arr.ndim == 1 and out_dim == 1:
        arr = arr.reshape(-1, 1)
    if arr.shape != (n, out_dim):
        raise ValueError(f"{name} must have shape ({n}, {out_dim}); got {arr.shape}")
    return arr


def _check_binary(y, name):
    if not np.all((y == 0.0) | (y == 1.0)):
        raise ValueError(f"{name} must contain only 0 and 1; got values {np.unique(y)[:5]}")


def _check_counts(y, name):
    if np.any(y < 0) or np.any(y != np.round(y)):
        raise ValueError(f"{name} must contain non-negative integers; got minimum {y.min()}")


# ---------------------------------------------------------------------------------------------


class Gaussian(Likelihood):
    """Gaussian regression: y | eta ~ N(eta, obs_var).

    obs_var: a scalar > 0 (R = obs_var * I), a (C,) vector of variances > 0 (R = diag), or a
    symmetric positive definite (C, C) matrix. A vector or matrix fixes the output dim C = C_f.
    """

    def __init__(self, obs_var: ArrayLike = 1.0, *, jitter: float = 0.0) -> None:
        super().__init__(jitter)
        arr = as_float_array(obs_var, "obs_var")
        if arr.ndim == 0:
            self._kind = "scalar"
            arr = np.asarray(positive_scalar(float(arr), "obs_var"))
            self._dim = None
        elif arr.ndim == 1:
            self._kind = "diag"
            if arr.shape[0] < 1 or np.any(arr <= 0):
                got = arr.min() if arr.size else "an empty vector"
                raise ValueError(f"obs_var must have entries > 0; got minimum {got}")
            self._dim = arr.shape[0]
        elif arr.ndim == 2:
            self._kind = "matrix"
            n = arr.shape[0]
            if arr.shape != (n, n) or n < 1:
                raise ValueError(f"obs_var must be a square matrix; got shape {arr.shape}")
            scale = np.max(np.abs(arr))
            if np.max(np.abs(arr - arr.T)) > 1e-10 * scale:
                raise ValueError("obs_var must be symmetric")
            arr = 0.5 * (arr + arr.T)
            try:
                self._chol = sla.cholesky(arr, lower=True)
            except np.linalg.LinAlgError as exc:
                raise ValueError("obs_var must be positive definite") from exc
            self._chol.setflags(write=False)
            self._dim = n
        else:
            raise ValueError(f"obs_var must be a scalar, a vector or a square matrix; got shape {arr.shape}")
        arr = np.array(arr, dtype=np.float64)
        arr.setflags(write=False)
        self.obs_var = arr

    def _repr_args(self) -> list[str]:
        if self._kind == "scalar":
            return [f"obs_var={float(self.obs_var)!r}"]
        return [f"obs_var=<{'x'.join(map(str, np.shape(self.obs_var)))} array>"]

    def check_out_dim(self, out_dim: int) -> int:
        out_dim = super().check_out_dim(out_dim)
        if self._dim is not None and out_dim != self._dim:
            raise ValueError(
                f"out_dim must be {self._dim} to match obs_var of shape {self.obs_var.shape}; got {out_dim}"
            )
        return out_dim

    def _R(self, C):
        """The noise covariance (C, C) without jitter."""
        if self._kind == "scalar":
            return float(self.obs_var) * np.eye(C)
        if self._kind == "diag":
            return np.diag(self.obs_var)
        return np.array(self.obs_var)

    def _solve(self, B):
        """R^{-1} B for B (C,) or (C, k) (or rows in the last axis for the diag/scalar cases)."""
        if self._kind == "scalar":
            return B / float(self.obs_var)
        if self._kind == "diag":
            return B / self.obs_var.reshape((-1,) + (1,) * (B.ndim - 1))
        return sla.cho_solve((self._chol, True), B)

    def encode(self, y: ArrayLike, out_dim: int) -> NDArray[np.float64]:
        return self._elementwise_encode(y, out_dim)

    def mean(self, eta: ArrayLike) -> NDArray[np.float64]:
        return np.array(self._eta(eta))

    def mean_jacobian(self, eta: ArrayLike) -> NDArray[np.float64]:
        return np.eye(self._eta(eta).shape[0])

    def _cov(self, eta):
        return self._R(eta.shape[0])

    def log_prob(self, y: ArrayLike, eta: ArrayLike) -> float:
        return self._elementwise_log_prob(y, eta)

    def log_prob_batch(self, Y: ArrayLike, ETA: ArrayLike) -> NDArray[np.float64]:
        ETA = self._eta_batch(ETA)
        n, C = ETA.shape
        r = _elementwise_Y(Y, n, C) - ETA
        if self._kind == "scalar":
            v = float(self.obs_var)
            return -0.5 * (C * (_LOG_2PI + np.log(v)) + np.sum(r * r, axis=1) / v)
        if self._kind == "diag":
            v = self.obs_var
            return -0.5 * (C * _LOG_2PI + np.sum(np.log(v)) + np.sum(r * r / v, axis=1))
        z = sla.solve_triangular(self._chol, r.T, lower=True)  # (C, n)
        logdet = 2.0 * np.sum(np.log(np.diag(self._chol)))
        return -0.5 * (C * _LOG_2PI + logdet + np.sum(z * z, axis=0))

    def grad(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        y, eta = self._elementwise(y, eta)
        return self._solve(y - eta)

    def hessian(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        _, eta = self._elementwise(y, eta)
        H = -self._solve(np.eye(eta.shape[0]))
        return 0.5 * (H + H.T)

    def sample(self, eta: ArrayLike, rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> NDArray[np.float64]:
        """Draws of shape size + (C,) (float64)."""
        eta = self._eta(eta)
        rng = self._rng(rng)
        C = eta.shape[0]
        z = rng.standard_normal(_size_shape(size) + (C,))
        if self._kind == "scalar":
            return eta + np.sqrt(float(self.obs_var)) * z
        if self._kind == "diag":
            return eta + np.sqrt(self.obs_var) * z
        return eta + z @ self._chol.T


class Bernoulli(Likelihood):
    """Independent binary outputs: y_c | eta_c ~ Bernoulli(sigmoid(eta_c)), c = 1..C_f.

    prob_clip (None or a float in [0, 0.5)): if given, the EKF moments use
    p = clip(sigmoid(eta), prob_clip, 1 - prob_clip), which keeps R away from 0. ``mean_jacobian``
    is then the derivative of the clipped mean, i.e. 0 wherever the clip is active (such an output
    gives no update). ``log_prob``, ``grad``, ``hessian`` and ``sample`` always use the unclipped p.
    """

    is_classification = True
    n_classes = 2  # per output

    def __init__(self, prob_clip: float | None = None, *, jitter: float = 0.0) -> None:
        super().__init__(jitter)
        if prob_clip is not None:
            prob_clip = nonnegative_scalar(prob_clip, "prob_clip")
            if prob_clip >= 0.5:
                raise ValueError(f"prob_clip must be in [0, 0.5); got {prob_clip}")
        self.prob_clip = prob_clip

    def _repr_args(self) -> list[str]:
        return [] if self.prob_clip is None else [f"prob_clip={self.prob_clip!r}"]

    def _pq(self, eta):
        """(p, 1 - p), each computed without cancellation, clipped if prob_clip is set."""
        p, q = expit(eta), expit(-eta)
        if self.prob_clip is not None:
            c = self.prob_clip
            p, q = np.clip(p, c, 1.0 - c), np.clip(q, c, 1.0 - c)
        return p, q

    def encode(self, y: ArrayLike, out_dim: int) -> NDArray[np.float64]:
        return self._elementwise_encode(y, out_dim, _check_binary)

    def mean(self, eta: ArrayLike) -> NDArray[np.float64]:
        return self._pq(self._eta(eta))[0]

    def mean_jacobian(self, eta: ArrayLike) -> NDArray[np.float64]:
        eta = self._eta(eta)
        d = expit(eta) * expit(-eta)
        if self.prob_clip is not None:
            p = expit(eta)
            c = self.prob_clip
            d = np.where((p < c) | (p > 1.0 - c), 0.0, d)
        return np.diag(d)

    def _cov(self, eta):
        p, q = self._pq(eta)
        return np.diag(p * q)

    def log_prob(self, y: ArrayLike, eta: ArrayLike) -> float:
        return self._elementwise_log_prob(y, eta, _check_binary)

    def log_prob_batch(self, Y: ArrayLike, ETA: ArrayLike) -> NDArray[np.float64]:
        Y, ETA = self._elementwise_batch(Y, ETA, _check_binary)
        # log sigmoid(eta) = -softplus(-eta); y eta - softplus(eta) in stable form
        return np.sum(Y * ETA - np.logaddexp(0.0, ETA), axis=1)

    def grad(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        y, eta = self._elementwise(y, eta, _check_binary)
        return y - expit(eta)

    def hessian(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        _, eta = self._elementwise(y, eta, _check_binary)
        return -np.diag(expit(eta) * expit(-eta))

    def sample(self, eta: ArrayLike, rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> NDArray[np.int64]:
        """Draws in {0, 1} of shape size + (C_f,) (int64)."""
        eta = self._eta(eta)
        rng = self._rng(rng)
        u = rng.random(_size_shape(size) + eta.shape)
        return (u < expit(eta)).astype(np.int64)


class Poisson(Likelihood):
    """Independent counts: y_c | eta_c ~ Poisson(exp(eta_c)), c = 1..C_f (log link)."""

    def encode(self, y: ArrayLike, out_dim: int) -> NDArray[np.float64]:
        return self._elementwise_encode(y, out_dim, _check_counts)

    def mean(self, eta: ArrayLike) -> NDArray[np.float64]:
        return np.exp(self._eta(eta))

    def mean_jacobian(self, eta: ArrayLike) -> NDArray[np.float64]:
        return np.diag(np.exp(self._eta(eta)))

    def _cov(self, eta):
        return np.diag(np.exp(eta))

    def log_prob(self, y: ArrayLike, eta: ArrayLike) -> float:
        return self._elementwise_log_prob(y, eta, _check_counts)

    def log_prob_batch(self, Y: ArrayLike, ETA: ArrayLike) -> NDArray[np.float64]:
        Y, ETA = self._elementwise_batch(Y, ETA, _check_counts)
        return np.sum(Y * ETA - np.exp(ETA) - gammaln(Y + 1.0), axis=1)

    def grad(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        y, eta = self._elementwise(y, eta, _check_counts)
        return y - np.exp(eta)

    def hessian(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        _, eta = self._elementwise(y, eta, _check_counts)
        return -np.diag(np.exp(eta))

    def sample(self, eta: ArrayLike, rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> NDArray[np.int64]:
        """Counts of shape size + (C_f,) (int64)."""
        eta = self._eta(eta)
        rng = self._rng(rng)
        return rng.poisson(np.exp(eta), size=_size_shape(size) + eta.shape).astype(np.int64)


class Categorical(Likelihood):
    """One label y in {0, ..., K-1}: y | eta ~ Cat(softmax(eta)), eta (K,) logits.

    mode="drop_last" (default): T(y), m, H and R drop the last class, C = K - 1, R is positive
    definite. mode="full": all K classes, C = K, R = diag(p) - p p^T is singular (``singular``
    is True unless jitter > 0) and solves must use a pseudo-inverse. Both modes give the same
    filter updates (see the module docstring).
    """

    is_classification = True
    MODES = ("drop_last", "full")

    def __init__(self, n_classes: int, mode: str = "drop_last", jitter: float = 0.0) -> None:
        super().__init__(jitter)
        if isinstance(n_classes, (bool, np.bool_)) or not isinstance(n_classes, (numbers.Integral, np.integer)):
            raise ValueError(f"n_classes must be an integer >= 2; got {n_classes!r}")
        if n_classes < 2:
            raise ValueError(f"n_classes must be >= 2; got {n_classes}")
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}; got {mode!r}")
        self.n_classes = int(n_classes)
        self.mode = mode

    def _repr_args(self) -> list[str]:
        return [str(self.n_classes)] + ([f"mode={self.mode!r}"] if self.mode != "drop_last" else [])

    @property
    def singular(self) -> bool:
        """True in ``mode="full"`` without jitter: the K x K covariance diag(p) - p p^T has rank K - 1."""
        return self.mode == "full" and self.jitter == 0.0

    def check_out_dim(self, out_dim: int) -> int:
        out_dim = super().check_out_dim(out_dim)
        if out_dim != self.n_classes:
            raise ValueError(f"out_dim must equal n_classes = {self.n_classes}; got {out_dim}")
        return out_dim

    def obs_dim(self, out_dim: int) -> int:
        out_dim = self.check_out_dim(out_dim)
        return out_dim - 1 if self.mode == "drop_last" else out_dim

    def _label(self, y, name="y"):
        if isinstance(y, (int, np.integer)) and not isinstance(y, (bool, np.bool_)):  # the common case
            if not 0 <= y < self.n_classes:
                raise ValueError(f"{name} must be in [0, {self.n_classes}); got {int(y)}")
            return int(y)
        arr = np.asarray(y)
        if arr.shape == (1,):
            arr = arr.reshape(())
        if arr.shape != ():
            raise ValueError(f"{name} must be one integer class label; got shape {arr.shape}")
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
            raise ValueError(f"{name} must be an integer class label; got {y!r}")
        v = float(arr)
        if not np.isfinite(v) or v != np.round(v):
            raise ValueError(f"{name} must be an integer class label; got {y!r}")
        if not 0 <= v < self.n_classes:
            raise ValueError(f"{name} must be in [0, {self.n_classes}); got {int(v)}")
        return int(v)

    def _labels(self, Y, n, name="Y"):
        arr = np.asarray(Y)
        if arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        if arr.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},); got {arr.shape}")
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
            raise ValueError(f"{name} must contain integer class labels; got dtype {arr.dtype}")
        v = arr.astype(np.float64)
        if not np.all(np.isfinite(v)) or np.any(v != np.round(v)):
            raise ValueError(f"{name} must contain integer class labels")
        if np.any(v < 0) or np.any(v >= self.n_classes):
            raise ValueError(f"{name} must be in [0, {self.n_classes}); got range [{v.min()}, {v.max()}]")
        return v.astype(np.int64)

    def _c(self):
        return self.n_classes - 1 if self.mode == "drop_last" else self.n_classes

    def encode(self, y: ArrayLike, out_dim: int) -> NDArray[np.float64]:
        self.check_out_dim(out_dim)
        k = self._label(y)
        t = np.zeros(self.n_classes)
        t[k] = 1.0
        return t[: self._c()]

    def probs(self, eta: ArrayLike) -> NDArray[np.float64]:
        """softmax(eta): (K,), all classes."""
        return _softmax(self._eta(eta))

    def mean(self, eta: ArrayLike) -> NDArray[np.float64]:
        return self.probs(eta)[: self._c()]

    def mean_jacobian(self, eta: ArrayLike) -> NDArray[np.float64]:
        return _categorical_cov_full(self.probs(eta))[: self._c()]

    def _cov(self, eta):
        c = self._c()
        return _categorical_cov_full(_softmax(eta))[:c, :c]

    def log_prob(self, y: ArrayLike, eta: ArrayLike) -> float:
        eta = self._eta(eta)
        k = self._label(y)
        return float(eta[k] - _logsumexp(eta))

    def log_prob_batch(self, Y: ArrayLike, ETA: ArrayLike) -> NDArray[np.float64]:
        ETA = self._eta_batch(ETA)
        k = self._labels(Y, ETA.shape[0])
        return ETA[np.arange(ETA.shape[0]), k] - _logsumexp(ETA, axis=1)

    def grad(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        eta = self._eta(eta)
        k = self._label(y)
        g = -_softmax(eta)
        g[k] += 1.0
        return g

    def hessian(self, y: ArrayLike, eta: ArrayLike) -> NDArray[np.float64]:
        eta = self._eta(eta)
        self._label(y)
        return -_categorical_cov_full(_softmax(eta))

    def sample(self, eta: ArrayLike, rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> NDArray[np.int64]:
        """Labels of shape size (int64; a 0-d array for size=None)."""
        eta = self._eta(eta)
        rng = self._rng(rng)
        shape = _size_shape(size)
        cdf = np.cumsum(_softmax(eta))
        u = rng.random(shape) * cdf[-1]
        k = np.searchsorted(cdf, u, side="right")
        return np.minimum(k, self.n_classes - 1).astype(np.int64)
