"""Extended Kalman filtering in a low-dimensional affine subspace of the parameters.

Duran-Martin, Kara & Murphy (2022), "Efficient online Bayesian inference for
neural bandits", section 3.4 and Algorithm 2. The network parameters are
restricted to theta(z) = A z + theta_star, with A (P, d) a fixed basis and
theta_star (P,) an offset, and the EKF runs on z (d,) with the state-space model

    z_t = z_{t-1} + N(0, q I_d),    y_t | z_t ~ N(f(x_t; A z_t + theta_star), R).

By the chain rule the z-space Jacobian is H = J A, so the usual full-covariance
EKF update (appendix A.5, eqs 58-64) or the diagonal (fully decoupled) EKF
update applies unchanged in d dimensions.

The basis comes from a warm-up phase: full-batch gradient descent with
heavy-ball momentum on the warm-up data, then either the principal directions
of the (thinned, centred) iterate trajectory or a random Gaussian basis with
unit-norm columns (Li et al. 2018); the offset is the last warm-up iterate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import autograd
import autograd.numpy as anp
import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._validate import as_float_array, nonnegative_scalar, positive_int, positive_scalar
from ..beliefs import Diag, FullCov
from ..errors import ConvergenceError
from ..models import Model
from . import diagonal, ekf
from ._compat import positional_deprecated
from .base import Filter

if TYPE_CHECKING:
    from ..likelihoods import Likelihood

__all__ = [
    "SubspaceModel",
    "Subspace",
    "SubspaceEKF",
    "gd_trajectory",
    "pca_basis",
    "random_basis",
    "build_subspace",
    "COVS",
    "DIAG_UPDATES",
]

COVS = ("full", "diag")
DIAG_UPDATES = ("fd", "vd")


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return rng


def _check_basis(basis, offset, n_params):
    A = as_float_array(basis, "basis", shape=(n_params, None))
    if A.shape[1] < 1:
        raise ValueError(f"basis must have at least one column; got shape {A.shape}")
    if offset is None:
        off = np.zeros(n_params)
    else:
        off = as_float_array(offset, "offset", shape=(n_params,))
    A = np.array(A, copy=True)
    off = np.array(off, copy=True)
    A.setflags(write=False)
    off.setflags(write=False)
    return A, off


# ---------------------------------------------------------------------------------------------
# the model seen in z-space
# ---------------------------------------------------------------------------------------------


class SubspaceModel(Model):
    """g(z, x) = f(A z + theta_star, x): a model restricted to an affine subspace.

    model: any refbayes model f with P parameters; basis A (P, d); offset
    theta_star (P,) (default 0). n_params is d. The Jacobian is the chain rule
    J_f(A z + theta_star, x) A (C, d), which costs O(C P d) on top of J_f.
    ``init_params`` returns z = 0, i.e. theta = theta_star (the prior mean of
    section 3.4).
    """

    def __init__(self, model, basis, offset=None):
        if not isinstance(model, Model):
            raise TypeError(f"model must be a refbayes Model; got {type(model).__name__}")
        A, off = _check_basis(basis, offset, model.n_params)
        super().__init__(A.shape[1], model.in_dim, model.out_dim)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "basis", A)
        object.__setattr__(self, "offset", off)

    def __repr__(self):
        return f"SubspaceModel(model={self.model!r}, d={self.n_params})"

    @property
    def dim(self) -> int:
        """d, the subspace dimension."""
        return self.n_params

    def to_params(self, z):
        """theta = A z + theta_star. z: (d,) or (n, d); returns (P,) or (n, P)."""
        if isinstance(z, autograd.tracer.Box):
            return anp.dot(self.basis, z) + self.offset
        z = as_float_array(z, "z")
        if z.ndim == 1 and z.shape[0] == self.n_params:
            return self.basis @ z + self.offset
        if z.ndim == 2 and z.shape[1] == self.n_params:
            return z @ self.basis.T + self.offset
        raise ValueError(f"z must have shape ({self.n_params},) or (n, {self.n_params}); got {z.shape}")

    def init_params(self, rng):
        """z = 0 (d,): theta = theta_star. ``rng`` is checked for the Model interface, not used."""
        _check_rng(rng)
        return np.zeros(self.n_params)

    def validate_x(self, x):
        """The wrapped model's check of one input x (in_dim,)."""
        return self.model.validate_x(x)

    def validate_X(self, X):
        """The wrapped model's check of a batch X (N, in_dim)."""
        return self.model.validate_X(X)

    def _forward(self, z, x):
        return self.model._forward(anp.dot(self.basis, z) + self.offset, x)

    def apply_batch(self, z, X):
        """f(A z + theta_star, x) for each row of X (N, in_dim): (N, C)."""
        z = self.validate_theta(z)
        return self.model.apply_batch(anp.dot(self.basis, z) + self.offset, X)

    def jacobian(self, z, x, method=None):
        """J_f(A z + theta_star, x) A: (C, d). ``method`` is passed to the wrapped model."""
        z = self.validate_theta(z)
        return self.model.jacobian(anp.dot(self.basis, z) + self.offset, x, method=method) @ self.basis

    def value_and_jacobian(self, z, x, method=None):
        """(f(A z + theta_star, x) (C,), J_f A (C, d)) from one pass of the wrapped model."""
        z = self.validate_theta(z)
        if isinstance(z, autograd.tracer.Box):
            return self._forward(z, x), self.jacobian(z, x, method=method)
        eta, J = self.model.value_and_jacobian(self.basis @ z + self.offset, x, method=method)
        return eta, J @ self.basis


