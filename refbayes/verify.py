"""Exact identities between the filters, as checks a reader can run (``refbayes verify``).

Each :class:`Check` states one identity from the papers (e.g. "LO-FI with rank
L >= n equals the full-covariance EKF"), the equations it relates, and a
function ``(rng) -> worst relative error`` that builds a fresh random instance
(random sizes; dynamics gamma < 1 and q > 0 where they apply; several
likelihoods where they apply), runs both sides for a few steps and returns the
worst error seen. The error of an array ``a`` against a reference ``b`` is
``max|a - b| / max(1, max|b|)``: round-off relative to the size of the numbers.

Papers: Chang, Jones & Murphy (2022), diagonal EKFs ("Chang 2022"); Chang et al.
(2023), LO-FI ("Chang 2023"); Jones, Chang & Murphy (2024), BONG ("Jones 2024");
Lambert, Bonnabel & Bach (2022), R-VGA ("Lambert 2022"); Duran-Martin, Kara &
Murphy (2022), subspace neural bandits ("Duran-Martin 2022"). ``docs/verify.md``
explains why each identity holds.

    >>> from refbayes.verify import run_checks
    >>> results = run_checks(["lofi"], seed=0)
    >>> all(r.passed for r in results)
    True

The tests (``tests/test_verify.py``) run every registered check, so this
registry is the single list of cross-method identities.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

import refbayes as rb

__all__ = ["Check", "CheckResult", "CHECKS", "METHODS", "register", "run_checks", "format_table", "relerr"]

METHODS = ("ekf", "fdekf", "vdekf", "lofi", "bong", "rvga", "subspace")

# Round-off budget for an exact identity computed two different ways in float64 over a few steps of
# small (P <= ~40) problems: products and solves with condition numbers up to ~1e4 lose ~1e-12.
ROUNDOFF = 1e-9


@dataclass(frozen=True)
class Check:
    """One identity: ``fn(rng)`` builds a random instance and returns the worst relative error.

    name: short id (``"lofi-full-rank-ekf"``); methods: the method families it concerns
    (subset of :data:`METHODS`); identity: one line of what equals what; equation: the paper
    equations it relates; tolerance and why: the pass threshold and its one-line justification;
    instances / thorough_instances: how many random instances a default / ``--thorough`` run draws.
    """

    name: str
    methods: tuple
    identity: str
    equation: str
    tolerance: float
    why: str
    fn: object = field(repr=False)
    instances: int = 10
    thorough_instances: int = 200


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check: worst error over ``instances`` random instances (inf if one raised)."""

    name: str
    methods: tuple
    identity: str
    equation: str
    instances: int
    worst_error: float
    tolerance: float
    passed: bool
    seconds: float
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict (a non-finite worst error becomes None)."""
        d = dict(self.__dict__)
        d["methods"] = list(self.methods)
        d["worst_error"] = None if not math.isfinite(self.worst_error) else self.worst_error
        return d


CHECKS = {}


def register(name: str, methods: Iterable[str], identity: str, equation: str, tolerance: float = ROUNDOFF,
             why: str = "float64 round-off over a few steps", instances: int = 10,
             thorough_instances: int = 200) -> Callable[[Callable[[np.random.Generator], float]],
                                                       Callable[[np.random.Generator], float]]:
    """Decorator adding ``fn(rng) -> worst error`` to :data:`CHECKS` under ``name``."""
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"methods must be among {METHODS}; got {sorted(unknown)}")

    def deco(fn):
        if name in CHECKS:
            raise ValueError(f"check {name!r} is registered twice")
        CHECKS[name] = Check(name, tuple(methods), identity, equation, tolerance, why, fn, instances,
                             thorough_instances)
        return fn

    return deco


def relerr(a: ArrayLike, b: ArrayLike) -> float:
    """max|a - b| / max(1, max|b|) for arrays of the same shape (inf if a is not finite)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if not np.all(np.isfinite(a)):
        return math.inf
    return float(np.max(np.abs(a - b), initial=0.0) / max(1.0, np.max(np.abs(b), initial=0.0)))


def _worst(*errs):
    return max(errs, default=0.0)


