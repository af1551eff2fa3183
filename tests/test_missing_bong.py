"""Missing observations in the BONG family, R-VGA and the logistic filters.

NaN components of y are not observed. The exact answer is the same filter run on the
reduced observation: a model whose output is the observed rows only, with the likelihood
of those outputs (a Gaussian with the observed block of R; Bernoulli and Poisson outputs
are independent). The oracle here is exactly that filter, built from ``rb.Function`` and
the reduced likelihood; Monte Carlo estimators get the same rng, so their draws agree.
An all-NaN y is a predict-only step, and a NaN class label skips the update.
"""

import numpy as np
import pytest

import refbayes as rb
from refbayes.filters.bong import COMBINATIONS, Bong

R_FULL = np.array([[0.30, 0.05, 0.02], [0.05, 0.20, -0.03], [0.02, -0.03, 0.25]])
OBSERVED = np.array([True, False, True])
GAMMA, Q = 0.95, 0.02
PRIOR_VAR = 0.1  # with R_STEP: small enough for the moment-form steps to stay positive definite
R_STEP = 5.0 * R_FULL
KERNEL_FAMILIES = ("diag", "diag-moment", "dlr")


def _options(algorithm, family, estimator):
    """Hyper-parameters that keep every combination's step well defined on the problems here."""
    kw = dict(algorithm=algorithm, family=family, estimator=estimator, gamma=GAMMA, q=Q, n_samples=4,
              n_probes=4, rank=3)
    kw.update({"bong": {}, "blr": dict(lr=0.5, n_iter=2), "bog": dict(lr=0.02),
               "bbb": dict(lr=0.02, n_iter=2)}[algorithm])
    if (algorithm, family) == ("blr", "dlr") and estimator.startswith("mc"):
        # a second iteration would draw from the projected factor W, which the SVD fixes only up
        # to the signs of its columns: round-off may flip one, changing the draws (not the belief)
        kw["n_iter"] = 1
    return kw


def _reduced(model, observed):
    """The model whose output is the observed rows of ``model``'s output."""
    idx = np.flatnonzero(observed)
    return rb.Function(lambda theta, x: model.apply(theta, x)[idx], model.n_params, len(idx), in_dim=model.in_dim)


def _reduced_gaussian(R, observed):
    return rb.Gaussian(R[np.ix_(observed, observed)])


def _assert_same_belief(a, b, rtol=1e-12, atol=1e-13):
    np.testing.assert_allclose(a.mean, b.mean, rtol=rtol, atol=atol)
    np.testing.assert_allclose(a.covariance(), b.covariance(), rtol=rtol, atol=atol)


def _problem(seed, n_in=2, hidden=3, out=3):
    rng = np.random.default_rng(seed)
    model = rb.MLP([n_in, hidden, out])
    theta0 = 0.5 * rng.standard_normal(model.n_params)
    x = rng.standard_normal(n_in)
    return rng, model, theta0, x


@pytest.mark.parametrize("algorithm,family,estimator", COMBINATIONS)
def test_every_combination_equals_the_filter_on_the_observed_outputs(algorithm, family, estimator):
    rng, model, theta0, x = _problem(0)
    y = np.where(OBSERVED, rng.standard_normal(3), np.nan)
    kw = _options(algorithm, family, estimator)
    filt = Bong(model, rb.Gaussian(R_STEP), **kw)
    oracle = Bong(_reduced(model, OBSERVED), _reduced_gaussian(R_STEP, OBSERVED), **kw)
    bel = filt.init(theta0, PRIOR_VAR)
    out = filt.predict_update(bel, x, y, rng=np.random.default_rng(11))
    ref = oracle.predict_update(oracle.init(theta0, PRIOR_VAR), x, y[OBSERVED], rng=np.random.default_rng(11))
    _assert_same_belief(out, ref)
    # the missing output is not read as a value: a full observation gives another posterior
    full = filt.predict_update(bel, x, np.nan_to_num(y), rng=np.random.default_rng(11))
    assert np.max(np.abs(full.mean - out.mean)) > 1e-6


LIKELIHOODS = {
    "bernoulli": (lambda: rb.Bernoulli(), lambda o: rb.Bernoulli(), np.array([1.0, np.nan, 0.0])),
    "poisson": (lambda: rb.Poisson(), lambda o: rb.Poisson(), np.array([2.0, np.nan, 0.0])),
    "gaussian-diag": (lambda: rb.Gaussian(np.array([1.5, 1.0, 1.2])),
                      lambda o: rb.Gaussian(np.array([1.5, 1.0, 1.2])[o]), np.array([0.4, np.nan, -1.1])),
    "gaussian-scalar": (lambda: rb.Gaussian(1.0), lambda o: rb.Gaussian(1.0), np.array([np.nan, 0.7, -1.1])),
}


