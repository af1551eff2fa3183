"""Tests for refbayes.likelihoods: moments, derivatives, categorical modes, whitening, sampling."""

import autograd.numpy as anp
import numpy as np
import pytest
import scipy.stats as ss
from autograd import grad as ag_grad
from autograd import hessian as ag_hessian
from autograd.scipy.special import logsumexp as ag_logsumexp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit
from scipy.special import softmax as sp_softmax

import refbayes as rb
from refbayes.errors import NotPositiveDefiniteError
from refbayes.likelihoods import (
    Bernoulli,
    Categorical,
    Gaussian,
    Likelihood,
    Poisson,
    logits_factor,
    whiten,
)

FAST = settings(max_examples=25, deadline=None)
seeds = st.integers(0, 2**32 - 1)


def spd(rng, n):
    A = rng.normal(size=(n, n))
    return A @ A.T / n + 0.5 * np.eye(n)


def fd_jacobian(f, x, h=1e-6):
    """Central differences of f: R^n -> R^m (or scalar), returned as (m, n)."""
    cols = []
    for i in range(x.size):
        d = np.zeros_like(x)
        d[i] = h
        cols.append((np.atleast_1d(f(x + d)) - np.atleast_1d(f(x - d))) / (2 * h))
    return np.stack(cols, axis=-1)


# One case per likelihood configuration: (likelihood, C_f, draw a valid y).
def _cases():
    rng = np.random.default_rng(1234)
    S = spd(rng, 3)
    return {
        "gauss-scalar": (Gaussian(0.7), 3, lambda r: r.normal(size=3)),
        "gauss-diag": (Gaussian(np.array([0.5, 1.0, 2.0])), 3, lambda r: r.normal(size=3)),
        "gauss-matrix": (Gaussian(S), 3, lambda r: r.normal(size=3)),
        "bernoulli": (Bernoulli(), 3, lambda r: r.integers(0, 2, size=3)),
        "bernoulli-1": (Bernoulli(), 1, lambda r: r.integers(0, 2, size=1)),
        "poisson": (Poisson(), 3, lambda r: r.poisson(2.0, size=3)),
        "cat-drop": (Categorical(4), 4, lambda r: int(r.integers(0, 4))),
        "cat-full": (Categorical(4, mode="full"), 4, lambda r: int(r.integers(0, 4))),
    }


CASES = _cases()
case_names = pytest.mark.parametrize("name", sorted(CASES))


# --- log-likelihoods written independently with autograd ---------------------------------------


def ag_log_prob(name, y, eta):
    lik = CASES[name][0]
    if name.startswith("gauss"):
        R = np.diag(np.broadcast_to(lik.obs_var, (eta.shape[0],))) if lik.obs_var.ndim < 2 else lik.obs_var
        r = y - eta
        return -0.5 * anp.dot(r, anp.linalg.solve(R, r)) - 0.5 * np.linalg.slogdet(2 * np.pi * R)[1]
    if name.startswith("bernoulli"):
        return anp.sum(y * eta - anp.logaddexp(0.0, eta))
    if name == "poisson":
        return anp.sum(y * eta - anp.exp(eta)) - np.sum([np.log(np.arange(1, k + 1)).sum() for k in y])
    return eta[y] - ag_logsumexp(eta)


# --- dimensions and flags -----------------------------------------------------------------------


def test_obs_dim_and_flags():
    assert Gaussian().obs_dim(3) == 3
    assert Bernoulli().obs_dim(2) == 2
    assert Poisson().obs_dim(5) == 5
    assert Categorical(5).obs_dim(5) == 4
    assert Categorical(5, mode="full").obs_dim(5) == 5
    assert Categorical(5, mode="full").singular
    assert not Categorical(5, mode="full", jitter=1e-6).singular
    assert not Categorical(5).singular and not Gaussian().singular
    assert Categorical(3).is_classification and Bernoulli().is_classification
    assert not Gaussian().is_classification and not Poisson().is_classification
    assert Categorical(3).n_classes == 3
    assert all(isinstance(c[0], Likelihood) for c in CASES.values())