# ------------------------------------------------------------------------------------------------
# random problems


def _spd(rng, n, floor=0.3):
    A = rng.standard_normal((n, n))
    return A @ A.T / n + floor * np.eye(n)


def _dynamics(rng):
    """gamma in (0.7, 0.99) and q in (0.005, 0.1): the predict step always does something."""
    return float(rng.uniform(0.7, 0.99)), float(rng.uniform(0.005, 0.1))


def _linear_gaussian(rng, max_in=3, max_out=2, T=None, dynamics=False):
    """A random Linear model with Gaussian noise: (model, lik, R, X, Y, Hs, mu0, prior_var), then
    (gamma, q) from :func:`_dynamics` when ``dynamics`` (drawn after the problem)."""
    D, C = int(rng.integers(1, max_in + 1)), int(rng.integers(1, max_out + 1))
    T = int(rng.integers(2, 6)) if T is None else T
    model = rb.Linear(D, C, bias=bool(rng.integers(2)))
    R = _spd(rng, C)
    X = rng.standard_normal((T, D))
    Hs = np.stack([model.jacobian(np.zeros(model.n_params), x) for x in X])
    theta = rng.standard_normal(model.n_params)
    Y = np.einsum("tcp,p->tc", Hs, theta) + rng.multivariate_normal(np.zeros(C), R, size=T)
    out = model, rb.Gaussian(R), R, X, Y, Hs, rng.standard_normal(model.n_params), float(rng.uniform(0.2, 2.0))
    return out + _dynamics(rng) if dynamics else out


LIKELIHOODS = ("gaussian", "bernoulli", "categorical", "poisson")


def _nonlinear(rng, kind=None, T=4, kinds=LIKELIHOODS, dynamics=False):
    """A small tanh MLP with a random likelihood: (kind, model, lik, X, Y, theta0, prior_var), then
    (gamma, q) from :func:`_dynamics` when ``dynamics`` (drawn after the problem)."""
    kind = kinds[int(rng.integers(len(kinds)))] if kind is None else kind
    D, H = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    if kind == "gaussian":
        C = int(rng.integers(1, 3))
        model, lik = rb.MLP([D, H, C], activation="tanh"), rb.Gaussian(_spd(rng, C, 0.2))
        Y = rng.standard_normal((T, C))
    elif kind == "bernoulli":
        model, lik = rb.MLP([D, H, 1], activation="tanh"), rb.Bernoulli()
        Y = rng.integers(0, 2, (T, 1)).astype(float)
    elif kind == "poisson":
        model, lik = rb.MLP([D, H, 1], activation="tanh"), rb.Poisson()
        Y = rng.poisson(1.0, (T, 1)).astype(float)
    elif kind == "categorical":
        K = int(rng.integers(2, 4))
        model, lik = rb.MLP([D, H, K], activation="tanh"), rb.Categorical(K)
        Y = rng.integers(0, K, T)
    else:
        raise ValueError(f"kind must be one of {LIKELIHOODS}; got {kind!r}")
    X = rng.standard_normal((T, D))
    out = kind, model, lik, X, Y, model.init_params(rng), float(rng.uniform(0.2, 1.5))
    return out + _dynamics(rng) if dynamics else out


def _pair(fa, fb, theta0, prior_var, X, Y, compare):
    """Run two filters side by side (predict, then update) and return the worst compare(a, b)."""
    a, b = fa.init(theta0, prior_var), fb.init(theta0, prior_var)
    worst = 0.0
    for x, y in zip(X, Y):
        a, b = fa.predict(a), fb.predict(b)
        worst = max(worst, compare(a, b))
        a, b = fa.update(a, x, y), fb.update(b, x, y)
        worst = max(worst, compare(a, b))
    return worst


def _same_gaussian(a, b):
    return _worst(relerr(a.mean, b.mean), relerr(a.covariance(), b.covariance()))


def _same_mean_and_precision(a, b):
    return _worst(relerr(a.mean, b.mean), relerr(a.precision(), b.precision()))


