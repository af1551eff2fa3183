"""Every compiled backend gives the NumPy reference's numbers through the filter classes
(float64, rtol 1e-10), with dynamics, for regression and classification."""

import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refbayes as rb
from _cuda_helpers import run_script


def close(a, b, rtol=1e-10):
    scale = max(1.0, np.abs(b).max(initial=0.0))
    assert np.abs(a - b).max(initial=0.0) <= rtol * scale


def run(make, backend, model, lik, X, Y, theta0):
    filt = make(backend)
    bel, hist = filt.scan(filt.init(theta0, 0.3), X, Y)
    return bel, hist


FILTERS = {
    "FDEKF": lambda m, l: (lambda b: rb.FDEKF(m, l, gamma=0.97, q=1e-3, backend=b)),
    "VDEKF-paper": lambda m, l: (lambda b: rb.VDEKF(m, l, gamma=0.97, q=1e-3, vd_mean="paper", backend=b)),
    "VDEKF-ekf": lambda m, l: (lambda b: rb.VDEKF(m, l, gamma=0.97, q=1e-3, vd_mean="ekf", backend=b)),
    "LoFi-0": lambda m, l: (lambda b: rb.LoFi(m, l, rank=0, gamma=0.97, q=1e-3, backend=b)),
    "LoFi-3": lambda m, l: (lambda b: rb.LoFi(m, l, rank=3, gamma=0.97, q=1e-3, backend=b)),
    "Bong-dlr": lambda m, l: (lambda b: rb.Bong(m, l, family="dlr", rank=3, gamma=0.97, q=1e-3, backend=b)),
    "Bong-diag": lambda m, l: (lambda b: rb.Bong(m, l, family="diag", gamma=0.97, q=1e-3, backend=b)),
    "Bong-diag-fullgain": lambda m, l: (lambda b: rb.Bong(m, l, family="diag", vd_mean="ekf", gamma=0.97,
                                                          q=1e-3, backend=b)),
}


@pytest.mark.parametrize("name", sorted(FILTERS))
@settings(max_examples=8, deadline=None)
@given(hidden=st.integers(1, 6), task=st.sampled_from(["regression", "drop_last", "full"]),
       activation=st.sampled_from(["tanh", "relu"]), seed=st.integers(0, 2**32 - 1))
def test_numba_backend_equals_reference(name, hidden, task, activation, seed):
    rng = np.random.default_rng(seed)
    K = 3
    model = rb.MLP([2, hidden, 1 if task == "regression" else K], activation=activation)
    lik = rb.Gaussian(0.2) if task == "regression" else rb.Categorical(K, mode=task)
    X = rng.standard_normal((6, 2))
    Y = rng.standard_normal((6, 1)) if task == "regression" else rng.integers(0, K, 6)
    theta0 = model.init_params(rng)
    make = FILTERS[name](model, lik)
    assert make("numba").kernels.__name__ == "refbayes.kernels.cpu"
    ref, href = run(make, "numpy", model, lik, X, Y, theta0)
    out, hout = run(make, "numba", model, lik, X, Y, theta0)
    assert type(out) is type(ref)
    close(out.mean, ref.mean)
    close(hout["yhat"], href["yhat"])
    if isinstance(ref, rb.DLR):
        close(out.ups, ref.ups)
        close(out.W @ out.W.T, ref.W @ ref.W.T)
    else:
        close(out.var, ref.var)


