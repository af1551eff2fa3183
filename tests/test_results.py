"""What a filter run gives back and what it does when things go wrong.

The scan result against the Kalman filter's exact marginal likelihood and against
step-by-step calls; divergence raised as DivergenceError at the step where it happens;
argument checks that come before any state changes.
"""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes import exact
from refbayes.results import InnovationMonitor, ScanResult

README = Path(__file__).resolve().parents[1] / "README.md"


def _linear_problem(rng, T=25, C=2):
    model = rb.Linear(3, C, bias=True)
    P = model.n_params
    X = rng.standard_normal((T, 3))
    theta = rng.standard_normal(P)
    Y = np.array([model.apply(theta, x) for x in X]) + 0.3 * rng.standard_normal((T, C))
    return model, X, Y


# -- the result object -------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda m, l: rb.FullEKF(m, l, gamma=0.95, q=0.01),
    lambda m, l: rb.FDEKF(m, l, gamma=0.95, q=0.01),
    lambda m, l: rb.VDEKF(m, l, gamma=0.95, q=0.01),
    lambda m, l: rb.LoFi(m, l, rank=20, gamma=0.95, q=0.01),
], ids=["FullEKF", "FDEKF", "VDEKF", "LoFi"])
def test_linearized_log_evidence_of_a_linear_gaussian_model_is_the_kalman_filters(make):
    """For h = H theta and Gaussian noise the one-step-ahead predictive N(H mu, H Sigma H^T + R)
    is exact, so the prequential log evidence is the exact marginal likelihood. FullEKF and
    LO-FI with rank >= P are exact filters; the diagonal ones are exact only for the first
    step, so for them only the per-step identity with their own predictive is checked."""
    rng = np.random.default_rng(3)
    model, X, Y = _linear_problem(rng)
    P, R = model.n_params, 0.09 * np.eye(2)
    filt = make(model, rb.Gaussian(0.09))
    mu0 = rng.standard_normal(P)
    bel, res = filt.scan(filt.init(mu0, 0.7), X, Y, predictive="linearized")
    assert isinstance(res, ScanResult) and res.log_pred.shape == (len(X),)
    np.testing.assert_allclose(res.log_evidence, np.cumsum(res.log_pred), rtol=1e-14)
    Hs = np.array([model.jacobian(mu0, x) for x in X])
    kf = exact.kalman_filter(mu0, 0.7 * np.eye(P), Hs, Y, R, gamma=0.95, q=0.01)
    if isinstance(filt, (rb.FullEKF, rb.LoFi)):
        np.testing.assert_allclose(res.log_pred, kf.logliks, rtol=1e-9)
        np.testing.assert_allclose(res.total_log_evidence, kf.log_evidence, rtol=1e-10)
    else:
        np.testing.assert_allclose(res.log_pred[0], kf.logliks[0], rtol=1e-10)


