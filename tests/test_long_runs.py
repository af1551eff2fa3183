"""Long runs at the defaults: every filter stays finite, or stops with DivergenceError at the
first bad step. Slow (minutes): run with ``pytest -m slow tests/test_long_runs.py``."""

import numpy as np
import pytest

import refbayes as rb

pytestmark = pytest.mark.slow


def _filters(model, lik):
    return {
        "FullEKF": rb.FullEKF(model, lik),
        "FDEKF": rb.FDEKF(model, lik),
        "VDEKF": rb.VDEKF(model, lik),
        "LoFi": rb.LoFi(model, lik, rank=10),
        "LoFi-numba": rb.LoFi(model, lik, rank=10, backend="numba"),
        "Bong": rb.Bong(model, lik),
        "Bong-numba": rb.Bong(model, lik, backend="numba"),
    }


def _run(filt, theta, X, Y):
    bel = filt.init(theta, 1.0)
    try:
        with np.errstate(all="ignore"):
            bel, res = filt.scan(bel, X, Y)
    except (rb.DivergenceError, rb.NotPositiveDefiniteError) as exc:
        assert exc.step is not None  # named at the step where it happened
        return None
    assert np.all(np.isfinite(bel.mean)) and np.all(np.isfinite(res.log_pred))
    return bel, res


@pytest.mark.parametrize("name", ["FullEKF", "FDEKF", "VDEKF", "LoFi", "LoFi-numba", "Bong", "Bong-numba"])
def test_20000_step_drifting_regression(name):
    rng = np.random.default_rng(0)
    T = 20_000
    X = rng.uniform(-2, 2, (T, 1))
    phase = np.linspace(0, 3 * np.pi, T)[:, None]  # the target drifts over the stream
    Y = np.sin(2 * X + phase) + 0.1 * rng.standard_normal((T, 1))
    model = rb.MLP([1, 16, 1])
    filt = _filters(model, rb.Gaussian(0.01))[name]
    _run(filt, model.init_params(rng), X, Y)


@pytest.mark.parametrize("name", ["FullEKF", "FDEKF", "VDEKF", "LoFi", "LoFi-numba", "Bong", "Bong-numba"])
def test_five_passes_over_digits(name):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    rng = np.random.default_rng(1)
    model = rb.MLP([64, 20, 10])
    if name == "FullEKF":  # P = 1,510: five passes of a dense P x P update take too long; one pass
        passes = 1
    else:
        passes = 5
    order = np.concatenate([rng.permutation(len(X)) for _ in range(passes)])
    filt = _filters(model, rb.Categorical(10))[name]
    # at the defaults (prior_var = 1) these filters stay finite but fit digits poorly (one-pass
    # accuracy 0.1-0.35 here; LO-FI reaches 0.91 with prior_var = 0.1, which refbayes.tune picks):
    # this test holds them to finiteness, not to accuracy
    _run(filt, model.init_params(rng), X[order], y[order])