@case_names
def test_output_shapes(name):
    lik, cf, draw = CASES[name]
    rng = np.random.default_rng(0)
    eta = rng.normal(size=cf)
    C = lik.obs_dim(cf)
    assert lik.encode(draw(rng), cf).shape == (C,)
    assert lik.mean(eta).shape == (C,)
    assert lik.mean_jacobian(eta).shape == (C, cf)
    assert lik.cov(eta).shape == (C, C)
    assert lik.grad(draw(rng), eta).shape == (cf,)
    assert lik.hessian(draw(rng), eta).shape == (cf, cf)
    assert isinstance(lik.log_prob(draw(rng), eta), float)
    one = lik.sample(eta, rng)
    many = lik.sample(eta, rng, size=(2, 5))
    assert np.shape(many) == (2, 5) + np.shape(one)
    lik.encode(one, cf)  # a draw is a valid observation


# --- moments against closed forms computed here -------------------------------------------------


@given(seed=seeds)
@FAST
def test_moments_closed_forms(seed):
    rng = np.random.default_rng(seed)
    eta = rng.normal(size=4) * 2
    p = sp_softmax(eta)
    Lam = np.diag(p) - np.outer(p, p)
    np.testing.assert_allclose(Categorical(4, mode="full").mean(eta), p, rtol=1e-12)
    np.testing.assert_allclose(Categorical(4).mean(eta), p[:3], rtol=1e-12)
    np.testing.assert_allclose(Categorical(4, mode="full").cov(eta), Lam, atol=1e-15)
    np.testing.assert_allclose(Categorical(4).cov(eta), Lam[:3, :3], atol=1e-15)
    s = expit(eta)
    np.testing.assert_allclose(Bernoulli().mean(eta), s, rtol=1e-12)
    np.testing.assert_allclose(Bernoulli().cov(eta), np.diag(s * (1 - s)), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(Poisson().cov(eta), np.diag(np.exp(eta)), rtol=1e-12)
    S = spd(rng, 4)
    np.testing.assert_allclose(Gaussian(S).cov(eta), S, rtol=1e-12)
    np.testing.assert_allclose(Gaussian(2.5).cov(eta), 2.5 * np.eye(4))
    np.testing.assert_allclose(Gaussian(2.5, jitter=0.1).cov(eta), 2.6 * np.eye(4))
    np.testing.assert_array_equal(Gaussian().mean(eta), eta)


@given(seed=seeds)
@FAST
def test_canonical_link_jacobian_equals_cov(seed):
    rng = np.random.default_rng(seed)
    eta = rng.normal(size=4) * 2
    for lik in (Bernoulli(), Poisson(), Categorical(4, mode="full")):
        np.testing.assert_allclose(lik.mean_jacobian(eta), lik.cov(eta), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(
        Categorical(4).mean_jacobian(eta), Categorical(4, mode="full").cov(eta)[:3], rtol=1e-12, atol=1e-300
    )


@case_names
@given(seed=seeds)
@FAST
def test_mean_jacobian_vs_finite_differences(name, seed):
    lik, cf, _ = CASES[name]
    eta = np.random.default_rng(seed).normal(size=cf) * 1.5
    fd = fd_jacobian(lik.mean, eta)
    np.testing.assert_allclose(lik.mean_jacobian(eta), fd, rtol=1e-6, atol=1e-8 * max(1.0, np.abs(fd).max()))


def test_bernoulli_prob_clip():
    c = 1e-3
    lik = Bernoulli(prob_clip=c)
    eta = np.array([-20.0, 0.3, 20.0])
    np.testing.assert_allclose(lik.mean(eta), [c, expit(0.3), 1 - c], rtol=1e-12)
    want = [c * (1 - c), expit(0.3) * expit(-0.3), c * (1 - c)]
    np.testing.assert_allclose(np.diag(lik.cov(eta)), want, rtol=1e-12)
    # the clipped mean is flat where the clip is active; elsewhere d sigmoid
    np.testing.assert_allclose(lik.mean_jacobian(eta), fd_jacobian(lik.mean, eta), atol=1e-9)
    # exact likelihood is unclipped
    np.testing.assert_allclose(lik.log_prob([0, 1, 1], eta), Bernoulli().log_prob([0, 1, 1], eta))


# --- exact log-likelihood -----------------------------------------------------------------------


@given(seed=seeds)
@FAST
def test_log_prob_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    eta = rng.normal(size=3) * 2
    y = rng.normal(size=3) * 2
    v = rng.uniform(0.2, 3.0, size=3)
    S = spd(rng, 3)
    np.testing.assert_allclose(Gaussian(v[0]).log_prob(y, eta), ss.norm.logpdf(y, eta, np.sqrt(v[0])).sum())
    np.testing.assert_allclose(Gaussian(v).log_prob(y, eta), ss.norm.logpdf(y, eta, np.sqrt(v)).sum())
    np.testing.assert_allclose(Gaussian(S).log_prob(y, eta), ss.multivariate_normal.logpdf(y, eta, S))
    yb = rng.integers(0, 2, size=3)
    np.testing.assert_allclose(Bernoulli().log_prob(yb, eta), ss.bernoulli.logpmf(yb, expit(eta)).sum())
    yp = rng.poisson(3.0, size=3)
    np.testing.assert_allclose(Poisson().log_prob(yp, eta), ss.poisson.logpmf(yp, np.exp(eta)).sum())
    k = int(rng.integers(0, 3))
    for mode in Categorical.MODES:
        np.testing.assert_allclose(
            Categorical(3, mode=mode).log_prob(k, eta), ss.multinomial.logpmf(np.eye(3)[k], 1, sp_softmax(eta))
        )


@given(seed=seeds)
@FAST
def test_log_prob_batch_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    N = 7
    ETA = rng.normal(size=(N, 3))
    Y = rng.normal(size=(N, 3))
    S = spd(rng, 3)
    want = np.array([ss.multivariate_normal.logpdf(Y[n], ETA[n], S) for n in range(N)])
    np.testing.assert_allclose(Gaussian(S).log_prob_batch(Y, ETA), want)
    np.testing.assert_allclose(Gaussian(0.3).log_prob_batch(Y, ETA), ss.norm.logpdf(Y, ETA, np.sqrt(0.3)).sum(1))
    Yb = rng.integers(0, 2, size=(N, 3))
    np.testing.assert_allclose(Bernoulli().log_prob_batch(Yb, ETA), ss.bernoulli.logpmf(Yb, expit(ETA)).sum(1))
    Yp = rng.poisson(2.0, size=(N, 3))
    np.testing.assert_allclose(Poisson().log_prob_batch(Yp, ETA), ss.poisson.logpmf(Yp, np.exp(ETA)).sum(1))
    k = rng.integers(0, 3, size=N)
    want = np.log(sp_softmax(ETA, axis=1))[np.arange(N), k]
    np.testing.assert_allclose(Categorical(3).log_prob_batch(k, ETA), want)


def test_extreme_logits_are_stable():
    b = Bernoulli()
    assert b.log_prob([1], [800.0]) == pytest.approx(0.0, abs=1e-300)
    assert b.log_prob([0], [800.0]) == pytest.approx(-800.0)
    assert b.log_prob([1], [-800.0]) == pytest.approx(-800.0)
    c = Categorical(3, mode="full")
    eta = np.array([1000.0, 0.0, -1000.0])
    assert c.log_prob(0, eta) == pytest.approx(0.0, abs=1e-300)
    assert c.log_prob(2, eta) == pytest.approx(-2000.0)
    for f in (c.mean, c.cov, c.mean_jacobian, Categorical(3).cov):
        assert np.all(np.isfinite(f(eta)))
    np.testing.assert_allclose(c.mean(eta), [1.0, 0.0, 0.0], atol=1e-300)
    # near-certain class: the full covariance still annihilates the ones vector
    eta = np.array([40.0, 0.0, 1.0])
    R = c.cov(eta)
    assert np.all(np.abs(R @ np.ones(3)) <= 1e-15 * np.abs(R).max())


# --- derivatives of the exact log-likelihood ----------------------------------------------------


@case_names
@given(seed=seeds)
@FAST
def test_grad_hessian_vs_finite_differences_and_autograd(name, seed):
    lik, cf, draw = CASES[name]
    rng = np.random.default_rng(seed)
    eta = rng.normal(size=cf) * 1.5
    y = draw(rng)
    g = lik.grad(y, eta)
    Hs = lik.hessian(y, eta)
    fd_g = fd_jacobian(lambda t: lik.log_prob(y, t), eta, h=1e-5)[0]
    np.testing.assert_allclose(g, fd_g, rtol=1e-6, atol=1e-7)
    fd_H = fd_jacobian(lambda t: lik.grad(y, t), eta, h=1e-5)
    np.testing.assert_allclose(Hs, fd_H, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(Hs, Hs.T, atol=1e-15)
    f = lambda t: ag_log_prob(name, y, t)  # noqa: E731
    np.testing.assert_allclose(lik.log_prob(y, eta), f(eta), rtol=1e-12)
    np.testing.assert_allclose(g, ag_grad(f)(eta), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(Hs, ag_hessian(f)(eta), rtol=1e-10, atol=1e-12)


# --- categorical modes (drop last class vs full K with pseudo-inverse) --------------------------


@given(K=st.integers(2, 6), P=st.integers(1, 8), seed=seeds, scale=st.floats(0.1, 2.5))
@FAST
def test_categorical_modes_agree(K, P, seed, scale):
    rng = np.random.default_rng(seed)
    eta = rng.normal(size=K) * scale
    J = rng.normal(size=(K, P))
    y = int(rng.integers(0, K))
    p = sp_softmax(eta)
    Lam = np.diag(p) - np.outer(p, p)
    A_ref = J.T @ Lam @ J  # Gauss-Newton matrix
    b_ref = J.T @ (np.eye(K)[y] - p)  # score
    tol = dict(rtol=1e-8, atol=1e-11 * max(1.0, np.abs(J).max() ** 2))

    drop, full = Categorical(K), Categorical(K, mode="full")
    Hd = drop.mean_jacobian(eta) @ J
    Rd = drop.cov(eta)
    ed = drop.encode(y, K) - drop.mean(eta)
    Hf = full.mean_jacobian(eta) @ J
    Rf = full.cov(eta)
    ef = full.encode(y, K) - full.mean(eta)
    assert Hd.shape == (K - 1, P) and Hf.shape == (K, P)

    np.testing.assert_allclose(Hd.T @ np.linalg.solve(Rd, Hd), A_ref, **tol)
    np.testing.assert_allclose(Hd.T @ np.linalg.solve(Rd, ed), b_ref, **tol)
    Rf_pinv = np.linalg.pinv(Rf, rtol=1e-12, hermitian=True)
    np.testing.assert_allclose(Hf.T @ Rf_pinv @ Hf, A_ref, **tol)
    np.testing.assert_allclose(Hf.T @ Rf_pinv @ ef, b_ref, **tol)
    B = logits_factor(eta)
    np.testing.assert_allclose(B @ B.T, Lam, atol=1e-15)
    np.testing.assert_allclose(J.T @ B @ B.T @ J, A_ref, **tol)

    Gd, gd = whiten(Hd, Rd, ed, singular=drop.singular)
    Gf, gf = whiten(Hf, Rf, ef, singular=full.singular)
    assert Gd.shape == (P, K - 1) and Gf.shape == (P, K - 1)
    for G, g in ((Gd, gd), (Gf, gf)):
        np.testing.assert_allclose(G @ G.T, A_ref, **tol)
        np.testing.assert_allclose(g, b_ref, **tol)


@pytest.mark.parametrize("mode", Categorical.MODES)
def test_categorical_jitter_converges(mode):
    rng = np.random.default_rng(7)
    K, P = 5, 6
    eta = rng.normal(size=K)
    J = rng.normal(size=(K, P))
    y = 2
    p = sp_softmax(eta)
    A_ref = J.T @ (np.diag(p) - np.outer(p, p)) @ J
    b_ref = J.T @ (np.eye(K)[y] - p)

    def err(eps):
        lik = Categorical(K, mode=mode, jitter=eps)
        assert not lik.singular
        H = lik.mean_jacobian(eta) @ J
        R = lik.cov(eta)
        e = lik.encode(y, K) - lik.mean(eta)
        G, g = whiten(H, R, e)
        return max(
            np.abs(G @ G.T - A_ref).max() / np.abs(A_ref).max(),
            np.abs(g - b_ref).max() / np.abs(b_ref).max(),
        )

    e4, e6, e8 = err(1e-4), err(1e-6), err(1e-8)
    assert e8 < e6 < e4
    assert e8 < 1e-6
    assert e4 > 1e-7  # the jitter does perturb the update


# --- whiten on generic matrices -----------------------------------------------------------------


@given(C=st.integers(1, 5), P=st.integers(1, 7), seed=seeds)
@FAST
def test_whiten_nonsingular(C, P, seed):
    rng = np.random.default_rng(seed)
    H = rng.normal(size=(C, P))
    R = spd(rng, C)
    e = rng.normal(size=C)
    G, g = whiten(H, R, e)
    assert G.shape == (P, C)
    np.testing.assert_allclose(G @ G.T, H.T @ np.linalg.solve(R, H), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, H.T @ np.linalg.solve(R, e), rtol=1e-10, atol=1e-12)


@given(C=st.integers(2, 6), P=st.integers(1, 7), seed=seeds, data=st.data())
@FAST
def test_whiten_singular(C, P, seed, data):
    r = data.draw(st.integers(1, C - 1))
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.normal(size=(C, C)))[0][:, :r]
    R = U @ np.diag(rng.uniform(0.5, 2.0, size=r)) @ U.T
    H = rng.normal(size=(C, P))  # not restricted to range(R)
    e = rng.normal(size=C)
    G, g = whiten(H, R, e, singular=True)
    assert G.shape == (P, r)
    Rp = np.linalg.pinv(R, rtol=1e-10, hermitian=True)
    np.testing.assert_allclose(G @ G.T, H.T @ Rp @ H, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(g, H.T @ Rp @ e, rtol=1e-9, atol=1e-11)


def test_whiten_rejects_bad_R():
    H, e = np.ones((2, 3)), np.ones(2)
    singular = np.array([[1.0, 1.0], [1.0, 1.0]])
    with pytest.raises(NotPositiveDefiniteError, match="R"):
        whiten(H, singular, e)
    with pytest.raises(NotPositiveDefiniteError, match="R"):
        whiten(H, np.diag([1.0, -1.0]), e, singular=True)
    with pytest.raises(ValueError, match="R"):
        whiten(H, np.eye(3), e)
    with pytest.raises(ValueError, match="e"):
        whiten(H, np.eye(2), np.ones(3))
    assert issubclass(NotPositiveDefiniteError, ValueError)


# --- sampling -----------------------------------------------------------------------------------


@case_names
def test_sample_moments(name):
    lik, cf, _ = CASES[name]
    rng = np.random.default_rng(99)
    eta = rng.normal(size=cf) * 0.8
    n = 4000
    draws = lik.sample(eta, rng, size=n)
    T = np.array([lik.encode(y, cf) for y in draws])
    m, R = lik.mean(eta), lik.cov(eta)
    # sample mean: 6 standard errors
    se_mean = np.sqrt(np.diag(R) / n)
    assert np.all(np.abs(T.mean(0) - m) <= 6 * se_mean), (T.mean(0), m)
    # second moments about the true mean: E[d d^T] = R; standard error from the products themselves
    d = T - m
    prod = d[:, :, None] * d[:, None, :]
    se_cov = prod.std(0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(prod.mean(0) - R) <= 6 * se_cov + 1e-12), (prod.mean(0), R)


def test_sample_frequencies_many_draws():
    # vectorised, so many draws: 6 standard errors are about 0.005 here
    rng = np.random.default_rng(3)
    n = 200_000
    eta = np.array([0.3, -1.0, 0.9, 0.0])
    p = sp_softmax(eta)
    freq = np.bincount(Categorical(4).sample(eta, rng, size=n), minlength=4) / n
    assert np.all(np.abs(freq - p) <= 6 * np.sqrt(p * (1 - p) / n))
    s = expit(eta)
    freq = Bernoulli().sample(eta, rng, size=n).mean(0)
    assert np.all(np.abs(freq - s) <= 6 * np.sqrt(s * (1 - s) / n))
    lam = np.exp(eta)
    avg = Poisson().sample(eta, rng, size=n).mean(0)
    assert np.all(np.abs(avg - lam) <= 6 * np.sqrt(lam / n))


def test_sample_is_reproducible_and_needs_generator():
    lik = Categorical(3)
    eta = np.array([0.1, -0.4, 0.8])
    a = lik.sample(eta, np.random.default_rng(5), size=10)
    b = lik.sample(eta, np.random.default_rng(5), size=10)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="rng"):
        lik.sample(eta, 5)


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obs_var",
    [
        -1.0, 0.0, np.nan, np.inf,  # scalars
        [1.0, 0.0], [1.0, -2.0],  # vectors
        [[1.0, 2.0], [2.0, 1.0]], [[1.0, 0.5], [0.2, 1.0]], np.ones((2, 3)),  # not PD / not symmetric / not square
    ],
)
def test_bad_obs_var(obs_var):
    with pytest.raises(ValueError, match="obs_var"):
        Gaussian(obs_var)


def test_bad_targets():
    cases = [
        (lambda: Gaussian().encode([1.0, np.nan], 2), "y"),
        (lambda: Gaussian().encode([1.0, 2.0, 3.0], 2), "y"),
        (lambda: Gaussian().log_prob([np.inf], [0.0]), "y"),
        (lambda: Categorical(3).encode(3, 3), "y"),
        (lambda: Categorical(3).encode(-1, 3), "y"),
        (lambda: Categorical(3).encode(1.5, 3), "y"),
        (lambda: Categorical(3).encode(np.nan, 3), "y"),
        (lambda: Categorical(3).encode([0, 1], 3), "y"),
        (lambda: Categorical(3).log_prob(5, np.zeros(3)), "y"),
        (lambda: Categorical(3).log_prob_batch([0, 3], np.zeros((2, 3))), "Y"),
        (lambda: Bernoulli().encode([0.5], 1), "y"),
        (lambda: Bernoulli().grad([2.0], [0.0]), "y"),
        (lambda: Poisson().encode([-1.0], 1), "y"),
        (lambda: Poisson().encode([1.5], 1), "y"),
        (lambda: Categorical(3).mean([0.0, np.nan, 1.0]), "eta"),
    ]
    for call, arg in cases:
        with pytest.raises(ValueError, match=arg):
            call()


def test_bad_constructor_and_dims():
    with pytest.raises(ValueError, match="n_classes"):
        Categorical(1)
    with pytest.raises(ValueError, match="n_classes"):
        Categorical(2.5)
    with pytest.raises(ValueError, match="mode"):
        Categorical(3, mode="pinv")
    with pytest.raises(ValueError, match="jitter"):
        Categorical(3, jitter=-1e-3)
    with pytest.raises(ValueError, match="prob_clip"):
        Bernoulli(prob_clip=0.7)
    with pytest.raises(ValueError, match="out_dim"):
        Categorical(3).check_out_dim(4)
    with pytest.raises(ValueError, match="out_dim"):
        Gaussian(np.eye(2)).check_out_dim(3)
    with pytest.raises(ValueError, match="out_dim"):
        Gaussian([1.0, 2.0, 3.0]).obs_dim(2)
    with pytest.raises(ValueError, match="out_dim"):
        Categorical(3).mean(np.zeros(4))
    Gaussian(np.eye(2)).check_out_dim(2)
    Gaussian(0.5).check_out_dim(7)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_zero_variance_from_the_likelihood_is_named_with_its_remedies(backend):
    """A Poisson rate exp(eta) that underflows to 0 (or a saturated Bernoulli probability) gives R a zero
    variance: the error says so and names the remedies, not only "use singular=True"; a jitter fixes it."""
    model = rb.Linear(2, 1)
    for lik, y in ((rb.Poisson(), np.array([0.0])), (rb.Bernoulli(), 0)):
        filt = rb.LoFi(model, lik, rank=1, backend=backend)
        bel = filt.init(np.full(3, -400.0), 1.0)  # eta = -1200
        with pytest.raises(rb.NotPositiveDefiniteError, match="variance 0.0 for output 0.*jitter"):
            filt.update(bel, np.ones(2), y)
    jittered = rb.LoFi(model, rb.Poisson(jitter=1e-6), rank=1, backend=backend)
    new = jittered.update(jittered.init(np.full(3, -400.0), 1.0), np.ones(2), np.array([0.0]))
    assert np.all(np.isfinite(new.mean))
    # a covariance that is merely indefinite keeps the plain message
    with pytest.raises(rb.NotPositiveDefiniteError, match="^R is not positive definite; use singular"):
        whiten(np.ones((2, 3)), np.array([[1.0, 2.0], [2.0, 1.0]]), np.zeros(2))


@pytest.mark.parametrize("kind", ["lofi", "vdekf", "bong-dlr", "blr-dlr", "bog-dlr", "bbb-dlr", "bong-diag",
                                  "blr-diag", "bbb-diag-moment"])
def test_the_compiled_mlp_steps_name_a_saturated_r_as_the_reference_does(kind):
    """A softmax saturated to 0 and 1 gives R zero variances: every compiled MLP step (the fused LO-FI
    and VD-EKF steps, BONG's estimates over DLR and its fused diagonal steps) raises the reference's
    error, which names the output and the remedies, not a generic "R is not positive definite"."""
    model = rb.MLP([2, 3, 3])
    lik = rb.Categorical(3)
    theta = np.zeros(model.n_params)
    theta[-3:] = [800.0, -800.0, 0.0]  # the output biases: probabilities 1, 0, 0

    def make(backend):
        if kind == "lofi":
            return rb.LoFi(model, lik, rank=2, backend=backend)
        if kind == "vdekf":
            return rb.VDEKF(model, lik, backend=backend)
        algorithm, family = kind.split("-", 1)
        return rb.Bong(model, lik, algorithm=algorithm, family=family, estimator="lin-hess", rank=2,
                       lr=None if algorithm == "bong" else 0.1, n_iter=2 if algorithm in ("blr", "bbb") else 1,
                       backend=backend)

    messages = []
    for backend in ("numpy", "numba"):
        filt = make(backend)
        with pytest.raises(rb.NotPositiveDefiniteError, match="variance 0.0 for output 0.*jitter") as err:
            filt.update(filt.init(theta, 1e-3), np.ones(2), 1)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


def test_repr_names_the_likelihood_and_rebuilds_it():
    # a likelihood's repr is its constructor call (arrays are shown by shape); filters' reprs show it
    names = {"Gaussian": rb.Gaussian, "Bernoulli": rb.Bernoulli, "Poisson": rb.Poisson, "Categorical": rb.Categorical}
    for lik in (rb.Gaussian(0.5), rb.Gaussian(2.0, jitter=1e-3), rb.Bernoulli(), rb.Bernoulli(prob_clip=1e-6),
                rb.Poisson(), rb.Categorical(3), rb.Categorical(4, mode="full", jitter=1e-4)):
        back = eval(repr(lik), names)
        assert type(back) is type(lik) and repr(back) == repr(lik)
        assert vars(back).keys() == vars(lik).keys()
    assert repr(rb.Gaussian(np.eye(2))) == "Gaussian(obs_var=<2x2 array>)"
    filt = rb.FDEKF(rb.MLP([2, 3, 3]), rb.Categorical(3), backend="numba", dtype=np.float32)
    assert "likelihood=Categorical(3)" in repr(filt) and "backend='numba', dtype=float32" in repr(filt)
