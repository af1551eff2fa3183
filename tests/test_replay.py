"""Replay-buffer SGD baselines (refbayes.filters.replay): SGD-RB and OGD (docs/lofi.md §8)."""

import autograd
import numpy as np
import pytest
from autograd.scipy.special import logsumexp as ag_logsumexp
from hypothesis import given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes.errors import ConvergenceError
from refbayes.filters import replay
from refbayes.filters.replay import OGD, SGDRB, ReplayBelief

from problems import linear_model, small_mlp

FAST = settings(max_examples=25, deadline=None)
seeds = st.integers(0, 2**32 - 1)


def least_squares_grad(H_list, y_list, theta, obs_var):
    """Gradient of the mean Gaussian NLL for y = H theta + noise, written out by hand."""
    return np.mean([H.T @ (H @ theta - y) / obs_var for H, y in zip(H_list, y_list)], axis=0)


@FAST
@given(P=st.integers(1, 5), C=st.integers(1, 3), B=st.integers(1, 5), T=st.integers(1, 8),
       lr=st.floats(1e-3, 0.1), obs_var=st.floats(0.2, 3.0), seed=seeds)
def test_sgd_rb_step_is_gradient_descent_on_the_buffer(P, C, B, T, lr, obs_var, seed):
    rng = np.random.default_rng(seed)
    Hs, ys = rng.standard_normal((T, C, P)), rng.standard_normal((T, C))
    filt = SGDRB(linear_model(P, C), rb.Gaussian(obs_var), buffer_size=B, lr=lr)
    bel = filt.init(rng.standard_normal(P))
    for t in range(T):
        theta = bel.mean
        bel = filt.update(filt.predict(bel), Hs[t].ravel(), ys[t])
        lo = max(0, t + 1 - B)  # FIFO: the newest B observations
        assert bel.count == t + 1 - lo
        np.testing.assert_array_equal(np.array(bel.inputs), Hs[lo:t + 1].reshape(t + 1 - lo, -1))
        g = least_squares_grad(Hs[lo:t + 1], ys[lo:t + 1], theta, obs_var)
        np.testing.assert_allclose(bel.mean, theta - lr * g, rtol=1e-12, atol=1e-14)


def test_ogd_is_sgd_rb_with_one_slot():
    rng = np.random.default_rng(1)
    model = small_mlp(3, 4, 2)
    lik = rb.Gaussian(0.5)
    X, Y = rng.standard_normal((9, 3)), rng.standard_normal((9, 2))
    theta0 = model.init_params(rng)
    for opt in replay.OPTIMIZERS:
        a, ha = OGD(model, lik, lr=0.05, optimizer=opt).scan(ReplayBelief(theta0), X, Y)
        b, hb = SGDRB(model, lik, buffer_size=1, lr=0.05, optimizer=opt).scan(ReplayBelief(theta0), X, Y)
        np.testing.assert_array_equal(a.mean, b.mean)
        np.testing.assert_array_equal(ha["yhat"], hb["yhat"])
        assert a.count == 1


def test_adam_matches_a_hand_recursion():
    rng = np.random.default_rng(2)
    P, C = 3, 1
    Hs, ys = rng.standard_normal((4, C, P)), rng.standard_normal((4, C))
    lr, b1, b2, eps = 0.1, 0.8, 0.99, 1e-8
    filt = SGDRB(linear_model(P, C), rb.Gaussian(1.0), buffer_size=2, lr=lr, optimizer="adam", n_iter=2,
                 b1=b1, b2=b2, eps=eps)
    bel = filt.init(np.zeros(P))
    theta, m, v, k = np.zeros(P), np.zeros(P), np.zeros(P), 0
    for t in range(4):
        bel = filt.update(bel, Hs[t].ravel(), ys[t])
        lo = max(0, t - 1)
        for _ in range(2):
            k += 1
            g = least_squares_grad(Hs[lo:t + 1], ys[lo:t + 1], theta, 1.0)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            theta = theta - lr * (m / (1 - b1**k)) / (np.sqrt(v / (1 - b2**k)) + eps)
        np.testing.assert_allclose(bel.mean, theta, rtol=1e-12, atol=1e-14)
        assert bel.n_steps == k
    # the first Adam step moves each coordinate by lr |g| / (|g| + eps) (m_hat = g, v_hat = g^2)
    one = SGDRB(linear_model(P, C), rb.Gaussian(1.0), lr=lr, optimizer="adam", b1=b1, b2=b2, eps=eps)
    first = one.update(one.init(np.zeros(P)), Hs[0].ravel(), ys[0])
    g = least_squares_grad(Hs[:1], ys[:1], np.zeros(P), 1.0)
    np.testing.assert_allclose(first.mean, -lr * g / (np.abs(g) + eps), rtol=1e-12)


