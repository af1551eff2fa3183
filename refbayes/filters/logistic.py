"""Bayesian logistic regression: R-VGA in closed form and its baselines.

Lambert, Bonnabel & Bach (2022), "The recursive variational Gaussian approximation
(R-VGA)", sections 5-6 and Appendix 9.5. Labels y in {0, 1}, inputs x (d,), loss
l(theta) = -y log s(x^T theta) - (1 - y) log(1 - s(x^T theta)) with s the logistic sigmoid.

Every expectation depends on theta only through a = x^T theta ~ N(m, v), so the implicit
R-VGA step (eqs 60-61) reduces to two scalar unknowns alpha = x^T mu_t, nu = x^T P_t x
(eqs 64-72), solved here by nested bracketing in the guaranteed box (eqs 71-72) or by
Powell's hybrid method as in the paper. The Gaussian expectations of s and s' use

- "sigmoid" (the paper's choice, eq 58): E[s(a)] ~ s(k m), E[s'(a)] ~ k s'(k m),
  k = k(v) = (1 + pi v / 8)^{-1/2};
- "probit": the exact Gaussian integrals of the probit surrogate, Phi(m / sqrt(v + beta^2))
  and N(m; 0, v + beta^2), beta^2 = 8 / pi (the middle terms of the derivations before eq 58);
- "quadrature": the exact sigmoid integrated numerically (a composite trapezoid rule in
  the standardised variable, exponentially accurate because s is analytic).

Baselines: the explicit scheme (eqs 78-80), the EKF (eq 81), the quadratic Kalman filter
built on the Jaakkola-Jordan bound (eqs 82-90), batch Laplace, and a batch variational
Gaussian (an oracle not in the paper). The comparison metric is the paper's "unnormalised
KL" (eqs 92-94), i.e. the negative ELBO.

Shapes: d parameters, N observations; means (d,), covariances (d, d), X (N, d), y (N,).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize
from scipy.special import expit, log_expit, logsumexp, ndtr

from .. import linalg
from .._validate import as_float_array, positive_scalar
from ..beliefs import FullCov
from ..errors import ConvergenceError, NotPositiveDefiniteError
from ..likelihoods import Bernoulli
from ..models import Linear
from . import ekf
from .base import Filter
from .rvga import implicit_update

if TYPE_CHECKING:
    from ..likelihoods import Likelihood
    from ..models import Model

__all__ = [
    "BETA",
    "APPROXIMATIONS",
    "SOLVERS",
    "sigmoid",
    "sigmoid_deriv",
    "k_factor",
    "normal_expectation",
    "gaussian_sigmoid_moments",
    "implicit_equations",
    "search_box",
    "shrink_box",
    "fixed_point_map",
    "solve_implicit",
    "rank_one_update",
    "implicit_step",
    "explicit_step",
    "ekf_step",
    "qkf_coefficients",
    "qkf_step",
    "qkf_bound",
    "logistic_loss",
    "predictive",
    "laplace",
    "batch_vga",
    "log_joint",
    "unnormalized_kl",
    "neg_elbo",
    "log_evidence_grid",
    "LogisticRVGA",
    "LogisticQKF",
]

#: beta = sqrt(8 / pi): s(a) ~ Phi(a / beta) and s'(a) ~ N(a; 0, beta^2)
BETA = math.sqrt(8.0 / math.pi)
_BETA2 = 8.0 / math.pi
_SQRT2PI = math.sqrt(2.0 * math.pi)
APPROXIMATIONS = ("sigmoid", "probit", "quadrature")
SOLVERS = ("bracket", "hybr")


# ---------------------------------------------------------------------------------------------
# the sigmoid and its Gaussian expectations


def sigmoid(z):
    """s(z) = 1 / (1 + exp(-z)), without overflow."""
    return expit(z)


def sigmoid_deriv(z):
    """s'(z) = s(z) s(-z), without cancellation."""
    return expit(z) * expit(-z)


def k_factor(v):
    """k(v) = beta / sqrt(v + beta^2) = (1 + pi v / 8)^{-1/2} (eqs 59, 75)."""
    return 1.0 / np.sqrt(1.0 + np.asarray(v, dtype=float) / _BETA2)


@functools.lru_cache(maxsize=64)
def _trapezoid_nodes(n):
    z = np.linspace(-10.0, 10.0, n)
    w = np.exp(-0.5 * z * z)
    z.setflags(write=False)
    w = w / w.sum()
    w.setflags(write=False)
    return z, w


def _nodes_for(s_max):
    """Trapezoid nodes in z for a ~ N(m, s^2), s <= s_max: the spacing h <= 1 / (2 s_max)
    keeps the error below exp(-4 pi^2) for integrands analytic within |Im a| < pi
    (at most 200001 nodes, so full accuracy up to s_max = 5000)."""
    h = min(0.2, 0.5 / max(float(s_max), 1e-300))
    n = int(min(2 * math.ceil(10.0 / max(h, 1e-4)) + 1, 200_001))
    return _trapezoid_nodes(n)


