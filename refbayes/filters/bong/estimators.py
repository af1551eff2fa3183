"""Estimators of the expected gradient and Hessian of the log-likelihood.

Jones, Chang & Murphy (2024), "Bayesian online natural gradient (BONG)",
Table 1 and Algorithms 4-7. For the current belief q = N(m, Sigma) and the
log-likelihood l(theta) = log p(y | f(x, theta)) each estimator returns

    g ~ E_q[grad l(theta)]          (P,)
    G ~ E_q[hess l(theta)]          (P, P), held as a :class:`Curvature`

- "mc-hess" (Alg. 4): M draws theta_j ~ q; g = mean grad l(theta_j),
  G = mean hess l(theta_j) (dense), or for diagonal families only its
  diagonal, by Hutchinson probes (Sec. E.3) or exactly.
- "mc-ef" (Alg. 5): the same draws; G = -(1/M) sum_j g_j g_j^T, kept as the
  factor U = [g_1, ..., g_M] / sqrt(M) with G = -U U^T.
- "lin-hess" (Alg. 6): the model linearised at m (eqs 91-92):
  g = H^T R^{-1} (y - yhat), G = -H^T R^{-1} H, factor U = H^T A with
  A A^T = R^{-1} (or the pseudo-inverse for a singular R).
- "lin-ef" (Alg. 7): g as in "lin-hess"; G = -g g^T, U = g.

A batch of observations is one observation with the summed log-likelihood. NaN components
of y are missing (docs/streams.md §3): the LIN estimators drop their rows from the
linearisation, and the MC estimators use the log-likelihood of the observed outputs,
log p(y_o | f(x, theta)) (Gaussian: the marginal with the observed block of R).
Factor estimates also carry ``coef`` (K,) with g = U coef (LIN-HESS: A e; LIN-EF: 1;
MC-EF: 1 / sqrt(M)), which lets a DLR step run as one LO-FI update. The optional
``value_and_jacobian`` (a compiled MLP Jacobian) and ``sampler`` (a compiled DLR sampler)
arguments replace the model's and the belief's own, with the same numbers.
"""

import warnings
from dataclasses import dataclass

import autograd
import autograd.numpy as anp
import numpy as np
import scipy.linalg as sla

from ...errors import DivergenceError, NotPositiveDefiniteError, r_not_positive_definite
from ...likelihoods import whiten
from ...models import Linear
from .._observed import observed_terms
from ..base import Linearization, has_missing, linearize, linearize_batch

__all__ = [
    "ESTIMATORS",
    "CURVATURE_KINDS",
    "Curvature",
    "Estimate",
    "draw_params",
    "loglik_grad",
    "loglik_hessian",
    "loglik_hvp",
    "hutchinson_diagonal",
    "rademacher_bits",
    "rademacher_probes",
    "lin_hess",
    "lin_ef",
    "lin_from_linearization",
    "mc_ef",
    "mc_hess",
    "estimate",
]

ESTIMATORS = ("mc-hess", "mc-ef", "lin-hess", "lin-ef")
CURVATURE_KINDS = ("factor", "dense", "diag")