def _kalman_problem(rng):
    """A linear-Gaussian problem with dynamics and its exact answer: (model, lik, X, Y, mu0, prior_var,
    gamma, q, kf), kf the Kalman filter from the prior N(mu0, prior_var I), for :func:`_against_kalman`."""
    from refbayes import exact

    model, lik, R, X, Y, Hs, mu0, v0, gamma, q = _linear_gaussian(rng, dynamics=True)
    kf = exact.kalman_filter(mu0, v0 * np.eye(model.n_params), Hs, Y, R, gamma, q)
    return model, lik, X, Y, mu0, v0, gamma, q, kf


def _against_kalman(filt, mu0, prior_var, X, Y, kf, cov=True):
    bel = filt.init(mu0, prior_var)
    worst = 0.0
    for t, (x, y) in enumerate(zip(X, Y)):
        bel = filt.predict(bel)
        worst = max(worst, relerr(bel.mean, kf.pred_means[t]))
        bel = filt.update(bel, x, y)
        worst = max(worst, relerr(bel.mean, kf.means[t]))
        worst = max(worst, relerr(bel.covariance(), kf.covs[t]) if cov
                    else relerr(np.diag(bel.covariance()), np.diag(kf.covs[t])))
    return worst


# ------------------------------------------------------------------------------------------------
# full-covariance EKF


@register("ekf-kalman", ["ekf"], "EKF on a linear-Gaussian model = Kalman filter (all three forms)",
          "Chang 2022 eqs 4-9")
def _ekf_kalman(rng):
    from refbayes.filters import ekf

    model, lik, X, Y, mu0, v0, gamma, q, kf = _kalman_problem(rng)
    return _worst(*(_against_kalman(rb.FullEKF(model, lik, gamma=gamma, q=q, form=form), mu0, v0, X, Y, kf)
                    for form in ekf.FORMS))


@register("ekf-joint-posterior", ["ekf"],
          "EKF on a linear-Gaussian model = batch conditioning of the joint prior of theta_1..T",
          "Chang 2022 eqs 4-9")
def _ekf_joint(rng):
    from refbayes import exact

    model, lik, R, X, Y, Hs, mu0, v0, gamma, q = _linear_gaussian(rng, dynamics=True)
    filt = rb.FullEKF(model, lik, gamma=gamma, q=q)
    bel = filt.init(mu0, v0)
    for x, y in zip(X, Y):
        bel = filt.update(filt.predict(bel), x, y)
    mean, cov, _ = exact.joint_filtering_posterior(mu0, v0 * np.eye(model.n_params), Hs, Y, R, gamma, q)
    return _worst(relerr(bel.mean, mean), relerr(bel.covariance(), cov))


@register("ekf-conjugate-any-order", ["ekf"],
          "static EKF on a linear-Gaussian model = conjugate Bayesian linear regression, any data order",
          "Chang 2022 eqs 5-9")
def _ekf_blr(rng):
    from refbayes import exact

    model, lik, R, X, Y, Hs, mu0, v0 = _linear_gaussian(rng)
    mean, cov = exact.blr_posterior(mu0, v0 * np.eye(model.n_params), Hs, Y, R)
    filt = rb.FullEKF(model, lik)
    worst = 0.0
    for order in (np.arange(len(X)), rng.permutation(len(X))):
        bel = filt.init(mu0, v0)
        for x, y in zip(X[order], Y[order]):
            bel = filt.update(bel, x, y)
        worst = max(worst, relerr(bel.mean, mean), relerr(bel.covariance(), cov))
    return worst


@register("ekf-forms-agree", ["ekf"],
          "covariance, Joseph and information forms of the EKF give the same belief (MLP, 4 likelihoods)",
          "Chang 2022 eqs 5-9",
          tolerance=1e-8, why="three algebraically equal forms; information form inverts P x P (cond ~1e3)")
def _ekf_forms(rng):
    from refbayes.filters import ekf

    _, model, lik, X, Y, theta0, v0, gamma, q = _nonlinear(rng, dynamics=True)
    ref = rb.FullEKF(model, lik, gamma=gamma, q=q, form="covariance")
    return _worst(*(_pair(rb.FullEKF(model, lik, gamma=gamma, q=q, form=form), ref, theta0, v0, X, Y, _same_gaussian)
                    for form in ekf.FORMS if form != "covariance"))