def normal_expectation(fn, m, v):
    """E[fn(a)] for a ~ N(m, v), elementwise over arrays m, v (same shape).

    Composite trapezoid rule in the standardised variable on [-10, 10], with a step fitted to
    the largest standard deviation; exponentially accurate for functions analytic in a strip
    of half-width ~ pi around the real axis (the sigmoid, its derivatives, softplus).
    """
    m = np.asarray(m, dtype=float)
    v = np.asarray(v, dtype=float)
    s = np.sqrt(np.maximum(v, 0.0))
    z, w = _nodes_for(np.max(s, initial=0.0))
    a = m[..., None] + s[..., None] * z
    return fn(a) @ w


def gaussian_sigmoid_moments(m, v, approx="sigmoid"):
    """(E[s(a)], E[s'(a)]) for a ~ N(m, v), elementwise; see the module docstring.

    "sigmoid": (s(k m), k s'(k m)) with k = k(v)  (eq 58);
    "probit": (Phi(m / sqrt(v + beta^2)), N(m; 0, v + beta^2));
    "quadrature": the exact expectations, numerically.
    """
    m = np.asarray(m, dtype=float)
    v = np.asarray(v, dtype=float)
    if approx == "sigmoid":
        k = k_factor(v)
        return expit(k * m), k * sigmoid_deriv(k * m)
    if approx == "probit":
        s2 = v + _BETA2
        return ndtr(m / np.sqrt(s2)), np.exp(-0.5 * m * m / s2) / np.sqrt(2.0 * np.pi * s2)
    if approx == "quadrature":
        return normal_expectation(expit, m, v), normal_expectation(sigmoid_deriv, m, v)
    raise ValueError(f"approx must be one of {APPROXIMATIONS}; got {approx!r}")


def _scalar_moments(approx, s_max):
    """Fast scalar (E[s], E[s']) for the root finders (math module, no arrays)."""
    if approx == "sigmoid":
        def moments(m, v):
            k = 1.0 / math.sqrt(1.0 + v / _BETA2)
            z = k * m
            e = math.exp(-abs(z))
            s = 1.0 / (1.0 + e) if z >= 0 else e / (1.0 + e)
            return s, k * e / (1.0 + e) ** 2
        return moments
    if approx == "probit":
        def moments(m, v):
            s2 = v + _BETA2
            density = math.exp(-0.5 * m * m / s2) / math.sqrt(2.0 * math.pi * s2)
            return 0.5 * math.erfc(-m / math.sqrt(2.0 * s2)), density
        return moments
    z, w = _nodes_for(s_max)

    def moments(m, v):
        a = m + math.sqrt(max(v, 0.0)) * z
        p = expit(a)
        return float(p @ w), float((p * expit(-a)) @ w)
    return moments


# ---------------------------------------------------------------------------------------------
# the implicit step: two scalar unknowns


def implicit_equations(alpha, nu, alpha0, nu0, y, approx="sigmoid"):
    """(f, g) of eqs 69-70 (with the chosen expectation approximation):

        f(alpha, nu) = alpha + nu0 E[s(a)] - alpha0 - nu0 y,
        g(alpha, nu) = nu - nu0 / (1 + nu0 E[s'(a)]),     a ~ N(alpha, nu).

    Their root gives alpha = x^T mu_t and nu = x^T P_t x.
    """
    Es, Ed = gaussian_sigmoid_moments(alpha, nu, approx)
    return alpha + nu0 * Es - alpha0 - nu0 * y, nu - nu0 / (1.0 + nu0 * Ed)


def search_box(alpha0, nu0, y):
    """The guaranteed box of eqs 71-72 (eqs 127-128): ((alpha_min, alpha_max), (nu_min, nu_max))
    with alpha in [alpha0 + nu0 (y - 1), alpha0 + nu0 y], nu in [4 nu0 / (4 + nu0), nu0]."""
    return (alpha0 + nu0 * (y - 1.0), alpha0 + nu0 * y), (4.0 * nu0 / (4.0 + nu0), nu0)


