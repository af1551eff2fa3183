"""The GPU FD-EKF / VD-EKF step (refbayes.kernels.cuda.diag_step) and diagonal beliefs on the GPU
(refbayes.device.DeviceDiag), against the NumPy reference.

As in tests/test_cuda_step.py the step runs in Numba's CUDA simulator with the hardware's launch
configuration, in a fresh interpreter, on tiny networks; its kernels are also typed and lowered to LLVM IR
(PTX where NVVM is present). tests/test_gpu.py runs the simulator script on a real GPU.
"""

import textwrap

import pytest
from _cuda_helpers import assert_kernels_compile, compile_targets, assert_script_prints

SIM = textwrap.dedent(
    """
    import os, tempfile
    import numpy as np
    import pytest
    import refbayes as rb
    from problems import close
    from refbayes.device import DeviceDiag, to_device, to_host
    from refbayes.kernels.cuda import step as S
    from launches import watch_launches

    launched = watch_launches()

    def same(bg, br):
        assert isinstance(bg, DeviceDiag), type(bg)
        close(bg.mean, br.mean)
        close(bg.var, br.var)

    rng = np.random.default_rng(5)
    n = 0
    # (filter, options, model, likelihood, gamma, q): a hidden layer with biases and a categorical likelihood
    # (drop_last, C < C_f) with a q per parameter; rb.Linear without bias across two slices of the per-unit
    # sums (2100 > SEG = 2048 inputs) and 17 blocks of the row kernel (2100 is not a multiple of TPB)
    cases = [(rb.FDEKF, {}, rb.MLP([3, 2, 3], activation="relu"), rb.Categorical(3), 0.95, "vector"),
             (rb.VDEKF, {"vd_mean": "paper"}, rb.Linear(2100, 1, bias=False), rb.Gaussian(0.5), 1.0, 0.0),
             (rb.VDEKF, {}, rb.MLP([2, 3, 2], activation="elu"), rb.Gaussian(0.3), 0.9, 0.05)]
    for F, kw, model, lik, gamma, q in cases:
        P = model.n_params
        q = rng.uniform(0.0, 0.02, P) if isinstance(q, str) else q
        X = rng.standard_normal((2, model.in_dim))
        Y = rng.integers(0, 3, 2) if isinstance(lik, rb.Categorical) else rng.standard_normal((2, model.out_dim))
        ref = F(model, lik, gamma=gamma, q=q, **kw)
        gpu = F(model, lik, gamma=gamma, q=q, backend="cuda", **kw)
        m0, v0 = 0.4 * rng.standard_normal(P), rng.uniform(0.3, 1.0, P)
        b0 = gpu.init(m0, v0)
        assert isinstance(b0, DeviceDiag), type(b0)
        if P > 100:  # one step of the large case
            same(gpu.predict_update(b0, X[0], Y[0]), ref.predict_update(ref.init(m0, v0), X[0], Y[0]))
            n += 1
            continue
        # one step from a prior with a variance per parameter (a diagonal belief has no other state)
        bg, rg = gpu.scan(b0, X[:1], Y[:1])
        br, rr = ref.scan(ref.init(m0, v0), X[:1], Y[:1])
        same(bg, br)
        close(rg.yhat, rr.yhat)
        close(rg.log_pred, rr.log_pred)
        n += 1
    # the predict step alone and the update alone, on the GPU (the last case: gamma < 1, q > 0)
    same(gpu.predict(bg), ref.predict(br))
    same(gpu.update(bg, X[0], Y[0]), ref.update(br, X[0], Y[0]))
    n += 1

    # a step moves x, y and numbers of the network's width, no copy of P numbers, and leaves the old belief
    # as it was
    model, lik = rb.Linear(60, 2, bias=False), rb.Gaussian(0.3)
    fd = rb.FDEKF(model, lik, q=0.01, backend="cuda")
    b0 = fd.init(0.1 * rng.standard_normal(120))
    before = b0.device_mean.copy_to_host()
    S.TRANSFERS.reset()
    b1 = fd.predict_update(b0, np.ones(60), np.ones(2))
    assert 0 < S.TRANSFERS.count and S.TRANSFERS.largest < 8 * 120, (S.TRANSFERS.largest, 8 * 120)
    np.testing.assert_array_equal(b0.device_mean.copy_to_host(), before)
    # a missing output takes the host route and comes back to the GPU; save writes the Diag
    b2 = fd.update(b1, np.ones(60), np.array([np.nan, 1.0]))
    assert isinstance(b2, DeviceDiag)
    same(b2, rb.FDEKF(model, lik, q=0.01).update(to_host(b1), np.ones(60), np.array([np.nan, 1.0])))
    with tempfile.TemporaryDirectory() as d:
        back = rb.load(rb.save(b2, os.path.join(d, "b.npz")))
        assert type(back) is rb.Diag
        np.testing.assert_array_equal(back.var, b2.var)
    with pytest.raises(ValueError):  # x of the wrong shape, before any work
        fd.update(b1, np.ones(3), np.ones(2))
    with pytest.raises(TypeError):  # the DeviceDiag constructor refuses host arrays
        rb.DeviceDiag(np.zeros(2), np.ones(2))

    # float32: the step reads the rounded belief as the float64 reference does and computes in float64, so
    # it differs from the reference by the rounding of its outputs (about U normwise); a result beyond
    # float32's range is a DivergenceError at the step, though finite in float64
    U = 2.0**-24
    rel = lambda a, b: np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)
    model, lik = rb.MLP([2, 3, 2]), rb.Gaussian(0.3)
    ref = rb.FDEKF(model, lik, gamma=0.97, q=0.002)
    b64, _ = ref.scan(ref.init(0.5 * rng.standard_normal(model.n_params), 0.7), X[:2, :2], Y[:2])
    b32 = to_device(b64.astype(np.float32))
    assert isinstance(b32, DeviceDiag) and b32.dtype == np.float32 and "float32" in repr(b32)
    g32 = rb.FDEKF(model, lik, gamma=0.97, q=0.002, backend="cuda", dtype=np.float32)
    out = g32.predict_update(b32, np.ones(2), np.ones(2))
    want = ref.predict_update(to_host(b32).astype(np.float64), np.ones(2), np.ones(2))
    assert isinstance(out, DeviceDiag) and out.device_mean.dtype == out.device_var.dtype == np.float32
    assert rel(out.mean, want.mean) < 2 * U and rel(out.var, want.var) < 2 * U, (rel(out.mean, want.mean) / U,
                                                                                rel(out.var, want.var) / U)
    assert rel(out.mean, b64.mean) > 1e3 * U  # the step moved the mean
    assert np.all(np.isfinite(ref.update(to_host(b32).astype(np.float64), np.ones(2), np.full(2, 1e100)).mean))
    with pytest.raises(rb.DivergenceError):
        g32.update(b32, np.ones(2), np.full(2, 1e100))
    with pytest.raises(ValueError, match=r"astype\\(np.float32\\)"):
        g32.update(rb.FDEKF(model, lik, backend="cuda").init(np.zeros(model.n_params)), np.ones(2), np.ones(2))
    n += 1
    # every kernel of the step and of predict alone ran with arguments of the kinds launches.py accepts
    want = {"_fwd_partial", "_fwd_finish", "_zeta_partial", "_reduce", "_diag_rows", "_predict_rows"}
    assert want <= set(launched), launched
    print("DIAG-SIM-OK", n)
    """
)


