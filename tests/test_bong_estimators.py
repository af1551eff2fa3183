"""Gradient / Hessian estimators of the BONG family (docs/bong.md §2, oracle O7).

Monte Carlo estimators are checked for unbiasedness against closed-form
expectations, with bounds of 6 standard errors computed from the sample size.
Linearised estimators are checked against exact derivatives from autograd.
"""

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes.beliefs import DLR, Diag, FullCov
from refbayes.filters.bong import estimators as E

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
seed_st = st.integers(0, 2**31 - 1)


def spd(rng, n, scale=1.0):
    A = rng.standard_normal((n, n))
    return scale * (A @ A.T / n + 0.5 * np.eye(n))


def linear_gaussian(rng, D=2, C=2):
    model = rb.Linear(D, C, bias=True)
    R = spd(rng, C, 0.7)
    x, y = rng.standard_normal(D), rng.standard_normal(C)
    J = model.jacobian(np.zeros(model.n_params), x)
    return model, rb.Gaussian(R), R, x, y, J


# ------------------------------------------------------------------------------------------
# Monte Carlo unbiasedness on a linear-Gaussian model


def test_mc_ef_unbiased_linear_gaussian():
    rng = np.random.default_rng(0)
    model, lik, R, x, y, J = linear_gaussian(rng)
    P = model.n_params
    bel = FullCov(rng.standard_normal(P), spd(rng, P, 0.5))
    M = 4000
    est = E.mc_ef(model, lik, bel.sample(np.random.default_rng(1), M), [x], [y])
    # grad l(theta) = A (y - J theta), A = J^T R^{-1}: Gaussian with mean m, covariance S
    A = J.T @ np.linalg.inv(R)
    m = A @ (y - J @ bel.mean)
    S = A @ J @ bel.cov @ J.T @ A.T
    assert np.all(np.abs(est.g - m) <= 6 * np.sqrt(np.diag(S) / M))
    # E[g g^T] = m m^T + S; Var(a_i a_j) for a ~ N(m, S)
    G = est.curvature.dense()
    d = np.diag(S)
    var = np.outer(d, d) + S**2 + np.outer(m**2, d) + np.outer(d, m**2) + 2 * np.outer(m, m) * S
    assert np.all(np.abs(-G - (np.outer(m, m) + S)) <= 6 * np.sqrt(var / M))
    assert est.curvature.factor().shape == (P, M)


def test_mc_hess_linear_gaussian_hessian_exact_and_gradient_unbiased():
    rng = np.random.default_rng(2)
    model, lik, R, x, y, J = linear_gaussian(rng)
    P = model.n_params
    bel = FullCov(rng.standard_normal(P), spd(rng, P, 0.5))
    M = 3000
    est = E.mc_hess(model, lik, bel.sample(np.random.default_rng(3), M), [x], [y])
    exact_G = -J.T @ np.linalg.inv(R) @ J
    assert np.max(np.abs(est.curvature.dense() - exact_G)) < 1e-12 * np.abs(exact_G).max()
    A = J.T @ np.linalg.inv(R)
    S = A @ J @ bel.cov @ J.T @ A.T
    assert np.all(np.abs(est.g - A @ (y - J @ bel.mean)) <= 6 * np.sqrt(np.diag(S) / M))


def test_hutchinson_diagonal_unbiased():
    rng = np.random.default_rng(4)
    model, lik, R, x, y, J = linear_gaussian(rng, D=3, C=2)
    H = -J.T @ np.linalg.inv(R) @ J  # constant Hessian, not diagonal
    P = model.n_params
    bel = Diag(rng.standard_normal(P), rng.uniform(0.1, 1.0, P))
    M, N = 5, 40000  # Linear model: probes are one matrix product
    est = E.mc_hess(model, lik, bel.sample(rng, M), [x], [y], curvature="hutchinson",
                    rng=np.random.default_rng(5), n_probes=N)
    # Var(z_i (H z)_i) = sum_{j != i} H_ij^2 for Rademacher z
    off = np.sum(H**2, axis=1) - np.diag(H) ** 2
    assert est.curvature.kind == "diag"
    assert np.all(np.abs(est.curvature.diag() - np.diag(H)) <= 6 * np.sqrt(off / (M * N)) + 1e-12)
    exact = E.mc_hess(model, lik, bel.sample(rng, 2), [x], [y], curvature="exact-diag")
    assert np.allclose(exact.curvature.diag(), np.diag(H), rtol=1e-12, atol=0)


