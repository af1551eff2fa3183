"""Recursive variational Gaussian approximation (R-VGA) for any model and likelihood.

Lambert, Bonnabel & Bach (2022), "The recursive variational Gaussian approximation
(R-VGA)", Statistics and Computing. Each observation moves the belief to the Gaussian
closest, in KL(q || .), to p(y_t | theta) q_{t-1}(theta) (Algorithm 1). With the loss
l_t(theta) = -log p(y_t | f(theta, x_t)) (eq 32), the minimiser satisfies (Theorem 1,
eqs 35-36)

    mu_t     = mu_{t-1} - P_{t-1} E_{q_t}[grad l_t]
    P_t^{-1} = P_{t-1}^{-1} + E_{q_t}[hess l_t],

with expectations under the NEW belief q_t: the scheme is implicit. This module gives

- the implicit scheme, solved by a safeguarded, Anderson-accelerated natural-gradient
  fixed-point iteration with a convergence check (ConvergenceError when it stops short);
- the explicit scheme (eqs 37-38), whose expectations are under q_{t-1}; it is the first
  image of that iteration;
- the linearised scheme (Theorem 3, eqs 51-53), equal to the extended Kalman filter;
- three estimators of the two expectations (Theorem 1 "order 2", Corollary 1.1 "order 1"
  and "order 0", with the corrected left factor P_t^{-1} in eqs 17 and 19), evaluated by
  cubature, tensor Gauss-Hermite or Monte Carlo nodes theta = mu + L z, P = L L^T.

Beliefs are FullCov (P x P). The logistic-regression special case with its closed-form
two-scalar step lives in ``refbayes.filters.logistic``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import autograd
import autograd.numpy as anp
import numpy as np
from numpy.typing import ArrayLike

from .. import linalg
from .._validate import int_at_least, positive_int, positive_scalar
from ..beliefs import FullCov
from ..errors import ConvergenceError, NotPositiveDefiniteError
from ..likelihoods import whiten
from ..models import Linear
from . import ekf
from ._compat import deprecated_stored_rng, keyword_renamed
from ._observed import nothing_observed, observed_terms
from .base import Filter, split_missing

if TYPE_CHECKING:
    from ..likelihoods import Likelihood
    from ..models import Model

__all__ = [
    "SCHEMES",
    "EXPECTATIONS",
    "FORMS",
    "CURVATURES",
    "QUADRATURES",
    "cubature_rule",
    "gauss_hermite_rule",
    "monte_carlo_rule",
    "loss_derivatives",
    "expected_derivatives",
    "explicit_update",
    "implicit_residuals",
    "one_step_objective",
    "implicit_update",
    "linearized_update",
    "RVGA",
]

# the tail of __all__ and these option tuples have the shape of lofi.py's (VARIANTS, SVD_METHODS, ...):
# lists of names, nothing to share
SCHEMES = ("implicit", "explicit")
EXPECTATIONS = ("quadrature", "mc", "linearized")
FORMS = ("order2", "order1", "order0")
CURVATURES = ("hessian", "ggn")
QUADRATURES = ("cubature", "gauss-hermite")

_MAX_GH_POINTS = 200_000


# ---------------------------------------------------------------------------------------------
# integration nodes: standardised points z (S, P) and weights w (S,), theta = mu + L z


def cubature_rule(P):
    """Spherical-radial cubature: the 2P points +-sqrt(P) e_i with weights 1/(2P).

    Integrates polynomials of degree <= 3 in theta exactly under any Gaussian.
    Returns (Z (2P, P), w (2P,)).
    """
    Z = np.sqrt(P) * np.concatenate([np.eye(P), -np.eye(P)])
    return Z, np.full(2 * P, 0.5 / P)


def gauss_hermite_rule(P, n_nodes):
    """Tensor-product Gauss-Hermite rule for N(0, I_P): n_nodes**P points.

    Exact for polynomials of degree <= 2 n_nodes - 1 in each coordinate.
    Returns (Z (n_nodes**P, P), w (n_nodes**P,)).
    """
    if n_nodes ** P > _MAX_GH_POINTS:
        raise ValueError(f"n_nodes**P must be <= {_MAX_GH_POINTS} for a tensor Gauss-Hermite rule; "
                         f"got {n_nodes}**{P}; use quadrature='cubature' or expectation='mc'")
    z, w = np.polynomial.hermite_e.hermegauss(n_nodes)
    w = w / w.sum()
    grids = np.meshgrid(*([z] * P), indexing="ij")
    wgrids = np.meshgrid(*([w] * P), indexing="ij")
    Z = np.stack([g.ravel() for g in grids], axis=1)
    W = np.prod(np.stack([g.ravel() for g in wgrids], axis=1), axis=1)
    return Z, W


def monte_carlo_rule(P, n_samples, rng, antithetic=True):
    """n_samples standard normal draws with equal weights; ``antithetic`` pairs z with -z.

    With antithetic pairs the draws have mean exactly 0, so expectations of functions that are
    linear in theta are exact. Returns (Z (n_samples, P), w (n_samples,)).
    """
    if antithetic:
        half = rng.standard_normal((n_samples // 2, P))
        Z = np.concatenate([half, -half])
    else:
        Z = rng.standard_normal((n_samples, P))
    return Z, np.full(Z.shape[0], 1.0 / Z.shape[0])


# ---------------------------------------------------------------------------------------------
# the loss and its derivatives


def loss_derivatives(model, likelihood, theta, xs, ys, order=2, curvature="hessian"):
    """The loss l(theta) = -sum_i log p(y_i | f(theta, x_i)) (eq 32) and its derivatives.

    order 0: value only; 1: value and gradient (P,); 2: also the Hessian (P, P).
    With ``g = d log p / d eta`` and ``A = -d^2 log p / d eta^2`` (likelihood.grad, .hessian):

        grad l = -J^T g,    hess l = J^T A J - sum_c g_c hess f_c(theta, x),

    where the last (model-curvature) term is computed with autograd; ``curvature="ggn"`` drops
    it (Gauss-Newton), and it is zero for a Linear model. Returns (value, grad, hess); entries
    beyond ``order`` are None. NaN components of y_i are missing: the loss is then that of the
    observed outputs, -log p(y_o | f(theta, x)_o) (a Gaussian's marginal with the observed block
    of R), and an observation with nothing observed adds nothing (docs/streams.md §3).
    """
    P = theta.shape[0]
    value = 0.0
    grad = np.zeros(P) if order >= 1 else None
    hess = np.zeros((P, P)) if order >= 2 else None
    linear_model = isinstance(model, Linear)
    for x, likelihood, y in observed_terms(likelihood, xs, ys, model.out_dim):
        if order == 0:
            value -= likelihood.log_prob(y, model.apply(theta, x))
            continue
        eta, J = model.value_and_jacobian(theta, x)
        value -= likelihood.log_prob(y, eta)
        g = likelihood.grad(y, eta)
        grad -= J.T @ g
        if order >= 2:
            hess += J.T @ (-likelihood.hessian(y, eta)) @ J
            if curvature == "hessian" and not linear_model and np.any(g != 0):
                with warnings.catch_warnings():  # a model linear in theta has no curvature term
                    warnings.filterwarnings("ignore", "Output seems independent of input")
                    hess -= autograd.hessian(lambda th: anp.dot(g, model.apply(th, x)))(theta)
    if hess is not None:
        hess = linalg.symmetrize(hess)
    return value, grad, hess


def expected_derivatives(loss, mean, chol, Z, w, form="order2"):
    """Estimates of E_q[l], E_q[grad l] (P,) and E_q[hess l] (P, P) under q = N(mean, chol chol^T).

    loss(theta, order) -> (value, grad, hess), as :func:`loss_derivatives`. Nodes
    theta_s = mean + chol z_s with weights w_s. Three algebraically equal forms:

    - "order2" (Theorem 1, eqs 3-4 via eqs 12 and 15): E[grad l], E[hess l];
    - "order1" (Corollary 1.1, eqs 16-17 via eq 26): E[hess l] = P^{-1} E[(theta - mu) grad l^T]
      (symmetrised), Hessian-free;
    - "order0" (Corollary 1.1, eqs 18-19 via eqs 21 and 23): E[grad l] = P^{-1} E[(theta - mu) l],
      E[hess l] = P^{-1} E[(theta - mu)(theta - mu)^T l] P^{-1} - P^{-1} E[l], derivative-free.

    The paper prints P_{t-1}^{-1} as the left factor in eqs 17 and 19; by Stein's lemma it is
    the current P^{-1}, used here (with theta - mu = L z, P^{-1}(theta - mu) = L^{-T} z).
    """
    P = mean.shape[0]
    thetas = mean + Z @ chol.T
    order = {"order2": 2, "order1": 1, "order0": 0}[form]
    vals = np.empty(len(w))
    grads = np.empty((len(w), P)) if order >= 1 else None
    Eh = np.zeros((P, P))
    for s, th in enumerate(thetas):
        v, g, h = loss(th, order)
        vals[s] = v
        if order >= 1:
            grads[s] = g
        if order == 2:
            Eh += w[s] * h
    El = float(w @ vals)
    if order == 2:
        return El, w @ grads, linalg.symmetrize(Eh)
    if order == 1:
        B = (Z * w[:, None]).T @ grads  # E[z grad^T]
        return El, w @ grads, linalg.symmetrize(np.linalg.solve(chol.T, B))
    Ez = (w * vals) @ Z  # E[z l]
    Linv = np.linalg.inv(chol)
    C = (Z * (w * vals)[:, None]).T @ Z - (w @ vals) * np.eye(P)  # E[(z z^T - I) l]
    return El, Linv.T @ Ez, linalg.symmetrize(Linv.T @ C @ Linv)


# ---------------------------------------------------------------------------------------------
# update steps


def _posterior_cov(prior_cov, D, what):
    """(P_{t-1}^{-1} + D)^{-1} = (I + P_{t-1} D)^{-1} P_{t-1}, without inverting P_{t-1}.

    Returns (cov, chol, M) with M = I + P_{t-1} D. Raises NotPositiveDefiniteError.
    """
    P = prior_cov.shape[0]
    M = np.eye(P) + prior_cov @ D
    try:
        cov = linalg.symmetrize(np.linalg.solve(M, prior_cov))
    except np.linalg.LinAlgError as exc:
        raise NotPositiveDefiniteError(f"{what} is singular") from exc
    return cov, linalg.cholesky(cov, what), M


def explicit_update(mean, cov, Eg, EH):
    """Explicit R-VGA step (eqs 37-38; eqs 30-31): expectations under the OLD belief q_{t-1}.

        P_t^{-1} = P_{t-1}^{-1} + E_{q_{t-1}}[hess l_t],   mu_t = mu_{t-1} - P_t E_{q_{t-1}}[grad l_t].

    mean (P,), cov (P, P), Eg (P,), EH (P, P). Returns (mean, cov).
    Raises NotPositiveDefiniteError if the new precision is not positive definite.
    """
    new_cov, _, _ = _posterior_cov(cov, EH, "R-VGA posterior covariance")
    return mean - new_cov @ Eg, new_cov


def implicit_residuals(prior_mean, prior_cov, mean, D, Eg, EH):
    """Residuals of the implicit equations (eqs 35-36) at the candidate q = N(mean, P).

    P^{-1} = P_{t-1}^{-1} + D; Eg, EH are the expectations under q. Returns
    (r_mu, r_prec) = (mean - mu_{t-1} + P_{t-1} Eg, D - EH), zero at the R-VGA solution.
    """
    return mean - prior_mean + prior_cov @ Eg, D - EH


def _whitened_error(chol, r_mu, r_prec, scale_mu, scale_prec):
    """Residual sizes in the candidate's own units: ||L^{-1} r_mu|| and ||L^T r_prec L||_F,
    each with a round-off floor from the size of the terms that cancel."""
    Linv = np.linalg.inv(chol)
    e_mu = np.linalg.norm(Linv @ r_mu)
    e_prec = np.linalg.norm(chol.T @ r_prec @ chol)
    eps = np.finfo(float).eps
    floor_mu = 64 * eps * scale_mu * np.linalg.norm(Linv)
    floor_prec = 64 * eps * scale_prec * np.sum(chol**2)
    return e_mu, e_prec, floor_mu, floor_prec


def one_step_objective(prior_mean, prior_chol, mean, chol, El):
    """The one-step objective of Algorithm 1, J_t(q) = E_q[l_t] + KL(q || q_{t-1}) (eq 5).

    KL(q || q_{t-1}) = (tr(P_{t-1}^{-1} P) + (mu - mu_{t-1})^T P_{t-1}^{-1} (mu - mu_{t-1}) - P
    + log|P_{t-1}| - log|P|) / 2, from the Cholesky factors of P_{t-1} and P; El = E_q[l_t].
    """
    A = np.linalg.solve(prior_chol, chol)
    b = np.linalg.solve(prior_chol, mean - prior_mean)
    logdet = 2.0 * (np.sum(np.log(np.diag(prior_chol))) - np.sum(np.log(np.diag(chol))))
    return El + 0.5 * (np.sum(A * A) + b @ b - mean.shape[0] + logdet)


def _damped_step(try_evaluate, state, u, f, min_step):
    """The safeguard of ``implicit_update``: the basic step u + rho f for rho = 1, 1/2, ..., >= min_step,
    first accepting a candidate that lowers the one-step objective J or the merit |f|^2. Near the
    solution both can stall in round-off (J is flat there, and |f|^2 is measured in unwhitened
    units) while the whitened residual still falls; the same steps are then tried once more,
    accepting a lower whitened residual. Returns (candidate or None, evaluations)."""
    n = 0
    for accept in ("objective", "residual"):
        rho = 1.0
        while rho >= min_step:
            new = try_evaluate(u + rho * f)
            n += 1
            if new is not None:
                if new["done"]:
                    return new, n
                if accept == "objective" and (new["J"] < state["J"] or new["merit"] < state["merit"]):
                    return new, n
                if accept == "residual" and new["err"] < state["err"]:
                    return new, n
            rho *= 0.5
    return None, n


def implicit_update(prior_mean, prior_cov, expect, *, tol=1e-8, max_iter=100, memory=5, init=None,
                    min_step=2.0**-30):
    """Implicit R-VGA step (Theorem 1; eqs 35-36) by a safeguarded, accelerated fixed-point iteration.

    Solves  mu = mu_{t-1} - P_{t-1} E_q[grad l],  P^{-1} = P_{t-1}^{-1} + E_q[hess l]  for
    q = N(mu, P). ``expect(mean, chol) -> (El, Eg, EH)`` evaluates E[l], E[grad l] and
    E[hess l] under N(mean, chol chol^T). The unknowns are mu and D = P^{-1} - P_{t-1}^{-1};
    the basic map is

        D'  = E_q[hess l],     mu' = mu - (I + P_{t-1} E_q[hess l])^{-1} r_mu,
        r_mu = mu - mu_{t-1} + P_{t-1} E_q[grad l],

    a unit natural-gradient step on the one-step objective J_t (Appendix 9.1, eqs 96-97); its
    first image from q_{t-1} is the explicit scheme (eqs 37-38). Undamped, the map can cycle
    (Appendix 9.5 shows the same for the logistic system), so each iteration

    1. tries an Anderson-accelerated step over the last ``memory`` iterates (a multisecant
       Newton step), kept if it lowers the size of the map's residual;
    2. otherwise takes the basic step scaled by rho = 1, 1/2, 1/4, ... until it lowers either
       J_t (of which it is a descent direction) or the residual size; when none does (near the
       solution both can stall in round-off), the first of those steps that lowers the whitened
       residual of the stopping test below.

    The iteration starts at q_{t-1}, or at ``init = (mean, cov)`` when given.
    Stops when ||L^{-1} r_mu|| <= tol and ||L^T (D - E_q[hess l]) L||_F <= tol (P = L L^T),
    i.e. the equations hold to ``tol`` in the candidate's own standard deviations (or to
    round-off). Returns (mean (P,), cov (P, P), info) with info = {"n_iter", "n_eval", "residual"}.
    Raises ConvergenceError after ``max_iter`` iterations or when no step makes progress, and
    NotPositiveDefiniteError when P_{t-1} or P_{t-1}^{-1} + E_q[hess l] at the current iterate
    is not positive definite (a non-convex loss).
    """
    P = prior_mean.shape[0]
    chol0 = linalg.cholesky(prior_cov, "prior covariance")
    Linv0 = np.linalg.inv(chol0)

    def pack(mean, D):  # whitened by the prior, so all unknowns are dimensionless
        return np.concatenate([Linv0 @ (mean - prior_mean), (chol0.T @ D @ chol0).ravel()])

    def unpack(u):
        return prior_mean + chol0 @ u[:P], linalg.symmetrize(Linv0.T @ u[P:].reshape(P, P) @ Linv0)

    def evaluate(mean, D):
        cov, chol, _ = _posterior_cov(prior_cov, D, "R-VGA candidate covariance")
        El, Eg, EH = expect(mean, chol)
        r_mu, r_prec = implicit_residuals(prior_mean, prior_cov, mean, D, Eg, EH)
        scale_mu = np.linalg.norm(mean) + np.linalg.norm(prior_cov @ Eg)
        scale_prec = np.linalg.norm(D) + np.linalg.norm(EH)
        e_mu, e_prec, f_mu, f_prec = _whitened_error(chol, r_mu, r_prec, scale_mu, scale_prec)
        done = e_mu <= max(tol, f_mu) and e_prec <= max(tol, f_prec)
        try:
            _, _, M = _posterior_cov(prior_cov, EH, "R-VGA candidate covariance")
            image = pack(mean - np.linalg.solve(M, r_mu), EH)
        except np.linalg.LinAlgError:
            image = np.full(P + P * P, np.nan)
        u = pack(mean, D)
        f = image - u
        return dict(mean=mean, chol=chol, u=u, f=f, merit=float(f @ f), err=max(e_mu, e_prec), done=done,
                    J=one_step_objective(prior_mean, chol0, mean, chol, El))

    def try_evaluate(u):
        try:
            state = evaluate(*unpack(u))
        except np.linalg.LinAlgError:  # includes NotPositiveDefiniteError
            return None
        return state if np.isfinite(state["J"]) and np.isfinite(state["merit"]) else None

    if init is None:
        state = evaluate(prior_mean, np.zeros((P, P)))
    else:
        init_mean, init_cov = init
        Linv = np.linalg.inv(linalg.cholesky(init_cov, "init covariance"))
        state = evaluate(init_mean, linalg.symmetrize(Linv.T @ Linv - Linv0.T @ Linv0))
    n_eval = 1
    hist_u, hist_f = [], []
    for it in range(max_iter + 1):
        if state["done"]:
            cov = linalg.symmetrize(state["chol"] @ state["chol"].T)
            return state["mean"], cov, {"n_iter": it, "n_eval": n_eval, "residual": state["err"]}
        if it == max_iter:
            break
        u, f = state["u"], state["f"]
        if not np.all(np.isfinite(f)):
            raise NotPositiveDefiniteError("R-VGA: P_{t-1}^{-1} + E_q[hess l] is not positive definite")
        new = None
        if hist_u:
            dU = np.stack([u - v for v in hist_u], axis=1)
            dF = np.stack([f - g for g in hist_f], axis=1)
            gam = np.linalg.lstsq(dF, f, rcond=None)[0]
            new = try_evaluate(u + f - (dU + dF) @ gam)
            n_eval += 1
            if new is not None and not (new["done"] or new["merit"] < state["merit"]):
                new = None
        if new is None:
            hist_u, hist_f = [], []
            new, n_trials = _damped_step(try_evaluate, state, u, f, min_step)
            n_eval += n_trials
            if new is None:
                raise ConvergenceError(
                    f"implicit R-VGA step: no step lowers the objective or the residual {state['err']:.3e} "
                    f"(iteration {it}); the expectation estimates may be too coarse or noisy for the "
                    "implicit equations to have a solution")
        hist_u = ([u] + hist_u)[:memory]
        hist_f = ([f] + hist_f)[:memory]
        state = new
    raise ConvergenceError(
        f"implicit R-VGA step did not converge in max_iter={max_iter} iterations: residual "
        f"{state['err']:.3e} > tol={tol:.1e}; raise max_iter or tol")


def linearized_update(mean, cov, G, g, scheme="implicit"):
    """Linearised R-VGA (Theorem 3, eqs 51-53): equal to the extended Kalman filter (eq 55).

    The model mean h is linearised at mu_{t-1} and R_t is frozen there (eqs 44-45), so the loss
    has grad l~(theta) = -(g - A (theta - mu_{t-1})) and hess l~ = A (eqs 47-48), with
    A = G G^T = H^T R^{-1} H and g = H^T R^{-1} (y - h(mu_{t-1})) from ``likelihoods.whiten``.

    - "implicit" (eq 51): P_t^{-1} = P_{t-1}^{-1} + A and the mean equation
      mu_t = mu_{t-1} + P_{t-1}(g - A (mu_t - mu_{t-1})) is solved as the linear system
      (I + P_{t-1} A)(mu_t - mu_{t-1}) = P_{t-1} g (as in eqs 108 and 117).
    - "explicit" (eqs 52-53): mu_t = mu_{t-1} + P_t g.

    mean (P,), cov (P, P), G (P, C'), g (P,). Returns (mean, cov).
    """
    A = G @ G.T
    new_cov, _, M = _posterior_cov(cov, A, "linearised R-VGA posterior covariance")
    if scheme == "implicit":
        return mean + np.linalg.solve(M, cov @ g), new_cov
    return mean + new_cov @ g, new_cov


# ---------------------------------------------------------------------------------------------
# filter class


def _check_choice(value, name, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")
    return value


def _check_rng(rng, name="rng"):
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(f"{name} must be a numpy.random.Generator or None; got {type(rng).__name__}")
    return rng


class RVGA(Filter):
    """R-VGA with a full-covariance belief (Lambert, Bonnabel & Bach 2022, Algorithm 1).

    scheme: "implicit" (Theorem 1, eqs 35-36; solved by :func:`implicit_update`) or
        "explicit" (eqs 37-38).
    expectation: how E_q[grad l] and E_q[hess l] are computed
        - "quadrature" (default): deterministic nodes, ``quadrature="cubature"`` (2P points,
          exact for cubic integrands) or ``"gauss-hermite"`` (``n_nodes``**P points);
        - "mc": ``n_samples`` draws (``antithetic`` pairs by default) from an explicit
          ``rng``; the same standard draws are reused in all iterations of one step, so the
          implicit iteration solves a fixed (sampled) system;
        - "linearized": Theorem 3 (eqs 51-53); equals the EKF, both schemes coincide.
    derivatives: "order2" | "order1" | "order0", the highest derivative of the loss the
        expectations use (see :func:`expected_derivatives`). Called ``form`` in 0.1, a name
        that means the covariance algebra in :class:`refbayes.FullEKF`; ``form=`` still works
        here with a DeprecationWarning.
    curvature: "hessian" (exact loss Hessian, as in the paper) or "ggn" (Gauss-Newton; drops
        the model-curvature term). Identical for a Linear model.
    tol, max_iter, memory: the implicit solver's settings (see :func:`implicit_update`).
    tol: 1e-8 by default, a relative error in the candidate's own standard deviations of a
        P-dimensional fixed point (a tighter one costs iterations without changing the
        belief beyond round-off); :class:`refbayes.LogisticRVGA` uses 1e-12 for its scalar
        root, which costs nothing more.
    rng: deprecated (DeprecationWarning): a Generator stored on the filter and advanced by
        every call. Pass ``rng=`` to ``update``, ``update_batch``, ``predict_update`` or
        ``scan`` instead (a per-call rng wins).
    update_batch(bel, X, Y): one R-VGA step on the summed loss of the N observations (the
        minibatch step, as for every filter).

    Dynamics (gamma, q) use the Kalman predict step (not in the paper, whose parameter is
    static); with them R-VGA on a linear-Gaussian model is the Kalman filter.
    Cost per step: O(S (P^2 + cost of the loss derivatives) + P^3) per iteration with S nodes.
    """

    belief_type = FullCov
    #: NaN components of y are missing: the expectations use the observed outputs' likelihood
    #: (docs/streams.md §3)
    handles_missing = True

    @keyword_renamed("form", "derivatives")
    def __init__(self, model: Model, likelihood: Likelihood, *, scheme: str = "implicit",
                 expectation: str = "quadrature", derivatives: str = "order2", curvature: str = "hessian",
                 quadrature: str = "cubature", n_nodes: int = 3, n_samples: int = 100, antithetic: bool = True,
                 tol: float = 1e-8, max_iter: int = 100, memory: int = 5, rng: np.random.Generator | None = None,
                 gamma: float = 1.0, q: ArrayLike = 0.0, backend: str = "numpy") -> None:
        super().__init__(model, likelihood, gamma=gamma, q=q, backend=backend)
        self.scheme = _check_choice(scheme, "scheme", SCHEMES)
        self.expectation = _check_choice(expectation, "expectation", EXPECTATIONS)
        self.derivatives = _check_choice(derivatives, "derivatives", FORMS)
        self.curvature = _check_choice(curvature, "curvature", CURVATURES)
        self.quadrature = _check_choice(quadrature, "quadrature", QUADRATURES)
        self.n_nodes = positive_int(n_nodes, "n_nodes")
        self.n_samples = int_at_least(n_samples, "n_samples", 2)
        self.antithetic = bool(antithetic)
        if self.antithetic and self.n_samples % 2:
            raise ValueError(f"n_samples must be even with antithetic=True; got {n_samples}")
        self.tol = positive_scalar(tol, "tol")
        self.max_iter = positive_int(max_iter, "max_iter")
        self.memory = int_at_least(memory, "memory", 0)
        self.rng = deprecated_stored_rng(_check_rng(rng), "RVGA")
        if expectation != "linearized":
            for attr in ("log_prob", "grad", "hessian"):
                if not hasattr(likelihood, attr):
                    raise TypeError(f"likelihood must define {attr!r} for expectation={expectation!r}")
        if expectation == "quadrature" and quadrature == "gauss-hermite" and n_nodes ** model.n_params > _MAX_GH_POINTS:
            raise ValueError(f"n_nodes**n_params must be <= {_MAX_GH_POINTS} for quadrature='gauss-hermite'; "
                             f"got {n_nodes}**{model.n_params}")

    def init(self, mean: ArrayLike, prior_var: ArrayLike = 1.0) -> FullCov:
        """Prior N(mean, diag(prior_var)); prior_var a scalar or (P,) vector."""
        mean, var = self._init_mean_var(mean, prior_var)
        return FullCov(mean, np.diag(var))

    def _predict(self, bel):
        return ekf.predict(bel, self.gamma, self.q)

    # -- one step ----------------------------------------------------------------------------

    @property
    def needs_rng(self) -> bool:
        """True when updates draw random numbers (expectation="mc")."""
        return self.expectation == "mc"

    def _nodes(self, rng):
        P = self.n_params
        if self.expectation == "mc":
            rng = _check_rng(rng) if rng is not None else self.rng
            if rng is None:
                raise TypeError("expectation='mc' needs rng, a numpy.random.Generator: pass rng= to "
                                "update, update_batch, predict_update or scan; got None")
            return monte_carlo_rule(P, self.n_samples, rng, self.antithetic)
        if self.quadrature == "cubature":
            return cubature_rule(P)
        return gauss_hermite_rule(P, self.n_nodes)

    def _condition(self, bel, xs, ys, rng):
        pairs = [(x, y) for x, y in zip(xs, ys) if not nothing_observed(self.likelihood, [y], self.model.out_dim)]
        if not pairs:
            return bel  # nothing observed: a predict-only step
        xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
        if self.expectation == "linearized":
            terms = [whiten(lin.H, lin.R, lin.e, singular=lin.singular)
                     for lin in (self.linearize(bel, x, y) for x, y in zip(xs, ys))]
            G = np.concatenate([G_i for G_i, _ in terms], axis=1)
            g = np.sum([g_i for _, g_i in terms], axis=0)
            mean, cov = linearized_update(bel.mean, bel.cov, G, g, self.scheme)
            return FullCov(mean, cov)
        Z, w = self._nodes(rng)
        model, lik, curv = self.model, self.likelihood, self.curvature

        def loss(theta, order):
            return loss_derivatives(model, lik, theta, xs, ys, order, curv)

        def expect(mean, chol):
            return expected_derivatives(loss, mean, chol, Z, w, self.derivatives)

        if self.scheme == "explicit":
            chol = linalg.cholesky(bel.cov, "prior covariance")
            _, Eg, EH = expect(bel.mean, chol)
            mean, cov = explicit_update(bel.mean, bel.cov, Eg, EH)
        else:
            mean, cov, _ = implicit_update(bel.mean, bel.cov, expect, tol=self.tol, max_iter=self.max_iter,
                                           memory=self.memory)
        return FullCov(mean, cov)

    # -- public API --------------------------------------------------------------------------

    def update(self, bel: FullCov, x: ArrayLike, y: ArrayLike, *, obs_var: ArrayLike | None = None,
               rng: np.random.Generator | None = None) -> FullCov:
        """Condition on one observation (x, y) (Algorithm 1, eqs 35-36 or 37-38); returns a new FullCov.

        NaN components of y are missing: the loss is that of the observed outputs (see
        :func:`loss_derivatives`), and with nothing observed (all NaN, or a NaN class label)
        ``bel`` itself is returned.
        obs_var: this observation's Gaussian noise where it differs (see ``with_noise``).
        rng: numpy.random.Generator for expectation="mc".
        """
        if obs_var is not None:
            return self.with_noise(obs_var=obs_var).update(bel, x, y, rng=rng)
        self._check_belief(bel)
        x = self.model.validate_x(x)
        filled = split_missing(self.likelihood, y, self.model.out_dim)[0] if self._check_missing(y) else y
        self.likelihood.encode(filled, self.model.out_dim)
        _check_rng(rng)
        return self._condition(bel, [x], [y], rng)

    def update_batch(self, bel: FullCov, X: ArrayLike, Y: ArrayLike, *,
                     rng: np.random.Generator | None = None) -> FullCov:
        """One R-VGA step for the summed loss of N observations (one KL projection)."""
        self._check_belief(bel)
        X, Y = self._check_stream(X, Y)
        _check_rng(rng)
        return self._condition(bel, list(X), list(Y), rng)

    def _update(self, bel, lin):
        if self.expectation != "linearized":
            raise NotImplementedError("R-VGA needs the observation itself; call update(bel, x, y)")
        G, g = whiten(lin.H, lin.R, lin.e, singular=lin.singular)
        return FullCov(*linearized_update(bel.mean, bel.cov, G, g, self.scheme))

    def _step(self, bel, x, y, rng=None):
        """One step of ``scan`` (which passes ``rng=``): returns (belief, yhat at the predicted mean)."""
        _check_rng(rng)
        yhat = self.likelihood.mean(self.model.apply(bel.mean, x))
        return self._condition(bel, [x], [y], rng), yhat

    def __repr__(self):
        return (f"RVGA(model={self.model!r}, likelihood={self.likelihood!r}, scheme={self.scheme!r}, "
                f"expectation={self.expectation!r}, derivatives={self.derivatives!r}, gamma={self.gamma}, q={self.q})")
