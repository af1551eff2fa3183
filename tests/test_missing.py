"""Missing observations: NaN components of y are not observed.

For a linear-Gaussian model the exact answer is the Kalman filter whose observation at each
step keeps only the observed rows of H and the matching block of R; an all-NaN y is a
predict-only step. The EKF family, LO-FI and the subspace EKF are checked against that
oracle (written here from the Kalman equations, not calling refbayes' filters), on every
backend they offer.
"""

import numpy as np
import pytest

import refbayes as rb
from refbayes.filters import diagonal

R_FULL = np.array([[0.30, 0.05, 0.02], [0.05, 0.20, -0.03], [0.02, -0.03, 0.25]])
GAMMA, Q = 0.95, 0.02


def _stream(rng, T, frac=0.3):
    X = rng.standard_normal((T, 3))
    Y = rng.standard_normal((T, 3))
    Y[rng.random((T, 3)) < frac] = np.nan
    Y[2] = np.nan  # one step with nothing observed
    Y[3, :2] = np.nan  # and one with a single output
    return X, Y


def _kalman_with_missing(model, mu, Sigma, X, Y, R):
    """The exact filter: predict, then condition on the observed rows only."""
    P = len(mu)
    for x, y in zip(X, Y):
        mu, Sigma = GAMMA * mu, GAMMA**2 * Sigma + Q * np.eye(P)
        o = ~np.isnan(y)
        if o.any():
            H = model.jacobian(mu, x)[o]
            S = H @ Sigma @ H.T + R[np.ix_(o, o)]
            K = Sigma @ H.T @ np.linalg.inv(S)
            mu = mu + K @ (y[o] - model.apply(mu, x)[o])
            Sigma = Sigma - K @ S @ K.T
    return mu, Sigma


EXACT = {
    "FullEKF": lambda m, l, b: rb.FullEKF(m, l, gamma=GAMMA, q=Q),
    "LoFi": lambda m, l, b: rb.LoFi(m, l, rank=30, gamma=GAMMA, q=Q, backend=b),
    "SubspaceEKF": lambda m, l, b: rb.SubspaceEKF(m, l, basis=np.eye(m.n_params), offset=np.zeros(m.n_params), gamma=GAMMA, q=Q),
}
EXACT_CASES = [("FullEKF", "numpy"), ("LoFi", "numpy"), ("LoFi", "numba"), ("SubspaceEKF", "numpy")]


@pytest.mark.parametrize("name,backend", EXACT_CASES)
def test_exact_filters_equal_the_kalman_filter_on_the_observed_rows(name, backend):
    rng = np.random.default_rng(1)
    model = rb.MLP([3, 3])  # no hidden layer: linear, and the compiled MLP step applies
    lik = rb.Gaussian(R_FULL)
    X, Y = _stream(rng, 10)
    mu0 = rng.standard_normal(model.n_params)
    filt = EXACT[name](model, lik, backend)
    bel, res = filt.scan(filt.init(mu0, 0.8), X, Y)
    mu, Sigma = _kalman_with_missing(model, mu0, 0.8 * np.eye(model.n_params), X, Y, R_FULL)
    np.testing.assert_allclose(bel.mean, mu, rtol=1e-10, atol=1e-12)  # the subspace's A = I, offset 0: z = theta
    cov = filt.param_covariance(bel) if name == "SubspaceEKF" else bel.covariance()
    np.testing.assert_allclose(cov, Sigma, rtol=1e-9, atol=1e-12)
    assert np.all(np.isfinite(res.log_pred)) and res.log_pred[2] == 0.0


