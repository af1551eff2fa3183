"""The compiled MLP steps of Bong(..., backend="numba") equal the NumPy reference (float64, rtol 1e-10).

Every (algorithm, family, estimator) triple that ``compiled.fused_combinations`` lists is
enumerated by parametrize and run over several predict + update steps (gamma < 1, q > 0) on a
tanh MLP with two hidden layers and on one with no hidden layer, with Gaussian and categorical
likelihoods; the reference's generic estimator is replaced by one that fails, so that a silent
fall back to the general route would fail the test. A DLR factor W is defined up to a right
orthogonal factor, so W W^T is compared.
"""

import importlib
import re

import numba
import numpy as np
import pytest

import refbayes as rb
from refbayes.errors import DivergenceError, NotPositiveDefiniteError
from refbayes.filters.bong import compiled
from refbayes.filters.bong import estimators as est_mod
from problems import close, same_belief

PURE_RELATIVE = 1e-300  # this file compares relative to max|b| alone, however small


def close_rel(a, b, rtol=1e-10):
    close(a, b, rtol, floor=PURE_RELATIVE)


def same_belief_rel(out, ref):
    same_belief(out, ref, floor=PURE_RELATIVE)

COMBOS = compiled.fused_combinations()
# learning rates that keep every step of these small problems positive definite
LR = {"bong": None, "blr": 0.5, "bog": 0.005, "bbb": 0.002}
N_ITER = {"bong": 1, "blr": 3, "bog": 1, "bbb": 3}
SIZES = {"two-hidden": [3, 5, 4, 3], "no-hidden": [3, 3]}


def likelihood(name):
    return rb.Gaussian(np.array([[1.0, 0.2, 0.0], [0.2, 0.8, 0.1], [0.0, 0.1, 1.2]])) if name == "gaussian" \
        else rb.Categorical(3)


def problem(net, lik_name, seed=0, T=4):
    rng = np.random.default_rng(seed)
    model = rb.MLP(SIZES[net], activation="tanh")
    lik = likelihood(lik_name)
    X = 0.5 * rng.standard_normal((T, 3))
    Y = rng.standard_normal((T, 3)) if lik_name == "gaussian" else rng.integers(0, 3, T)
    return model, lik, model.init_params(rng), X, Y


def filters(model, lik, algorithm, family, estimator, **extra):
    kw = dict(algorithm=algorithm, family=family, estimator=estimator, lr=LR[algorithm], n_iter=N_ITER[algorithm],
              rank=2, gamma=0.97, q=1e-3, **extra)
    return rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)


@pytest.fixture
def no_generic_estimate(monkeypatch):
    """The general route's estimator raises: the numba filter must not reach it."""
    def fail(*args, **kwargs):
        raise AssertionError("the general route ran")

    return lambda: monkeypatch.setattr(est_mod, "estimate", fail)


def test_the_compiled_grid_is_every_algorithm_over_the_diagonal_and_dlr_families_with_lin_estimators():
    assert len(COMBOS) == len(set(COMBOS)) == 4 * 3 * 2
    assert {c[1] for c in COMBOS} == {"diag", "diag-moment", "dlr"}
    assert {c[2] for c in COMBOS} == {"lin-hess", "lin-ef"}


@pytest.mark.parametrize("lik_name", ["gaussian", "categorical"])
@pytest.mark.parametrize("net", ["two-hidden", "no-hidden"])
@pytest.mark.parametrize("algorithm,family,estimator", COMBOS)
def test_compiled_step_equals_reference_over_a_stream(algorithm, family, estimator, net, lik_name,
                                                      no_generic_estimate):
    model, lik, theta, X, Y = problem(net, lik_name)
    ref_f, fast_f = filters(model, lik, algorithm, family, estimator)
    assert ref_f._fused_spec is None and fast_f._fused_spec is not None
    bel = ref_f.init(theta, prior_var=0.05)
    ref, ref_res = ref_f.scan(bel, X, Y)
    # update alone (no predict) and predict_update, from the reference's belief
    ref_upd, ref_pu = ref_f.update(ref, X[0], Y[0]), ref_f.update(ref_f.predict(ref), X[1], Y[1])
    no_generic_estimate()
    out, out_res = fast_f.scan(bel, X, Y)
    same_belief_rel(out, ref)
    close_rel(out_res.yhat, ref_res.yhat)
    same_belief_rel(fast_f.update(ref, X[0], Y[0]), ref_upd)
    same_belief_rel(fast_f.predict_update(ref, X[1], Y[1]), ref_pu)