def shrink_box(alpha0, nu0, y, box):
    """One box-shrinking pass of Appendix 9.5 (eqs 129-136), for the "sigmoid" approximation.

    box = ((alpha_min, alpha_max), (nu_min, nu_max)). Returns the intersection of the box with
    the new bounds. The root stays inside; the box collapses for small nu0 and stalls for
    large nu0, so it is only a pre-conditioner.
    """
    (amin, amax), (vmin, vmax) = box
    kmax, kmin = k_factor(vmin), k_factor(vmax)  # k decreases with nu
    a1 = amin * kmin if amin >= 0 else amin * kmax  # eq 130
    a2 = amax * kmax if amax >= 0 else amax * kmin  # eq 131
    new_amin = alpha0 + nu0 * y - nu0 * sigmoid(a2)  # eq 132
    new_amax = alpha0 + nu0 * y - nu0 * sigmoid(a1)
    d1, d2 = sigmoid_deriv(a1), sigmoid_deriv(a2)
    b1 = min(d1, d2)  # eqs 133-135
    b2 = max(d1, d2) if a1 * a2 > 0 else 0.25
    new_vmin = nu0 / (1.0 + nu0 * kmax * b2)  # eq 136
    new_vmax = nu0 / (1.0 + nu0 * kmin * b1)
    return ((max(amin, new_amin), min(amax, new_amax)), (max(vmin, new_vmin), min(vmax, new_vmax)))


def fixed_point_map(alpha, nu, alpha0, nu0, y, approx="sigmoid"):
    """The map F~ of Appendix 9.5 (eqs 123-126) whose fixed points solve eqs 69-70:
    (alpha, nu) -> (alpha0 + nu0 y - nu0 E[s(a)], nu0 / (1 + nu0 E[s'(a)])).
    It is not a contraction; iterating it oscillates (Figure 13)."""
    Es, Ed = gaussian_sigmoid_moments(alpha, nu, approx)
    return alpha0 + nu0 * y - nu0 * Es, nu0 / (1.0 + nu0 * Ed)


def _brent(fn, lo, hi, flo, fhi):
    """Root of an increasing function on [lo, hi] with flo <= 0 <= fhi, to machine precision."""
    if flo >= 0.0:
        return lo
    if fhi <= 0.0:
        return hi
    xtol = 2e-16 * max(abs(lo), abs(hi), 1e-300)
    return optimize.brentq(fn, lo, hi, xtol=xtol, rtol=4.5 * np.finfo(float).eps, maxiter=500)


def _solve_bracket(alpha0, nu0, y, moments):
    (amin, amax), (vmin, vmax) = search_box(alpha0, nu0, y)
    target = alpha0 + nu0 * y

    def alpha_of(nu):  # f is increasing in alpha, f(amin) <= 0 <= f(amax)
        f = lambda a: a + nu0 * moments(a, nu)[0] - target
        return _brent(f, amin, amax, f(amin), f(amax))

    def G(nu):  # G(vmin) <= 0 <= G(vmax) because E[s'] <= 1/4
        return nu - nu0 / (1.0 + nu0 * moments(alpha_of(nu), nu)[1])

    if vmax - vmin <= 2e-16 * vmax:
        nu = vmax
    else:
        g_lo, g_hi = G(vmin), G(vmax)
        if g_lo >= 0.0:
            nu = vmin
        elif g_hi <= 0.0:
            nu = vmax
        else:
            nu = optimize.brentq(G, vmin, vmax, xtol=2e-16 * vmax, rtol=4.5 * np.finfo(float).eps, maxiter=500)
    return alpha_of(nu), nu


def _solve_hybr(alpha0, nu0, y, approx, moments, tol):
    """Powell's hybrid method in (alpha, log nu), started at the box centre (as the paper's code)."""
    (amin, amax), (vmin, vmax) = search_box(alpha0, nu0, y)

    def fun(u):
        a, nu = u[0], math.exp(u[1])
        Es, Ed = moments(a, nu)
        return [a + nu0 * Es - alpha0 - nu0 * y, nu - nu0 / (1.0 + nu0 * Ed)]

    def jac(u):  # sigmoid mode; z = k a, s1 = s'(z), s2 = s''(z), D = 1 + nu0 k s1
        a, nu = u[0], math.exp(u[1])
        k = 1.0 / math.sqrt(1.0 + nu / _BETA2)
        z = k * a
        s = float(expit(z))
        s1 = s * (1.0 - s)
        s2 = s1 * (1.0 - 2.0 * s)
        k_g = -0.5 * BETA * nu * (nu + _BETA2) ** -1.5
        D = 1.0 + nu0 * k * s1
        return [[1.0 + nu0 * k * s1, nu0 * a * k_g * s1],
                [nu0**2 * k**2 * s2 / D**2, nu + nu0**2 * k_g * (s1 + z * s2) / D**2]]

    x0 = [0.5 * (amin + amax), math.log(0.5 * (vmin + vmax))]
    sol = optimize.root(fun, x0, jac=jac if approx == "sigmoid" else None, method="hybr", tol=tol)
    return float(sol.x[0]), math.exp(float(sol.x[1]))