# ---------------------------------------------------------------------------------------------
# building the subspace
# ---------------------------------------------------------------------------------------------


def gd_trajectory(model, X, Y, theta0, n_steps=1000, lr=0.05, momentum=0.9):
    """Full-batch gradient descent with heavy-ball momentum (Algorithm 2, "SGD(D_tau)").

    Loss L(theta) = (1/N) sum_n 1/2 ||f(theta, x_n) - y_n||^2 over X (N, in_dim),
    Y (N, C) (or (N,) when C = 1). Update: m_k = grad L(theta_{k-1}) + momentum m_{k-1},
    theta_k = theta_{k-1} - lr m_k, k = 1..n_steps, m_0 = 0.
    Returns the iterates theta_1..theta_E as an (n_steps, P) array; raises
    ConvergenceError if an iterate stops being finite.
    """
    X = model.validate_X(X)
    N = X.shape[0]
    if N < 1:
        raise ValueError("X must have at least one row")
    Y = as_float_array(Y, "Y")
    if Y.ndim == 1:
        Y = Y[:, None]
    if Y.shape != (N, model.out_dim):
        raise ValueError(f"Y must have shape ({N}, {model.out_dim}) (or ({N},) when out_dim is 1); got {Y.shape}")
    theta = np.array(model.validate_theta(theta0), dtype=np.float64, copy=True)
    n_steps = positive_int(n_steps, "n_steps")
    lr = positive_scalar(lr, "lr")
    momentum = nonnegative_scalar(momentum, "momentum")
    if momentum >= 1:
        raise ValueError(f"momentum must be < 1; got {momentum}")

    def loss(th):
        r = model.apply_batch(th, X) - Y
        return 0.5 * anp.sum(r * r) / N

    grad = autograd.grad(loss)
    out = np.empty((n_steps, theta.shape[0]))
    m = np.zeros_like(theta)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(n_steps):
            m = grad(theta) + momentum * m
            theta = theta - lr * m
            if not np.all(np.isfinite(theta)):
                raise ConvergenceError(f"gradient descent diverged at step {k + 1} (non-finite iterate); "
                                       f"use a smaller lr than {lr}")
            out[k] = theta
    return out


def _thin(iterates, thin, n_keep):
    thin = positive_int(thin, "thin")
    kept = iterates[::thin]
    if n_keep is not None:
        kept = kept[-positive_int(n_keep, "n_keep"):]
    return kept


def pca_basis(iterates, d, thin=2, n_keep=None, method="exact", rng=None, oversample=10, n_power=2):
    """Principal directions of an iterate trajectory (section 3.4, "SVD of the iterates").

    iterates (n, P): theta_1..theta_n. Keep every ``thin``-th row starting at the
    first (theta_1, theta_3, ...), then the last ``n_keep`` of those; centre
    them, Theta_c = U S V^T (thin SVD), and return (A, explained) with
    A = V[:, :d] (P, d), A^T A = I_d, and ``explained`` (d,) the fractions of
    the total variance carried by each direction.

    d: an int (1 <= d <= min(n_kept, P)) or a fraction rho in (0, 1): the
    smallest d whose cumulative explained variance is >= rho.
    method: "exact" (LAPACK thin SVD) or "randomized" (Halko et al. 2011, with
    ``oversample`` extra columns and ``n_power`` power iterations; needs ``rng``).
    """
    Theta = as_float_array(iterates, "iterates", ndim=2)
    kept = _thin(Theta, thin, n_keep)
    n, P = kept.shape
    if n < 2:
        raise ValueError(f"pca_basis needs at least 2 kept iterates; got {n}")
    frac = None
    if isinstance(d, (float, np.floating)):
        frac = float(d)
        if not 0 < frac < 1:
            raise ValueError(f"d must be an int >= 1 or a float fraction in (0, 1); got {d}")
    else:
        d = positive_int(d, "d")
        if d > min(n, P):
            raise ValueError(f"d must be <= min(n_kept, P) = {min(n, P)}; got {d}")
    if method not in ("exact", "randomized"):
        raise ValueError(f"method must be 'exact' or 'randomized'; got {method!r}")
    centred = kept - kept.mean(axis=0)
    total = float(np.sum(centred * centred))
    if method == "exact" or frac is not None:
        _, s, Vt = np.linalg.svd(centred, full_matrices=False)
    else:
        _check_rng(rng)
        k = min(d + int(oversample), n, P)
        Q, _ = np.linalg.qr(centred.T @ rng.standard_normal((n, k)))  # (P, k) range of Theta_c^T
        for _ in range(int(n_power)):
            Q, _ = np.linalg.qr(centred.T @ (centred @ Q))
        _, s, Wt = np.linalg.svd(centred @ Q, full_matrices=False)  # (n, k) = U S (Q W)^T
        Vt = Wt @ Q.T
    if total == 0.0:
        raise ValueError("iterates are all equal; the trajectory spans no direction")
    explained = s**2 / total
    if frac is not None:
        d = int(np.searchsorted(np.cumsum(explained), frac - 1e-12) + 1)
        d = min(d, Vt.shape[0])
    A = np.ascontiguousarray(Vt[:d].T)
    return A, explained[:d]