@pytest.mark.parametrize("family", ["diag", "diag-moment", "dlr"])
def test_compiled_lin_ef_with_vector_q_ou_dynamics_and_full_categorical(family, no_generic_estimate):
    model, _, theta, X, _ = problem("two-hidden", "categorical", seed=3)
    lik = rb.Categorical(3, mode="full")  # singular R: the pseudo-inverse whitening
    Y = np.random.default_rng(4).integers(0, 3, X.shape[0])
    q = np.random.default_rng(5).uniform(0, 2e-3, model.n_params)
    cases = []
    for extra in ({"q": q}, {"dynamics": "ou", "q": 0.0, "ou_mean": 0.1 * theta, "ou_var": 0.05}):
        kw = dict(family=family, estimator="lin-ef", rank=2, gamma=0.9, **extra)
        ref_f, fast_f = rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)
        bel = ref_f.init(theta, prior_var=0.05)
        cases.append((fast_f, bel, ref_f.scan(bel, X, Y)))
    no_generic_estimate()
    for fast_f, bel, (ref, ref_res) in cases:
        out, out_res = fast_f.scan(bel, X, Y)
        same_belief_rel(out, ref)
        close_rel(out_res.yhat, ref_res.yhat)


@pytest.mark.parametrize("estimator", ["lin-hess", "lin-ef"])
def test_compiled_natural_bong_with_the_full_gain_mean(estimator, no_generic_estimate):
    model, lik, theta, X, Y = problem("two-hidden", "gaussian", seed=6)
    kw = dict(family="diag", estimator=estimator, gamma=0.95, q=1e-3, vd_mean="ekf")
    ref_f, fast_f = rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)
    bel = ref_f.init(theta, prior_var=0.3)
    ref, _ = ref_f.scan(bel, X, Y)
    no_generic_estimate()
    out, _ = fast_f.scan(bel, X, Y)
    same_belief_rel(out, ref)


@pytest.mark.parametrize("bias", [True, False])
def test_compiled_step_serves_a_linear_model(bias, no_generic_estimate):
    rng = np.random.default_rng(7)
    model, lik = rb.Linear(3, 2, bias=bias), rb.Gaussian(0.5)
    X, Y = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    cases = []
    for family in ("diag-moment", "dlr"):
        kw = dict(algorithm="blr", family=family, estimator="lin-ef", lr=0.5, n_iter=2, rank=1, gamma=0.9, q=1e-3)
        ref_f, fast_f = rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)
        assert fast_f._fused_spec is not None
        bel = ref_f.init(np.zeros(model.n_params), 0.1)
        cases.append((fast_f, bel, ref_f.scan(bel, X, Y)[0]))
    no_generic_estimate()
    for fast_f, bel, ref in cases:
        same_belief_rel(fast_f.scan(bel, X, Y)[0], ref)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
@pytest.mark.parametrize("family", ["diag", "dlr"])
@pytest.mark.parametrize("estimator", ["lin-hess", "lin-ef"])
def test_compiled_step_raises_like_the_reference_and_keeps_the_belief(family, estimator):
    model, lik, theta, X, Y = problem("two-hidden", "gaussian")
    kw = dict(algorithm="blr", family=family, estimator=estimator, lr=0.5, n_iter=2, rank=2)
    ref_f, fast_f = rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)
    bel = ref_f.init(np.full_like(theta, 1e308), 0.1)  # a run-away mean: the model output overflows
    before = bel.mean.copy()
    x = np.ones(3)
    for f in (ref_f, fast_f):
        with pytest.raises(DivergenceError):
            f.update(bel, x, Y[0])
    np.testing.assert_array_equal(bel.mean, before)