# ------------------------------------------------------------------------------------------------
# diagonal EKFs (Chang, Jones & Murphy 2022)


@register("diag-one-step-projections", ["fdekf", "vdekf", "ekf"],
          "one step from a diagonal prior: FD var = diag(EKF cov), VD precision = diag(EKF precision), "
          "both means = EKF mean",
          "Chang 2022 eqs 10-12 (FD), 13-14 (VD) vs 5-9")
def _diag_one_step(rng):
    kind, model, lik, X, Y, theta0, _ = _nonlinear(rng, T=1)
    var0 = rng.uniform(0.2, 1.5, model.n_params)
    full = rb.FullEKF(model, lik)
    fc = full.update(rb.FullCov(theta0, np.diag(var0)), X[0], Y[0])
    fd = rb.FDEKF(model, lik)
    vd = rb.VDEKF(model, lik, vd_mean="ekf")
    bfd = fd.update(fd.init(theta0, var0), X[0], Y[0])
    bvd = vd.update(vd.init(theta0, var0), X[0], Y[0])
    return _worst(relerr(bfd.mean, fc.mean), relerr(np.diag(bfd.covariance()), np.diag(fc.covariance())),
                  relerr(bvd.mean, fc.mean), relerr(np.diag(bvd.precision()), np.diag(fc.precision())))


@register("diag-one-block-ekf", ["fdekf", "vdekf", "ekf"],
          "block FD-EKF and block VD-EKF with a single block containing every parameter = full EKF",
          "Chang 2022 eqs 10-14 (block form) vs 5-9")
def _diag_one_block(rng):
    _, model, lik, X, Y, theta0, v0, gamma, q = _nonlinear(rng, dynamics=True)
    every = [np.arange(model.n_params)]
    ref = rb.FullEKF(model, lik, gamma=gamma, q=q)
    return _worst(*(_pair(f, ref, theta0, v0, X, Y, _same_gaussian) for f in (
        rb.FDEKF(model, lik, gamma=gamma, q=q, blocks=every),
        rb.VDEKF(model, lik, gamma=gamma, q=q, blocks=every))))


@register("diag-axis-aligned-kalman", ["fdekf", "vdekf"],
          "FD-EKF and VD-EKF (both mean rules) = Kalman filter when every observation touches one parameter",
          "Chang 2022 eqs 10-14 vs the Kalman filter")
def _diag_axis(rng):
    from refbayes import exact

    P, T = int(rng.integers(1, 6)), int(rng.integers(2, 7))
    gamma = float(rng.uniform(0.7, 0.99))
    q = rng.uniform(0.005, 0.1, P)
    Hs = np.zeros((T, 1, P))
    Hs[np.arange(T), 0, rng.integers(0, P, T)] = rng.normal(0, 2, T)
    Y = rng.standard_normal((T, 1))
    r = float(rng.uniform(0.1, 1.0))
    var0, mu0 = rng.uniform(0.2, 2, P), rng.standard_normal(P)
    kf = exact.kalman_filter(mu0, np.diag(var0), Hs, Y, r * np.eye(1), gamma, q)
    model, lik = rb.Linear(P, 1, bias=False), rb.Gaussian(r)
    X = Hs[:, 0, :]  # Linear(P, 1) without bias: H_t = x_t^T
    return _worst(*(_against_kalman(f, mu0, var0, X, Y, kf, cov=False) for f in (
        rb.FDEKF(model, lik, gamma=gamma, q=q),
        rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="paper"),
        rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="ekf"))))


@register("one-parameter-all-agree", ["ekf", "fdekf", "vdekf", "lofi"],
          "with P = 1 the full, FD, VD (both mean rules) EKFs and LO-FI (rank 0 and 1) coincide",
          "Chang 2022 eqs 5-14; Chang 2023 eqs 13-43")