def random_basis(n_params, d, rng):
    """Random basis (Li et al. 2018): G_ij ~ N(0, 1) i.i.d., A[:, j] = G[:, j] / ||G[:, j]||.

    Returns A (n_params, d) with unit-norm (not orthogonal) columns.
    """
    P = positive_int(n_params, "n_params")
    d = positive_int(d, "d")
    _check_rng(rng)
    G = rng.standard_normal((P, d))
    return G / np.linalg.norm(G, axis=0)


@dataclass(frozen=True, eq=False)
class Subspace:
    """A subspace theta = basis @ z + offset.

    basis (P, d); offset (P,); init (P,) the starting point of the warm-up
    descent; explained (d,) explained-variance fractions (PCA basis) or None;
    kind: "svd" or "random".
    """

    basis: np.ndarray
    offset: np.ndarray
    init: np.ndarray
    explained: object = None
    kind: str = "svd"

    @property
    def dim(self) -> int:
        """d, the number of basis columns."""
        return self.basis.shape[1]

    def to_params(self, z):
        """A z + theta_star for z (d,) or (n, d)."""
        z = np.asarray(z, dtype=np.float64)
        return self.basis @ z + self.offset if z.ndim == 1 else z @ self.basis.T + self.offset


def build_subspace(model, X, Y, d, rng, *, kind="svd", offset="warm", theta0=None, n_steps=1000, lr=0.05,
                   momentum=0.9, thin=2, n_keep=2000, svd="exact"):
    """Warm-up descent, then basis and offset (Algorithm 2, lines 2-4).

    model, X, Y: the warm-up regression problem (see ``gd_trajectory``).
    theta0 (P,) or None (then ``model.init_params(rng)``).
    kind: "svd" (PCA of the thinned trajectory, ``pca_basis``) or "random"
    (``random_basis``). offset: "warm" (the last iterate theta_E) or "init"
    (theta_0; then no descent is run for a random basis). Returns a Subspace.
    """
    _check_rng(rng)
    if kind not in ("svd", "random"):
        raise ValueError(f"kind must be 'svd' or 'random'; got {kind!r}")
    if offset not in ("warm", "init"):
        raise ValueError(f"offset must be 'warm' or 'init'; got {offset!r}")
    theta0 = model.init_params(rng) if theta0 is None else model.validate_theta(theta0)
    theta0 = np.array(theta0, dtype=np.float64, copy=True)
    needs_gd = kind == "svd" or offset == "warm"
    traj = gd_trajectory(model, X, Y, theta0, n_steps, lr, momentum) if needs_gd else None
    if kind == "svd":
        A, explained = pca_basis(traj, d, thin=thin, n_keep=n_keep, method=svd, rng=rng)
    else:
        A, explained = random_basis(model.n_params, d, rng), None
    off = traj[-1] if offset == "warm" else theta0
    A.setflags(write=False)
    for arr in (off, theta0):
        arr.setflags(write=False)
    return Subspace(A, off, theta0, explained, kind)


# ---------------------------------------------------------------------------------------------
# the filter
# ---------------------------------------------------------------------------------------------