def test_combinations_without_a_compiled_step_take_the_documented_general_route():
    # MC-HESS with the exact Hessian diagonal, other models and update_batch run the general route
    # (compiled inner steps and Jacobian); MC-HESS with Hutchinson's diagonal (the default) is compiled
    model, lik, theta, X, Y = problem("no-hidden", "gaussian")
    assert rb.Bong(model, lik, family="diag", estimator="mc-hess", n_samples=2, backend="numba")._fused_spec is not None
    f = rb.Bong(model, lik, family="diag", estimator="mc-hess", hess_diag="exact", n_samples=2, backend="numba")
    assert f._fused_spec is None
    g = rb.Bong(rb.Function(lambda th, x: th[:3] * x, 3, 3), lik, family="diag", estimator="lin-ef",
                backend="numba")
    assert g._fused_spec is None
    bel = f.init(theta, 0.1)
    assert np.all(np.isfinite(f.update(bel, X[0], Y[0], rng=np.random.default_rng(0)).mean))


def test_new_kernels_are_cached_and_use_only_reordering_fastmath():
    mod = importlib.import_module("refbayes.kernels.cpu.bong_mlp")
    disp = [(n, d) for n, d in vars(mod).items()
            if isinstance(d, numba.core.registry.CPUDispatcher) and d.__module__ == mod.__name__]
    assert len(disp) >= 8
    for name, d in disp:
        assert d._cache.__class__.__name__ == "FunctionCache", f"{name} lacks cache=True"
        fm = d.targetoptions.get("fastmath")
        assert set(fm or ()) <= {"reassoc", "contract"} and fm is not True, name


@pytest.mark.parametrize("family", ["diag", "diag-moment"])
def test_compiled_variance_failure_names_the_entry_and_its_value_like_the_reference(family):
    # a learning rate too large for BBB: a variance turns non-positive in some inner iteration
    model, lik, theta, X, Y = problem("two-hidden", "gaussian", seed=2)
    kw = dict(algorithm="bbb", family=family, estimator="lin-ef", lr=0.9, n_iter=4)
    ref_f, fast_f = rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)
    bel = ref_f.init(theta, 5.0)
    errors = []
    for f in (ref_f, fast_f):
        with pytest.raises(NotPositiveDefiniteError, match=r"made entry \d+ non-positive") as info:
            f.update(bel, X[0], Y[0])
        m = re.search(r"made entry (\d+) non-positive \((?:np\.float64\()?([-+0-9.eE]+)", str(info.value))
        errors.append((int(m.group(1)), float(m.group(2)), str(info.value)[:m.start()]))
    assert errors[1][0] == errors[0][0] and errors[0][1] <= 0.0
    assert errors[1][2] == errors[0][2]  # the same quantity named, in the reference's words
    close_rel(errors[1][1], errors[0][1])


def test_bad_moments_names_nonfinite_before_nonpositive():
    # the diagonal kernel's one-pass check of its outputs: 1 for NaN or inf anywhere, else 2 for a
    # variance <= 0 (-0.0 included), else 0
    from refbayes.kernels.cpu.bong_mlp import _bad_moments

    m, v = np.ones(37), np.full(37, 0.5)
    assert _bad_moments(m, v) == 0
    for arr, i, val, code in ((m, 3, np.nan, 1), (m, 36, -np.inf, 1), (v, 0, np.inf, 1), (v, 20, np.nan, 1),
                              (v, 5, 0.0, 2), (v, 36, -0.0, 2), (v, 11, -1e-300, 2)):
        bad = arr.copy()
        bad[i] = val
        args = (bad, v) if arr is m else (m, bad)
        assert _bad_moments(*args) == code, (i, val)
    v2 = v.copy()
    v2[[4, 9]] = (-1.0, np.nan)  # both: the non-finite one is named first
    assert _bad_moments(m, v2) == 1