def test_scan_result_fields_match_step_by_step_calls():
    rng = np.random.default_rng(4)
    model = rb.MLP([2, 4, 3])
    lik = rb.Categorical(3)
    filt = rb.FDEKF(model, lik, gamma=0.99, q=1e-3)
    X = rng.standard_normal((12, 2))
    Y = rng.integers(0, 3, 12)
    bel0 = filt.init(model.init_params(rng), 0.5)
    bel, res = filt.scan(bel0, X, Y, keep_mean=True, keep_var=True)
    assert res.yhat.shape == (12, 2)            # the drop-last statistic
    assert res.pred_mean.shape == (12, 3)       # all three classes
    assert res.pred_cov.shape == (12, 3, 3)
    np.testing.assert_allclose(res.pred_mean.sum(1), 1.0, rtol=1e-13)
    b = bel0
    for t in range(12):
        pred = filt.predict(b)
        mean, cov = filt.predict_obs(pred, X[t], method="plugin")
        np.testing.assert_allclose(res.pred_mean[t], mean, rtol=1e-12)
        np.testing.assert_allclose(res.pred_cov[t], cov, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(res.log_pred[t], np.log(mean[Y[t]]), rtol=1e-12)
        b = filt.update(pred, X[t], Y[t])
        np.testing.assert_array_equal(res.means[t], b.mean)
        np.testing.assert_array_equal(res.variances[t], b.var)
    np.testing.assert_array_equal(bel.mean, b.mean)
    assert res.seconds.shape == (12,) and np.all(res.seconds > 0)
    assert res["yhat"] is res.yhat and "yhat" in res and "callback" not in res
    assert res.get("callback", []) == [] and res.get("yhat") is res.yhat and res.keys() == ["yhat"]


def test_categorical_accuracy_from_all_classes():
    """argmax over the K - 1 kept columns of yhat misses the last class; pred_mean has all K."""
    rng = np.random.default_rng(5)
    model = rb.Linear(2, 3)
    filt = rb.FullEKF(model, rb.Categorical(3))
    X = rng.standard_normal((60, 2))
    Y = np.argmax(X @ rng.standard_normal((2, 3)), axis=1)
    _, res = filt.scan(filt.init(np.zeros(model.n_params), 1.0), X, Y)
    assert np.any(np.argmax(res.pred_mean, 1) == 2)
    np.testing.assert_array_equal(np.argmax(res.pred_mean[:, :2], 1)[np.argmax(res.pred_mean, 1) < 2],
                                  np.argmax(res.pred_mean, 1)[np.argmax(res.pred_mean, 1) < 2])


def test_on_step_keeps_the_compiled_step():
    """on_step receives the step's results: the numbers are those of a plain scan, bit for bit."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(6)
    model = rb.MLP([3, 5, 2])
    filt = rb.LoFi(model, rb.Gaussian(0.2), rank=3, gamma=0.99, q=1e-4, backend="numba")
    X, Y = rng.standard_normal((15, 3)), rng.standard_normal((15, 2))
    bel0 = filt.init(model.init_params(rng), 0.5)
    plain, res0 = filt.scan(bel0, X, Y)
    seen, res1 = filt.scan(bel0, X, Y, on_step=lambda t, step: (t, step.log_pred, step.belief.mean.copy()))
    np.testing.assert_array_equal(plain.mean, seen.mean)
    np.testing.assert_array_equal(res0.log_pred, res1.log_pred)
    assert [c[0] for c in res1.callback] == list(range(15))
    np.testing.assert_array_equal(res1.callback[-1][2], seen.mean)
    np.testing.assert_array_equal(np.array([c[1] for c in res1.callback]), res1.log_pred)


def test_old_callback_still_sees_predicted_and_posterior_beliefs():
    rng = np.random.default_rng(7)
    model = rb.Linear(2, 1)
    filt = rb.FDEKF(model, rb.Gaussian(0.5), gamma=0.9, q=0.1)
    X, Y = rng.standard_normal((5, 2)), rng.standard_normal((5, 1))
    bel0 = filt.init(np.zeros(3), 1.0)
    _, res = filt.scan(bel0, X, Y, callback=lambda t, pred, post, x, y: (pred.var.copy(), post.var.copy()))
    np.testing.assert_allclose(res["callback"][0][0], 0.81 * 1.0 + 0.1, rtol=1e-15)
    with pytest.raises(ValueError, match="not both"):
        filt.scan(bel0, X, Y, callback=lambda *a: 0, on_step=lambda *a: 0)
    with pytest.raises(ValueError, match="predictive"):
        filt.scan(bel0, X, Y, predictive="exact")


# -- batched predictive -------------------------------------------------------------------

@pytest.mark.parametrize("method,kind", [(m, k) for m in ("plugin", "linearized", "probit", "mc", "linearized-mc")
                                         for k in ("gaussian", "categorical", "bernoulli")
                                         if not (m == "probit" and k == "gaussian")])  # probit: classification only
def test_batched_predict_obs_equals_single_calls(method, kind):
    rng = np.random.default_rng(8)
    lik, out = {"gaussian": (rb.Gaussian(0.1), 2), "categorical": (rb.Categorical(3), 3),
                "bernoulli": (rb.Bernoulli(), 1)}[kind]
    model = rb.MLP([2, 4, out])
    X = rng.standard_normal((9, 2))
    for filt in (rb.LoFi(model, lik, rank=3), rb.FDEKF(model, lik), rb.FullEKF(model, lik)):
        bel = filt.init(model.init_params(rng), 0.5)
        mean, cov = filt.predict_obs(bel, X, method=method, rng=np.random.default_rng(1))
        assert mean.shape[0] == 9 and cov.shape == (9, mean.shape[1], mean.shape[1])
        if method in ("mc", "linearized-mc"):  # one set of samples for the batch: compare with that set
            thetas = bel.sample(np.random.default_rng(1), 100)
            etas = [model.apply(th, X[4]) for th in thetas] if method == "mc" else None
            if etas is not None and kind == "gaussian":
                np.testing.assert_allclose(mean[4], np.mean(etas, 0), rtol=1e-12)
            continue
        for i, x in enumerate(X):
            m1, c1 = filt.predict_obs(bel, x, method=method)
            np.testing.assert_allclose(mean[i], m1, rtol=1e-12)
            np.testing.assert_allclose(cov[i], c1, rtol=1e-10, atol=1e-15)


# -- divergence ---------------------------------------------------------------------------

def test_poisson_overflow_is_a_divergence_error_not_a_scipy_error():
    rng = np.random.default_rng(9)
    model = rb.MLP([3, 4, 1])
    for filt in (rb.FullEKF(model, rb.Poisson()), rb.LoFi(model, rb.Poisson(), rank=2), rb.VDEKF(model, rb.Poisson())):
        bel = filt.init(model.init_params(rng), 1.0)
        x = np.ones(3)
        with np.errstate(all="ignore"):
            with pytest.raises(rb.DivergenceError) as info:
                for _ in range(5):
                    bel = filt.update(bel, x, 1e12)
        assert info.value.quantity is not None
        assert np.all(np.isfinite(bel.mean))  # the last good belief is intact


def test_scan_names_the_step_where_it_diverges():
    """A spike of 1e12 counts at step 5 throws the Poisson log-rate to ~1e11 in size: at the
    next linearisation exp(eta) overflows or underflows to a zero variance, which scan reports
    as step 6 (the belief after step 5 is finite)."""
    rng = np.random.default_rng(10)
    model = rb.MLP([3, 4, 1])
    filt = rb.FullEKF(model, rb.Poisson())
    X = rng.standard_normal((12, 3))
    Y = rng.poisson(1.0, (12, 1)).astype(float)
    Y[5] = 1e12
    bel = filt.init(model.init_params(rng), 1.0)
    with np.errstate(all="ignore"):
        with pytest.raises((rb.DivergenceError, rb.NotPositiveDefiniteError)) as info:
            filt.scan(bel, X, Y)
    assert info.value.step == 6 and str(info.value).startswith("step 6: ")


def test_monitor_stops_the_papers_vd_rule_long_before_it_overflows():
    """With obs_var 1e-8 the paper's VD mean rule runs to weights of ~1e12 without ever
    overflowing; the innovation monitor names it within a few steps."""
    rng = np.random.default_rng(10)
    model = rb.MLP([1, 50, 1])
    filt = rb.VDEKF(model, rb.Gaussian(1e-8), vd_mean="paper")
    X = rng.uniform(-2, 2, (300, 1))
    bel = filt.init(model.init_params(rng), 1.0)
    with pytest.raises(rb.DivergenceError, match="normalised innovation") as info:
        filt.scan(bel, X, np.sin(2 * X), monitor=InnovationMonitor(threshold=1e4, patience=5, action="raise"))
    assert info.value.step < 50


@settings(max_examples=30, deadline=None)
@given(scale=st.floats(1e3, 1e300), seed=st.integers(0, 2**31 - 1))
def test_overflowing_inputs_raise_divergence_error(scale, seed):
    """A huge input or observation either updates to a finite belief or raises DivergenceError:
    never another error, never a non-finite belief."""
    rng = np.random.default_rng(seed)
    model = rb.MLP([2, 3, 1])
    filters = (rb.FullEKF(model, rb.Poisson()), rb.FDEKF(model, rb.Gaussian(1.0)),
               rb.LoFi(model, rb.Bernoulli(), rank=2),
               # the compiled steps: a kernel's overflow is a DivergenceError too
               rb.FDEKF(model, rb.Gaussian(1.0), backend="numba"), rb.VDEKF(model, rb.Poisson(), backend="numba"),
               rb.LoFi(model, rb.Gaussian(1e-8), rank=2, backend="numba"),
               rb.Bong(model, rb.Gaussian(1.0), family="diag", backend="numba"))
    for filt in filters:
        bel = filt.init(model.init_params(rng), 1.0)
        x = scale * rng.standard_normal(2)
        y = 1.0
        with np.errstate(all="ignore"):
            try:
                for _ in range(3):
                    bel = filt.update(filt.predict(bel), x, y)
            except rb.DivergenceError:
                pass
        assert np.all(np.isfinite(bel.mean))


def test_the_vd_ekf_default_fits_where_the_papers_rule_runs_away():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(200, 1))
    Y = np.sin(2 * X) + 0.1 * rng.standard_normal((200, 1))
    model = rb.MLP([1, 16, 1])
    theta = model.init_params(rng)
    grid = np.linspace(-2, 2, 41)[:, None]
    rmse = {}
    for rule in ("ekf", "paper"):
        filt = rb.VDEKF(model, rb.Gaussian(0.01)) if rule == "ekf" else rb.VDEKF(model, rb.Gaussian(0.01), vd_mean=rule)
        bel, _ = filt.scan(filt.init(theta, 1.0), X, Y)
        mean, _ = filt.predict_obs(bel, grid)
        rmse[rule] = np.sqrt(np.mean((mean[:, 0] - np.sin(2 * grid[:, 0])) ** 2))
    assert rmse["ekf"] < 0.5 < 10 < rmse["paper"]


def test_innovation_monitor_warns_and_raises_on_an_overconfident_filter():
    rng = np.random.default_rng(11)
    model = rb.Linear(2, 1)
    X = rng.standard_normal((30, 2))
    Y = 5.0 + rng.standard_normal((30, 1))  # far from a tiny-variance prior at zero, with tiny noise
    filt = rb.FDEKF(model, rb.Gaussian(1e-4))
    bel = filt.init(np.zeros(3), 1e-6)
    with pytest.warns(RuntimeWarning, match="normalised innovation"):
        filt.scan(bel, X, Y, monitor=InnovationMonitor(threshold=25, patience=3))
    with pytest.raises(rb.DivergenceError, match="normalised innovation"):
        filt.scan(bel, X, Y, monitor=InnovationMonitor(patience=3, action="raise"))
    good = rb.FDEKF(model, rb.Gaussian(1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon = InnovationMonitor(patience=3)
        good.scan(good.init(np.zeros(3), 1.0), X, 0.1 * Y, monitor=mon)
    assert len(mon.history) == 30 and max(mon.history) < 25
    for bad in (dict(threshold=0), dict(patience=0), dict(action="log")):
        with pytest.raises(ValueError):
            InnovationMonitor(**bad)


# -- argument checks ----------------------------------------------------------------------

FILTERS = {
    "FullEKF": lambda m, l, **k: rb.FullEKF(m, l, **k),
    "FDEKF": lambda m, l, **k: rb.FDEKF(m, l, **k),
    "VDEKF": lambda m, l, **k: rb.VDEKF(m, l, **k),
    "LoFi": lambda m, l, **k: rb.LoFi(m, l, rank=2, **k),
    "Bong": lambda m, l, **k: rb.Bong(m, l, **k),
}


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_gamma_above_one_is_rejected(name):
    model = rb.MLP([2, 3, 1])
    with pytest.raises(ValueError, match="gamma"):
        FILTERS[name](model, rb.Gaussian(1.0), gamma=1.5)
    FILTERS[name](model, rb.Gaussian(1.0), gamma=1.0)


def test_scan_rejects_a_scalar_y_and_boolean_inputs_like_update():
    rng = np.random.default_rng(12)
    model = rb.MLP([2, 3, 1])
    filt = rb.FDEKF(model, rb.Gaussian(1.0))
    bel = filt.init(model.init_params(rng), 1.0)
    X = rng.standard_normal((4, 2))
    with pytest.raises(TypeError, match="Y must be a sequence"):
        filt.scan(bel, X, 0.3)
    with pytest.raises(TypeError):
        filt.scan(bel, X > 0, np.zeros((4, 1)))
    with pytest.raises(TypeError):
        filt.update(bel, np.array([True, False]), np.zeros(1))


def test_cuda_without_a_gpu_fails_at_construction(monkeypatch):
    numba_cuda = pytest.importorskip("numba.cuda")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(numba_cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="GPU"):
        rb.FDEKF(rb.MLP([2, 3, 1]), rb.Gaussian(1.0), backend="cuda")


# -- the README example -------------------------------------------------------------------

def test_readme_example_runs_and_fits(tmp_path, monkeypatch):
    """The README's example, as written, fits its sine data (grid RMSE < 0.2)."""
    text = README.read_text()
    code = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    env = {}
    exec(compile(code, "README.md", "exec"), env)
    filt, bel = env["filt"], env["bel"]
    grid = np.linspace(-2, 2, 101)[:, None]
    mean, _ = filt.predict_obs(bel, grid)
    rmse = np.sqrt(np.mean((mean[:, 0] - np.sin(2 * grid[:, 0])) ** 2))
    assert rmse < 0.2, rmse


@pytest.mark.parametrize("kind", ["gaussian", "gaussian-missing", "categorical", "categorical-missing", "bernoulli", "poisson"])
def test_the_stream_wide_predictive_equals_the_per_step_one(kind):
    """A plain scan computes the plug-in predictive for all steps after the loop; with on_step it
    is computed at each step. Both give the same numbers, bit for bit."""
    rng = np.random.default_rng(13)
    T = 20
    lik, out = {"gaussian": (rb.Gaussian(np.array([0.2, 0.5])), 2), "categorical": (rb.Categorical(3), 3),
                "bernoulli": (rb.Bernoulli(), 2), "poisson": (rb.Poisson(), 2)}[kind.split("-")[0]]
    model = rb.MLP([2, 3, out])
    X = rng.standard_normal((T, 2))
    if kind.startswith("gaussian"):
        Y = rng.standard_normal((T, 2))
    elif kind.startswith("categorical"):
        Y = rng.integers(0, 3, T).astype(float)
    elif kind == "bernoulli":
        Y = rng.integers(0, 2, (T, 2)).astype(float)
    else:
        Y = rng.poisson(1.0, (T, 2)).astype(float)
    if kind.endswith("missing"):
        Y[3] = np.nan
        if kind.startswith("gaussian"):
            Y[7, 0] = np.nan
    filt = rb.FDEKF(model, lik, gamma=0.99, q=1e-3)
    bel = filt.init(model.init_params(rng), 0.3)
    _, plain = filt.scan(bel, X, Y)
    _, stepped = filt.scan(bel, X, Y, on_step=lambda t, step: None)
    np.testing.assert_array_equal(plain.pred_mean, stepped.pred_mean)
    np.testing.assert_array_equal(plain.pred_cov, stepped.pred_cov)
    np.testing.assert_array_equal(plain.log_pred, stepped.log_pred)
    assert np.all(np.isfinite(plain.log_pred))