class SubspaceEKF(Filter):
    """EKF on subspace coordinates z, with theta = A z + theta_star (section 3.4, Algorithm 2).

    model: the network f (P parameters); basis A (P, d); offset theta_star (P,)
    (default 0). cov="full": FullCov belief over z and the EKF of appendix A.5
    (eqs 58-64; ``form`` as in refbayes.filters.ekf). cov="diag": Diag belief and
    the diagonal EKF in z (``diag_update="fd"``, fully decoupled, the paper's
    EKF-Sub-Diag; or "vd", variational diagonal with ``vd_mean``).
    Dynamics z_t = gamma z_{t-1} + N(0, q I_d); q may be a (d,) vector.

    Call ``SubspaceEKF(model, likelihood, *, basis=A, offset=theta_star, ...)``: everything after
    (model, likelihood) is keyword-only (positional basis and offset still work in this release,
    with a DeprecationWarning). ``vd_mean``: "paper" (eq. 25 of the diagonal-EKF paper) or "ekf",
    as in :class:`refbayes.VDEKF` (whose default is "ekf"; here "paper" is kept for the
    paper's EKF-Sub-Diag).

    ``self.model`` is the z-space model (a SubspaceModel); ``self.full_model`` is f.
    Cost per step: one Jacobian of f, O(C P d) for H = J A, then O(C d^2) (full)
    or O(C d) (diag); memory O(P d + d^2). No P x P matrix is formed.
    """

    handles_missing = True

    @positional_deprecated("basis", "offset")
    def __init__(self, model: Model, likelihood: Likelihood, *, basis: ArrayLike, offset: ArrayLike | None = None,
                 cov: str = "full", gamma: float = 1.0, q: ArrayLike = 0.0, form: str = "covariance",
                 diag_update: str = "fd", vd_mean: str = "paper", backend: str = "numpy") -> None:
        if cov not in COVS:
            raise ValueError(f"cov must be one of {COVS}; got {cov!r}")
        if diag_update not in DIAG_UPDATES:
            raise ValueError(f"diag_update must be one of {DIAG_UPDATES}; got {diag_update!r}")
        if form not in ekf.FORMS:
            raise ValueError(f"form must be one of {ekf.FORMS}; got {form!r}")
        if vd_mean not in diagonal.VD_MEAN_RULES:
            raise ValueError(f"vd_mean must be one of {diagonal.VD_MEAN_RULES}; got {vd_mean!r}")
        sub = SubspaceModel(model, basis, offset)
        super().__init__(sub, likelihood, gamma=gamma, q=q, backend=backend)
        self.full_model = model
        self.cov = cov
        self.form = form
        self.diag_update = diag_update
        self.vd_mean = vd_mean
        self.belief_type = FullCov if cov == "full" else Diag

    @property
    def basis(self) -> NDArray[np.float64]:
        """A (P, d)."""
        return self.model.basis

    @property
    def offset(self) -> NDArray[np.float64]:
        """theta_star (P,)."""
        return self.model.offset

    @property
    def dim(self) -> int:
        """d."""
        return self.model.n_params

    def init(self, mean: ArrayLike | None, prior_var: ArrayLike = 1.0) -> FullCov | Diag:
        """Prior N(mean, prior_var I_d) over z: mean (d,), or None for 0 (theta = theta_star);
        prior_var a scalar or (d,) vector, in z coordinates."""
        mean = np.zeros(self.dim) if mean is None else mean
        mean, var = self._init_mean_var(mean, prior_var)
        return FullCov(mean, np.diag(var)) if self.cov == "full" else Diag(mean, var)

    def params(self, bel: FullCov | Diag) -> NDArray[np.float64]:
        """Mean of theta: A mu + theta_star (P,)."""
        self._check_belief(bel)
        return self.model.to_params(bel.mean)

    def sample_params(self, bel: FullCov | Diag, rng: np.random.Generator, n: int | None = None) -> NDArray[np.float64]:
        """theta = A z + theta_star with z drawn from the belief: (P,) or (n, P)."""
        self._check_belief(bel)
        return self.model.to_params(bel.sample(rng, n))

    def param_covariance(self, bel: FullCov | Diag) -> NDArray[np.float64]:
        """Dense A Sigma A^T (P, P); for tests and small P."""
        self._check_belief(bel)
        A = self.basis
        return (A * bel.marginal_variance()) @ A.T if self.cov == "diag" else A @ bel.cov @ A.T

    def _predict(self, bel):
        if self.cov == "full":
            return ekf.predict(bel, self.gamma, self.q)
        return diagonal.predict(bel, self.gamma, self.q)

    def _update(self, bel, lin):
        if self.cov == "full":
            return ekf.update(bel, lin.H, lin.R, lin.e, form=self.form, singular=lin.singular)
        if self.diag_update == "fd":
            return diagonal.fd_update(bel, lin.H, lin.R, lin.e, singular=lin.singular)
        return diagonal.vd_update(bel, lin.H, lin.R, lin.e, mean_rule=self.vd_mean, singular=lin.singular)

    def __repr__(self):
        return (f"SubspaceEKF(model={self.full_model!r}, d={self.dim}, cov={self.cov!r}, "
                f"likelihood={self.likelihood!r}, gamma={self.gamma}, q={self.q})")
