"""FullEKF against the exact oracles (Kalman filter, joint posterior, conjugate regression)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes import exact
from refbayes.filters import ekf
from refbayes.predictive import prequential_log_likelihood

from problems import linear_gaussian_stream, linear_model, random_spd, small_mlp

dims = dict(
    T=st.integers(1, 6), C=st.integers(1, 3), P=st.integers(1, 5),
    gamma=st.floats(0.5, 1.0), q=st.floats(0.0, 0.5), prior_var=st.floats(0.1, 3.0),
    seed=st.integers(0, 2**32 - 1),
)


def run_ekf(form, P, C, Hs, ys, R, gamma, q, mu0, prior_var):
    filt = rb.FullEKF(linear_model(P, C), rb.Gaussian(R), gamma=gamma, q=q, form=form)
    bel = filt.init(mu0, prior_var)
    out = []
    for H, y in zip(Hs, ys):
        bel = filt.update(filt.predict(bel), H.ravel(), y)
        out.append(bel)
    return out


@settings(max_examples=40, deadline=None)
@given(form=st.sampled_from(ekf.FORMS), **dims)
def test_full_ekf_equals_kalman_filter_every_step(form, T, C, P, gamma, q, prior_var, seed):
    rng = np.random.default_rng(seed)
    Hs, ys, R = linear_gaussian_stream(rng, T, C, P)
    mu0 = rng.standard_normal(P)
    kf = exact.kalman_filter(mu0, prior_var * np.eye(P), Hs, ys, R, gamma, q)
    beliefs = run_ekf(form, P, C, Hs, ys, R, gamma, q, mu0, prior_var)
    for t, bel in enumerate(beliefs):
        np.testing.assert_allclose(bel.mean, kf.means[t], rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(bel.cov, kf.covs[t], rtol=1e-9, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(**dims)
def test_full_ekf_equals_joint_posterior_with_dynamics(T, C, P, gamma, q, prior_var, seed):
    rng = np.random.default_rng(seed)
    Hs, ys, R = linear_gaussian_stream(rng, T, C, P)
    mu0 = rng.standard_normal(P)
    bel = run_ekf("covariance", P, C, Hs, ys, R, gamma, q, mu0, prior_var)[-1]
    mean, cov, _ = exact.joint_filtering_posterior(mu0, prior_var * np.eye(P), Hs, ys, R, gamma, q)
    np.testing.assert_allclose(bel.mean, mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(bel.cov, cov, rtol=1e-9, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(form=st.sampled_from(ekf.FORMS), **dims)
def test_static_full_ekf_equals_conjugate_posterior_in_any_order(form, T, C, P, gamma, q, prior_var, seed):
    rng = np.random.default_rng(seed)
    Hs, ys, R = linear_gaussian_stream(rng, T, C, P)
    mu0 = rng.standard_normal(P)
    mean, cov = exact.blr_posterior(mu0, prior_var * np.eye(P), Hs, ys, R)
    for order in (np.arange(T), rng.permutation(T)):
        bel = run_ekf(form, P, C, Hs[order], ys[order], R, 1.0, 0.0, mu0, prior_var)[-1]
        np.testing.assert_allclose(bel.mean, mean, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(bel.cov, cov, rtol=1e-9, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(**dims)
def test_prequential_log_likelihood_equals_log_evidence(T, C, P, gamma, q, prior_var, seed):
    rng = np.random.default_rng(seed)
    Hs, ys, R = linear_gaussian_stream(rng, T, C, P)
    mu0 = rng.standard_normal(P)
    X = Hs.reshape(T, -1)
    static = rb.FullEKF(linear_model(P, C), rb.Gaussian(R))
    total, _ = prequential_log_likelihood(static, static.init(mu0, prior_var), X, ys)
    assert total == pytest.approx(exact.blr_log_evidence(mu0, prior_var * np.eye(P), Hs, ys, R), rel=1e-9, abs=1e-9)
    # with dynamics: equals the Kalman filter's evidence and the batch joint evidence
    dyn = rb.FullEKF(linear_model(P, C), rb.Gaussian(R), gamma=gamma, q=q)
    total, _ = prequential_log_likelihood(dyn, dyn.init(mu0, prior_var), X, ys)
    _, _, logev = exact.joint_filtering_posterior(mu0, prior_var * np.eye(P), Hs, ys, R, gamma, q)
    assert total == pytest.approx(logev, rel=1e-9, abs=1e-9)


def test_scan_equals_hand_written_loop_with_dynamics():
    rng = np.random.default_rng(11)
    model = small_mlp(3, 5, 2)
    lik = rb.Gaussian(0.3)
    X = rng.standard_normal((12, 3))
    Y = rng.standard_normal((12, 2))
    for Filt in (rb.FullEKF, rb.FDEKF, rb.VDEKF):
        filt = Filt(model, lik, gamma=0.95, q=0.01)
        bel0 = filt.init(model.init_params(rng), 0.5)
        bel = bel0
        seen = []
        for x, y in zip(X, Y):
            bel = filt.update(filt.predict(bel), x, y)
            seen.append(bel.mean)
        out, hist = filt.scan(bel0, X, Y, callback=lambda t, bp, b, x, y: b.mean)
        np.testing.assert_array_equal(out.mean, bel.mean)
        np.testing.assert_array_equal(out.covariance(), bel.covariance())
        np.testing.assert_array_equal(np.array(hist["callback"]), np.array(seen))
        assert hist["yhat"].shape == (12, 2)


def test_nonlinear_classification_forms_agree():
    """Covariance, Joseph and information forms, and drop-last vs full-class (pinv) modes."""
    rng = np.random.default_rng(2)
    K = 4
    model = small_mlp(3, 4, K)
    theta0 = model.init_params(rng)
    X = rng.standard_normal((8, 3))
    Y = rng.integers(0, K, 8)
    results = []
    for mode in ("drop_last", "full"):
        for form in ekf.FORMS:
            filt = rb.FullEKF(model, rb.Categorical(K, mode=mode), form=form, gamma=0.9, q=0.01)
            bel, _ = filt.scan(filt.init(theta0, 0.5), X, Y)
            results.append(bel)
    for bel in results[1:]:
        np.testing.assert_allclose(bel.mean, results[0].mean, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(bel.cov, results[0].cov, rtol=1e-8, atol=1e-10)


def test_ekf_update_matches_textbook_formula_on_mlp():
    """One update from a dense prior written out with explicit inverses (test-only)."""
    rng = np.random.default_rng(4)
    model = small_mlp(2, 3, 2)
    P = model.n_params
    Sigma = random_spd(rng, P)
    mu = model.init_params(rng)
    x, y = rng.standard_normal(2), rng.standard_normal(2)
    R = random_spd(rng, 2)
    filt = rb.FullEKF(model, rb.Gaussian(R))
    out = filt.update(rb.FullCov(mu, Sigma), x, y)
    H = model.jacobian(mu, x)
    S = H @ Sigma @ H.T + R
    K = Sigma @ H.T @ np.linalg.inv(S)
    np.testing.assert_allclose(out.mean, mu + K @ (y - model.apply(mu, x)), rtol=1e-10)
    np.testing.assert_allclose(out.cov, Sigma - K @ S @ K.T, rtol=1e-9, atol=1e-12)


def test_scan_progress_bar_reports_every_step(capsys):
    rng = np.random.default_rng(12)
    model = small_mlp(2, 3, 1)
    filt = rb.VDEKF(model, rb.Gaussian(0.5))
    X, Y = rng.standard_normal((7, 2)), rng.standard_normal((7, 1))
    filt.scan(filt.init(model.init_params(rng), 0.5), X, Y, progress=True)
    err = capsys.readouterr().err
    assert "VDEKF" in err and "7/7" in err
    filt.scan(filt.init(model.init_params(rng), 0.5), X, Y)
    assert capsys.readouterr().err == ""


def test_a_diverged_mean_raises_a_named_error_not_a_bad_input_error():
    model = small_mlp(1, 2, 1, activation="linear")
    theta = np.full(model.n_params, 1e200)  # finite, but the output overflows
    filt = rb.VDEKF(model, rb.Gaussian(1.0))
    bel = filt.init(theta, 1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        with pytest.raises(rb.DivergenceError, match="diverged"):
            filt.update(bel, np.array([1e200]), np.zeros(1))