def solve_implicit(alpha0, nu0, y, approx="sigmoid", solver="bracket", tol=1e-12):
    """Root (alpha, nu) of eqs 69-70 in the box of eqs 71-72 (eq 74).

    solver="bracket" (default): for fixed nu, f is increasing in alpha with f(alpha_min) <= 0
    <= f(alpha_max), giving a unique alpha(nu) by Brent's method; G(nu) = g(alpha(nu), nu)
    then satisfies G(nu_min) <= 0 <= G(nu_max) (because E[s'] <= 1/4) and Brent's method
    finds nu. Both solves run to machine precision.
    solver="hybr": scipy's MINPACK hybrid method in (alpha, log nu) from the box centre,
    with the analytic Jacobian in the sigmoid mode (the paper's method, section 5.2).

    Returns (alpha, nu). With hybr, raises ConvergenceError if the result violates eqs 69-70
    by more than ``100 tol (1 + |alpha0| + nu0)`` or leaves the box.
    """
    alpha0, nu0, y = float(alpha0), float(nu0), float(y)
    if approx not in APPROXIMATIONS:
        raise ValueError(f"approx must be one of {APPROXIMATIONS}; got {approx!r}")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}; got {solver!r}")
    if not (math.isfinite(alpha0) and math.isfinite(nu0)) or nu0 < 0:
        raise ValueError(f"need finite alpha0 and nu0 >= 0; got alpha0={alpha0}, nu0={nu0}")
    if y not in (0.0, 1.0):
        raise ValueError(f"y must be 0 or 1; got {y}")
    if nu0 == 0.0:
        return alpha0, 0.0
    moments = _scalar_moments(approx, math.sqrt(nu0))
    if solver == "bracket":
        alpha, nu = _solve_bracket(alpha0, nu0, y, moments)
        return alpha, nu
    alpha, nu = _solve_hybr(alpha0, nu0, y, approx, moments, tol)
    Es, Ed = moments(alpha, nu)
    f, g = alpha + nu0 * Es - alpha0 - nu0 * y, nu - nu0 / (1.0 + nu0 * Ed)
    (amin, amax), (vmin, vmax) = search_box(alpha0, nu0, y)
    scale = 1.0 + abs(alpha0) + nu0
    inside = amin - 1e-9 * scale <= alpha <= amax + 1e-9 * scale and vmin * (1 - 1e-9) <= nu <= vmax * (1 + 1e-9)
    if not (abs(f) <= 100 * tol * scale and abs(g) <= 100 * tol * scale and inside):
        raise ConvergenceError(f"hybr did not solve the R-VGA logistic equations (alpha0={alpha0}, nu0={nu0}, "
                               f"y={y}): |f|={abs(f):.2e}, |g|={abs(g):.2e}, inside box: {inside}; "
                               "use solver='bracket'")
    return alpha, nu


# ---------------------------------------------------------------------------------------------
# online filters: all are rank-one updates along P x


def rank_one_update(mean, cov, x, c, r, old_cov_in_mean=False):
    """The rank-one step shared by the logistic filters.

    P_t = P - (c / (1 + nu0 c)) (P x)(P x)^T  (P_t^{-1} = P^{-1} + c x x^T), nu0 = x^T P x;
    mu_t = mu + r P_t x = mu + r P x / (1 + nu0 c), or mu + r P x if ``old_cov_in_mean``
    (the implicit R-VGA, eq 76). The weight c / (1 + nu0 c) stays finite when c underflows.
    Returns (mean, cov); raises NotPositiveDefiniteError if a variance becomes <= 0.
    """
    Px = cov @ x
    nu0 = float(x @ Px)
    wgt = c / (1.0 + nu0 * c)
    new_cov = linalg.symmetrize(cov - wgt * np.outer(Px, Px))
    if not np.all(np.diag(new_cov) > 0):
        raise NotPositiveDefiniteError("logistic filter covariance lost positive definiteness (round-off)")
    gain = Px if old_cov_in_mean else Px / (1.0 + nu0 * c)
    return mean + r * gain, new_cov


def implicit_step(mean, cov, x, y, approx="sigmoid", solver="bracket", tol=1e-12):
    """Implicit R-VGA for logistic regression (eqs 73-77).

    alpha0 = x^T mu, nu0 = x^T P x (eq 73); (alpha, nu) from :func:`solve_implicit` (eq 74);
    mu_t = mu + (y - E[s(a)]) P x with the OLD covariance (eq 76) and
    P_t = P - P x x^T P / (1 / E[s'(a)] + nu0) (eq 77), a ~ N(alpha, nu).
    Returns (mean, cov, (alpha, nu)).
    """
    alpha0, nu0 = float(x @ mean), float(x @ cov @ x)
    alpha, nu = solve_implicit(alpha0, nu0, y, approx, solver, tol)
    Es, Ed = gaussian_sigmoid_moments(alpha, nu, approx)
    new_mean, new_cov = rank_one_update(mean, cov, x, float(Ed), y - float(Es), old_cov_in_mean=True)
    return new_mean, new_cov, (alpha, nu)