def test_mc_hess_unbiased_on_quadratic_model():
    # f(theta) = theta^T A theta / 2 with a Gaussian likelihood: closed-form E[grad l], E[hess l].
    rng = np.random.default_rng(6)
    P, r, y = 3, 0.5, 0.7
    A = rng.standard_normal((P, P))
    A = A + A.T
    model = rb.Function(lambda th, x: 0.5 * anp.dot(th, anp.dot(A, th)), n_params=P, out_dim=1, in_dim=1)
    lik = rb.Gaussian(r)
    mu, S = 0.5 * rng.standard_normal(P), spd(rng, P, 0.2)
    M = 600
    thetas = FullCov(mu, S).sample(np.random.default_rng(7), M)
    est = E.mc_hess(model, lik, thetas, [np.zeros(1)], [np.array([y])])
    Ef = 0.5 * (np.trace(A @ S) + mu @ A @ mu)
    g_exact = A @ (y * mu - Ef * mu - S @ A @ mu) / r  # Stein: E[f theta] = E[f] mu + S A mu
    G_exact = (-A @ (S + np.outer(mu, mu)) @ A + (y - Ef) * A) / r
    # 6 standard errors from the per-draw spread (each draw's terms checked against autograd below)
    grads = np.array([E.loglik_grad(model, lik, th, [np.zeros(1)], [np.array([y])]) for th in thetas])
    hess = np.array([E.loglik_hessian(model, lik, th, [np.zeros(1)], [np.array([y])]) for th in thetas])
    assert np.all(np.abs(est.g - g_exact) <= 6 * grads.std(axis=0) / np.sqrt(M))
    assert np.all(np.abs(est.curvature.dense() - G_exact) <= 6 * hess.std(axis=0) / np.sqrt(M) + 1e-12)
    ll = lambda th: -0.5 * (y - 0.5 * anp.dot(th, anp.dot(A, th))) ** 2 / r
    th = thetas[0]
    assert np.allclose(grads[0], autograd.grad(ll)(th), rtol=1e-10, atol=1e-12)
    assert np.allclose(hess[0], autograd.hessian(ll)(th), rtol=1e-10, atol=1e-12)


def test_antithetic_draws_have_exact_mean_and_right_law():
    rng = np.random.default_rng(8)
    P = 4
    bel = DLR(rng.standard_normal(P), rng.uniform(0.5, 2.0, P), rng.standard_normal((P, 2)))
    th = E.draw_params(bel, np.random.default_rng(1), 6, antithetic=True)
    assert th.shape == (6, P)
    assert np.allclose(th.mean(axis=0), bel.mean, rtol=0, atol=1e-14)
    plain = E.draw_params(bel, np.random.default_rng(1), 3)
    assert np.array_equal(th[:3], plain)
    with pytest.raises(TypeError, match="rng"):
        E.draw_params(bel, None, 3)


# ------------------------------------------------------------------------------------------
# O7: linearised estimators


def _glm_loglik(kind, model, x, y):
    def ll(theta):
        eta = model.apply(theta, x)
        if kind == "bernoulli":
            return anp.sum(y * eta - anp.logaddexp(0.0, eta))
        if kind == "poisson":
            return anp.sum(y * eta - anp.exp(eta))
        return eta[y] - anp.log(anp.sum(anp.exp(eta)))
    return ll


