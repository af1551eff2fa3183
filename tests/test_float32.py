"""float32 beliefs (``dtype=np.float32``, backend "numba"): LoFi, FDEKF and VDEKF store the belief in
float32 and compute in float64 (docs/float32.md). Each step is compared with the NumPy reference run
in float64 on the same, float32-rounded, belief."""

import numpy as np
import pytest

import refbayes as rb

U = 2.0**-24  # float32's unit round-off

MAKERS = {
    "LoFi": lambda m, l, b, dt: rb.LoFi(m, l, rank=3, gamma=0.97, q=0.002, backend=b, dtype=dt),
    "FDEKF": lambda m, l, b, dt: rb.FDEKF(m, l, gamma=0.97, q=0.002, backend=b, dtype=dt),
    "VDEKF": lambda m, l, b, dt: rb.VDEKF(m, l, gamma=0.97, q=0.002, backend=b, dtype=dt),
    "VDEKF-paper": lambda m, l, b, dt: rb.VDEKF(m, l, gamma=0.97, q=0.002, vd_mean="paper", backend=b, dtype=dt),
}

PROBLEMS = {
    "mlp-gaussian": (lambda: rb.MLP([6, 12, 3]), lambda: rb.Gaussian(0.4)),
    "mlp-categorical": (lambda: rb.MLP([6, 12, 3]), lambda: rb.Categorical(3)),
    "linear-no-bias": (lambda: rb.Linear(6, 3, bias=False), lambda: rb.Gaussian(0.4)),
}


def _stream(rng, kind, T):
    X = rng.standard_normal((T, 6))
    Y = rng.integers(0, 3, T) if kind == "mlp-categorical" else rng.standard_normal((T, 3))
    return X, Y