def _one_parameter(rng):
    import autograd.numpy as anp

    C = int(rng.integers(1, 3))
    w = rng.standard_normal(C)
    model = rb.Function(lambda th, x: anp.tanh(w * th[0] * x[0]) + 0.3 * th[0] ** 2, n_params=1, out_dim=C,
                        in_dim=1)
    lik = rb.Gaussian(_spd(rng, C))
    T = 5
    X, Y = rng.standard_normal((T, 1)), rng.standard_normal((T, C))
    gamma, q = _dynamics(rng)
    theta0, v0 = rng.standard_normal(1), float(rng.uniform(0.2, 2.0))
    ref = rb.FullEKF(model, lik, gamma=gamma, q=q)
    others = (rb.FDEKF(model, lik, gamma=gamma, q=q), rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="paper"),
              rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="ekf"), rb.LoFi(model, lik, rank=0, gamma=gamma, q=q),
              rb.LoFi(model, lik, rank=1, gamma=gamma, q=q))
    return _worst(*(_pair(f, ref, theta0, v0, X, Y, _same_gaussian) for f in others))


# ------------------------------------------------------------------------------------------------
# LO-FI (Chang et al. 2023)


@register("lofi-predict-exact", ["lofi"],
          "DLR predict: (diag(ups') + W'W'^T)^-1 = gamma^2 (diag(ups) + WW^T)^-1 + diag(q), any rank",
          "Chang 2023 eqs 13-25")
def _lofi_predict(rng):
    from refbayes.beliefs import DLR
    from refbayes.filters import lofi

    P, L = int(rng.integers(1, 9)), int(rng.integers(0, 5))
    bel = DLR(rng.standard_normal(P), rng.uniform(0.3, 2.0, P), rng.standard_normal((P, L)))
    gamma = float(rng.uniform(0.5, 0.99))
    q = rng.uniform(0.005, 0.5, P) if rng.integers(2) else float(rng.uniform(0.005, 0.5))
    out = lofi.predict(bel, gamma, q)
    dense = gamma**2 * bel.covariance() + np.diag(np.broadcast_to(q, (P,)))
    return _worst(relerr(out.mean, gamma * bel.mean), relerr(out.covariance(), dense),
                  relerr(out.precision(), np.linalg.inv(dense)))


@register("lofi-full-rank-ekf", ["lofi", "ekf"],
          "LO-FI with rank L >= min(P, observations seen) = full EKF (MLP, 4 likelihoods)",
          "Chang 2023 eqs 13-43 vs Chang 2022 eqs 4-9",
          tolerance=1e-8, why="SVD of [W, H^T] then re-inversion of the DLR precision (cond ~1e3)")
def _lofi_full(rng):
    kind, model, lik, X, Y, theta0, v0, gamma, q = _nonlinear(rng, dynamics=True)
    C = model.out_dim - 1 if kind == "categorical" else model.out_dim
    L = min(model.n_params, len(X) * C + int(rng.integers(0, 2)))  # L >= t C, or L = P (the largest a filter keeps)
    variant = ("diagonal", "spherical")[int(rng.integers(2))]
    lo = rb.LoFi(model, lik, rank=L, variant=variant, gamma=gamma, q=q)
    # same shape as _rvga_ekf below: deliberate, each registered check reads alone as one identity
    return _pair(lo, rb.FullEKF(model, lik, gamma=gamma, q=q), theta0, v0, X, Y, _same_mean_and_precision)


@register("lofi-rank0-vdekf", ["lofi", "vdekf"],
          "LO-FI with rank 0 = VD-EKF with the exact-gain (\"ekf\") mean",
          "Chang 2023 eqs 13-43 vs Chang 2022 eqs 13-14")
def _lofi_rank0(rng):
    _, model, lik, X, Y, theta0, v0, gamma, q = _nonlinear(rng, dynamics=True)
    lo = rb.LoFi(model, lik, rank=0, gamma=gamma, q=q)
    vd = rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="ekf")
    return _pair(lo, vd, theta0, v0, X, Y,
                 lambda a, b: _worst(relerr(a.mean, b.mean), relerr(np.diag(a.precision()), np.diag(b.precision()))))