@pytest.mark.parametrize("name", ["FDEKF", "VDEKF"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_diagonal_filters_condition_on_the_observed_block(name, backend):
    """One masked step equals the diagonal update with the reduced H, R and residual."""
    rng = np.random.default_rng(2)
    model = rb.MLP([3, 4, 3])
    lik = rb.Gaussian(R_FULL)
    filt = getattr(rb, name)(model, lik, gamma=GAMMA, q=Q, backend=backend)
    bel = filt.init(model.init_params(rng), 0.6)
    x = rng.standard_normal(3)
    for observed in ([True, False, True], [False, True, False], [True, True, True]):
        o = np.array(observed)
        y = np.where(o, rng.standard_normal(3), np.nan)
        pred = diagonal.predict(bel, GAMMA, Q)
        H = model.jacobian(pred.mean, x)[o]
        e = (np.nan_to_num(y) - model.apply(pred.mean, x))[o]
        R = R_FULL[np.ix_(o, o)]
        ref = diagonal.fd_update(pred, H, R, e) if name == "FDEKF" else diagonal.vd_update(pred, H, R, e, mean_rule="ekf")
        out = filt.predict_update(bel, x, y)
        np.testing.assert_allclose(out.mean, ref.mean, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(out.var, ref.var, rtol=1e-10)


@pytest.mark.parametrize("make", [
    lambda m, l: rb.FullEKF(m, l, gamma=GAMMA, q=Q),
    lambda m, l: rb.FDEKF(m, l, gamma=GAMMA, q=Q),
    lambda m, l: rb.VDEKF(m, l, gamma=GAMMA, q=Q, backend="numba"),
    lambda m, l: rb.LoFi(m, l, rank=4, gamma=GAMMA, q=Q, backend="numba"),
], ids=["FullEKF", "FDEKF", "VDEKF-numba", "LoFi-numba"])
def test_nothing_observed_is_a_predict_only_step(make):
    rng = np.random.default_rng(3)
    model = rb.MLP([2, 3, 2])
    filt = make(model, rb.Gaussian(0.3))
    bel = filt.init(model.init_params(rng), 0.5)
    x = rng.standard_normal(2)
    out = filt.predict_update(bel, x, np.array([np.nan, np.nan]))
    pred = filt.predict(bel)
    np.testing.assert_array_equal(out.mean, pred.mean)
    np.testing.assert_array_equal(out.marginal_variance(), pred.marginal_variance())
    assert filt.update(bel, x, np.array([np.nan, np.nan])) is bel


def test_a_missing_class_label_skips_the_update_and_counts_nothing():
    rng = np.random.default_rng(4)
    model = rb.MLP([2, 3, 3])
    filt = rb.FDEKF(model, rb.Categorical(3))
    bel = filt.init(model.init_params(rng), 0.5)
    X = rng.standard_normal((6, 2))
    Y = np.array([0, 2, np.nan, 1, np.nan, 0])
    full, res = filt.scan(bel, X, Y)
    kept = [0, 1, 3, 5]
    b = bel
    for t in kept:
        b = filt.update(b, X[t], int(Y[t]))
    np.testing.assert_allclose(full.mean, b.mean, rtol=1e-12)
    assert res.log_pred[2] == 0.0 and res.log_pred[4] == 0.0 and np.all(res.log_pred[kept] < 0)


def test_a_long_stream_with_30_percent_missing_runs_through_scan():
    rng = np.random.default_rng(5)
    model = rb.MLP([3, 8, 3])
    X = rng.standard_normal((300, 3))
    Y = np.tanh(X @ rng.standard_normal((3, 3))) + 0.1 * rng.standard_normal((300, 3))
    Y[rng.random(Y.shape) < 0.3] = np.nan
    for filt in (rb.LoFi(model, rb.Gaussian(0.05), rank=5, backend="numba"), rb.VDEKF(model, rb.Gaussian(0.05))):
        bel, res = filt.scan(filt.init(model.init_params(rng), 0.5), X, Y)
        assert np.all(np.isfinite(bel.mean)) and np.isfinite(res.total_log_evidence)
        assert res.pred_mean.shape == (300, 3)


def test_inf_stays_an_error_and_unsupported_filters_say_so():
    rng = np.random.default_rng(6)
    model = rb.MLP([2, 3, 2])
    filt = rb.FDEKF(model, rb.Gaussian(0.3))
    bel = filt.init(model.init_params(rng), 0.5)
    with pytest.raises(ValueError, match="inf"):
        filt.update(bel, np.ones(2), np.array([np.inf, 0.0]))
    with pytest.raises(ValueError, match="inf"):
        filt.scan(bel, np.ones((2, 2)), np.array([[0.0, 1.0], [np.nan, -np.inf]]))
    replay = rb.SGDRB(model, rb.Gaussian(0.3), buffer_size=3, lr=0.05, n_iter=1)
    with pytest.raises(ValueError, match="NaN"):
        replay.update(replay.init(model.init_params(rng)), np.ones(2), np.array([np.nan, 0.0]))


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_adaptive_noise_lofi_averages_the_observed_residuals_only(backend):
    """Adaptive-noise LO-FI with a missing output equals the same filter on the model that only has
    the observed output: the update and the running noise estimate both see the observed rows."""
    rng = np.random.default_rng(8)
    model = rb.MLP([2, 4, 3], activation="tanh")
    keep = np.array([True, False, True])
    idx = np.flatnonzero(keep)
    reduced = rb.Function(lambda theta, x: model.apply(theta, x)[idx], model.n_params, 2, in_dim=2)
    full = rb.LoFi(model, rb.Gaussian(0.3), rank=3, adaptive_obs_noise=True, gamma=0.98, q=1e-3, backend=backend)
    small = rb.LoFi(reduced, rb.Gaussian(0.3), rank=3, adaptive_obs_noise=True, gamma=0.98, q=1e-3)
    theta = model.init_params(rng)
    a, b = full.init(theta, 0.5), small.init(theta, 0.5)
    for t in range(6):
        x, y = rng.standard_normal(2), rng.standard_normal(3)
        y_missing = np.where(keep, y, np.nan)
        if t == 3:  # nothing observed: predict only, the noise estimate unchanged
            a_next = full.predict_update(a, x, np.full(3, np.nan))
            assert a_next.obs_var == a.obs_var and a_next.n_obs == a.n_obs
            a, b = a_next, small.predict(b)
            continue
        a, b = full.predict_update(a, x, y_missing), small.predict_update(b, x, y[idx])
        assert a.n_obs == b.n_obs
        np.testing.assert_allclose(a.obs_var, b.obs_var, rtol=1e-12)
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a.W @ a.W.T, b.W @ b.W.T, rtol=1e-10, atol=1e-12)