@pytest.mark.parametrize("kind", ["bernoulli", "poisson", "categorical", "categorical-full"])
@settings(max_examples=7, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=seed_st)
def test_o7_glm_lin_hess_equals_exact_derivatives(kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "bernoulli":
        model, lik, y = rb.Linear(3, 2), rb.Bernoulli(), rng.integers(0, 2, 2)
    elif kind == "poisson":
        model, lik, y = rb.Linear(3, 2), rb.Poisson(), rng.poisson(1.0, 2)
    else:
        mode = "full" if kind.endswith("full") else "drop_last"
        model, lik, y = rb.Linear(3, 3), rb.Categorical(3, mode=mode), int(rng.integers(0, 3))
    m = 0.5 * rng.standard_normal(model.n_params)
    x = rng.standard_normal(3)
    ll = _glm_loglik(kind.split("-")[0], model, x, y)
    est = E.lin_hess(model, lik, m, [x], [y])
    assert np.allclose(est.g, autograd.grad(ll)(m), rtol=1e-9, atol=1e-12)
    H = autograd.hessian(ll)(m)
    assert np.allclose(est.curvature.dense(), H, rtol=1e-8, atol=1e-11 * np.abs(H).max())
    ef = E.lin_ef(model, lik, m, [x], [y])
    assert np.allclose(ef.g, est.g, rtol=1e-14, atol=0)
    assert np.allclose(ef.curvature.dense(), -np.outer(est.g, est.g), rtol=1e-14, atol=0)


@FAST
@given(seed_st)
def test_o7_nonlinear_lin_hess_is_generalised_gauss_newton(seed):
    # Prop. 4.2: (J_f^T (y - p), -J_f^T V J_f) with V = diag(p) - p p^T for softmax outputs
    rng = np.random.default_rng(seed)
    model, lik = rb.MLP([2, 3, 3]), rb.Categorical(3)
    m = model.init_params(rng)
    x, y = rng.standard_normal(2), int(rng.integers(0, 3))
    Jf = model.jacobian(m, x)
    eta = model.apply(m, x)
    p = np.exp(eta - eta.max())
    p /= p.sum()
    V = np.diag(p) - np.outer(p, p)
    est = E.lin_hess(model, lik, m, [x], [y])
    assert np.allclose(est.g, Jf.T @ (np.eye(3)[y] - p), rtol=1e-9, atol=1e-12)
    assert np.allclose(est.curvature.dense(), -Jf.T @ V @ Jf, rtol=1e-8, atol=1e-12)


def test_batch_is_sum_of_observations():
    rng = np.random.default_rng(9)
    model, lik = rb.MLP([2, 3, 1]), rb.Gaussian(0.4)
    m = model.init_params(rng)
    X, Y = rng.standard_normal((3, 2)), rng.standard_normal((3, 1))
    one = [E.lin_hess(model, lik, m, [x], [y]) for x, y in zip(X, Y)]
    batch = E.lin_hess(model, lik, m, list(X), list(Y))
    assert np.allclose(batch.g, sum(e.g for e in one), rtol=1e-12)
    assert np.allclose(batch.curvature.dense(), sum(e.curvature.dense() for e in one), rtol=1e-12)
    thetas = FullCov(m, 0.1 * np.eye(model.n_params)).sample(rng, 2)
    mc = E.mc_ef(model, lik, thetas, list(X), list(Y))
    per = [E.loglik_grad(model, lik, th, list(X), list(Y)) for th in thetas]
    assert np.allclose(mc.g, np.mean(per, axis=0), rtol=1e-12)


def test_curvature_forms_agree():
    rng = np.random.default_rng(10)
    U = rng.standard_normal((5, 2))
    f = E.Curvature.from_factor(U)
    d = E.Curvature.from_dense(-U @ U.T)
    S = spd(rng, 5)
    assert np.allclose(f.diag(), d.diag(), rtol=1e-14)
    assert np.allclose(f.sandwich(S), d.sandwich(S), rtol=1e-12)
    with pytest.raises(ValueError, match="factor"):
        d.factor()
    with pytest.raises(ValueError, match="diagonal"):
        E.Curvature.from_diag(np.ones(5)).dense()
    with pytest.raises(ValueError, match="kind"):
        E.Curvature("sparse", np.ones(5))


def test_mc_ef_reports_a_diverged_draw_as_divergence():
    # a draw whose network output overflows is a numerical failure, not bad input
    import refbayes as rb
    from refbayes.filters.bong import estimators as E

    model = rb.MLP([2, 3, 2], activation="relu")
    lik = rb.Categorical(2)
    theta = np.full(model.n_params, 1e200)
    with pytest.raises(rb.DivergenceError), np.errstate(over="ignore", invalid="ignore"):
        E.mc_ef(model, lik, theta[None, :], [np.ones(2)], [1])