@register("lofi-kalman", ["lofi"],
          "LO-FI with L >= min(P, n) on a linear-Gaussian model = Kalman filter",
          "Chang 2023 eqs 13-43 vs the Kalman filter",
          tolerance=1e-8, why="SVD of [W, H^T] then re-inversion of the DLR precision (cond ~1e3)")
def _lofi_kalman(rng):
    model, lik, X, Y, mu0, v0, gamma, q, kf = _kalman_problem(rng)
    lo = rb.LoFi(model, lik, rank=min(model.n_params, len(X) * model.out_dim), gamma=gamma, q=q)
    return _against_kalman(lo, mu0, v0, X, Y, kf)


# ------------------------------------------------------------------------------------------------
# BONG (Jones, Chang & Murphy 2024)


@register("bong-lin-hess-ekf", ["bong", "ekf"],
          "BONG-LIN-HESS over the full (natural) Gaussian family = full EKF (MLP, 4 likelihoods)",
          "Jones 2024 eqs 120-121 with 128-132 vs Chang 2022 eqs 4-9")
def _bong_ekf(rng):
    _, model, lik, X, Y, theta0, v0, gamma, q = _nonlinear(rng, dynamics=True)
    bong = rb.Bong(model, lik, family="full", estimator="lin-hess", gamma=gamma, q=q)
    return _pair(bong, rb.FullEKF(model, lik, gamma=gamma, q=q), theta0, v0, X, Y, _same_gaussian)


@register("bong-kalman", ["bong"],
          "BONG-LIN-HESS, full family, on a linear-Gaussian model = Kalman filter (conjugacy)",
          "Jones 2024 Prop. 4.1, eqs 120-121")
def _bong_kalman(rng):
    model, lik, X, Y, mu0, v0, gamma, q, kf = _kalman_problem(rng)
    return _against_kalman(rb.Bong(model, lik, family="full", estimator="lin-hess", gamma=gamma, q=q),
                           mu0, v0, X, Y, kf)


@register("bong-diag-vdekf", ["bong", "vdekf"],
          "BONG-LIN-HESS diagonal natural = VD-EKF (paper mean; \"ekf\" mean), DLR rank 0 = VD-EKF (\"ekf\" mean)",
          "Jones 2024 eqs 212-215 vs Chang 2022 eqs 13-14")
def _bong_diag(rng):
    _, model, lik, X, Y, theta0, v0, gamma, q = _nonlinear(rng, dynamics=True)

    def cmp(a, b):
        return _worst(relerr(a.mean, b.mean), relerr(np.diag(a.precision()), np.diag(b.precision())))

    cases = ((dict(family="diag"), "paper"), (dict(family="diag", vd_mean="ekf"), "ekf"),
             (dict(family="dlr", rank=0), "ekf"))
    return _worst(*(_pair(rb.Bong(model, lik, estimator="lin-hess", gamma=gamma, q=q, **kw),
                          rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean=rule), theta0, v0, X, Y, cmp)
                    for kw, rule in cases))


@register("bong-dlr-lofi", ["bong", "lofi"],
          "BONG-LIN-HESS over the DLR family = LO-FI of the same rank (truncation included)",
          "Jones 2024 eqs 281-292 vs Chang 2023 eqs 13-43",
          tolerance=1e-8, why="two SVD routes to the same rank-L projection; W W^T compared, not W")
def _bong_lofi(rng):
    _, model, lik, X, Y, theta0, v0 = _nonlinear(rng, kinds=("gaussian", "categorical"))
    gamma, q = _dynamics(rng)
    rank = int(rng.integers(0, 4))
    bong = rb.Bong(model, lik, family="dlr", rank=rank, estimator="lin-hess", gamma=gamma, q=q)
    lo = rb.LoFi(model, lik, rank=rank, gamma=gamma, q=q)
    return _pair(bong, lo, theta0, v0, X, Y, _same_mean_and_precision)


# ------------------------------------------------------------------------------------------------
# R-VGA (Lambert, Bonnabel & Bach 2022)


@register("rvga-kalman", ["rvga"],
          "implicit and explicit R-VGA (Gauss-Hermite expectations) on a linear-Gaussian model = Kalman filter",
          "Lambert 2022 eqs 35-38 vs the Kalman filter")