@pytest.mark.cuda_script(SIM)
def test_gpu_diag_step_matches_reference_in_the_simulator():
    assert_script_prints(SIM, "DIAG-SIM-OK 5")


SIGS = textwrap.dedent(
    """
    from numba import cuda, types as T
    from refbayes.kernels.cuda import diag_step as D
    f8, f4, i8 = T.float64, T.float32, T.int64
    A1, I1, I2 = f8[::1], i8[::1], i8[:, ::1]
    kernels = {k for k, v in vars(D).items() if hasattr(v, "py_func") and "cuda" in type(v).__module__
               and not getattr(v, "targetoptions", {}).get("device")}
    assert kernels == {"_zeta_partial", "_diag_rows", "_predict_rows"}, kernels
    todo = []
    for B1 in (f8[::1], f4[::1]):  # the belief's arrays in float64 and in float32
        todo += [(D._zeta_partial.py_func, (I2, B1, A1, i8, f8, f8, A1, f8[:, ::1]), "_zeta_partial"),
                 (D._diag_rows.py_func, (B1, B1, A1, i8, f8, f8, I2, A1, A1, i8, i8, B1, B1, I1), "_diag_rows"),
                 (D._predict_rows.py_func, (B1, B1, A1, i8, f8, f8, B1, B1, I1), "_predict_rows")]
    probe = (D._predict_rows.py_func, todo[2][1])
    """
)