def explicit_step(mean, cov, x, y, approx="sigmoid"):
    """Explicit R-VGA for logistic regression (eqs 78-80): expectations under q_{t-1}.

    With alpha0 = x^T mu, nu0 = x^T P x: c = E[s'(a0)], r = y - E[s(a0)], a0 ~ N(alpha0, nu0)
    (sigmoid mode: c = k0 s'(k0 alpha0), k0 = k(nu0)), then :func:`rank_one_update`.
    """
    Es, Ed = gaussian_sigmoid_moments(float(x @ mean), float(x @ cov @ x), approx)
    return rank_one_update(mean, cov, x, float(Ed), y - float(Es))


def ekf_step(mean, cov, x, y):
    """EKF for logistic regression in compact form (eq 81): c = s'(x^T mu), r = y - s(x^T mu),
    i.e. the explicit step without the factor k. Equals the Kalman form with R_t = s'(x^T mu),
    H_t = R_t x^T, and the online natural gradient (Theorem 3)."""
    a = float(x @ mean)
    return rank_one_update(mean, cov, x, float(sigmoid_deriv(a)), y - float(sigmoid(a)))


def qkf_coefficients(xi):
    """c(xi) = (s(xi) - 1/2) / xi = tanh(xi / 2) / (2 xi)  (= -2 eta of eqs 83, 90);
    1/4 - xi^2 / 48 near 0."""
    xi = abs(float(xi))
    return 0.25 - xi * xi / 48.0 if xi < 1e-4 else math.tanh(0.5 * xi) / (2.0 * xi)


def qkf_step(mean, cov, x, y):
    """Quadratic Kalman filter (eqs 84-90): R-VGA on the Jaakkola-Jordan bound Q(theta, xi).

    xi^2 = x^T (P + mu mu^T) x (eq 90, from q_{t-1} only), c = c(xi), r = (y - 1/2) - c x^T mu;
    equivalently P_t^{-1} = P^{-1} + c x x^T and mu_t = P_t (P^{-1} mu + (y - 1/2) x) (eq 86).
    """
    alpha0, nu0 = float(x @ mean), float(x @ cov @ x)
    c = qkf_coefficients(math.sqrt(nu0 + alpha0 * alpha0))
    return rank_one_update(mean, cov, x, c, (y - 0.5) - c * alpha0)


def qkf_bound(theta, x, y, xi):
    """Q(theta, xi) = -y a - log s(xi) + (a + xi)/2 + (c/2)(a^2 - xi^2), a = x^T theta, c = c(xi):
    the quadratic upper bound of the logistic loss (section 5.4.3), tight at a = +-xi."""
    a = float(np.dot(x, theta))
    c = qkf_coefficients(xi)
    return -y * a - float(log_expit(xi)) + 0.5 * (a + xi) + 0.5 * c * (a * a - xi * xi)


def logistic_loss(theta, x, y):
    """l(theta) = -log p(y | theta) = softplus(x^T theta) - y x^T theta."""
    a = float(np.dot(x, theta))
    return float(np.logaddexp(0.0, a)) - y * a


def predictive(mean, cov, X):
    """Predictive probability and its variance (eqs 62-63) at inputs X (N, d):
    p = s(k x^T mu), Var = p (1 - p)(1 - k), k = k(x^T P x). Returns (p (N,), var (N,))."""
    X = np.atleast_2d(X)
    k = k_factor(np.einsum("ij,jk,ik->i", X, cov, X))
    p = expit(k * (X @ mean))
    return p, p * (1.0 - p) * (1.0 - k)


# ---------------------------------------------------------------------------------------------
# batch baselines and metrics


def _check_data(X, y, prior_mean, prior_cov):
    X = as_float_array(X, "X", ndim=2)
    N, d = X.shape
    y = as_float_array(y, "y").reshape(-1)
    if y.shape != (N,):
        raise ValueError(f"y must have {N} entries to match X; got {y.shape}")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("y must contain only 0 and 1")
    prior_mean = as_float_array(prior_mean, "prior_mean", shape=(d,))
    prior_cov = as_float_array(prior_cov, "prior_cov", shape=(d, d))
    return X, y, prior_mean, prior_cov