def test_unsupported_backends_are_refused():
    model, lik = rb.MLP([2, 3, 1]), rb.Gaussian(1.0)
    with pytest.raises(ValueError, match="backend"):
        rb.FullEKF(model, lik, backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        rb.LoFi(model, lik, rank=2, backend="tpu")
    with pytest.raises(ValueError, match="backend"):  # numba over the full families: BONG and BOG with LIN only
        rb.Bong(model, lik, algorithm="blr", family="full-moment", lr=0.1, backend="numba")
    with pytest.raises(ValueError, match="backend"):
        rb.Bong(model, lik, family="full", estimator="mc-ef", backend="numba")
    with pytest.raises(ValueError, match="backend"):
        rb.FDEKF(model, lik, blocks=[np.arange(model.n_params)], backend="numba")
    with pytest.raises(ValueError, match="backend"):
        rb.VDEKF(model, lik, backend="tpu")


CUDA_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import refbayes as rb
    rng = np.random.default_rng(0)
    model = rb.MLP([2, 3, 3], activation="tanh")
    X, Y = rng.standard_normal((2, 2)), rng.integers(0, 3, 2)
    theta0 = model.init_params(rng)
    for Filt, kw in ((rb.FDEKF, {}), (rb.VDEKF, {"vd_mean": "paper"}), (rb.VDEKF, {"vd_mean": "ekf"})):
        outs = []
        for backend in ("numpy", "cuda"):
            f = Filt(model, rb.Categorical(3), gamma=0.9, q=0.01, backend=backend, **kw)
            outs.append(f.scan(f.init(theta0, 0.3), X, Y)[0])
        for a, b in ((outs[1].mean, outs[0].mean), (outs[1].var, outs[0].var)):
            assert np.abs(a - b).max() <= 1e-10 * max(1.0, np.abs(b).max()), (Filt.__name__, kw)
    outs = []
    for backend in ("numpy", "cuda"):
        f = rb.LoFi(model, rb.Categorical(3), rank=2, gamma=0.9, q=0.01, backend=backend)
        outs.append(f.scan(f.init(theta0, 0.3), X, Y)[0])
    for a, b in ((outs[1].mean, outs[0].mean), (outs[1].ups, outs[0].ups),
                 (outs[1].W @ outs[1].W.T, outs[0].W @ outs[0].W.T)):
        assert np.abs(a - b).max() <= 1e-10 * max(1.0, np.abs(b).max()), "LoFi"
    print("cuda-ok")
    """
)


@pytest.mark.cuda_script(CUDA_SCRIPT)
def test_cuda_backend_equals_reference_in_the_simulator():
    proc = run_script(CUDA_SCRIPT, simulator=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cuda-ok" in proc.stdout


PREDICT_UPDATE_FILTERS = {
    "FullEKF": lambda m, l: rb.FullEKF(m, l, gamma=0.97, q=1e-3),
    "VDEKF-numba": lambda m, l: rb.VDEKF(m, l, gamma=0.97, q=1e-3, backend="numba"),
    "LoFi": lambda m, l: rb.LoFi(m, l, rank=3, gamma=0.97, q=1e-3),
    "LoFi-numba": lambda m, l: rb.LoFi(m, l, rank=3, gamma=0.97, q=np.linspace(0, 1e-2, m.n_params),
                                       backend="numba"),
    "LoFi-numba-inflation": lambda m, l: rb.LoFi(m, l, rank=3, gamma=0.97, q=1e-3, inflation="simple",
                                                 alpha=0.1, backend="numba"),
}


@pytest.mark.parametrize("name", sorted(PREDICT_UPDATE_FILTERS))
def test_predict_update_equals_update_of_predict(name):
    rng = np.random.default_rng(5)
    model = rb.MLP([3, 4, 3])
    lik = rb.Categorical(3)
    filt = PREDICT_UPDATE_FILTERS[name](model, lik)
    bel = filt.init(model.init_params(rng), 0.5)
    X, Y = rng.standard_normal((4, 3)), rng.integers(0, 3, 4)
    for t in range(3):
        bel = filt.update(filt.predict(bel), X[t], Y[t])
    a = filt.predict_update(bel, X[3], Y[3])
    b = filt.update(filt.predict(bel), X[3], Y[3])
    close(a.mean, b.mean)
    if isinstance(a, rb.DLR):
        close(a.ups, b.ups)
        close(a.W @ a.W.T, b.W @ b.W.T)
    # scan without a callback (fused where available) = scan with one (predict and update apart)
    s1, h1 = filt.scan(bel, X, Y)
    s2, h2 = filt.scan(bel, X, Y, callback=lambda t, bp, bn, x, y: None)
    close(s1.mean, s2.mean)
    close(h1["yhat"], h2["yhat"])


def test_predict_update_rejects_bad_input_before_any_change():
    rng = np.random.default_rng(6)
    model = rb.MLP([3, 4, 3])
    lik = rb.Categorical(3)
    filt = rb.LoFi(model, lik, rank=2, gamma=0.97, q=1e-3, backend="numba")
    bel = filt.init(model.init_params(rng), 0.5)
    before = bel.mean.copy()
    with pytest.raises(ValueError, match="x"):
        filt.predict_update(bel, np.array([0.0, np.nan, 1.0]), 1)
    with pytest.raises(ValueError, match="y"):
        filt.predict_update(bel, np.zeros(3), 7)
    with pytest.raises(TypeError):
        filt.predict_update(rb.Diag(bel.mean, np.ones(model.n_params)), np.zeros(3), 1)
    np.testing.assert_array_equal(bel.mean, before)


@pytest.mark.parametrize("name", ["FDEKF", "VDEKF", "LoFi"])
def test_a_saturated_likelihood_is_the_same_error_type_on_both_backends(name):
    # softmax saturated: R = diag(p) - p p^T and the Jacobian vanish together, so S = H V H^T + R is
    # finite but singular; the compiled steps said "not finite (overflow)" with a DivergenceError for it
    pytest.importorskip("numba")
    model, lik = rb.MLP([4, 5, 3]), rb.Categorical(3)
    theta = model.init_params(np.random.default_rng(0)) * 1e4
    errors = []
    for backend in ("numpy", "numba"):
        kw = {"rank": 2} if name == "LoFi" else {}
        f = getattr(rb, name)(model, lik, backend=backend, **kw)
        bel = f.init(theta, 0.5)
        with pytest.raises(rb.NotPositiveDefiniteError) as info:
            f.predict_update(bel, np.full(4, 3.0), 1)
        errors.append(info.value)
    assert not isinstance(errors[1], rb.DivergenceError), errors[1]
    if name == "LoFi":  # R whitened on the host: the reference's message, naming the saturated variance
        assert str(errors[1]) == str(errors[0])