@dataclass(frozen=True, eq=False)
class Curvature:
    """An estimate of the expected Hessian G (P, P) in one of three forms.

    kind "factor": ``data`` is U (P, K) and G = -U U^T (negative semi-definite).
    kind "dense": ``data`` is G (P, P) itself.
    kind "diag": ``data`` is d (P,), standing for diag(G) only.
    """

    kind: str
    data: np.ndarray

    def __post_init__(self):
        if self.kind not in CURVATURE_KINDS:
            raise ValueError(f"kind must be one of {CURVATURE_KINDS}; got {self.kind!r}")
        ndim = {"factor": 2, "dense": 2, "diag": 1}[self.kind]
        arr = np.array(self.data, dtype=np.float64, copy=True)
        if arr.ndim != ndim or (self.kind == "dense" and arr.shape[0] != arr.shape[1]):
            raise ValueError(f"Curvature data of kind {self.kind!r} has the wrong shape {arr.shape}")
        arr.setflags(write=False)
        object.__setattr__(self, "data", arr)

    @classmethod
    def from_factor(cls, U):
        """G = -U U^T from U (P, K)."""
        return cls("factor", U)

    @classmethod
    def from_dense(cls, G):
        """A dense G (P, P), symmetrised."""
        return cls("dense", 0.5 * (np.asarray(G) + np.asarray(G).T))

    @classmethod
    def from_diag(cls, d):
        """G = diag(d) from d (P,)."""
        return cls("diag", d)

    @property
    def n_params(self):
        """P."""
        return self.data.shape[0]

    @property
    def is_factor(self):
        """Whether G is held as a factor U (G = -U U^T)."""
        return self.kind == "factor"

    def diag(self):
        """diag(G): (P,). For a factor, -rowsum(U * U)."""
        if self.kind == "factor":
            return -np.einsum("ij,ij->i", self.data, self.data)
        if self.kind == "dense":
            return np.diag(self.data).copy()
        return self.data.copy()

    def factor(self):
        """U (P, K) with G = -U U^T; only for kind "factor"."""
        if self.kind != "factor":
            raise ValueError(f"this update needs a low-rank curvature factor; got curvature of kind {self.kind!r}")
        return self.data

    def dense(self):
        """G as a dense (P, P) matrix; not available for kind "diag"."""
        if self.kind == "factor":
            return -(self.data @ self.data.T)
        if self.kind == "dense":
            return self.data.copy()
        raise ValueError("this update needs the full curvature matrix; got only its diagonal (kind 'diag')")

    def sandwich(self, S):
        """S G S for a symmetric (P, P) matrix S, without forming G for a factor."""
        if self.kind == "factor":
            SU = S @ self.data
            return -(SU @ SU.T)
        return S @ self.dense() @ S


@dataclass(frozen=True, eq=False)
class Estimate:
    """Output of an estimator: g (P,), the curvature, the parameter draws used (M, P) or None,
    for a factor curvature U (P, K) the coefficients coef (K,) with g = U coef (or None), and for a
    LIN estimator the predicted mean of T(y) at the linearisation point, yhat (the rows of all
    observations, (N C,)), or None."""

    g: np.ndarray
    curvature: Curvature
    samples: np.ndarray = None
    coef: np.ndarray = None
    yhat: np.ndarray = None


# --------------------------------------------------------------------------------------------
# exact derivatives of the log-likelihood at one parameter vector


def _pairs(xs, ys):
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys must have the same length; got {len(xs)} and {len(ys)}")
    return list(zip(xs, ys))


def _terms(model, likelihood, xs, ys):
    """(x, likelihood, y) per observation; NaN components of y are missing: the likelihood is then
    that of the observed outputs (``filters._observed``), and an observation with nothing observed
    adds nothing."""
    return observed_terms(likelihood, xs, ys, model.out_dim)


def loglik_grad(model, likelihood, theta, xs, ys, value_and_jacobian=None):
    """grad_theta sum_n log p(y_n | f(x_n, theta)) = sum_n J_n^T dlogp/deta: (P,).

    NaN components of y_n are missing: log p is then that of the observed outputs only."""
    vj = value_and_jacobian or model.value_and_jacobian
    out = np.zeros(model.n_params)
    for x, likelihood, y in _terms(model, likelihood, xs, ys):
        eta, J = vj(theta, x)
        if not (np.all(np.isfinite(eta)) and np.all(np.isfinite(J))):
            raise DivergenceError("the model output or its Jacobian at a parameter draw is not finite: "
                                  f"the belief has diverged (max |theta| = {np.abs(theta).max():.3g})")
        out += J.T @ likelihood.grad(y, eta)
    return out


def _has_curved_output(model):
    return not isinstance(model, Linear)