@pytest.mark.parametrize("lik", sorted(LIKELIHOODS))
@pytest.mark.parametrize("algorithm,family,estimator", [
    ("bong", "dlr", "mc-ef"), ("bong", "full", "mc-hess"), ("blr", "diag", "lin-hess"),
    ("bbb", "diag-moment", "mc-hess"), ("bog", "full-moment", "lin-ef")])
def test_independent_outputs_use_the_likelihood_of_the_observed_ones(lik, algorithm, family, estimator):
    make, make_reduced, y = LIKELIHOODS[lik]
    observed = ~np.isnan(y)
    _, model, theta0, x = _problem(1)
    kw = _options(algorithm, family, estimator)
    filt = Bong(model, make(), **kw)
    oracle = Bong(_reduced(model, observed), make_reduced(observed), **kw)
    out = filt.predict_update(filt.init(theta0, PRIOR_VAR), x, y, rng=np.random.default_rng(3))
    ref = oracle.predict_update(oracle.init(theta0, PRIOR_VAR), x, y[observed], rng=np.random.default_rng(3))
    _assert_same_belief(out, ref)


@pytest.mark.parametrize("estimator", ["lin-hess", "mc-ef"])
def test_a_minibatch_with_missing_components(estimator):
    """Rows with the same mask equal the reduced model's minibatch; an all-NaN row adds nothing."""
    rng, model, theta0, _ = _problem(2)
    X = rng.standard_normal((3, 2))
    Y = np.where(OBSERVED, rng.standard_normal((3, 3)), np.nan)
    kw = _options("bong", "dlr", estimator)
    filt = Bong(model, rb.Gaussian(R_STEP), **kw)
    oracle = Bong(_reduced(model, OBSERVED), _reduced_gaussian(R_STEP, OBSERVED), **kw)
    bel = filt.init(theta0, PRIOR_VAR)
    out = filt.update_batch(bel, X, Y, rng=np.random.default_rng(5))
    ref = oracle.update_batch(oracle.init(theta0, PRIOR_VAR), X, Y[:, OBSERVED], rng=np.random.default_rng(5))
    _assert_same_belief(out, ref)
    X4, Y4 = np.vstack([X[:1], rng.standard_normal((1, 2)), X[1:]]), np.vstack([Y[:1], np.full((1, 3), np.nan), Y[1:]])
    _assert_same_belief(filt.update_batch(bel, X4, Y4, rng=np.random.default_rng(5)), out)
    assert filt.update_batch(bel, X4[1:2], Y4[1:2], rng=np.random.default_rng(5)) is bel