def _rvga_kalman(rng):
    model, lik, X, Y, mu0, v0, gamma, q, kf = _kalman_problem(rng)
    return _worst(*(_against_kalman(rb.RVGA(model, lik, scheme=s, expectation="quadrature", gamma=gamma, q=q),
                                    mu0, v0, X, Y, kf) for s in ("implicit", "explicit")))


@register("rvga-linearized-ekf", ["rvga", "ekf"],
          "R-VGA with linearised expectations = full EKF (MLP, 4 likelihoods)",
          "Lambert 2022 Theorem 3, eqs 51-53 vs Chang 2022 eqs 4-9")
def _rvga_ekf(rng):
    _, model, lik, X, Y, theta0, v0, gamma, q = _nonlinear(rng, dynamics=True)
    scheme = ("implicit", "explicit")[int(rng.integers(2))]
    rv = rb.RVGA(model, lik, scheme=scheme, expectation="linearized", gamma=gamma, q=q)
    # same shape as _lofi_full above: deliberate, each registered check reads alone as one identity
    return _pair(rv, rb.FullEKF(model, lik, gamma=gamma, q=q), theta0, v0, X, Y, _same_gaussian)


# ------------------------------------------------------------------------------------------------
# subspace EKF (Duran-Martin, Kara & Murphy 2022)


@register("subspace-identity-ekf", ["subspace", "ekf"],
          "subspace EKF with basis A = I and offset 0 = full EKF on theta",
          "Duran-Martin 2022 sec. 3.4, eqs 58-64 vs Chang 2022 eqs 4-9")
def _subspace_ekf(rng):
    _, model, lik, X, Y, theta0, v0, gamma, q = _nonlinear(rng, dynamics=True)
    P = model.n_params
    sub = rb.SubspaceEKF(model, lik, basis=np.eye(P), offset=np.zeros(P), cov="full", gamma=gamma, q=q)
    return _pair(sub, rb.FullEKF(model, lik, gamma=gamma, q=q), theta0, v0, X, Y, _same_gaussian)


@register("subspace-orthogonal-equivariance", ["subspace", "ekf"],
          "subspace EKF with a square orthogonal basis A and offset theta*: A mu_z + theta* = EKF mean, "
          "A Sigma_z A^T = EKF covariance (gamma = 1 or theta* = 0)",
          "Duran-Martin 2022 sec. 3.4, eqs 58-64 vs Chang 2022 eqs 4-9")
def _subspace_orthogonal(rng):
    _, model, lik, X, Y, _, _, gamma, q = _nonlinear(rng, dynamics=True)
    P = model.n_params
    A, _ = np.linalg.qr(rng.standard_normal((P, P)))
    # gamma shrinks z towards 0, i.e. theta towards theta*, while the EKF shrinks theta towards 0:
    # so the identity needs gamma = 1 or theta* = 0; draw one of the two
    off = rng.standard_normal(P)
    if rng.integers(2):
        gamma = 1.0
    else:
        off = np.zeros(P)
    sub = rb.SubspaceEKF(model, lik, basis=A, offset=off, cov="full", gamma=gamma, q=q)
    ref = rb.FullEKF(model, lik, gamma=gamma, q=q)  # Q_theta = q A A^T = q I
    mu_z, var_z = 0.5 * rng.standard_normal(P), rng.uniform(0.2, 1.0, P)
    bz = rb.FullCov(mu_z, np.diag(var_z))
    Sz = A @ np.diag(var_z) @ A.T
    bt = rb.FullCov(A @ mu_z + off, 0.5 * (Sz + Sz.T))
    worst = 0.0
    for x, y in zip(X, Y):
        bz, bt = sub.predict(bz), ref.predict(bt)
        bz, bt = sub.update(bz, x, y), ref.update(bt, x, y)
        worst = max(worst, relerr(A @ bz.mean + off, bt.mean), relerr(A @ bz.covariance() @ A.T, bt.covariance()))
    return worst


@register("subspace-identity-diag", ["subspace", "fdekf", "vdekf"],
          "diagonal subspace EKF with A = I = FD-EKF, and = VD-EKF (both mean rules)",
          "Duran-Martin 2022 sec. 3.4 vs Chang 2022 eqs 10-14")
