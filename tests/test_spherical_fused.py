"""Spherical LO-FI (Chang et al. 2023, eqs 110-118) on the compiled one-call MLP step, against the NumPy
reference (``spherical_predict`` / ``spherical_update``).

The compiled step is the diagonal variant's with the discarded directions dropped: for ups = eta * 1 and W
with orthogonal columns the exact DLR predict is eqs 110-111, the diagonal variant's mean is eq. 116 (both
use the untruncated precision) and W' is the same; eq. 118 keeps ups' = ubar. These tests hold the step
to the reference's numbers and check that the compiled route was taken.
"""

import numpy as np
import pytest

import refbayes as rb
from refbayes.kernels.cpu import step as kstep

SETTINGS = {
    "gamma-q": dict(gamma=0.95, q=0.01),
    "steady-state": dict(gamma=0.97, steady_state=True),
    "no-dynamics": dict(gamma=1.0, q=0.0),
    "svd-qr": dict(gamma=0.9, q=0.02, svd="qr"),
}


def _problem(kind, rng, T=20):
    if kind == "mlp-gaussian":
        model, lik = rb.MLP([3, 5, 2]), rb.Gaussian(0.3)
        Y = rng.standard_normal((T, 2))
    elif kind == "mlp-categorical":
        model, lik = rb.MLP([3, 6, 4, 3], activation="relu"), rb.Categorical(3)
        Y = rng.integers(0, 3, T)
    else:  # a Linear model without bias, categorical with all classes
        model, lik = rb.Linear(6, 3, bias=False), rb.Categorical(3, mode="full")
        Y = rng.integers(0, 3, T)
    X = rng.standard_normal((T, model.in_dim))
    return model, lik, X, Y, 0.5 * rng.standard_normal(model.n_params)


def _counting(monkeypatch):
    calls = []
    real = kstep.lofi_mlp_step

    def counted(*args, **kw):
        calls.append(kw.get("spherical"))
        return real(*args, **kw)

    monkeypatch.setattr(kstep, "lofi_mlp_step", counted)
    return calls


def _same(b1, b0):
    np.testing.assert_allclose(b1.mean, b0.mean, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(b1.ups, b0.ups, rtol=1e-12)
    np.testing.assert_allclose(b1.W @ b1.W.T, b0.W @ b0.W.T, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("kind", ["mlp-gaussian", "mlp-categorical", "linear-categorical-full"])
def test_spherical_lofi_on_the_compiled_step_equals_the_reference(kind, setting, monkeypatch):
    rng = np.random.default_rng(11)
    model, lik, X, Y, theta = _problem(kind, rng)
    kw = SETTINGS[setting]
    ref = rb.LoFi(model, lik, rank=3, variant="spherical", **kw)
    fast = rb.LoFi(model, lik, rank=3, variant="spherical", backend="numba", **kw)
    calls = _counting(monkeypatch)
    b1, r1 = fast.scan(fast.init(theta, 0.5), X, Y)
    b0, r0 = ref.scan(ref.init(theta, 0.5), X, Y)
    assert calls and all(calls), calls  # every step took the compiled route, as the spherical variant
    assert np.all(b1.ups == b1.ups[0])  # exactly spherical: the discarded directions were dropped
    _same(b1, b0)
    np.testing.assert_allclose(r1.log_pred, r0.log_pred, rtol=1e-10)
    # one predict_update and one update from the scanned belief, through the compiled step too
    n = len(calls)
    _same(fast.predict_update(b1, X[0], Y[0]), ref.predict_update(b0, X[0], Y[0]))
    _same(fast.update(b1, X[1], Y[1]), ref.update(b0, X[1], Y[1]))
    assert len(calls) == n + 2
    # the columns of W stay orthogonal (what the spherical predict, eq. 111, assumes)
    WtW = b1.W.T @ b1.W
    off = WtW - np.diag(np.diag(WtW))
    assert np.abs(off).max() <= 1e-10 * np.abs(WtW).max()


def test_spherical_compiled_step_refuses_a_non_constant_diagonal_before_any_work(monkeypatch):
    rng = np.random.default_rng(1)
    model, lik, X, Y, theta = _problem("mlp-gaussian", rng)
    fast = rb.LoFi(model, lik, rank=2, variant="spherical", backend="numba", gamma=0.9, q=0.01)
    bel = rb.DLR(theta, rng.uniform(1.0, 2.0, model.n_params), np.zeros((model.n_params, 2)))
    calls = _counting(monkeypatch)
    for step in (lambda: fast.predict_update(bel, X[0], Y[0]), lambda: fast.update(bel, X[0], Y[0]),
                 lambda: fast.scan(bel, X[:2], Y[:2])):
        with pytest.raises(ValueError, match="must be constant"):
            step()
    assert calls == []


def test_orthogonal_projection_update_does_not_take_the_compiled_step(monkeypatch):
    # svd="orth" is another algorithm (App. F.5.2): it must run the reference, never the SVD step
    rng = np.random.default_rng(2)
    model, lik, X, Y, theta = _problem("mlp-gaussian", rng)
    calls = _counting(monkeypatch)
    fast = rb.LoFi(model, lik, rank=2, variant="spherical", svd="orth", backend="numba")
    ref = rb.LoFi(model, lik, rank=2, variant="spherical", svd="orth")
    b1, _ = fast.scan(fast.init(theta, 0.5), X, Y)
    b0, _ = ref.scan(ref.init(theta, 0.5), X, Y)
    assert calls == []
    np.testing.assert_allclose(b1.mean, b0.mean, rtol=1e-10, atol=1e-13)


def test_the_diagonal_variant_keeps_the_discarded_directions(monkeypatch):
    # the same compiled step without drop moves the discarded directions into ups (eqs 41-42): on the
    # same belief the two variants share mean and W and differ in ups exactly by those directions
    rng = np.random.default_rng(3)
    model, lik, X, Y, theta = _problem("mlp-categorical", rng)
    sph = rb.LoFi(model, lik, rank=2, variant="spherical", backend="numba", gamma=0.95, q=0.01)
    dia = rb.LoFi(model, lik, rank=2, backend="numba", gamma=0.95, q=0.01)
    bel, _ = sph.scan(sph.init(theta, 0.5), X[:6], Y[:6])
    bs, bd = sph.predict_update(bel, X[6], Y[6]), dia.predict_update(bel, X[6], Y[6])
    np.testing.assert_allclose(bs.mean, bd.mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(bs.W @ bs.W.T, bd.W @ bd.W.T, rtol=1e-10, atol=1e-13)
    extra = bd.ups - bs.ups
    assert np.all(extra >= 0) and extra.max() > 1e-6 * bs.ups[0]