def test_bong_lin_hess_full_with_missing_is_the_full_ekf_with_missing():
    rng = np.random.default_rng(4)
    model = rb.MLP([3, 5, 3])
    X = rng.standard_normal((40, 3))
    Y = np.tanh(X @ rng.standard_normal((3, 3))) + 0.3 * rng.standard_normal((40, 3))
    Y[rng.random(Y.shape) < 0.3] = np.nan
    Y[5] = np.nan
    lik = rb.Gaussian(R_FULL)
    theta0 = model.init_params(rng)
    bong = Bong(model, lik, algorithm="bong", family="full", estimator="lin-hess", gamma=GAMMA, q=Q)
    ekf = rb.FullEKF(model, lik, gamma=GAMMA, q=Q)
    b1, r1 = bong.scan(bong.init(theta0, 0.5), X, Y)
    b2, r2 = ekf.scan(ekf.init(theta0, 0.5), X, Y)
    np.testing.assert_allclose(b1.mean, b2.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b1.cov, b2.cov, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(r1.log_pred, r2.log_pred, rtol=1e-10)
    assert r1.log_pred[5] == 0.0


@pytest.mark.parametrize("family,estimator", [("full", "mc-hess"), ("diag-moment", "mc-ef"), ("dlr", "lin-hess"),
                                              ("diag", "lin-ef")])
def test_nothing_observed_is_a_predict_only_step_for_bong(family, estimator):
    _, model, theta0, x = _problem(6)
    filt = Bong(model, rb.Gaussian(R_STEP), **_options("blr", family, estimator))
    bel = filt.init(theta0, PRIOR_VAR)
    y = np.full(3, np.nan)
    assert filt.update(bel, x, y, rng=np.random.default_rng(0)) is bel
    out = filt.predict_update(bel, x, y, rng=np.random.default_rng(0))
    _assert_same_belief(out, filt.predict(bel), rtol=0, atol=0)


@pytest.mark.parametrize("make", [
    lambda m, l: Bong(m, l, family="dlr", rank=2, estimator="mc-ef", n_samples=3),
    lambda m, l: Bong(m, l, family="diag", estimator="lin-hess", backend="numba"),
    lambda m, l: rb.RVGA(m, l, expectation="mc", n_samples=6, scheme="explicit", curvature="ggn"),
    lambda m, l: rb.RVGA(m, l, expectation="linearized"),
], ids=["bong-dlr-mc-ef", "bong-diag-numba", "rvga-mc", "rvga-linearized"])
def test_a_missing_class_label_skips_the_update(make):
    rng = np.random.default_rng(7)
    model = rb.MLP([2, 2, 3])
    filt = make(model, rb.Categorical(3))
    bel = filt.init(0.5 * rng.standard_normal(model.n_params), 0.5)
    X = rng.standard_normal((6, 2))
    Y = np.array([0, 2, np.nan, 1, np.nan, 0])
    full, res = filt.scan(bel, X, Y, rng=np.random.default_rng(8))
    kept = [0, 1, 3, 5]
    b, r = bel, np.random.default_rng(8)
    for t in kept:  # gamma = 1, q = 0: the skipped steps' predict steps change nothing
        b = filt.update(b, X[t], int(Y[t]), rng=r)
    np.testing.assert_allclose(full.mean, b.mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(full.marginal_variance(), b.marginal_variance(), rtol=1e-12)
    assert res.log_pred[2] == 0.0 and res.log_pred[4] == 0.0 and np.all(res.log_pred[kept] < 0)
    assert filt.update(bel, X[2], np.nan, rng=np.random.default_rng(0)) is bel


@pytest.mark.parametrize("algorithm,family,estimator",
                         [c for c in COMBINATIONS if c[1] in KERNEL_FAMILIES])
def test_numba_backend_equals_numpy_with_missing(algorithm, family, estimator):
    rng = np.random.default_rng(9)
    model = rb.MLP([2, 3, 3])
    X = rng.standard_normal((5, 2))
    Y = rng.standard_normal((5, 3))
    Y[0, 1] = Y[2, :2] = Y[3, 0] = np.nan
    Y[4] = np.nan
    theta0 = 0.5 * rng.standard_normal(model.n_params)
    fnp, fnb = (Bong(model, rb.Gaussian(R_STEP), backend=b, **_options(algorithm, family, estimator))
                for b in ("numpy", "numba"))
    bel = fnp.init(theta0, PRIOR_VAR)
    if family == "dlr" and algorithm in ("bong", "blr") and estimator.startswith("mc"):
        # a projected W is fixed only up to column signs, which the two backends' SVDs may choose
        # differently; the next draws then differ. Compare step by step from the reference's belief.
        for t in range(len(X)):
            pred = fnp.predict(bel)
            ref = fnp.update(pred, X[t], Y[t], rng=np.random.default_rng(t))
            _assert_same_belief(fnb.update(pred, X[t], Y[t], rng=np.random.default_rng(t)), ref,
                                rtol=1e-9, atol=1e-12)
            bel = ref
        return
    ref = fnp.scan(bel, X, Y, rng=np.random.default_rng(10))[0]
    _assert_same_belief(fnb.scan(bel, X, Y, rng=np.random.default_rng(10))[0], ref, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# R-VGA


@pytest.mark.parametrize("scheme,expectation,derivatives,curvature", [
    ("implicit", "quadrature", "order2", "ggn"), ("explicit", "quadrature", "order0", "hessian"),
    ("explicit", "mc", "order1", "hessian"), ("implicit", "mc", "order2", "hessian"),
    ("implicit", "linearized", "order2", "hessian"), ("explicit", "linearized", "order2", "hessian")])
def test_rvga_equals_the_filter_on_the_observed_outputs(scheme, expectation, derivatives, curvature):
    rng, model, theta0, x = _problem(12, hidden=2)
    y = np.where(OBSERVED, rng.standard_normal(3), np.nan)
    kw = dict(scheme=scheme, expectation=expectation, derivatives=derivatives, curvature=curvature, n_samples=8,
              gamma=GAMMA, q=Q)
    filt = rb.RVGA(model, rb.Gaussian(R_STEP), **kw)
    oracle = rb.RVGA(_reduced(model, OBSERVED), _reduced_gaussian(R_STEP, OBSERVED), **kw)
    bel = filt.init(theta0, PRIOR_VAR)
    out = filt.predict_update(bel, x, y, rng=np.random.default_rng(13))
    ref = oracle.predict_update(oracle.init(theta0, PRIOR_VAR), x, y[OBSERVED], rng=np.random.default_rng(13))
    _assert_same_belief(out, ref, rtol=1e-10, atol=1e-12)
    full = filt.predict_update(bel, x, np.nan_to_num(y), rng=np.random.default_rng(13))
    assert np.max(np.abs(full.mean - out.mean)) > 1e-6


def test_rvga_with_bernoulli_outputs_and_a_minibatch():
    rng, model, theta0, _ = _problem(14, hidden=2)
    X = rng.standard_normal((2, 2))
    Y = np.array([[1.0, np.nan, 0.0], [0.0, np.nan, 0.0]])
    filt = rb.RVGA(model, rb.Bernoulli(), scheme="explicit")
    oracle = rb.RVGA(_reduced(model, OBSERVED), rb.Bernoulli(), scheme="explicit")
    out = filt.update_batch(filt.init(theta0, PRIOR_VAR), X, Y)
    ref = oracle.update_batch(oracle.init(theta0, PRIOR_VAR), X, Y[:, OBSERVED])
    _assert_same_belief(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("expectation", ["quadrature", "linearized"])
def test_rvga_nothing_observed_is_a_predict_only_step(expectation):
    _, model, theta0, x = _problem(15, hidden=2)
    filt = rb.RVGA(model, rb.Gaussian(0.3), expectation=expectation, gamma=GAMMA, q=Q)
    bel = filt.init(theta0, 0.5)
    assert filt.update(bel, x, np.full(3, np.nan)) is bel
    _assert_same_belief(filt.predict_update(bel, x, np.full(3, np.nan)), filt.predict(bel), rtol=0, atol=0)


@pytest.mark.parametrize("cls", ["LogisticRVGA", "LogisticQKF"])
def test_logistic_filters_skip_a_missing_label(cls):
    rng = np.random.default_rng(16)
    model = rb.Linear(2, 1)
    filt = getattr(rb, cls)(model, rb.Bernoulli())
    bel = filt.init(np.zeros(model.n_params), 1.0)
    X = rng.standard_normal((5, 2))
    Y = np.array([1.0, np.nan, 0.0, 1.0, np.nan])
    full, res = filt.scan(bel, X, Y)
    b = bel
    for t in (0, 2, 3):
        b = filt.update(b, X[t], Y[t])
    np.testing.assert_allclose(full.mean, b.mean, rtol=1e-12)
    np.testing.assert_allclose(full.cov, b.cov, rtol=1e-12)
    assert res.log_pred[1] == 0.0 and res.log_pred[4] == 0.0
    assert filt.update(bel, X[1], np.nan) is bel


# ---------------------------------------------------------------------------------------------
# streams and errors


def test_a_stream_with_30_percent_missing_runs_through_scan():
    rng = np.random.default_rng(17)
    model = rb.MLP([3, 6, 3])
    X = rng.standard_normal((150, 3))
    Y = np.tanh(X @ rng.standard_normal((3, 3))) + 0.1 * rng.standard_normal((150, 3))
    Y[rng.random(Y.shape) < 0.3] = np.nan
    filters = [Bong(model, rb.Gaussian(0.05), family="dlr", rank=4, backend="numba"),
               Bong(model, rb.Gaussian(0.05), family="diag", estimator="mc-ef", n_samples=4),
               rb.RVGA(model, rb.Gaussian(0.05), expectation="linearized")]
    for filt in filters:
        bel, res = filt.scan(filt.init(model.init_params(rng), 0.5), X, Y, rng=np.random.default_rng(18))
        assert np.all(np.isfinite(bel.mean)) and np.isfinite(res.total_log_evidence)
        assert res.pred_mean.shape == (150, 3)
        # it learned from the observed components: later steps predict better than the first ones
        assert res.log_pred[-50:].mean() > res.log_pred[:50].mean()
    small = rb.MLP([3, 2, 3])
    filt = rb.RVGA(small, rb.Gaussian(0.05), scheme="explicit", curvature="ggn")  # cubature expectations
    bel, res = filt.scan(filt.init(small.init_params(rng), 0.5), X[:30], Y[:30])
    assert np.all(np.isfinite(bel.mean)) and np.isfinite(res.total_log_evidence)


@pytest.mark.parametrize("make", [
    lambda m: Bong(m, rb.Gaussian(0.3), family="dlr", rank=2, estimator="mc-ef", n_samples=2),
    lambda m: rb.RVGA(m, rb.Gaussian(0.3)),
], ids=["bong", "rvga"])
def test_inf_stays_an_error_and_the_belief_is_untouched(make):
    model = rb.MLP([2, 3, 2])
    filt = make(model)
    assert filt.handles_missing
    bel = filt.init(np.zeros(model.n_params), 1.0)
    before = bel.mean.copy()
    with pytest.raises(ValueError, match="inf"):
        filt.update(bel, np.ones(2), np.array([np.inf, np.nan]), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="inf"):
        filt.scan(bel, np.ones((2, 2)), np.array([[0.0, 1.0], [np.nan, -np.inf]]), rng=np.random.default_rng(0))
    np.testing.assert_array_equal(bel.mean, before)