def laplace(X, y, prior_mean, prior_cov, tol=1e-18, max_iter=200):
    """Batch Laplace approximation: the MAP by Newton's method with backtracking, then
    P_L = (P0^{-1} + sum_i s'(x_i^T theta) x_i x_i^T)^{-1}. Returns (mean, cov).

    (The paper's code uses L-BFGS-B from mu0 with default tolerances.) Backtracking until the
    squared Newton decrement g^T H^{-1} g is below 1e-8 (1 + |objective|), full steps after;
    stops when it is <= tol (1 + |objective|). ConvergenceError after max_iter iterations.
    """
    X, y, mu0, P0 = _check_data(X, y, prior_mean, prior_cov)
    prec0 = linalg.psd_solve(P0, np.eye(X.shape[1]), name="prior_cov")

    def objective(th):
        a = X @ th
        dev = th - mu0
        return float(np.sum(np.logaddexp(0.0, a) - y * a) + 0.5 * dev @ prec0 @ dev)

    theta = mu0.copy()
    obj = objective(theta)
    for _ in range(max_iter):
        a = X @ theta
        grad = X.T @ (expit(a) - y) + prec0 @ (theta - mu0)
        hess = linalg.symmetrize(X.T @ (sigmoid_deriv(a)[:, None] * X) + prec0)
        step = linalg.psd_solve(hess, grad, name="Laplace Hessian")
        dec = float(grad @ step)
        if dec <= tol * (1.0 + abs(obj)):
            cov = linalg.symmetrize(linalg.psd_solve(hess, np.eye(X.shape[1]), name="Laplace Hessian"))
            return theta, cov
        if dec <= 1e-8 * (1.0 + abs(obj)):  # quadratic convergence; the objective is at round-off
            theta = theta - step
            continue
        t = 1.0
        while True:
            cand = theta - t * step
            new = objective(cand)
            if new <= obj - 0.25 * t * dec:
                theta, obj = cand, new
                break
            t *= 0.5
            if t < 1e-12:
                raise ConvergenceError("Laplace: the Newton line search failed")
    raise ConvergenceError(f"Laplace: Newton's method did not converge in {max_iter} iterations")


def _expected_losses(X, y, mean, chol):
    """Per-observation E[l_i], E[s(a_i)], E[s'(a_i)], a_i ~ N(x_i^T mu, x_i^T P x_i), in one pass
    of the rule of :func:`normal_expectation`."""
    m = X @ mean
    s = np.sqrt(np.sum((X @ chol) ** 2, axis=1))
    z, w = _nodes_for(np.max(s, initial=0.0))
    a = m[:, None] + s[:, None] * z
    ls = log_expit(a)  # log s(a)
    lm = ls - a  # log s(-a)
    p = np.exp(ls)
    El = -np.where(y[:, None] == 1.0, ls, lm) @ w
    return El, p @ w, np.exp(ls + lm) @ w


def batch_vga(X, y, prior_mean, prior_cov, tol=1e-9, max_iter=500, init="laplace"):
    """Batch variational Gaussian: argmin over N(mu, P) of KL(q || p(theta | y_1..y_N)).

    An oracle not in the paper. The objective is the negative ELBO
    F(q) = sum_i E_q[l_i] + KL(q || p0), which is the one-step R-VGA objective (eq 5) with all
    data as one observation, so it is solved by ``rvga.implicit_update`` with exact 1-D
    expectations (:func:`normal_expectation`): at the optimum
    mu = mu0 - P0 sum_i (E[s(a_i)] - y_i) x_i and P^{-1} = P0^{-1} + sum_i E[s'(a_i)] x_i x_i^T.
    init: "laplace" (start at the Laplace approximation) or "prior". Returns (mean, cov, info).
    """
    X, y, mu0, P0 = _check_data(X, y, prior_mean, prior_cov)

    def expect(mean, chol):
        El, Es, Ed = _expected_losses(X, y, mean, chol)
        return float(El.sum()), X.T @ (Es - y), linalg.symmetrize(X.T @ (Ed[:, None] * X))

    if init not in ("laplace", "prior"):
        raise ValueError(f"init must be 'laplace' or 'prior'; got {init!r}")
    start = laplace(X, y, mu0, P0) if init == "laplace" else None
    return implicit_update(mu0, P0, expect, tol=tol, max_iter=max_iter, init=start)


def log_joint(thetas, X, y, prior_mean, prior_cov):
    """log p~(theta) = sum_i log s((2 y_i - 1) x_i^T theta) + log N(theta; mu0, P0) for each row
    of thetas (M, d): the unnormalised log posterior of the KL metric (section 6.1). Returns (M,)."""
    X, y, mu0, P0 = _check_data(X, y, prior_mean, prior_cov)
    thetas = np.atleast_2d(as_float_array(thetas, "thetas"))
    L0 = linalg.cholesky(P0, "prior_cov")
    sgn = 2.0 * y - 1.0
    loglik = np.sum(log_expit((thetas @ X.T) * sgn), axis=1)
    z = np.linalg.solve(L0, (thetas - mu0).T)
    d = X.shape[1]
    logprior = -0.5 * np.sum(z * z, axis=0) - np.sum(np.log(np.diag(L0))) - 0.5 * d * math.log(2 * math.pi)
    return loglik + logprior


