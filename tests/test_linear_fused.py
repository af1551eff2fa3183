"""rb.Linear(bias=True) has the parameter layout of an MLP with no hidden layer, so the
compiled one-call steps serve it; they must give the NumPy reference's numbers."""

import numpy as np
import pytest

import refbayes as rb

MAKERS = {
    "LoFi": lambda m, l, b: rb.LoFi(m, l, rank=4, gamma=0.95, q=0.01, backend=b),
    "FDEKF": lambda m, l, b: rb.FDEKF(m, l, gamma=0.95, q=0.01, backend=b),
    "VDEKF": lambda m, l, b: rb.VDEKF(m, l, gamma=0.95, q=0.01, backend=b),
    "Bong-dlr": lambda m, l, b: rb.Bong(m, l, family="dlr", rank=4, gamma=0.95, q=0.01, backend=b),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("kind", ["gaussian", "categorical"])
def test_linear_model_on_the_compiled_step_equals_the_reference(name, kind):
    rng = np.random.default_rng(0)
    model = rb.Linear(20, 3, bias=True)
    lik = rb.Gaussian(0.3) if kind == "gaussian" else rb.Categorical(3)
    X = rng.standard_normal((30, 20))
    Y = rng.standard_normal((30, 3)) if kind == "gaussian" else rng.integers(0, 3, 30)
    theta = model.init_params(rng)
    prior_var = rng.uniform(0.3, 1.0, model.n_params)  # distinct variances: no ties in LO-FI's truncation
    ref, fast = MAKERS[name](model, lik, "numpy"), MAKERS[name](model, lik, "numba")
    assert fast._fused_step(fast.init(theta, prior_var), X[0], Y[0]) is not None  # the compiled step serves it
    b0, r0 = ref.scan(ref.init(theta, prior_var), X, Y)
    b1, r1 = fast.scan(fast.init(theta, prior_var), X, Y)
    np.testing.assert_allclose(b1.mean, b0.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b1.marginal_variance(), b0.marginal_variance(), rtol=1e-10)
    np.testing.assert_allclose(r1.log_pred, r0.log_pred, rtol=1e-10)


def test_linear_model_without_bias_takes_the_general_route():
    model = rb.Linear(5, 2, bias=False)
    filt = rb.LoFi(model, rb.Gaussian(0.3), rank=2, backend="numba")
    assert filt._fused_step(filt.init(np.zeros(10), 1.0), np.ones(5), np.zeros(2)) is None