def test_classification_gradient_matches_autograd():
    rng = np.random.default_rng(3)
    K = 4
    model = small_mlp(3, 5, K)
    lik = rb.Categorical(K)
    theta = model.init_params(rng)
    X, Y = rng.standard_normal((5, 3)), rng.integers(0, K, 5)

    def mean_nll(th):
        total = 0.0
        for x, y in zip(X, Y):
            logits = model._forward(th, x)
            total = total - (logits[y] - ag_logsumexp(logits))
        return total / len(X)

    loss, g = replay.nll_and_grad(model, lik, theta, list(X), [float(y) for y in Y])
    np.testing.assert_allclose(loss, mean_nll(theta), rtol=1e-12)
    np.testing.assert_allclose(g, autograd.grad(mean_nll)(theta), rtol=1e-10, atol=1e-13)
    filt = SGDRB(model, lik, buffer_size=5, lr=0.3)
    bel = filt.update_batch(filt.init(theta), X, Y)
    np.testing.assert_allclose(bel.mean, theta - 0.3 * g, rtol=1e-12, atol=1e-14)
    assert filt.loss(bel) < loss  # a small step downhill


def test_full_buffer_gradient_descent_converges_to_least_squares():
    rng = np.random.default_rng(4)
    N, P = 8, 3
    X = rng.standard_normal((N, P))
    y = X @ rng.standard_normal(P) + 0.1 * rng.standard_normal(N)
    model = rb.Linear(P, 1, bias=False)
    # lr below 2 / lambda_max(X^T X / N) for the mean squared loss with obs_var 1
    lr = 1.0 / np.linalg.eigvalsh(X.T @ X / N).max()
    filt = SGDRB(model, rb.Gaussian(1.0), buffer_size=N, lr=lr, n_iter=400)
    bel = filt.update_batch(filt.init(np.zeros(P)), X, y[:, None])
    np.testing.assert_allclose(bel.mean, np.linalg.lstsq(X, y, rcond=None)[0], rtol=1e-8)


def test_scan_history_callback_and_plugin_predictive():
    rng = np.random.default_rng(5)
    model = small_mlp(2, 3, 3)
    filt = SGDRB(model, rb.Categorical(3), buffer_size=3, lr=0.1, optimizer="adam")
    X, Y = rng.standard_normal((6, 2)), rng.integers(0, 3, 6)
    bel0 = filt.init(model.init_params(rng))
    out, hist = filt.scan(bel0, X, Y, callback=lambda t, bp, b, x, y: b.mean.copy())
    assert hist["yhat"].shape == (6, 2)  # drop_last: K - 1 entries
    bel = bel0
    for t, (x, y) in enumerate(zip(X, Y)):
        bel = filt.update(bel, x, y)
        np.testing.assert_array_equal(hist["callback"][t], bel.mean)
    np.testing.assert_array_equal(out.mean, bel.mean)
    assert bel0.count == 0 and bel0.n_steps == 0  # untouched
    mean, cov = filt.predict_obs(out, X[0])
    logits = model.apply(out.mean, X[0])
    np.testing.assert_allclose(mean, np.exp(logits) / np.exp(logits).sum(), rtol=1e-12)
    total, _ = rb.predictive.prequential_log_likelihood(filt, bel0, X, Y, method="plugin")
    assert np.isfinite(total) and total < 0
    with pytest.raises(ValueError, match="plugin"):
        filt.predict_obs(out, X[0], method="linearized")


def test_beliefs_are_immutable_and_inputs_are_checked():
    rng = np.random.default_rng(6)
    model = small_mlp(2, 2, 1)
    lik = rb.Gaussian(1.0)
    filt = SGDRB(model, lik, buffer_size=2)
    bel = filt.update(filt.init(model.init_params(rng)), np.ones(2), 0.5)
    assert not bel.mean.flags.writeable and not bel.inputs[0].flags.writeable
    with pytest.raises(AttributeError):
        bel.mean = np.zeros(model.n_params)
    with pytest.raises(ValueError, match="buffer_size"):
        SGDRB(model, lik, buffer_size=0)
    with pytest.raises(ValueError, match="lr"):
        SGDRB(model, lik, lr=-1.0)
    with pytest.raises(ValueError, match="optimizer"):
        SGDRB(model, lik, optimizer="rmsprop")
    with pytest.raises(ValueError, match="n_iter"):
        OGD(model, lik, n_iter=0)
    with pytest.raises(ValueError, match="mean"):
        filt.init(np.zeros(3))
    with pytest.raises(ValueError):
        filt.update(bel, np.ones(3), 0.5)
    with pytest.raises(ValueError):
        filt.update(bel, np.ones(2), np.nan)
    with pytest.raises(ValueError, match="must be in"):
        SGDRB(small_mlp(2, 2, 3), rb.Categorical(3)).update(ReplayBelief(np.zeros(small_mlp(2, 2, 3).n_params)),
                                                            np.ones(2), 5)
    with pytest.raises(TypeError, match="ReplayBelief"):
        filt.update(rb.Diag(np.zeros(model.n_params), np.ones(model.n_params)), np.ones(2), 0.5)
    with pytest.raises(ConvergenceError):
        SGDRB(rb.Linear(1, 1), lik, lr=1e200).update(ReplayBelief(np.ones(2)), [1e200], 0.0)