def unnormalized_kl(mean, cov, X, y, prior_mean, prior_cov, z):
    """The paper's Monte Carlo KL metric with Z_p := 1 (eqs 92-94):

        KL ~ -(1/M) sum_k log p~(theta_k) - log|P|/2 - (d/2)(1 + log 2 pi),  theta_k = mu + L z_k,

    L = chol(P), z (M, d) standard normal draws shared by all beliefs (common random numbers).
    It estimates the negative ELBO F(q) = KL(q || posterior) - log p(y_1..y_N).
    """
    L = linalg.cholesky(as_float_array(cov, "cov", ndim=2), "cov")
    thetas = np.asarray(mean) + np.atleast_2d(z) @ L.T
    d = L.shape[0]
    entropy = np.sum(np.log(np.diag(L))) + 0.5 * d * (1.0 + math.log(2 * math.pi))
    return float(-np.mean(log_joint(thetas, X, y, prior_mean, prior_cov)) - entropy)


def neg_elbo(mean, cov, X, y, prior_mean, prior_cov):
    """F(q) = sum_i E_q[l_i] + KL(q || p0), the exact value (1-D quadrature) of the quantity
    that :func:`unnormalized_kl` estimates by Monte Carlo. F(q) >= -log Z for every q."""
    X, y, mu0, P0 = _check_data(X, y, prior_mean, prior_cov)
    mean = as_float_array(mean, "mean", shape=(X.shape[1],))
    chol = linalg.cholesky(as_float_array(cov, "cov", shape=(X.shape[1], X.shape[1])), "cov")
    El, _, _ = _expected_losses(X, y, mean, chol)
    L0 = linalg.cholesky(P0, "prior_cov")
    A = np.linalg.solve(L0, chol)
    b = np.linalg.solve(L0, mean - mu0)
    kl = 0.5 * (np.sum(A * A) + b @ b - X.shape[1]) + np.sum(np.log(np.diag(L0))) - np.sum(np.log(np.diag(chol)))
    return float(El.sum() + kl)


def log_evidence_grid(X, y, prior_mean, prior_cov, center, scale_cov, n=401, width=8.0, gap=40.0):
    """log Z = log int p0(theta) prod_i p(y_i | theta) d theta for d = 2, on a grid.

    Coordinates u along the eigenvectors of ``scale_cov`` (e.g. the Laplace covariance),
    theta = center + V diag(sd) u. A coarse grid over |u| <= width (doubled until the log density
    on its border is ``gap`` below the maximum) finds the region holding the mass; an n x n grid
    over that region then gives log Z. Returns (log Z, the border gap of the fine grid).
    """
    X, y, mu0, P0 = _check_data(X, y, prior_mean, prior_cov)
    if X.shape[1] != 2:
        raise ValueError(f"log_evidence_grid needs d = 2; got d = {X.shape[1]}")
    lam, V = np.linalg.eigh(as_float_array(scale_cov, "scale_cov", shape=(2, 2)))
    sd = np.sqrt(np.maximum(lam, 1e-300))
    center = as_float_array(center, "center", shape=(2,))

    def logp_on(u1, u2):
        U1, U2 = np.meshgrid(u1, u2, indexing="ij")
        thetas = center + (np.stack([U1.ravel(), U2.ravel()], axis=1) * sd) @ V.T
        return log_joint(thetas, X, y, mu0, P0).reshape(len(u1), len(u2))

    for _ in range(12):
        u = np.linspace(-width, width, 161)
        lp = logp_on(u, u)
        top = lp.max()
        if top - max(lp[0].max(), lp[-1].max(), lp[:, 0].max(), lp[:, -1].max()) >= gap:
            break
        width *= 2.0
    else:
        raise ConvergenceError("log_evidence_grid: the posterior mass does not fit in the grid")
    i1, i2 = np.nonzero(lp >= top - gap - 5.0)
    lo1, hi1 = u[max(i1.min() - 2, 0)], u[min(i1.max() + 2, len(u) - 1)]
    lo2, hi2 = u[max(i2.min() - 2, 0)], u[min(i2.max() + 2, len(u) - 1)]
    u1, u2 = np.linspace(lo1, hi1, n), np.linspace(lo2, hi2, n)
    lp = logp_on(u1, u2)
    border = max(lp[0].max(), lp[-1].max(), lp[:, 0].max(), lp[:, -1].max())
    cell = (u1[1] - u1[0]) * (u2[1] - u2[0])
    return float(logsumexp(lp) + math.log(cell) + np.sum(np.log(sd))), float(lp.max() - border)


# ---------------------------------------------------------------------------------------------
# filter classes


def _logistic_model(model, likelihood):
    if not isinstance(model, Linear) or model.out_dim != 1:
        raise TypeError(f"model must be a refbayes Linear model with out_dim=1; got {model!r}")
    if not isinstance(likelihood, Bernoulli) or likelihood.prob_clip is not None:
        raise TypeError(f"likelihood must be refbayes Bernoulli() without prob_clip; got {likelihood!r}")


