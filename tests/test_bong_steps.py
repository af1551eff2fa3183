"""Each inner step of bong/algorithms.py against an independent autograd derivation.

For a quadratic expected log-likelihood E(mu, Sigma) = b^T mu + mu^T A mu / 2 + tr(A Sigma) / 2
(A = -U U^T), the estimates g = b + A mu and G = A are exact at every belief. Then:

- BOG / BBB are one plain gradient step on E (BOG) or E - KL(q || prior) (BBB) in the
  family's own parameters;
- BONG / BLR are one natural-gradient step, i.e. natural parameters move by the gradient
  with respect to the mean parameters (mu, Sigma + mu mu^T) (moment families: the Fisher
  preconditioner blockdiag(Sigma, 2 Sigma (x) Sigma)).

The gradients come from autograd applied to E and KL written here; nothing is taken from
the code under test.
"""

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from refbayes.beliefs import DLR, Diag, FullCov
from refbayes.errors import NotPositiveDefiniteError
from refbayes.filters.bong import algorithms
from refbayes.filters.bong.estimators import Curvature

FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALGORITHMS = ["bong", "blr", "bog", "bbb"]


def per_case(n_cases, total=20):
    """Hypothesis settings for one of ``n_cases`` parametrised (algorithm, family) cases: every case
    runs (pytest parametrize), and the numeric draws share about ``total`` examples between them."""
    return settings(max_examples=max(3, -(-total // n_cases)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
seed_st = st.integers(0, 2**31 - 1)
P = 3


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / max(np.max(np.abs(b)), 1e-300))


def spd(rng, n, scale):
    A = rng.standard_normal((n, n))
    return scale * (A @ A.T / n + 0.5 * np.eye(n))


def pd(S):
    return bool(np.all(np.linalg.eigvalsh(0.5 * (S + S.T)) > 0))


def check(step, args, ok, compare):
    """Run step(*args); when the expected result is not positive definite it must raise."""
    if not ok:
        with pytest.raises(NotPositiveDefiniteError):
            step(*args)
        return
    compare(step(*args))


def problem(seed):
    rng = np.random.default_rng(seed)
    U = 0.5 * rng.standard_normal((P, 2))
    b = rng.standard_normal(P)
    mu_p, mu = rng.standard_normal(P), rng.standard_normal(P)
    return rng, U, -U @ U.T, b, mu_p, mu


# ------------------------------------------------------------------------------------------
# full covariance


def E_full(A, b):
    return lambda mu, S: anp.dot(b, mu) + 0.5 * anp.dot(mu, anp.dot(A, mu)) + 0.5 * anp.trace(anp.dot(A, S))


def kl_full(mu_p, S_p):
    L_p = np.linalg.inv(S_p)
    ld_p = np.linalg.slogdet(S_p)[1]

    def kl(mu, S):
        d = mu - mu_p
        return 0.5 * (anp.trace(anp.dot(L_p, S)) + anp.dot(d, anp.dot(L_p, d)) - P + ld_p - anp.linalg.slogdet(S)[1])
    return kl


def objective_full(alg, A, b, prior):
    E = E_full(A, b)
    if alg in ("bong", "bog"):
        return E
    kl = kl_full(prior.mean, prior.cov)
    return lambda mu, S: E(mu, S) - kl(mu, S)


@pytest.mark.parametrize("alg", ALGORITHMS)
@per_case(4)
@given(seed=seed_st, alpha=st.floats(0.05, 0.5), dense=st.booleans())
def test_full_natural_steps(alg, seed, alpha, dense):
    rng, U, A, b, mu_p, mu = problem(seed)
    prior = FullCov(mu_p, spd(rng, P, 0.3))
    cur = prior if alg in ("bong", "bog") else FullCov(mu, spd(rng, P, 0.3))
    L = objective_full(alg, A, b, prior)
    curv = Curvature.from_dense(A) if dense else Curvature.from_factor(U)
    g = b + A @ cur.mean
    lam = np.linalg.inv(cur.cov)
    psi1, psi2 = lam @ cur.mean, -0.5 * lam
    if alg in ("bong", "blr"):
        # natural parameters += alpha * gradient wrt mean parameters (m1, m2) = (mu, Sigma + mu mu^T)
        Lm = lambda m1, m2: L(m1, m2 - anp.outer(m1, m1))
        m1, m2 = cur.mean, cur.cov + np.outer(cur.mean, cur.mean)
        n1, n2 = psi1 + alpha * autograd.grad(Lm, 0)(m1, m2), psi2 + alpha * autograd.grad(Lm, 1)(m1, m2)
        cov = np.linalg.inv(-2 * n2)

        def cmp(got):
            assert rel(got.cov, cov) < 1e-9 and rel(got.mean, cov @ n1) < 1e-9
        check(algorithms.get_step(alg, "full-natural"), (cur, prior, g, curv, alpha), pd(-2 * n2), cmp)
        return
    Lpsi = lambda p1, p2: L(anp.dot(-0.5 * anp.linalg.inv(p2), p1), -0.5 * anp.linalg.inv(p2))
    d1, d2 = autograd.grad(Lpsi, 0)(psi1, psi2), autograd.grad(Lpsi, 1)(psi1, psi2)
    step = algorithms.get_step(alg, "full-natural")
    for sym in (True, False):
        n2 = psi2 + alpha * (0.5 * (d2 + d2.T) if sym else d2)  # paper: gradient wrt unconstrained psi2
        lam_new = -2 * n2
        mean = np.linalg.solve(lam_new, psi1 + alpha * d1)
        cov = np.linalg.inv(lam_new)

        def cmp(got):
            assert rel(got.mean, mean) < 1e-9
            assert rel(got.cov, 0.5 * (cov + cov.T)) < 1e-9
        check(lambda *a: step(*a, symmetrize=sym), (cur, prior, g, curv, alpha), pd(lam_new) and pd(cov), cmp)


@pytest.mark.parametrize("alg", ALGORITHMS)
@per_case(4)
@given(seed=seed_st, alpha=st.floats(0.05, 0.5), dense=st.booleans())
@example(seed=176, alpha=0.5, dense=False)  # BOG: Sigma_p - (alpha/2) U U^T indefinite outside the span of U
def test_full_moment_steps(alg, seed, alpha, dense):
    rng, U, A, b, mu_p, mu = problem(seed)
    prior = FullCov(mu_p, spd(rng, P, 0.3))
    cur = prior if alg in ("bong", "bog") else FullCov(mu, spd(rng, P, 0.3))
    L = objective_full(alg, A, b, prior)
    dmu, dS = autograd.grad(L, 0)(cur.mean, cur.cov), autograd.grad(L, 1)(cur.mean, cur.cov)
    if alg in ("bong", "blr"):  # Fisher preconditioner blockdiag(Sigma, 2 Sigma (x) Sigma)
        mean, cov = cur.mean + alpha * cur.cov @ dmu, cur.cov + 2 * alpha * cur.cov @ dS @ cur.cov
    else:
        mean, cov = cur.mean + alpha * dmu, cur.cov + alpha * dS
    curv = Curvature.from_dense(A) if dense else Curvature.from_factor(U)

    def cmp(got):
        assert rel(got.mean, mean) < 1e-9 and rel(got.cov, cov) < 1e-9
    check(algorithms.get_step(alg, "full"), (cur, prior, b + A @ cur.mean, curv, alpha), pd(cov), cmp)


# ------------------------------------------------------------------------------------------
# diagonal


def objective_diag(alg, A, b, prior):
    a = np.diag(A)

    def E(mu, s):
        return anp.dot(b, mu) + 0.5 * anp.dot(mu, anp.dot(A, mu)) + 0.5 * anp.dot(a, s)
    if alg in ("bong", "bog"):
        return E
    mp, sp = prior.mean, prior.var

    def kl(mu, s):
        return 0.5 * anp.sum(s / sp + (mu - mp) ** 2 / sp - 1.0 + anp.log(sp) - anp.log(s))
    return lambda mu, s: E(mu, s) - kl(mu, s)


@pytest.mark.parametrize("natural", [True, False], ids=["diag-natural", "diag"])
@pytest.mark.parametrize("alg", ALGORITHMS)
@per_case(8)
@given(seed=seed_st, alpha=st.floats(0.02, 0.3))
def test_diag_steps(alg, natural, seed, alpha):
    rng, U, A, b, mu_p, mu = problem(seed)
    prior = Diag(mu_p, rng.uniform(0.2, 0.6, P))
    cur = prior if alg in ("bong", "bog") else Diag(mu, rng.uniform(0.2, 0.6, P))
    L = objective_diag(alg, A, b, prior)
    m, s = cur.mean, cur.var
    if natural:
        psi1, psi2 = m / s, -0.5 / s
        if alg in ("bong", "blr"):
            Lm = lambda m1, m2: L(m1, m2 - m1**2)
            n1 = psi1 + alpha * autograd.grad(Lm, 0)(m, s + m**2)
            n2 = psi2 + alpha * autograd.grad(Lm, 1)(m, s + m**2)
        else:
            Lpsi = lambda p1, p2: L(-0.5 * p1 / p2, -0.5 / p2)
            n1 = psi1 + alpha * autograd.grad(Lpsi, 0)(psi1, psi2)
            n2 = psi2 + alpha * autograd.grad(Lpsi, 1)(psi1, psi2)
        var = -0.5 / n2
        mean = var * n1
    else:
        dmu, ds = autograd.grad(L, 0)(m, s), autograd.grad(L, 1)(m, s)
        if alg in ("bong", "blr"):
            mean, var = m + alpha * s * dmu, s + 2 * alpha * s**2 * ds
        else:
            mean, var = m + alpha * dmu, s + alpha * ds
    family = "diag-natural" if natural else "diag"
    for curv in (Curvature.from_factor(U), Curvature.from_diag(np.diag(A)), Curvature.from_dense(A)):

        def cmp(got):
            assert rel(got.mean, mean) < 1e-9 and rel(got.var, var) < 1e-9
        check(algorithms.get_step(alg, family), (cur, prior, b + A @ m, curv, alpha), bool(np.all(var > 0)), cmp)


# ------------------------------------------------------------------------------------------
# DLR: BOG and BBB are plain gradient steps on (mu, ups, W); BONG and BLR are tested
# against the full-natural steps in test_bong_oracles.py (O5a) and the projection (O5b).


@pytest.mark.parametrize("alg", ["bog", "bbb"])
@per_case(2)
@given(seed=seed_st, alpha=st.floats(0.02, 0.3), R=st.integers(0, 3))
def test_dlr_gradient_steps(alg, seed, alpha, R):
    rng, U, A, b, mu_p, mu = problem(seed)
    prior = DLR(mu_p, rng.uniform(1.0, 3.0, P), 0.5 * rng.standard_normal((P, R)))
    cur = prior if alg == "bog" else DLR(mu, rng.uniform(1.0, 3.0, P), 0.5 * rng.standard_normal((P, R)))
    L = objective_full(alg, A, b, FullCov(prior.mean, prior.covariance()))
    Ld = lambda m, u, W: L(m, anp.linalg.inv(anp.diag(u) + anp.dot(W, W.T)))
    args = (cur.mean, cur.ups, cur.W)
    mean = cur.mean + alpha * autograd.grad(Ld, 0)(*args)
    ups = cur.ups + alpha * autograd.grad(Ld, 1)(*args)
    W = cur.W + alpha * autograd.grad(Ld, 2)(*args) if R > 0 else cur.W

    def cmp(got):
        assert rel(got.mean, mean) < 1e-9 and rel(got.ups, ups) < 1e-9
        if R > 0:
            assert rel(got.W, W) < 1e-9
    check(algorithms.get_step(alg, "dlr"), (cur, prior, b + A @ cur.mean, Curvature.from_factor(U), alpha),
          bool(np.all(ups > 0)), cmp)


def test_dlr_steps_reject_dense_curvature():
    rng = np.random.default_rng(0)
    bel = DLR(np.zeros(P), np.ones(P), rng.standard_normal((P, 1)))
    for alg in ("bong", "blr", "bog", "bbb"):
        with pytest.raises(ValueError, match="low-rank curvature factor"):
            algorithms.get_step(alg, "dlr")(bel, bel, np.zeros(P), Curvature.from_dense(-np.eye(P)), 0.5)
    with pytest.raises(ValueError, match="alpha"):
        algorithms.dlr_blr(bel, bel, np.zeros(P), Curvature.from_factor(np.ones((P, 1))), 1.5)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_dlr_w_from_zero_stays_zero_for_bog_and_bbb_and_grows_for_bong_and_blr(backend):
    # docs/bong.md §5: BOG's and BBB's W steps are multiples of W (eqs 309-318, 321), so from the paper's
    # W0 = 0 the low-rank part stays exactly zero; BONG's and BLR's projections take directions from U
    import refbayes as rb

    model, lik = rb.MLP([4, 5, 2]), rb.Gaussian(0.5)
    for alg, lr in (("bong", None), ("blr", 0.5), ("bog", 0.05), ("bbb", 0.05)):
        rng = np.random.default_rng(0)
        kw = {} if lr is None else {"lr": lr, "n_iter": 2 if alg in ("blr", "bbb") else 1}
        f = rb.Bong(model, lik, algorithm=alg, family="dlr", estimator="lin-hess", rank=2, backend=backend, **kw)
        bel = f.init(model.init_params(rng), 0.5)
        assert not np.any(bel.W)
        for _ in range(3):
            bel = f.predict_update(bel, rng.standard_normal(4), rng.standard_normal(2))
        if alg in ("bog", "bbb"):
            assert not np.any(bel.W), alg
        else:
            assert np.abs(bel.W).max() > 0.1, alg
