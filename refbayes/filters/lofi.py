"""LO-FI: the low-rank extended Kalman filter.

Chang, Duran-Martin, Shestopaloff, Jones & Murphy (2023), "Low-rank extended
Kalman filtering for online learning of neural networks from streaming data".

The belief is N(mu, (diag(ups) + W W^T)^{-1}) with ups (P,) and W (P, L)
(:class:`refbayes.beliefs.DLR`). One step is

- predict (App. A.1, eqs 13-25): exact for any gamma and q, O(P L^2 + L^3);
- update (App. A.2, eqs 26-43): the exact linearised posterior has precision
  diag(ups) + W~ W~^T with W~ = [W, H^T A^T] (P, L + C); the mean uses this
  untruncated precision (eq. 38); then a thin SVD of W~ keeps the top L
  directions (eqs 39-40) and the discarded ones move into the diagonal so that
  the diagonal of the precision stays exact (eqs 41-43).

Spherical LO-FI (App. F) keeps ups = eta * 1 and W = U diag(lambda) with
orthonormal U. Covariance inflation (App. E) and the adaptive observation
variance (App. C.2) are options of :class:`LoFi`.

No function here builds a P x P matrix. The derivation of the predict step is
in ``docs/lofi.md``.
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.linalg as sla
from numpy.typing import ArrayLike, NDArray

from .. import linalg, predictive
from .._validate import as_float_array, nonnegative_scalar, positive_or_vector, positive_scalar
from ..beliefs import DLR
from ..likelihoods import Gaussian, whiten
from ._compat import check_call_rng, deprecated_stored_rng, positional_deprecated
from .base import Filter, mlp_kernel_spec, require_finite

if TYPE_CHECKING:
    from ..likelihoods import Likelihood
    from ..models import Model

__all__ = [
    "predict",
    "update",
    "update_whitened",
    "truncate",
    "spherical_predict",
    "spherical_update",
    "orth_update",
    "steady_state_q",
    "inflate",
    "estimate_obs_var",
    "LoFiBelief",
    "LoFi",
    "VARIANTS",
    "SVD_METHODS",
    "INFLATION_MODES",
]

# the tail of __all__ and these option tuples have the shape of rvga.py's (SCHEMES, EXPECTATIONS, FORMS):
# lists of names, nothing to share
VARIANTS = ("diagonal", "spherical")
SVD_METHODS = ("svd", "qr", "gram")
INFLATION_MODES = (None, "bayesian", "simple", "hybrid")
MIN_OBS_VAR = 1e-6  # floor of the adaptive observation variance (App. C.2)


# ---------------------------------------------------------------------------------------------
# checks


def _check_dlr(bel, name="bel"):
    if not isinstance(bel, DLR):
        raise TypeError(f"{name} must be a refbayes.beliefs.DLR; got {type(bel).__name__}")
    return bel


def _rank(rank, default):
    if rank is None:
        return default
    if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (numbers.Integral, np.integer)):
        raise TypeError(f"rank must be a non-negative integer; got {rank!r}")
    if rank < 0:
        raise ValueError(f"rank must be >= 0; got {rank}")
    return int(rank)


def _rank_within(rank, n_params, what):
    """``rank`` clipped to P with a warning: a factor W (P, L) with L > P holds no more than a rank-P one
    (the SVD truncation keeps every direction once L >= P), so the surplus columns would only cost memory."""
    if rank > n_params:
        import warnings

        warnings.warn(f"{what}: rank = {rank} exceeds the number of parameters P = {n_params}; using rank "
                      f"{n_params}, which already represents any precision exactly", UserWarning, stacklevel=3)
        return n_params
    return rank


def _svd_method(svd):
    if svd not in SVD_METHODS:
        raise ValueError(f"svd must be one of {SVD_METHODS}; got {svd!r}")
    return svd


def _process_noise(q, P):
    """q as a float (spherical-friendly) or a (P,) vector, all >= 0."""
    arr = as_float_array(q, "q")
    if arr.ndim == 0:
        return nonnegative_scalar(float(arr), "q")
    return positive_or_vector(arr, "q", P, allow_zero=True)


def _spherical_eta(bel):
    eta = float(bel.ups[0])
    if np.any(np.abs(bel.ups - eta) > 1e-12 * eta):
        raise ValueError("bel.ups must be constant (eta * 1) for spherical LO-FI; got a non-constant diagonal")
    return eta


def _observation_terms(bel, H, R, e, singular):
    """(G, g) = (H^T A^T, H^T R^{-1} e) from finite H, R, e; DivergenceError where they overflow (a tiny R
    against a large H or e), before any update uses them."""
    H = as_float_array(H, "H", ndim=2)
    if H.shape[1] != bel.n_params:
        raise ValueError(f"H must have shape (C, {bel.n_params}); got {H.shape}")
    G, g = whiten(H, R, e, singular=singular)
    require_finite("LO-FI update", G, g)
    return G, g


# ---------------------------------------------------------------------------------------------
# predict


def predict(bel, gamma, q):
    """LO-FI predict step (Chang et al. 2023, eqs 13-25; Algorithm 2).

    Pushes N(mu, (diag(ups) + W W^T)^{-1}) through theta' = gamma theta + N(0, diag(q))
    (eqs 15-16: mu' = gamma mu, Sigma' = gamma^2 Sigma + diag(q)); two Woodbury
    steps (eqs 17-25) give the precision of Sigma' in DLR form:

        mu' = gamma mu
        ups' = ups / (gamma^2 + q ups)                       (elementwise)
        D = ups' / ups
        C = (I_L + W^T diag(q D) W)^{-1}
        W' = gamma diag(D) W chol(C)

    The step is exact: (diag(ups') + W' W'^T)^{-1} = gamma^2 Sigma + diag(q), and
    the rank stays L. Any square root of C may replace chol(C); here C = (M M^T)^{-1}
    with M = chol(I + W^T diag(q D) W), and chol(C) is replaced by M^{-T}.

    bel: DLR (P, rank L); gamma > 0; q >= 0, a scalar or (P,). Returns a DLR of
    the same type (extra fields of a subclass are kept). Cost O(P L^2 + L^3).
    """
    bel = _check_dlr(bel)
    gamma = positive_scalar(gamma, "gamma")
    q = _process_noise(q, bel.n_params)
    ups, W = bel.ups, bel.W
    ups_pred = ups / (gamma**2 + q * ups)
    D = ups_pred / ups
    if bel.rank == 0:
        W_pred = W
    else:
        qD = np.broadcast_to(q * D, ups.shape)
        Mchol = linalg.cholesky(np.eye(bel.rank) + W.T @ (W * qD[:, None]), "I + W^T diag(q D) W")
        # W chol(C) = W M^{-T}: solve M Z = W^T for Z = M^{-1} W^T.
        W_pred = gamma * D[:, None] * sla.solve_triangular(Mchol, W.T, lower=True).T
    mean = gamma * bel.mean
    require_finite("LO-FI predict", ups_pred, W_pred, mean)
    return bel.replace(mean=mean, ups=ups_pred, W=W_pred)


def steady_state_q(gamma, eta):
    """Process noise that keeps the spherical precision fixed (Chang et al. 2023, eq. 97).

    q = (1 - gamma^2) / eta, for 0 < gamma <= 1 and eta > 0.
    """
    gamma = positive_scalar(gamma, "gamma")
    if gamma > 1.0:
        raise ValueError(f"gamma must be <= 1 for the steady-state assumption; got {gamma}")
    return (1.0 - gamma**2) / positive_scalar(eta, "eta")


def spherical_predict(bel, gamma, q=0.0, steady_state=False):
    """Spherical LO-FI predict step (Chang et al. 2023, eqs 110-115; Algorithm 6).

    Requires ups = eta * 1 and mutually orthogonal columns W = U diag(lambda)
    (what :func:`spherical_update` returns). With a = gamma^2 + q eta:

        eta' = eta / a                                        (eq. 110)
        lambda'^2 = gamma^2 lambda^2 / (a (a + q lambda^2))   (eq. 111), U unchanged
        mu' = gamma mu                                        (eq. 112)

    steady_state=True uses q = (1 - gamma^2) / eta (eq. 97, the ``q`` argument
    must then be 0), so eta' = eta and lambda'^2 = gamma^2 lambda^2 / (1 + q lambda^2)
    (eqs 113-115). The result equals :func:`predict` for the same belief.
    bel: DLR (P, L); q a scalar. Cost O(P L).
    """
    bel = _check_dlr(bel)
    gamma = positive_scalar(gamma, "gamma")
    q = nonnegative_scalar(q, "q")
    eta = _spherical_eta(bel)
    if steady_state:
        if q != 0.0:
            raise ValueError(f"q must be 0 with steady_state=True (it is set by eq. 97); got {q}")
        q = steady_state_q(gamma, eta)
    a = gamma**2 + q * eta
    lam2 = linalg.rowsumsq(bel.W.T)  # squared column norms
    scale = gamma / np.sqrt(a * (a + q * lam2))
    eta_pred = eta if steady_state else eta / a
    W_pred = bel.W * scale[None, :]
    mean = gamma * bel.mean
    require_finite("spherical LO-FI predict", W_pred, mean)
    return bel.replace(mean=mean, ups=np.full(bel.n_params, eta_pred), W=W_pred)


# ---------------------------------------------------------------------------------------------
# update


def _posterior_mean(mean, ups, Wtil, g):
    """mu + (diag(ups) + Wtil Wtil^T)^{-1} g by Woodbury (Chang et al. 2023, eq. 38).

    With g = H^T R^{-1} e this is mu + K e with the gain
    K = ups^{-1} H^T R^{-1} - ups^{-1} Wtil (I + Wtil^T ups^{-1} Wtil)^{-1} Wtil^T ups^{-1} H^T R^{-1},
    which equals Sigma H^T (H Sigma H^T + R)^{-1} for Sigma = (diag(ups) + W W^T)^{-1}.
    """
    Dg = g / ups
    if Wtil.shape[1] == 0:
        return mean + Dg
    DWtil = Wtil / ups[:, None]
    core = np.eye(Wtil.shape[1]) + Wtil.T @ DWtil
    return mean + Dg - DWtil @ linalg.psd_solve(core, Wtil.T @ Dg, name="I + W~^T diag(1/ups) W~")


def _scaled_left_vectors(Wtil, svd):
    """B = U diag(s) and s for the thin SVD Wtil = U diag(s) V^T, s descending (eq. 39).

    "svd": LAPACK SVD of Wtil. "qr": Wtil = Q R, then the SVD of the small R.
    "gram": eigh of Wtil^T Wtil; then B = Wtil V needs no division by s, but the
    small singular values lose half their digits (squared conditioning).
    Returns B (P, k), s (k,) with k = min(P, m) ("gram": k = m).
    """
    if svd == "svd":
        U, s, _ = np.linalg.svd(Wtil, full_matrices=False)
        return U * s, s
    if svd == "qr":
        Q, Rq = np.linalg.qr(Wtil)
        Ur, s, _ = np.linalg.svd(Rq, full_matrices=False)
        return Q @ (Ur * s), s
    w, V = np.linalg.eigh(linalg.symmetrize(Wtil.T @ Wtil))
    w, V = w[::-1], V[:, ::-1]
    return Wtil @ V, np.sqrt(np.maximum(w, 0.0))


def truncate(ups, Wtil, rank, svd="svd", diagonal=True):
    """Project diag(ups) + Wtil Wtil^T back to rank L (Chang et al. 2023, eqs 39-43).

    Thin SVD Wtil = U diag(s) V^T with s descending; W = U[:, :L] diag(s[:L]) (eq. 40,
    zero columns appended when fewer than L components exist), and the discarded
    part W* = U[:, L:] diag(s[L:]) moves into the diagonal,
    ups' = ups + rowsumsq(W*) (eqs 41-42), so diag(ups' + W W^T) = diag(ups + Wtil Wtil^T)
    (eq. 43). W W^T is the best rank-L approximation of Wtil Wtil^T (Eckart-Young) and
    W^T W is diagonal. diagonal=False drops W* instead (spherical LO-FI, eq. 118).

    ups: (P,); Wtil: (P, m). Returns (ups' (P,), W (P, L)). Cost O(P m^2 + m^3).
    """
    L = _rank(rank, 0)
    svd = _svd_method(svd)
    P, m = Wtil.shape
    if m == 0:
        return ups, np.zeros((P, L))
    B, _ = _scaled_left_vectors(Wtil, svd)
    W = B[:, :L]
    if W.shape[1] < L:
        W = np.hstack([W, np.zeros((P, L - W.shape[1]))])
    if diagonal and B.shape[1] > L:
        ups = ups + linalg.rowsumsq(B[:, L:])
    return ups, W


def update_whitened(bel, G, g, rank=None, svd="svd"):
    """LO-FI update from whitened observation terms (Chang et al. 2023, eqs 31-43).

    G (P, C'): the new columns H^T A^T with A^T A = R^{-1} (eq. 31); g (P,): H^T R^{-1} e.
    Any G with G G^T = H^T R^{-1} H gives the same belief. W~ = [W, G] (eq. 31);
    the mean uses the untruncated precision diag(ups) + W~ W~^T (eqs 36-38), then
    :func:`truncate` keeps rank ``rank`` (default: bel.rank) and updates ups.
    Returns a DLR of the same type as ``bel``.
    """
    bel = _check_dlr(bel)
    L = _rank(rank, bel.rank)
    svd = _svd_method(svd)
    P = bel.n_params
    G = as_float_array(G, "G", shape=(P, None))
    g = as_float_array(g, "g", shape=(P,))
    Wtil = np.hstack([bel.W, G])
    mean = _posterior_mean(bel.mean, bel.ups, Wtil, g)
    ups, W = truncate(bel.ups, Wtil, L, svd=svd)
    require_finite("LO-FI update", mean, ups, W)
    return bel.replace(mean=mean, ups=ups, W=W)


def update(bel, H, R, e, rank=None, svd="svd", singular=False):
    """LO-FI update step (Chang et al. 2023, eqs 26-43; Algorithm 3).

    Linearised observation y ~ N(yhat + H (theta - mu), R) with residual e = y - yhat:

        A^T A = R^{-1} (A = chol(R)^{-1}, or the pseudo-inverse form)   (eq. 31)
        W~ = [W, H^T A^T]                                              (eq. 31)
        Lambda~ = diag(ups) + W~ W~^T = Sigma^{-1} + H^T R^{-1} H       (eqs 34-36)
        mu' = mu + Lambda~^{-1} H^T R^{-1} e                            (eqs 37-38)
        W~ = U diag(s) V^T;  W' = U[:, :L] diag(s[:L])                 (eqs 39-40)
        ups' = ups + rowsumsq(U[:, L:] diag(s[L:]))                      (eqs 41-42)

    The mean equals the EKF mean from the DLR prior; the truncation keeps the
    diagonal of the precision exact (eq. 43). With L >= rank(W~) nothing is
    discarded and the step is the EKF update.

    bel: DLR (P, L0); H (C, P); R (C, C); e (C,); rank L >= 0 (default L0);
    svd: "svd" | "qr" | "gram"; singular: R is singular by construction (full-class
    categorical), use the pseudo-inverse. Returns a DLR with rank L.
    Cost O(P (L0 + C)^2 + (L0 + C)^3); no P x P matrix.
    """
    bel = _check_dlr(bel)
    G, g = _observation_terms(bel, H, R, e, singular)
    return update_whitened(bel, G, g, rank=rank, svd=svd)


def spherical_update(bel, H, R, e, rank=None, svd="svd", singular=False):
    """Spherical LO-FI update, SVD version (Chang et al. 2023, eqs 116-118; Algorithm 7).

    With ups = eta * 1 and W~ = [W, H^T A^T] = U diag(s) V^T (all k components):

        mu' = mu + eta^{-1} [g - U diag(s^2 / (eta + s^2)) U^T g],  g = H^T R^{-1} e   (eq. 116)
        W' = U[:, :L] diag(s[:L]),  eta' = eta                                        (eqs 117-118)

    The discarded directions are dropped, which keeps the diagonal spherical.
    Arguments as in :func:`update`. Returns a DLR with constant ups and
    orthogonal columns of W.
    """
    bel = _check_dlr(bel)
    L = _rank(rank, bel.rank)
    svd = _svd_method(svd)
    eta = _spherical_eta(bel)
    G, g = _observation_terms(bel, H, R, e, singular)
    Wtil = np.hstack([bel.W, G])
    P = bel.n_params
    if Wtil.shape[1] == 0:
        return bel.replace(mean=bel.mean + g / eta, W=np.zeros((P, L)))
    B, s = _scaled_left_vectors(Wtil, svd)
    # U diag(s^2/(eta+s^2)) U^T = B diag(1/(eta+s^2)) B^T
    mean = bel.mean + (g - B @ ((B.T @ g) / (eta + s**2))) / eta
    W = B[:, :L]
    if W.shape[1] < L:
        W = np.hstack([W, np.zeros((P, L - W.shape[1]))])
    require_finite("spherical LO-FI update", mean, W)
    return bel.replace(mean=mean, W=W)


def orth_update(bel, H, R, e, singular=False, rng=None):
    """Spherical LO-FI update, orthogonal-projection version (Chang et al. 2023, App. F.5.2, eqs 119-121; Algorithm 8).

    W = U diag(lambda) with orthonormal U. The columns g_c of H^T A^T are visited
    in a random order (natural order if rng is None). For each,
    v = g_c - U U^T g_c and rho = |v| (eq. 120); if rho > min lambda, the column
    j = argmin lambda is replaced by v / rho and lambda_j = rho. The mean uses the
    exact gain with W~ = [W, H^T A^T] and ups = eta (eq. 116). Cost O(P L C) for
    the basis, O(P (L + C)^2) for the mean. Returns a DLR of the same rank.
    """
    bel = _check_dlr(bel)
    _spherical_eta(bel)  # ups must be eta * 1 (raises otherwise)
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or None; got {type(rng).__name__}")
    G, g = _observation_terms(bel, H, R, e, singular)
    mean = _posterior_mean(bel.mean, bel.ups, np.hstack([bel.W, G]), g)
    lam = np.sqrt(linalg.rowsumsq(bel.W.T))
    U = np.divide(bel.W, lam[None, :], out=np.zeros_like(bel.W), where=lam[None, :] > 0)
    order = np.arange(G.shape[1]) if rng is None else rng.permutation(G.shape[1])
    for c in order if bel.rank > 0 else ():
        v = G[:, c] - U @ (U.T @ G[:, c])
        rho = float(np.sqrt(v @ v))
        j = int(np.argmin(lam))
        if rho > lam[j]:
            U[:, j] = v / rho
            lam[j] = rho
    W = U * lam[None, :]
    require_finite("orthogonal-projection LO-FI update", mean, W)
    return bel.replace(mean=mean, W=W)


# ---------------------------------------------------------------------------------------------
# inflation and adaptive observation noise


def inflate(bel, alpha, mode, prior_mean=None, prior_prec=None):
    """Covariance inflation of a posterior before the predict step (Chang et al. 2023, App. E).

    With a = alpha / (1 + alpha), eta0 = prior_prec (the latent prior-predictive
    precision, (P,) or scalar) and m0 = prior_mean (its mean):

    - "bayesian" (eqs 81-83): W / sqrt(1 + alpha); ups / (1 + alpha) + a eta0;
      mu + Sigma_infl (a eta0 (m0 - mu)), Sigma_infl the inflated covariance.
    - "simple" (eqs 86-88): W / sqrt(1 + alpha); ups / (1 + alpha); mu unchanged.
    - "hybrid" (eqs 91-93): the "bayesian" precision with mu unchanged.

    In spherical LO-FI ups = eta0 and these reduce to eqs 122-130. Returns a DLR
    of the same type; mode None or alpha = 0 returns ``bel``.
    """
    bel = _check_dlr(bel)
    if mode not in INFLATION_MODES:
        raise ValueError(f"mode must be one of {INFLATION_MODES}; got {mode!r}")
    alpha = nonnegative_scalar(alpha, "alpha")
    if mode is None or alpha == 0.0:
        return bel
    W = bel.W / np.sqrt(1.0 + alpha)
    if mode == "simple":
        return bel.replace(ups=bel.ups / (1.0 + alpha), W=W)
    P = bel.n_params
    if prior_prec is None:
        raise ValueError(f"prior_prec is needed for {mode!r} inflation")
    a = alpha / (1.0 + alpha)
    eta0 = positive_or_vector(prior_prec, "prior_prec", P)
    ups = bel.ups / (1.0 + alpha) + a * eta0
    if mode == "hybrid":
        return bel.replace(ups=ups, W=W)
    if prior_mean is None:
        raise ValueError("prior_mean is needed for 'bayesian' inflation")
    m0 = as_float_array(prior_mean, "prior_mean", shape=(P,))
    mean = bel.mean + linalg.dlr_solve(ups, W, a * eta0 * (m0 - bel.mean))
    return bel.replace(mean=mean, ups=ups, W=W)


def estimate_obs_var(obs_var, n_obs, residual):
    """Running-average observation variance (Chang et al. 2023, App. C.2, eqs 67-68).

    r_t = max(1e-6, r_{t-1} + (||residual||^2 / C - r_{t-1}) / t) with t = n_obs + 1.
    residual: (C,) the error y_t - h(x_t, mu_t). Returns (r_t, t).
    """
    residual = as_float_array(residual, "residual", ndim=1)
    t = int(n_obs) + 1
    r = obs_var + (float(residual @ residual) / residual.shape[0] - obs_var) / t
    return max(MIN_OBS_VAR, r), t


# ---------------------------------------------------------------------------------------------
# belief with LO-FI's extra state and the filter class


@dataclass(frozen=True, eq=False)
class LoFiBelief(DLR):
    """A DLR belief plus the state that LO-FI's options carry along.

    obs_var: float or None, the adaptive observation variance r_t (App. C.2);
    n_obs: int, observations averaged into obs_var;
    prior_mean (P,) / prior_prec (P,) or None: the latent prior-predictive mean and
    precision m0_t = gamma^t mu_0, eta0_t = eta0_{t-1} / (gamma^2 + q eta0_{t-1})
    used by Bayesian and hybrid inflation (App. E, eqs 77-79).
    """

    obs_var: float = None
    n_obs: int = 0
    prior_mean: np.ndarray = None
    prior_prec: np.ndarray = None

    def __post_init__(self):
        super().__post_init__()
        P = self.n_params
        if self.obs_var is not None:
            object.__setattr__(self, "obs_var", positive_scalar(self.obs_var, "LoFiBelief.obs_var"))
        if isinstance(self.n_obs, (bool, np.bool_)) or not isinstance(self.n_obs, (numbers.Integral, np.integer)) or self.n_obs < 0:
            raise ValueError(f"LoFiBelief.n_obs must be an integer >= 0; got {self.n_obs!r}")
        object.__setattr__(self, "n_obs", int(self.n_obs))
        if self.prior_mean is not None:
            self._freeze("prior_mean", self.prior_mean, (P,))
        if self.prior_prec is not None:
            self._freeze("prior_prec", self.prior_prec, (P,))
            if np.any(self.prior_prec <= 0):
                raise ValueError("LoFiBelief.prior_prec must be > 0")


class LoFi(Filter):
    """Low-rank filter LO-FI (Chang et al. 2023, Algorithms 1-3) with a DLR belief of rank ``rank``.

    Belief: N(mu, Sigma) with precision Sigma^{-1} = diag(ups) + W W^T, mean mu (P,),
    ups (P,) > 0 and W (P, rank) (a :class:`refbayes.DLR`; a :class:`LoFiBelief` when an
    option below needs extra state). Memory O(P rank); no P x P matrix is formed.

    Call ``LoFi(model, likelihood, *, rank=10, ...)``: every hyper-parameter is keyword-only
    (docs/conventions.md); positional ``rank`` and ``variant`` still work in this release
    with a DeprecationWarning.

    model, likelihood: a refbayes model with P parameters and a likelihood for its C outputs.
    rank: int >= 0, the number of columns of W (L in the paper); rank=0 is a diagonal
        (FD-EKF-like) belief. The update keeps the top ``rank`` directions of the
        posterior precision (eqs 22-25, truncated SVD of [W, H^T A^T]).
    gamma: in (0, 1], dynamics theta_t = gamma theta_{t-1} + N(0, q I) (eq. 2);
        the predict step is eqs 17-21 (exact on ups, Woodbury-corrected W).
    q: >= 0, scalar or (P,) process-noise variance of the same dynamics.
    variant: "diagonal" (ups per parameter, eqs 15-43) or "spherical" (ups = eta * 1,
        App. F; needs a scalar q and prior_var).
    svd: "svd" | "qr" | "gram" (how the thin SVD of W~ is computed), or "orth"
        (spherical only: orthogonal-projection update, App. F.5.2; pass ``rng=`` to
        ``update``/``predict_update``/``scan`` for a random column order, natural order
        without one).
    steady_state: spherical only; q = (1 - gamma^2) / eta (eq. 97) keeps eta fixed.
    inflation: None | "bayesian" | "simple" | "hybrid" with factor alpha >= 0 (App. E),
        applied to the posterior before each predict.
    adaptive_obs_noise: Gaussian likelihood with scalar obs_var only; R_t = r_t I with
        r_t the running average of eqs 67-68 (residual at the posterior mean), starting
        from the likelihood's obs_var.
    rng: deprecated (DeprecationWarning): a Generator kept on the filter and advanced by
        every "orth" update; pass ``rng=`` per call instead. A per-call rng wins.
    backend: "numpy" (reference), "numba" or "cuda": compiled DLR predict and (diagonal variant)
        update (``svd`` is then not used: the kernel picks its own accurate factorisation). With
        "numba", for an MLP with a Gaussian or categorical likelihood (no adaptive noise) ``update``
        runs forward pass, Jacobian structure and update in compiled code without forming H
        (``kernels.cpu.step.lofi_mlp_step``), and ``predict_update`` and ``scan`` (without a callback)
        fuse the predict step into it too. The spherical variant takes the same compiled step (with
        ``svd`` "svd", "qr" or "gram", which there give the same belief; "orth" runs the reference),
        with the discarded directions dropped (``update`` alone too); its ``predict`` alone runs the
        reference.
        With "cuda" the spherical variant runs on the GPU too, except with steady_state.

    dtype: np.float64 (default) or np.float32 (backend "numba" or "cuda"): the dtype of the beliefs'
        arrays. A float32 belief takes half the memory; the one-call MLP steps (CPU and GPU) read and
        write it in float32 and compute in float64 (docs/float32.md); every other route computes in
        float64 and rounds the new belief to float32. With "cuda" the belief is a float32 DeviceDLR.

    ``init(mean, prior_var=1.0)`` gives ups = 1 / prior_var and W = 0.
    """

    belief_type = DLR
    backends = ("numpy", "numba", "cuda")
    float32_backends = ("numba", "cuda")

    #: NaN components of y are not observed (with adaptive observation noise, the running
    #: estimate averages the observed residuals only)
    handles_missing = True

    @positional_deprecated("rank", "variant")
    def __init__(self, model: Model, likelihood: Likelihood, *, rank: int = 10, variant: str = "diagonal",
                 gamma: float = 1.0, q: ArrayLike = 0.0, svd: str = "svd", steady_state: bool = False,
                 inflation: str | None = None, alpha: float = 0.0, adaptive_obs_noise: bool = False,
                 rng: np.random.Generator | None = None, backend: str = "numpy", dtype: Any = np.float64) -> None:
        super().__init__(model, likelihood, gamma=gamma, q=q, backend=backend, dtype=dtype)
        if rank is None:
            raise TypeError("rank must be a non-negative integer; got None")
        self.rank = _rank_within(_rank(rank, None), self.n_params, "LoFi")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}; got {variant!r}")
        self.variant = variant
        if svd not in SVD_METHODS + ("orth",):
            raise ValueError(f"svd must be one of {SVD_METHODS + ('orth',)}; got {svd!r}")
        if svd == "orth" and variant != "spherical":
            raise ValueError("svd='orth' (orthogonal projection) needs variant='spherical'")
        self.svd = svd
        self.rng = deprecated_stored_rng(rng, "LoFi")
        if variant == "spherical" and np.ndim(self.q) != 0:
            raise ValueError(f"q must be a scalar for variant='spherical'; got shape {np.shape(self.q)}")
        if not isinstance(steady_state, (bool, np.bool_)):
            raise TypeError(f"steady_state must be a bool; got {steady_state!r}")
        if steady_state:
            if variant != "spherical":
                raise ValueError("steady_state=True needs variant='spherical' (eq. 97)")
            if self.gamma > 1.0:
                raise ValueError(f"gamma must be <= 1 with steady_state=True; got {self.gamma}")
            if self.q != 0.0:
                raise ValueError(f"q must be 0 with steady_state=True (eq. 97 sets it); got {self.q}")
        self.steady_state = bool(steady_state)
        if inflation not in INFLATION_MODES:
            raise ValueError(f"inflation must be one of {INFLATION_MODES}; got {inflation!r}")
        self.alpha = nonnegative_scalar(alpha, "alpha")
        if inflation is None and self.alpha > 0:
            raise ValueError(f"alpha = {self.alpha} needs inflation in {INFLATION_MODES[1:]}")
        self.inflation = inflation
        if not isinstance(adaptive_obs_noise, (bool, np.bool_)):
            raise TypeError(f"adaptive_obs_noise must be a bool; got {adaptive_obs_noise!r}")
        if adaptive_obs_noise and not (isinstance(likelihood, Gaussian) and np.ndim(likelihood.obs_var) == 0):
            raise ValueError("adaptive_obs_noise=True needs a Gaussian likelihood with a scalar obs_var")
        self.adaptive_obs_noise = bool(adaptive_obs_noise)

    # -- state ---------------------------------------------------------------------------------
    @property
    def _tracks_prior(self):
        return self.inflation in ("bayesian", "hybrid") and self.alpha > 0

    @property
    def _stateful(self):
        return self._tracks_prior or self.adaptive_obs_noise

    def init(self, mean: ArrayLike, prior_var: ArrayLike = 1.0) -> DLR:
        """Prior N(mean, prior_var I) as a DLR with ups = 1 / prior_var and W = 0 (P, rank)."""
        mean, var = self._init_mean_var(mean, prior_var)
        if self.variant == "spherical" and np.any(var != var[0]):
            raise ValueError("prior_var must be a scalar for variant='spherical'")
        ups, W = 1.0 / var, np.zeros((self.n_params, self.rank))
        if not self._stateful:
            bel = DLR(mean, ups, W, dtype=self.dtype)
            return self._on_device(bel) if self._device_spec() is not None else bel
        return LoFiBelief(
            mean, ups, W, dtype=self.dtype,
            obs_var=float(self.likelihood.obs_var) if self.adaptive_obs_noise else None,
            prior_mean=mean if self._tracks_prior else None,
            prior_prec=ups if self._tracks_prior else None,
        )

    def _check_belief(self, bel):
        super()._check_belief(bel)
        if self._stateful and not isinstance(bel, LoFiBelief):
            raise TypeError("bel must be a LoFiBelief (from LoFi.init) when inflation or adaptive_obs_noise is on; "
                            f"got {type(bel).__name__}")
        if self._tracks_prior and (bel.prior_mean is None or bel.prior_prec is None):
            raise ValueError("bel.prior_mean and bel.prior_prec are needed for this inflation mode")
        if self.adaptive_obs_noise and bel.obs_var is None:
            raise ValueError("bel.obs_var is needed with adaptive_obs_noise=True")

    # -- steps ---------------------------------------------------------------------------------
    def _predict(self, bel):
        if self.inflation is not None:
            bel = inflate(bel, self.alpha, self.inflation,
                          getattr(bel, "prior_mean", None), getattr(bel, "prior_prec", None))
        on_device = getattr(bel, "device_mean", None) is not None and type(bel).__name__ == "DeviceDLR"
        if on_device and not (self.variant == "spherical" and self.steady_state):
            from ..device import predict_on_device

            out = predict_on_device(self, bel)  # the exact DLR predict; for the spherical variant eqs 110-111
        elif self.variant == "spherical":  # (steady_state on the GPU: q = (1 - gamma^2) / eta needs eta on the host)
            out = spherical_predict(bel.to_host() if on_device else bel, self.gamma, self.q,
                                    steady_state=self.steady_state)
            if on_device:
                from ..device import to_device

                out = to_device(out)
        elif self.kernels is not None:
            mean, ups, W = self.kernels.dlr_predict(bel.mean, bel.ups, bel.W, self.gamma, self.q)
            out = self._kernel_belief(bel, mean, ups, W)
        else:
            out = predict(bel, self.gamma, self.q)
        if self._tracks_prior:
            q = steady_state_q(self.gamma, bel.ups[0]) if self.steady_state else self.q
            out = out.replace(prior_mean=self.gamma * bel.prior_mean,
                              prior_prec=bel.prior_prec / (self.gamma**2 + q * bel.prior_prec))
        return out

    def _update(self, bel, lin):
        R, singular = lin.R, lin.singular
        if self.adaptive_obs_noise:
            R, singular = bel.obs_var * np.eye(R.shape[0]), False
        if self.variant == "diagonal" and self.kernels is not None:
            mean, ups, W = self.kernels.lofi_update(bel.mean, bel.ups, bel.W, lin.H, R, lin.e, self.rank, singular)
            out = self._kernel_belief(bel, mean, ups, W)
        elif self.variant == "diagonal":
            out = update(bel, lin.H, R, lin.e, rank=self.rank, svd=self.svd, singular=singular)
        elif self.svd == "orth":
            rng = self.__dict__.get("_call_rng")
            rng = self.rng if rng is None else rng
            out = orth_update(bel, lin.H, R, lin.e, singular=singular, rng=rng)
        else:
            out = spherical_update(bel, lin.H, R, lin.e, rank=self.rank, svd=self.svd, singular=singular)
        if self.adaptive_obs_noise:
            r, n = out.obs_var, out.n_obs
            # with missing components, each observation's residual is over its observed outputs only
            masks = ([None] * len(lin.inputs) if lin.observed is None
                     else np.split(np.asarray(lin.observed), len(lin.inputs)))
            for x, target, seen in zip(lin.inputs, lin.targets, masks):
                resid = target - self.likelihood.mean(self.model.apply(out.mean, x))
                if seen is not None:
                    if not seen.any():
                        continue
                    resid = resid[seen]
                r, n = estimate_obs_var(r, n, resid)
            out = out.replace(obs_var=r, n_obs=n)
        return out

    # -- randomness per call (the "orth" update's column order) -------------------------------
    @property
    def needs_rng(self) -> bool:
        """True when updates use random numbers (svd="orth": a random column order per update)."""
        return self.svd == "orth"

    def _with_rng(self, rng):
        """This filter for one call with the generator ``rng`` (a copy; None: this filter)."""
        if check_call_rng(rng) is None:
            return self
        new = copy.copy(self)
        new.__dict__["_call_rng"] = rng
        return new

    def update(self, bel: DLR, x: ArrayLike, y: ArrayLike, *, obs_var: ArrayLike | None = None,
               rng: np.random.Generator | None = None) -> DLR:
        """Condition on one observation (x, y): LO-FI update (eqs 22-43). Returns a new belief.

        x: (in_dim,); y as the likelihood takes it. obs_var as in ``Filter.update``.
        rng: numpy.random.Generator for svd="orth" (random column order); None: natural order.
        """
        return Filter.update(self._with_rng(rng), bel, x, y, obs_var=obs_var)

    def update_batch(self, bel: DLR, X: ArrayLike, Y: ArrayLike, *, rng: np.random.Generator | None = None) -> DLR:
        """Condition on N observations at once, one LO-FI update with the stacked H (NC, P)
        (a minibatch step). rng as for ``update``."""
        return Filter.update_batch(self._with_rng(rng), bel, X, Y)

    def _step(self, bel, x, y, rng=None, **options):
        return Filter._step(self._with_rng(rng), bel, x, y, **options)

    def _predict_step(self, bel, x, y, rng=None, **options):
        return Filter._predict_step(self._with_rng(rng), bel, x, y, **options)

    # -- compiled paths (backend "numba" or "cuda"; the one-call MLP step is numba-only) -----
    @staticmethod
    def _kernel_belief(bel, mean, ups, W):
        """bel.replace(mean=, ups=, W=) for new arrays from a kernel, which has checked them (finite,
        ups > 0): a plain DLR takes them as they are (made read-only), without a second check and copy;
        a belief on the GPU (from a step that had to take the host route) goes back to the GPU."""
        if bel.dtype != mean.dtype:  # a float32 belief through a float64 kernel: rounded on the way out
            mean, ups, W = (a.astype(bel.dtype) for a in (mean, ups, W))
        if type(bel) is DLR:
            return DLR._trusted(mean=mean, ups=ups, W=W)
        if getattr(bel, "device_mean", None) is not None:
            from ..device import to_device

            return to_device(DLR._trusted(mean=mean, ups=ups, W=W))
        return bel.replace(mean=mean, ups=ups, W=W)

    def _mlp_kernel_spec(self):
        """Arguments of the compiled MLP step (base.mlp_kernel_spec), or None where it does not apply:
        backend "numba", the diagonal variant or the spherical one with an SVD (not svd="orth"), an MLP,
        a Gaussian or categorical likelihood, no adaptive observation noise."""
        if "_mlp_spec" not in self.__dict__:
            spec = None
            if self.backend == "numba" and self.svd != "orth" and not self.adaptive_obs_noise:
                spec = mlp_kernel_spec(self.model, self.likelihood)
            self.__dict__["_mlp_spec"] = spec
        return self.__dict__["_mlp_spec"]

    def _device_spec(self):
        """Arguments of the GPU step (kernels.cuda.step), or None where it does not apply: backend
        "cuda", the diagonal variant or the spherical one with an SVD and without steady_state (whose q
        depends on eta, which lives on the GPU), an MLP or Linear model, a Gaussian or categorical
        likelihood, no adaptive observation noise, no inflation."""
        if "_dspec" not in self.__dict__:
            spec = None
            if (self.backend == "cuda" and self.svd != "orth" and not self.steady_state and not self.adaptive_obs_noise
                    and self.inflation is None):
                spec = mlp_kernel_spec(self.model, self.likelihood)
            self.__dict__["_dspec"] = spec
        return self.__dict__["_dspec"]

    def _device_step(self, bel, x, y, predict):
        """The GPU step (refbayes.device.step_on_device: kernels.cuda.step.lofi_mlp_step) on a belief moved
        to the GPU if it is not there yet, or None to take the general route."""
        from ..device import DeviceDLR, step_on_device

        spec = self._device_spec()
        if spec is None or not (type(bel) is DLR or isinstance(bel, DeviceDLR)):
            return None
        spherical = self.variant == "spherical"
        if spherical and type(bel) is DLR:
            _spherical_eta(bel)  # ups must be eta * 1 (raises otherwise); a DeviceDLR is not read back to check
        return step_on_device(self, spec, bel, x, y, predict, rank=self.rank, spherical=spherical)

    def _fused_step(self, bel, x, y, predict=False):
        """The compiled MLP step (kernels.cpu.step.lofi_mlp_step, or kernels.cuda.step on the GPU), or
        None to take the general route."""
        if self.backend == "cuda":
            return self._device_step(bel, x, y, predict)
        spec = self._mlp_kernel_spec()
        if spec is None or type(bel) is not DLR or (predict and self.inflation is not None):
            return None
        from ..kernels.cpu.step import lofi_mlp_step

        x = self.model.validate_x(x)
        target = self.likelihood.encode(y, self.model.out_dim)
        gamma, q = (self.gamma, self.q) if predict else (1.0, 0.0)
        spherical = self.variant == "spherical"
        if spherical:
            eta = _spherical_eta(bel)  # ups must be eta * 1 (raises otherwise)
            if predict and self.steady_state:
                q = steady_state_q(gamma, eta)  # eq. 97: eta' = eta
        res = lofi_mlp_step(*spec, bel.mean, bel.ups, bel.W, x, target, self.rank, gamma=gamma, q=q,
                            spherical=spherical)
        if res is None:  # one Gram matrix would not be accurate enough
            return None
        mean, ups, W, yhat = res
        return DLR._trusted(mean=mean, ups=ups, W=W), yhat

    def predict_obs(self, bel: DLR, x: ArrayLike, method: str = "linearized", rng: np.random.Generator | None = None,
                    n_samples: int = 100) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """As Filter.predict_obs; with adaptive_obs_noise the noise is the belief's r_t."""
        self._check_belief(bel)
        lik = Gaussian(bel.obs_var) if self.adaptive_obs_noise else self.likelihood
        return predictive.predict_obs(self.model, lik, bel, x, method, rng=rng, n_samples=n_samples)

    def __repr__(self):
        return (f"LoFi(model={self.model!r}, likelihood={self.likelihood!r}, rank={self.rank}, "
                f"variant={self.variant!r}, gamma={self.gamma}, q={self.q}, svd={self.svd!r}{self._repr_tail()})")