class _LogisticFilter(Filter):
    belief_type = FullCov
    #: a NaN label is not observed: the update is skipped (docs/streams.md §3)
    handles_missing = True

    def __init__(self, model: Model, likelihood: Likelihood, *, gamma: float = 1.0, q: ArrayLike = 0.0,
                 backend: str = "numpy") -> None:
        _logistic_model(model, likelihood)
        super().__init__(model, likelihood, gamma=gamma, q=q, backend=backend)

    def init(self, mean: ArrayLike, prior_var: ArrayLike = 1.0) -> FullCov:
        """Prior N(mean, diag(prior_var))."""
        mean, var = self._init_mean_var(mean, prior_var)
        return FullCov(mean, np.diag(var))

    def _predict(self, bel):
        return ekf.predict(bel, self.gamma, self.q)

    def _update(self, bel, lin):
        x = lin.J[0]  # the feature row: x, with a trailing 1 when the model has a bias
        y = float(round(lin.e[0] + lin.yhat[0]))  # T(y) = y in {0, 1}, up to one rounding
        return FullCov(*self._rank_one_step(bel.mean, bel.cov, x, y))

    def update_sequential(self, bel: FullCov, X: ArrayLike, Y: ArrayLike) -> FullCov:
        """Condition on the rows of X (N, d) and the labels Y (N,) one after the other (each
        logistic step is rank one; no predict step in between). Returns a new FullCov."""
        self._check_belief(bel)
        X, Y = self._check_stream(X, Y)
        for x, y in zip(X, Y):
            bel = self.update(bel, x, y)
        return bel

    def update_batch(self, bel: FullCov, X: ArrayLike, Y: ArrayLike) -> FullCov:
        """Deprecated: in 0.1 this meant :meth:`update_sequential` (one rank-one step per row),
        not the one-step minibatch update that ``update_batch`` means for the other filters;
        it calls update_sequential with a DeprecationWarning."""
        warnings.warn(f"{type(self).__name__}.update_batch is deprecated (it conditions on the rows one after "
                      "the other); call update_sequential", DeprecationWarning, stacklevel=2)
        return self.update_sequential(bel, X, Y)


class LogisticRVGA(_LogisticFilter):
    """R-VGA for Bayesian logistic regression (Lambert et al. 2022, eqs 73-77 and 78-80).

    model: refbayes Linear(in_dim, 1, bias=...) (the bias acts as a constant input 1);
    likelihood: Bernoulli(). scheme: "implicit" (eqs 73-77) or "explicit" (eqs 78-80).
    approx: "sigmoid" (the paper's, eq 58), "probit" or "quadrature" (see the module docstring).
    solver: "bracket" (default) or "hybr" (the paper's), for the implicit scheme.
    tol: 1e-12 by default, the residual tolerance of the implicit scheme's two scalar
        equations (eqs 76-77, see :func:`solve_implicit`); a scalar root converges to it in
        O(100) cheap evaluations, so it is tighter than :class:`refbayes.RVGA`'s 1e-8 for its
        P-dimensional fixed point.
    All of scheme, approx, solver, tol, gamma, q, backend are keyword-only. Model and
    likelihood are restricted (a Linear model with one output, a Bernoulli likelihood): the
    closed form exists only there. ``update_sequential`` conditions on several rows in turn.
    Cost O(d^2) per observation plus O(100) scalar evaluations for the implicit root.
    """

    def __init__(self, model: Model, likelihood: Likelihood, *, scheme: str = "implicit", approx: str = "sigmoid",
                 solver: str = "bracket", tol: float = 1e-12, gamma: float = 1.0, q: ArrayLike = 0.0,
                 backend: str = "numpy") -> None:
        super().__init__(model, likelihood, gamma=gamma, q=q, backend=backend)
        if scheme not in ("implicit", "explicit"):
            raise ValueError(f"scheme must be 'implicit' or 'explicit'; got {scheme!r}")
        if approx not in APPROXIMATIONS:
            raise ValueError(f"approx must be one of {APPROXIMATIONS}; got {approx!r}")
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}; got {solver!r}")
        self.scheme, self.approx, self.solver = scheme, approx, solver
        self.tol = positive_scalar(tol, "tol")

    def _rank_one_step(self, mean, cov, x, y):
        if self.scheme == "explicit":
            return explicit_step(mean, cov, x, y, self.approx)
        return implicit_step(mean, cov, x, y, self.approx, self.solver, self.tol)[:2]


class LogisticQKF(_LogisticFilter):
    """Quadratic Kalman filter for logistic regression (Lambert et al. 2022, eqs 84-90).

    R-VGA applied to the Jaakkola-Jordan quadratic bound, with xi from q_{t-1}.
    model: Linear(in_dim, 1, bias=...); likelihood: Bernoulli().
    """

    def _rank_one_step(self, mean, cov, x, y):
        return qkf_step(mean, cov, x, y)