@pytest.mark.parametrize("target", compile_targets(SIGS))
def test_gpu_diag_step_kernels_compile(target):
    """The diagonal step's kernels, with the belief in float64 and in float32, typed and lowered to LLVM IR
    (no NVVM needed) and compiled to PTX for sm_80 (needs NVVM, not a GPU; skipped without it)."""
    assert_kernels_compile(SIGS, target, 6)


BONG = textwrap.dedent(
    """
    import numpy as np
    import pytest
    import refbayes as rb
    from problems import close
    from refbayes.device import DeviceDiag, DeviceDLR

    # Bong(backend="cuda"): BONG with LIN-HESS over "diag" (natural) runs the VD-EKF chain, over "dlr" the
    # LO-FI chain (Jones et al. 2024: eqs 214-215 and 281-292 are those updates); the predict step, a step with
    # a missing output and update_batch (the host route) come back to the GPU. Against the NumPy reference Bong.
    rng = np.random.default_rng(9)
    model, lik = rb.MLP([2, 3, 2]), rb.Gaussian(0.3)
    P = model.n_params
    X, Y = rng.standard_normal((2, 2)), rng.standard_normal((2, 2))
    n = 0
    # (the diagonal family from a prior with a variance per parameter: one step; DLR: two, so that W != 0)
    for fam, kw, kind, T in (("diag", {"vd_mean": "ekf"}, DeviceDiag, 1), ("dlr", {"rank": 2}, DeviceDLR, 2)):
        ref = rb.Bong(model, lik, family=fam, gamma=0.95, q=0.01, **kw)
        gpu = rb.Bong(model, lik, family=fam, gamma=0.95, q=0.01, backend="cuda", **kw)
        m0, v0 = 0.4 * rng.standard_normal(P), rng.uniform(0.3, 1.0, P)
        bg, rg = gpu.scan(gpu.init(m0, v0), X[:T], Y[:T])
        br, rr = ref.scan(ref.init(m0, v0), X[:T], Y[:T])
        for out, want in ((bg, br), (gpu.predict(bg), ref.predict(br)),
                          (gpu.update(bg, X[0], np.array([np.nan, 1.0])), ref.update(br, X[0], np.array([np.nan, 1.0]))),
                          (gpu.update_batch(bg, X, Y), ref.update_batch(br, X, Y))):
            assert type(out) is kind, type(out)
            close(out.mean, want.mean)
            close(out.marginal_variance(), want.marginal_variance())
        close(rg.yhat, rr.yhat)
        n += 1
    # combinations without a GPU chain are refused at construction
    for bad in (dict(family="diag-moment"), dict(family="dlr", algorithm="blr", lr=0.5), dict(estimator="lin-ef")):
        with pytest.raises(ValueError, match="backend='cuda' runs Bong"):
            rb.Bong(model, lik, backend="cuda", **bad)
    fn = rb.Function(lambda th, x: th[:2] * x[0], n_params=2, out_dim=2, in_dim=1)
    with pytest.raises(ValueError, match="rb.MLP or rb.Linear"):
        rb.Bong(fn, lik, family="diag", backend="cuda")
    print("BONG-SIM-OK", n)
    """
)


@pytest.mark.cuda_script(BONG)
def test_gpu_bong_lin_hess_matches_reference_in_the_simulator():
    assert_script_prints(BONG, "BONG-SIM-OK 2")