def _rel(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize("name", sorted(MAKERS))
def test_float32_step_is_the_reference_step_rounded(name, problem):
    # The float32 step reads the same numbers as the float64 reference does from the rounded belief,
    # so their difference is (i) the rounding of the new belief to float32, <= U per entry, and
    # (ii) the products of two float32 belief entries that the passes form before adding them in
    # float64 (the Gram matrices of W), each within U; the small algebra runs in float64. On these
    # well-conditioned problems that is about U, normwise (measured: 0.3-0.9 U). A kernel that read
    # float32 memory with the wrong stride or offset, or returned float64, fails.
    rng = np.random.default_rng(7)
    make_model, make_lik = PROBLEMS[problem]
    model, lik = make_model(), make_lik()
    X, Y = _stream(rng, problem, 8)
    ref = MAKERS[name](model, lik, "numpy", np.float64)
    theta = rng.standard_normal(model.n_params) * 0.5
    prior = ref.init(theta, rng.uniform(0.3, 1.0, model.n_params))
    b64, _ = ref.scan(prior, X[:6], Y[:6])  # a belief with a non-zero low-rank part
    b32 = b64.astype(np.float32)
    rounded = b32.astype(np.float64)  # exactly the float32 numbers, in float64

    fast = MAKERS[name](model, lik, "numba", np.float32)
    assert fast._fused_step(b32, X[6], Y[6]) is not None  # the compiled one-call step serves it
    for step in ("predict_update", "update"):
        out = getattr(fast, step)(b32, X[6], Y[6])
        want = getattr(ref, step)(rounded, X[6], Y[6])
        assert out.dtype == np.float32 and type(out) is type(want)
        arrays = ("mean", "ups", "W") if name == "LoFi" else ("mean", "var")
        assert all(getattr(out, a).dtype == np.float32 for a in arrays)
        assert _rel(out.mean, want.mean) < 2 * U
        if name == "LoFi":
            assert _rel(out.ups, want.ups) < 2 * U
            # W is unique up to the signs and order of its columns; the precision's low-rank part is not
            assert _rel(out.W.astype(np.float64) @ out.W.T, want.W @ want.W.T) < 4 * U
        else:
            assert _rel(out.var, want.var) < 2 * U
        assert _rel(out.mean, b64.mean) > 1e3 * U  # the step moved the mean: the comparison means something


@pytest.mark.parametrize("name", ["LoFi", "FDEKF"])
def test_float32_filtering_follows_float64(name):
    # 150 steps of a categorical MLP: the float32 run is the float64 run perturbed by about U per step;
    # its predictions stay within 1e-5 of the float64 run's (measured: 1.0e-6 for LoFi, 7e-8 for FDEKF;
    # the means 2.2e-6 and 1.8e-7)
    rng = np.random.default_rng(1)
    model, lik = rb.MLP([6, 10, 3]), rb.Categorical(3)
    X = rng.standard_normal((150, 6))
    Y = (X[:, 0] + X[:, 1] > 0).astype(int) + (X[:, 2] > 1).astype(int)
    theta = model.init_params(rng)
    runs = {}
    for dt in (np.float64, np.float32):
        filt = MAKERS[name](model, lik, "numba", dt)
        runs[dt] = filt.scan(filt.init(theta, 0.5), X, Y)
    (b64, r64), (b32, r32) = runs[np.float64], runs[np.float32]
    assert b32.dtype == np.float32
    np.testing.assert_allclose(r32.log_pred, r64.log_pred, rtol=1e-5)
    assert _rel(b32.mean, b64.mean) < 1e-5


def test_other_routes_keep_float32():
    # an rb.Function model and inflation take the general route (float64 arithmetic, the new belief
    # rounded to float32); the spherical variant the one-call step, as the diagonal one
    rng = np.random.default_rng(2)
    fn = rb.Function(lambda th, x: np.tanh(th[:3] * x[0]) + th[3:6], n_params=6, out_dim=3, in_dim=1)
    lik = rb.Gaussian(0.5)
    X, Y = rng.standard_normal((20, 1)), rng.standard_normal((20, 3))
    cases = [
        (fn, dict(rank=2)),
        (rb.MLP([1, 4, 3]), dict(rank=2, variant="spherical")),
        (rb.MLP([1, 4, 3]), dict(rank=2, inflation="bayesian", alpha=0.1)),
    ]
    for model, kw in cases:
        theta = rng.standard_normal(model.n_params) * 0.5  # distinct weights: no tied directions to truncate
        runs = {}
        for dt in (np.float64, np.float32):
            filt = rb.LoFi(model, lik, q=1e-3, gamma=0.99, backend="numba", dtype=dt, **kw)
            runs[dt], _ = filt.scan(filt.init(theta, 0.5), X, Y)
        assert runs[np.float32].dtype == np.float32 and runs[np.float32].W.dtype == np.float32
        assert _rel(runs[np.float32].mean, runs[np.float64].mean) < 1e-5, kw


def test_dtype_errors_are_clear_and_early():
    model, lik = rb.MLP([2, 3, 1]), rb.Gaussian(1.0)
    with pytest.raises(ValueError, match="needs backend in"):
        rb.LoFi(model, lik, dtype=np.float32)  # the NumPy reference is float64
    with pytest.raises(TypeError, match="dtype"):  # filters without a float32 path take no dtype
        rb.Bong(model, lik, family="diag", backend="numba", dtype=np.float32)
    with pytest.raises(ValueError, match="float64 or float32"):
        rb.FDEKF(model, lik, backend="numba", dtype=np.float16)
    f32 = rb.FDEKF(model, lik, backend="numba", dtype="float32")
    b64 = rb.FDEKF(model, lik, backend="numba").init(np.zeros(model.n_params))
    with pytest.raises(ValueError, match=r"astype\(np.float32\)"):
        f32.update(b64, np.zeros(2), 0.0)  # a float64 belief is not silently converted
    b32 = f32.init(np.zeros(model.n_params))
    assert b32.var.dtype == np.float32 and b32.astype(np.float32) is b32
    with pytest.raises(ValueError, match="beyond the range of float32"):
        f32.init(np.full(model.n_params, 1e39))
    with pytest.raises(ValueError, match="beyond the range of float32"):
        rb.DLR(np.zeros(2), np.ones(2), np.zeros((2, 1)), dtype=np.float32).replace(ups=np.array([1.0, 1e40]))


def test_a_float32_file_with_a_float64_array_is_malformed(tmp_path):
    bel = rb.DLR(np.zeros(3), np.ones(3), np.ones((3, 2)), dtype=np.float32)
    path = rb.save(bel, tmp_path / "b.npz")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files if k != "__checksum__"}
    arrays["W"] = arrays["W"].astype(np.float64)
    np.savez(tmp_path / "mixed.npz", **arrays)
    with pytest.raises(ValueError, match="'W' must hold float32"):
        rb.load(tmp_path / "mixed.npz")