def _output_term_hessian(model, theta, x, r):
    """Hessian of theta -> r^T f(x, theta) (P, P): the second-order model term."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        H = autograd.hessian(lambda th: anp.dot(r, model.apply(th, x)))(theta)
    return np.asarray(H, dtype=np.float64)


def _output_term_hvp(model, theta, x, r, z):
    """(Hessian of theta -> r^T f(x, theta)) z: (P,), by reverse-over-reverse autograd."""
    inner = autograd.grad(lambda th: anp.dot(r, model.apply(th, x)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = autograd.grad(lambda th: anp.dot(inner(th), z))(theta)
    return np.asarray(out, dtype=np.float64)


def loglik_hessian(model, likelihood, theta, xs, ys, value_and_jacobian=None):
    """Dense Hessian of sum_n log p(y_n | f(x_n, theta)) in theta: (P, P).

    J^T (d2 logp / deta2) J + sum_c (dlogp/deta_c) hess f_c; the second term is
    zero for a Linear model and is found with autograd otherwise. NaN components of y_n are
    missing (the observed outputs' log-likelihood, as in :func:`loglik_grad`).
    """
    vj = value_and_jacobian or model.value_and_jacobian
    out = np.zeros((model.n_params, model.n_params))
    for x, likelihood, y in _terms(model, likelihood, xs, ys):
        eta, J = vj(theta, x)
        out += J.T @ likelihood.hessian(y, eta) @ J
        if _has_curved_output(model):
            out += _output_term_hessian(model, theta, model.validate_x(x), likelihood.grad(y, eta))
    return 0.5 * (out + out.T)


def loglik_hvp(model, likelihood, theta, xs, ys, Z, value_and_jacobian=None):
    """Hessian-vector products (hess l(theta)) Z for Z (P, N): (P, N); never forms the Hessian.
    NaN components of y_n are missing, as in :func:`loglik_grad`."""
    vj = value_and_jacobian or model.value_and_jacobian
    Z = np.asarray(Z, dtype=np.float64)
    out = np.zeros_like(Z)
    for x, likelihood, y in _terms(model, likelihood, xs, ys):
        eta, J = vj(theta, x)
        out += J.T @ (likelihood.hessian(y, eta) @ (J @ Z))
        if _has_curved_output(model):
            r = likelihood.grad(y, eta)
            xv = model.validate_x(x)
            for n in range(Z.shape[1]):
                out[:, n] += _output_term_hvp(model, theta, xv, r, Z[:, n])
    return out


def hutchinson_diagonal(model, likelihood, theta, xs, ys, rng, n_probes, value_and_jacobian=None):
    """Hutchinson estimate of diag(hess l(theta)) (Jones et al. 2024, Sec. E.3).

    mean_n z_n * (hess l(theta) z_n) with Rademacher probes z_n (P,): unbiased,
    with per-entry variance sum_{j != i} H_ij^2 / n_probes. Returns (P,).
    """
    Z = rademacher_probes(rng, model.n_params, n_probes)
    HZ = loglik_hvp(model, likelihood, theta, xs, ys, Z, value_and_jacobian)
    return np.mean(Z * HZ, axis=1)


def rademacher_bits(rng, P, n_probes):
    """(P, n_probes) int64 zeros and ones from one ``rng.integers`` call: the probes of
    :func:`hutchinson_diagonal` are 2 B - 1 (:func:`rademacher_probes`); the compiled MC-HESS step
    takes B itself, so that both consume ``rng`` alike."""
    return rng.integers(0, 2, size=(P, n_probes))


def rademacher_probes(rng, P, n_probes):
    """(P, n_probes) Rademacher probes (+-1): 2 B - 1 for B = :func:`rademacher_bits`."""
    return rademacher_bits(rng, P, n_probes).astype(np.float64) * 2.0 - 1.0


# --------------------------------------------------------------------------------------------
# estimators


def draw_params(bel, rng, n, antithetic=False, sampler=None):
    """n draws theta_j ~ bel (n, P) via ``bel.sample(rng, n)`` (or ``sampler(bel, rng, n)``).

    antithetic=True draws n/2 and appends their mirror images 2 mean - theta_j
    (n must be even), which makes the sample mean equal the belief mean.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator for Monte Carlo estimators; got {type(rng).__name__}")
    sample = bel.sample if sampler is None else (lambda r, m: sampler(bel, r, m))
    if antithetic:
        half = sample(rng, n // 2)
        return np.concatenate([half, 2.0 * bel.mean - half])
    return sample(rng, n)


def _whitening(R, singular):
    """The whitening of likelihoods.whiten: ("chol", L) with R = L L^T, or ("eig", V_k, s) with
    R^+ = V_k diag(s)^2 V_k^T over the eigenvalues above 10 C eps max (None: R = 0).
    Raises NotPositiveDefiniteError when R is not positive (semi-)definite."""
    R = 0.5 * (R + R.T)
    C = R.shape[0]
    if C == 0:
        return None
    if not singular:
        try:
            return "chol", sla.cholesky(R, lower=True)
        except np.linalg.LinAlgError as exc:
            raise r_not_positive_definite(R) from exc
    w, V = np.linalg.eigh(R)
    if w[-1] <= 0.0:
        return None
    if w[0] < -1e-8 * w[-1]:
        raise NotPositiveDefiniteError(f"R is not positive semi-definite; smallest eigenvalue {w[0]:.3e}")
    keep = w > 10.0 * C * np.finfo(np.float64).eps * w[-1]
    return "eig", V[:, keep], 1.0 / np.sqrt(w[keep])


def _whitened_coef(wh, e):
    """c = A e (k,) for the whitener A (A^T A = R^{-1} or R^+) of ``wh``: g = G c for (G, g) = whiten(H, R, e)."""
    if wh is None:
        return np.zeros(0)
    if wh[0] == "chol":
        return sla.solve_triangular(wh[1], e, lower=True)
    return wh[2] * (wh[1].T @ e)


def _whitened_factor(wh, H):
    """G = H^T A^T (P, k) as likelihoods.whiten computes it; the triangular solve runs as one BLAS
    call on H^T (no transposed copy of H)."""
    if wh is None:
        return np.zeros((H.shape[1], 0))
    if wh[0] == "chol":
        return sla.blas.dtrsm(1.0, wh[1], np.asarray(H, dtype=np.float64).T, side=1, lower=1, trans_a=1)
    return (H.T @ wh[1]) * wh[2]


def lin_from_linearization(lin, ef=False, fast=False):
    """LIN-HESS (eqs 91-92) or LIN-EF estimate from a refbayes Linearization.

    g = H^T R^{-1} e; U = H^T A^T (whitened Jacobian, A^T A = R^{-1}) or U = g (ef=True);
    coef = A e or [1], so that g = U coef. fast=False: U and g from likelihoods.whiten (the
    reference). fast=True: the same arithmetic with the triangular solve as one BLAS call
    on H^T instead of a solve on a transposed copy (the same numbers to round-off).
    """
    wh = _whitening(lin.R, lin.singular)
    c = _whitened_coef(wh, lin.e)
    if fast:
        U = _whitened_factor(wh, lin.H)
        g = U @ c
    else:
        U, g = whiten(lin.H, lin.R, lin.e, singular=lin.singular)
    if ef:
        return Estimate(g, Curvature.from_factor(g[:, None]), coef=np.ones(1), yhat=lin.yhat)
    return Estimate(g, Curvature.from_factor(U), coef=c, yhat=lin.yhat)


def _linearize(model, likelihood, mean, xs, ys, value_and_jacobian=None):
    """The (stacked) linearisation; rows of missing components are dropped (``base.linearize``)."""
    pairs = _pairs(xs, ys)
    if len(pairs) == 1:
        return linearize(model, likelihood, mean, pairs[0][0], pairs[0][1], value_and_jacobian)
    if not any(has_missing(y) for _, y in pairs):
        return linearize_batch(model, likelihood, mean, xs, ys, value_and_jacobian)
    # observations with missing components have fewer rows: stack H, e and a block-diagonal R
    lins = [linearize(model, likelihood, mean, x, y, value_and_jacobian) for x, y in pairs]
    return Linearization(
        np.stack([lin.eta for lin in lins]), np.stack([lin.J for lin in lins]),
        np.concatenate([lin.yhat for lin in lins]), np.concatenate([lin.H for lin in lins]),
        sla.block_diag(*[lin.R for lin in lins]), np.concatenate([lin.e for lin in lins]),
        any(lin.singular for lin in lins))


def lin_hess(model, likelihood, mean, xs, ys, value_and_jacobian=None, fast=False):
    """LIN-HESS estimator (Jones et al. 2024, Alg. 6, eqs 91-92) at the mean (P,)."""
    lin = _linearize(model, likelihood, mean, xs, ys, value_and_jacobian)
    return lin_from_linearization(lin, ef=False, fast=fast)


def lin_ef(model, likelihood, mean, xs, ys, value_and_jacobian=None, fast=False):
    """LIN-EF estimator (Jones et al. 2024, Alg. 7): g as LIN-HESS, G = -g g^T."""
    lin = _linearize(model, likelihood, mean, xs, ys, value_and_jacobian)
    return lin_from_linearization(lin, ef=True, fast=fast)


def mc_ef(model, likelihood, thetas, xs, ys, value_and_jacobian=None):
    """MC-EF estimator (Jones et al. 2024, Alg. 5) from given draws thetas (M, P).

    g = mean_j g_j, U = [g_1 .. g_M] / sqrt(M), G = -U U^T (uncentred, real y); coef = 1 / sqrt(M).
    """
    thetas = np.atleast_2d(thetas)
    grads = np.stack([loglik_grad(model, likelihood, th, xs, ys, value_and_jacobian) for th in thetas], axis=1)
    M = grads.shape[1]
    return Estimate(grads.mean(axis=1), Curvature.from_factor(grads / np.sqrt(M)), thetas,
                    coef=np.full(M, 1.0 / np.sqrt(M)))


def mc_hess(model, likelihood, thetas, xs, ys, curvature="dense", rng=None, n_probes=100, value_and_jacobian=None):
    """MC-HESS estimator (Jones et al. 2024, Alg. 4) from given draws thetas (M, P).

    curvature="dense": G = mean_j hess l(theta_j) (P, P).
    curvature="hutchinson": d = mean_j mean_n z_n * (hess l(theta_j) z_n)
    (Rademacher probes from ``rng``); O(n_probes M P), no P x P matrix.
    curvature="exact-diag": d = mean_j diag(hess l(theta_j)) (builds the Hessian).
    """
    vj = value_and_jacobian
    thetas = np.atleast_2d(thetas)
    g = np.mean([loglik_grad(model, likelihood, th, xs, ys, vj) for th in thetas], axis=0)
    if curvature == "dense":
        G = np.mean([loglik_hessian(model, likelihood, th, xs, ys, vj) for th in thetas], axis=0)
        return Estimate(g, Curvature.from_dense(G), thetas)
    if curvature == "exact-diag":
        d = np.mean([np.diag(loglik_hessian(model, likelihood, th, xs, ys, vj)) for th in thetas], axis=0)
        return Estimate(g, Curvature.from_diag(d), thetas)
    if curvature == "hutchinson":
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator for Hutchinson probes; got {type(rng).__name__}")
        d = np.mean([hutchinson_diagonal(model, likelihood, th, xs, ys, rng, n_probes, vj) for th in thetas], axis=0)
        return Estimate(g, Curvature.from_diag(d), thetas)
    raise ValueError(f"curvature must be 'dense', 'hutchinson' or 'exact-diag'; got {curvature!r}")


def estimate(name, model, likelihood, bel, xs, ys, rng=None, n_samples=10, hess_curvature="dense",
             n_probes=100, antithetic=False, value_and_jacobian=None, sampler=None, fast=False):
    """Run estimator ``name`` (one of ESTIMATORS) at belief ``bel`` for the observations (xs, ys).

    MC estimators draw ``draw_params(bel, rng, n_samples, antithetic, sampler)``;
    LIN estimators linearise at ``bel.mean`` (``fast``: see lin_from_linearization).
    ``value_and_jacobian`` replaces the model's (same arguments and outputs). Returns an Estimate.
    """
    vj = value_and_jacobian
    if name == "lin-hess":
        return lin_hess(model, likelihood, bel.mean, xs, ys, vj, fast)
    if name == "lin-ef":
        return lin_ef(model, likelihood, bel.mean, xs, ys, vj, fast)
    if name not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}; got {name!r}")
    thetas = draw_params(bel, rng, n_samples, antithetic, sampler)
    if name == "mc-ef":
        return mc_ef(model, likelihood, thetas, xs, ys, vj)
    return mc_hess(model, likelihood, thetas, xs, ys, curvature=hess_curvature, rng=rng, n_probes=n_probes,
                   value_and_jacobian=vj)