def _subspace_diag(rng):
    _, model, lik, X, Y, theta0, v0, gamma, q = _nonlinear(rng, dynamics=True)
    P = model.n_params
    kw = dict(gamma=gamma, q=q)
    pairs = [(rb.SubspaceEKF(model, lik, basis=np.eye(P), cov="diag", **kw), rb.FDEKF(model, lik, **kw))]
    for rule in ("paper", "ekf"):
        pairs.append((rb.SubspaceEKF(model, lik, basis=np.eye(P), cov="diag", diag_update="vd", vd_mean=rule, **kw),
                      rb.VDEKF(model, lik, vd_mean=rule, **kw)))
    return _worst(*(_pair(a, b, theta0, v0, X, Y, _same_gaussian) for a, b in pairs))


# ------------------------------------------------------------------------------------------------
# running


def select(methods: Iterable[str] | None = None) -> list[Check]:
    """The checks concerning any of ``methods`` (all when None); unknown names raise ValueError."""
    if methods is None:
        return list(CHECKS.values())
    methods = [m.lower() for m in methods]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(map(repr, unknown))}; choose from {', '.join(METHODS)}")
    return [c for c in CHECKS.values() if set(c.methods) & set(methods)]


def run_check(check: Check, seed: int = 0, thorough: bool = False, instances: int | None = None) -> CheckResult:
    """Run one check on ``instances`` fresh random instances; returns a CheckResult."""
    n = instances or (check.thorough_instances if thorough else check.instances)
    # one independent stream per check, so adding a check does not change the others' instances
    key = [int.from_bytes(check.name.encode(), "little") % (2**63), int(seed)]
    rng = np.random.default_rng(key)
    worst, msg = 0.0, ""
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            with np.errstate(all="ignore"):
                err = float(check.fn(rng))
        except Exception as exc:  # a filter that raises fails the identity; say why
            err, msg = math.inf, f"{type(exc).__name__}: {exc}"
        if not err <= worst:  # NaN counts as a failure
            worst = err if not math.isnan(err) else math.inf
        if msg:
            break
    return CheckResult(check.name, check.methods, check.identity, check.equation, n, worst, check.tolerance,
                       worst <= check.tolerance, time.perf_counter() - t0, msg)


def run_checks(methods: Iterable[str] | None = None, seed: int = 0, thorough: bool = False,
               blas_threads: int | None = 1) -> list[CheckResult]:
    """Run every registered check concerning ``methods`` (names in :data:`METHODS`; None: all).

    seed: base seed of the random instances; thorough: more instances per check;
    blas_threads: BLAS threads while the checks run (default 1: the matrices are tiny and
    a multi-threaded BLAS spends more time waking threads than computing, about 6x slower
    on 2 cores; None leaves BLAS as it is). The limit is lifted on return.
    Returns a list of :class:`CheckResult` (identity, equation, instances, worst error,
    tolerance, passed).
    """
    checks = select(methods)
    if blas_threads is None:
        return [run_check(c, seed=seed, thorough=thorough) for c in checks]
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(blas_threads), user_api="blas"):
        return [run_check(c, seed=seed, thorough=thorough) for c in checks]


def format_table(results: Sequence[CheckResult]) -> str:
    """Plain-text table of results: one row per identity (check, paper equations, instances,
    worst error, tolerance, ok/FAIL), with the identity itself on an indented line below."""
    rows = [("check", "paper equations", "inst", "worst err", "tol", "pass")]
    for r in results:
        err = "inf" if not math.isfinite(r.worst_error) else f"{r.worst_error:.1e}"
        rows.append((r.name, r.equation, str(r.instances), err, f"{r.tolerance:.0e}", "ok" if r.passed else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def fmt(row):
        return "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()

    lines = [fmt(rows[0]), "  ".join("-" * w for w in widths)]
    for r, row in zip(results, rows[1:]):
        lines += [fmt(row), f"    {r.identity}"]
    for r in results:
        if r.error:
            lines.append(f"{r.name}: {r.error}")
    return "\n".join(lines)
