"""Noise that changes with time: per-step gamma, q and observation noise.

Constant per-step values give the static filter's numbers bit for bit; for a
linear-Gaussian model the full-covariance filters equal a Kalman filter with time-varying
R_t, Q_t and gamma_t written here from its equations.
"""

import numpy as np
import pytest

import refbayes as rb


def _kalman(model, mu, Sigma, X, Y, gammas, qs, Rs):
    P = len(mu)
    for x, y, g, q, R in zip(X, Y, gammas, qs, Rs):
        mu, Sigma = g * mu, g * g * Sigma + q * np.eye(P)
        H = model.jacobian(mu, x)
        S = H @ Sigma @ H.T + R
        K = Sigma @ H.T @ np.linalg.inv(S)
        mu, Sigma = mu + K @ (y - model.apply(mu, x)), Sigma - K @ S @ K.T
    return mu, Sigma


def _problem(rng, T=12):
    model = rb.MLP([3, 2])  # linear
    X, Y = rng.standard_normal((T, 3)), rng.standard_normal((T, 2))
    gammas = rng.uniform(0.8, 1.0, T)
    qs = rng.uniform(0.0, 0.1, T)
    A = rng.standard_normal((T, 2, 2))
    Rs = A @ A.transpose(0, 2, 1) + 0.1 * np.eye(2)
    return model, X, Y, gammas, qs, Rs


@pytest.mark.parametrize("make", [
    lambda m, l: rb.FullEKF(m, l),
    lambda m, l: rb.LoFi(m, l, rank=30),
    lambda m, l: rb.LoFi(m, l, rank=30, backend="numba"),
], ids=["FullEKF", "LoFi", "LoFi-numba"])
def test_time_varying_linear_gaussian_equals_the_kalman_filter(make):
    rng = np.random.default_rng(1)
    model, X, Y, gammas, qs, Rs = _problem(rng)
    filt = make(model, rb.Gaussian(1.0))
    mu0 = rng.standard_normal(model.n_params)
    bel, res = filt.scan(filt.init(mu0, 0.5), X, Y, gamma=gammas, q=qs, obs_var=Rs)
    mu, Sigma = _kalman(model, mu0, 0.5 * np.eye(model.n_params), X, Y, gammas, qs, Rs)
    np.testing.assert_allclose(bel.mean, mu, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bel.covariance(), Sigma, rtol=1e-10, atol=1e-12)
    # step by step through predict / update keywords: the same numbers
    b = filt.init(mu0, 0.5)
    for t in range(len(X)):
        b = filt.update(filt.predict(b, gamma=gammas[t], q=qs[t]), X[t], Y[t], obs_var=Rs[t])
    np.testing.assert_allclose(b.mean, mu, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [
    lambda m, l: rb.FullEKF(m, l, gamma=0.9, q=0.01),
    lambda m, l: rb.FDEKF(m, l, gamma=0.9, q=0.01, backend="numba"),
    lambda m, l: rb.VDEKF(m, l, gamma=0.9, q=0.01),
    lambda m, l: rb.LoFi(m, l, rank=3, gamma=0.9, q=0.01, backend="numba"),
    lambda m, l: rb.Bong(m, l, family="dlr", rank=3, gamma=0.9, q=0.01),
], ids=["FullEKF", "FDEKF-numba", "VDEKF", "LoFi-numba", "Bong-dlr"])
def test_constant_per_step_noise_is_the_static_filter_bit_for_bit(make):
    rng = np.random.default_rng(2)
    model = rb.MLP([2, 4, 2])
    T = 15
    X, Y = rng.standard_normal((T, 2)), rng.standard_normal((T, 2))
    filt = make(model, rb.Gaussian(0.3))
    bel0 = filt.init(model.init_params(rng), 0.5)
    static, r0 = filt.scan(bel0, X, Y)
    varying, r1 = filt.scan(bel0, X, Y, gamma=np.full(T, 0.9), q=np.full(T, 0.01), obs_var=np.full(T, 0.3))
    np.testing.assert_array_equal(static.mean, varying.mean)
    np.testing.assert_array_equal(r0.log_pred, r1.log_pred)


def test_per_step_values_are_checked_before_the_first_step():
    rng = np.random.default_rng(3)
    model = rb.MLP([2, 3, 1])
    filt = rb.FDEKF(model, rb.Gaussian(0.3))
    bel = filt.init(model.init_params(rng), 0.5)
    X, Y = rng.standard_normal((4, 2)), rng.standard_normal((4, 1))
    with pytest.raises(ValueError, match="q must be a scalar or hold one value per step"):
        filt.scan(bel, X, Y, q=np.zeros(3))
    with pytest.raises(ValueError, match="gamma"):
        filt.scan(bel, X, Y, gamma=np.array([1.0, 1.0, 1.5, 1.0]))
    with pytest.raises(ValueError, match="obs_var"):
        filt.scan(bel, X, Y, obs_var=np.array([0.1, -0.1, 0.1, 0.1]))
    with pytest.raises(ValueError, match="Gaussian"):
        rb.FDEKF(model, rb.Bernoulli()).with_noise(obs_var=0.1)
    assert filt.with_noise() is filt
    other = filt.with_noise(obs_var=0.7, q=0.2)
    assert other is not filt and filt.q == 0.0 and float(filt.likelihood.obs_var) == 0.3
    assert other.q == 0.2 and float(other.likelihood.obs_var) == 0.7
