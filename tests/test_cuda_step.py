"""The GPU LO-FI step (refbayes.kernels.cuda.step) and beliefs on the GPU (refbayes.device), against
the NumPy reference.

Without a GPU the step runs in Numba's CUDA simulator, with the launch configuration of the
hardware (TPB threads per block, SEG rows per slice): NUMBA_ENABLE_CUDASIM must be set before
numba.cuda is first imported, so these checks run in a fresh interpreter, on tiny networks (the
simulator runs every GPU thread as a Python thread). The kernels are also typed and lowered to
LLVM IR (and to PTX where NVVM is installed), which catches what the simulator lets through.
tests/test_gpu.py holds the checks that need a real GPU.
"""

import textwrap

import pytest
from _cuda_helpers import assert_kernels_compile, compile_targets, assert_script_prints, run_script

SIM = textwrap.dedent(
    """
    import numpy as np
    import pytest
    import refbayes as rb
    from problems import close
    from refbayes.device import DeviceDLR, to_device, to_host
    from refbayes.kernels.cuda import step as S
    from launches import watch_launches

    launched = watch_launches()

    def same(bg, br, probe):
        assert isinstance(bg, DeviceDLR), type(bg)
        close(bg.mean, br.mean)
        close(bg.ups, br.ups)
        # W is defined up to a right orthogonal factor: compare W W^T on a few directions
        close(bg.W @ (bg.W.T @ probe), br.W @ (br.W.T @ probe))

    rng = np.random.default_rng(7)
    n = 0
    # (model, likelihood, rank, gamma, q): biases and hidden layers; categorical (drop_last, C < C_f) with a
    # q per parameter; Linear without bias across two slices of pass 1 (2100 > SEG = 2048 inputs) and
    # 17 blocks of pass 2 (2100 is not a multiple of TPB); rank 0 (a diagonal belief)
    cases = [(rb.MLP([2, 3, 2]), rb.Gaussian(0.3), 2, 0.95, 0.01),
             (rb.MLP([3, 2, 3], activation="relu"), rb.Categorical(3), 2, 1.0, "vector"),
             (rb.Linear(2100, 1, bias=False), rb.Gaussian(0.5), 1, 1.0, 0.0),
             (rb.MLP([2, 2, 1], activation="elu"), rb.Gaussian(1.0), 0, 0.9, 0.05)]
    for model, lik, rank, gamma, q in cases:
        P = model.n_params
        q = rng.uniform(0.0, 0.02, P) if isinstance(q, str) else q
        X = rng.standard_normal((2, model.in_dim))
        Y = rng.integers(0, 3, 2) if isinstance(lik, rb.Categorical) else rng.standard_normal((2, model.out_dim))
        ref = rb.LoFi(model, lik, rank=rank, gamma=gamma, q=q)
        gpu = rb.LoFi(model, lik, rank=rank, gamma=gamma, q=q, backend="cuda")
        m0 = 0.4 * rng.standard_normal(P)
        b0 = gpu.init(m0, 0.7)
        assert isinstance(b0, DeviceDLR), type(b0)
        bg, rg = gpu.scan(b0, X, Y)
        br, rr = ref.scan(ref.init(m0, 0.7), X, Y)
        probe = rng.standard_normal((P, 2))
        same(bg, br, probe)
        close(rg.yhat, rr.yhat)
        close(rg.log_pred, rr.log_pred)
        n += 1
        if P > 100:
            continue
        # predict alone (on the GPU too), update alone and a host DLR in: the same numbers, beliefs on the GPU
        same(gpu.predict(bg), ref.predict(br), probe)
        same(gpu.update(gpu.predict(bg), X[0], Y[0]), ref.update(ref.predict(br), X[0], Y[0]), probe)
        same(gpu.predict_update(to_host(bg), X[1], Y[1]), ref.predict_update(br, X[1], Y[1]), probe)
        n += 1

    # the old belief is untouched by a step (no kernel writes into an existing belief's arrays)
    model, lik = rb.MLP([2, 3, 2]), rb.Gaussian(0.3)
    gpu = rb.LoFi(model, lik, rank=2, backend="cuda")
    b0 = gpu.init(0.3 * rng.standard_normal(model.n_params), 0.5)
    before = [b0.device_mean.copy_to_host(), b0.device_ups.copy_to_host(), b0.device_Wt.copy_to_host()]
    b1 = gpu.update(b0, np.ones(2), np.ones(2))
    after = [b0.device_mean.copy_to_host(), b0.device_ups.copy_to_host(), b0.device_Wt.copy_to_host()]
    for u, v in zip(before, after):
        np.testing.assert_array_equal(u, v)
    # a step moves x, y and numbers of the network's width: no copy of P numbers (here P = 120, two units)
    lin = rb.LoFi(rb.Linear(60, 2, bias=False), lik, rank=2, q=0.01, backend="cuda")
    bl = lin.init(np.zeros(120))
    S.TRANSFERS.reset()
    lin.predict_update(bl, np.ones(60), np.ones(2))
    assert 0 < S.TRANSFERS.count and S.TRANSFERS.largest < 8 * 120, (S.TRANSFERS.largest, 8 * 120)
    S.TRANSFERS.reset()
    bp = lin.predict(lin.update(bl, np.ones(60), np.ones(2)))  # predict alone: L x L numbers cross
    assert isinstance(bp, DeviceDLR) and S.TRANSFERS.largest < 8 * 120, S.TRANSFERS.largest
    # beliefs that are kept are never written again; the arrays of a collected belief serve a later step,
    # unless the caller still holds one of them
    import gc
    gc.collect()  # beliefs in reference cycles die now, not in the middle of the checks below
    gc.disable()
    S._POOL.clear()
    S._PENDING.clear()
    beliefs, snaps = [], []
    b = bl
    xs = rng.standard_normal((5, 60))  # inputs in general position: the one-Gram route, not its fallback
    for t in range(3):
        b = lin.predict_update(b, xs[t], np.ones(2))
        beliefs.append(b)
        snaps.append(b.device_mean.copy_to_host())
    bx = lin.predict_update(b, xs[3], np.zeros(2))
    held = bx.device_ups
    gone = id(bx.device_mean)
    del bx
    S._collect()
    key = ((120,), np.dtype(np.float64).str)
    assert all(id(a) != id(held) for a in S._POOL.get(key, [])), "an array still held was recycled"
    assert any(id(a) == gone for a in S._POOL.get(key, [])), "a collected belief's array was not recycled"
    by = lin.predict_update(b, xs[4], np.zeros(2))
    assert gone in (id(by.device_mean), id(by.device_ups)), "the recycled array was not used"
    gc.enable()
    for bb, sn in zip(beliefs, snaps):
        np.testing.assert_array_equal(bb.device_mean.copy_to_host(), sn)
    close(by.mean, rb.LoFi(rb.Linear(60, 2, bias=False), lik, rank=2, q=0.01).predict_update(
        to_host(b), xs[4], np.zeros(2)).mean)
    # a missing output takes the host route and comes back to the GPU; save writes the DLR
    b2 = gpu.update(b1, np.ones(2), np.array([np.nan, 1.0]))
    assert isinstance(b2, DeviceDLR)
    r1 = rb.LoFi(model, lik, rank=2).update(to_host(b1), np.ones(2), np.array([np.nan, 1.0]))
    close(b2.mean, r1.mean)
    import tempfile, os
    with tempfile.TemporaryDirectory() as d:
        path = rb.save(b2, os.path.join(d, "b.npz"))
        back = rb.load(path)
        assert type(back) is rb.DLR
        np.testing.assert_array_equal(back.mean, b2.mean)
    # overflow is a DivergenceError at the step; bad input a ValueError before any work
    with pytest.raises(rb.DivergenceError):
        gpu.update(b1, np.array([1e300, 1e300]), np.ones(2))
    with pytest.raises(ValueError):  # x of the wrong shape
        gpu.update(b1, np.ones(3), np.ones(2))
    with pytest.raises(TypeError):  # the DeviceDLR constructor refuses host arrays
        rb.DeviceDLR(np.zeros(2), np.ones(2), np.zeros((2, 0)))
    # the pool and the workspaces can be dropped; the next step builds what it needs again
    S.release_pool()
    from refbayes.kernels.cuda import _launch
    assert not S._POOL and not S._WS and not _launch._CACHE
    close(lin.predict_update(bl, xs[0], np.ones(2)).mean,
          rb.LoFi(rb.Linear(60, 2, bias=False), lik, rank=2, q=0.01).predict_update(to_host(bl), xs[0], np.ones(2)).mean)
    # every kernel of the step and of predict alone ran with arguments of the kinds launches.py accepts
    assert {"_fwd_partial", "_fwd_finish", "rev_partial", "_rev_finish", "pass1", "_reduce", "pass2", "pred_rows",
            "_fill"} <= set(launched), launched
    print("STEP-SIM-OK", n)
    """
)

SIGS = textwrap.dedent(
    """
    from numba import cuda, types as T
    from refbayes.kernels.cuda import step as S
    f8, i8, b1 = T.float64, T.int64, T.boolean
    A1, A2, A3, I1, I2 = f8[::1], f8[:, ::1], f8[:, :, ::1], i8[::1], i8[:, ::1]
    plain = {"_fwd_partial": (A1, i8, i8, A1, i8, A2),
             "_fwd_finish": (A2, A1, i8, f8, i8, b1, A1, A1, i8, A1, i8, i8, I1),
             "_rev_finish": (A3, f8, A1, i8, A2, i8), "_reduce": (A2, A1, i8, A2, I1, A2), "_fill": (A1, f8)}
    kernels = {k for k, v in vars(S).items() if hasattr(v, "py_func") and "cuda" in type(v).__module__
               and not getattr(v, "targetoptions", {}).get("device")}
    assert set(plain) == kernels, sorted(kernels ^ set(plain))  # every kernel has a signature here
    built = {"rev_partial": (A1, i8, i8, i8, f8, A2, i8, A3),
             "pass1": (I2, A1, A2, A1, i8, f8, f8, A1, I1, I1, A2, A2),
             "pass2": (A1, A1, A2, A1, i8, f8, f8, I2, A1, A1, i8, A1, A1, A2, I1),
             "pred_rows": (A1, A1, A2, A1, i8, f8, f8, A2, A1, A1, A2, I1)}
    todo = [(getattr(S, k).py_func, sig, k) for k, sig in plain.items()]
    for L, rank, Cf in [(3, 2, 4), (0, 1, 1), (10, 10, 10), (70, 70, 2)]:
        rev, p1, p2 = S._kernels(L, rank, Cf)[:3]
        pr = S._kernels(L, rank, Cf)[6]
        todo += [(rev.py_func, built["rev_partial"], "rev_partial"), (p1.py_func, built["pass1"], "pass1"),
                 (p2.py_func, built["pass2"], "pass2"), (pr.py_func, built["pred_rows"], "pred_rows")]
    # float32 beliefs: the kernels that read or write the belief's arrays, once more with those in float32
    f4 = T.float32
    B1, B2 = f4[::1], f4[:, ::1]
    todo += [(S._fwd_partial.py_func, (B1, i8, i8, A1, i8, A2), "_fwd_partial f4"),
             (S._fwd_finish.py_func, (A2, B1, i8, f8, i8, b1, A1, A1, i8, A1, i8, i8, I1), "_fwd_finish f4")]
    rev, p1, p2 = S._kernels(3, 2, 4)[:3]
    pr = S._kernels(3, 2, 4)[6]
    todo += [(rev.py_func, (B1, i8, i8, i8, f8, A2, i8, A3), "rev_partial f4"),
             (p1.py_func, (I2, B1, B2, A1, i8, f8, f8, A1, I1, I1, A2, A2), "pass1 f4"),
             (p2.py_func, (B1, B1, B2, A1, i8, f8, f8, I2, A1, A1, i8, B1, B1, B2, I1), "pass2 f4"),
             (pr.py_func, (B1, B1, B2, A1, i8, f8, f8, A2, B1, B1, B2, I1), "pred_rows f4")]
    probe = (S._reduce.py_func, plain["_reduce"])
    """
)


@pytest.mark.cuda_script(SIM)
def test_gpu_step_matches_reference_in_the_simulator():
    assert_script_prints(SIM, "STEP-SIM-OK 7")


@pytest.mark.parametrize("target", compile_targets(SIGS))
def test_gpu_step_kernels_compile(target):
    """Every kernel of the step (four compiled triples, rank 0 included; those that touch the belief's arrays
    also with float32 arrays) is typed and lowered to LLVM IR (no NVVM needed) and compiled to PTX for sm_80
    (needs NVVM, not a GPU; skipped without it)."""
    assert_kernels_compile(SIGS, target, 27)


TO_DEVICE = textwrap.dedent(
    """
    import numpy as np
    import pytest
    import refbayes as rb
    from numba import cuda
    if cuda.is_available():
        print("HAS-GPU")
        raise SystemExit(0)
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        rb.device.to_device(rb.DLR(np.zeros(3), np.ones(3), np.zeros((3, 1))))
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        rb.device.to_device(rb.Diag(np.zeros(3), np.ones(3)))
    with pytest.raises(TypeError, match="takes a refbayes.DLR or a refbayes.Diag"):
        rb.device.to_device(rb.FullCov(np.zeros(3), np.eye(3)))
    print("REFUSED-OK")
    """
)


def test_moving_a_belief_to_the_gpu_without_one_is_a_clear_error():
    r = run_script(TO_DEVICE, simulator=False)
    assert r.returncode == 0, r.stderr[-4000:]
    if "HAS-GPU" in r.stdout:
        pytest.skip("a GPU is present")
    assert "REFUSED-OK" in r.stdout, r.stdout


BENCH = textwrap.dedent(
    """
    import json, os, sys, tempfile
    import refbayes as rb
    from numba import cuda
    from refbayes.validation import bench_gpu as B
    # the bench's whole code path in the simulator, on one tiny workload (the GPU figures come from a GPU)
    B._gpu = lambda: cuda
    B._workloads = lambda quick: [("linear", rb.Linear(30, 2, bias=False))]
    B.device_copy_bandwidth = lambda cuda, **kw: 1e12
    B.C, B.RANK, B.N_TIMED, B.WARM = 2, 2, (1, 1), 1
    with tempfile.TemporaryDirectory() as d:
        s = B.run(quick=True, outdir=d)
        assert os.path.exists(os.path.join(d, "bench_gpu.json"))
    row = s["rows"][0]
    assert row["P"] == 60 and row["cuda"]["device_resident"] and not row["numba"]["device_resident"]
    assert row["cuda_f32"]["device_resident"] and row["cuda_f32"]["dtype"] == row["numba_f32"]["dtype"] == "float32"
    assert {"numba_over_cuda", "numpy_over_cuda", "multiple_of_floor", "numba_over_cuda_f32",
            "multiple_of_floor_f32"} <= set(row)
    assert row["bytes_per_step_f32"] == row["bytes_per_step"] // 2
    assert row["fdekf"]["cuda"]["device_resident"] and row["fdekf"]["bytes_per_step"] == 6 * 8 * 60
    sp = row["spherical"]
    assert sp["cuda"]["device_resident"] and not sp["numba"]["device_resident"]
    assert sp["bytes_per_step"] == row["bytes_per_step"] and sp["numba_over_cuda"] > 0
    assert any(c["name"].startswith("spherical LO-FI GPU step") for c in s["checks"])
    assert 0 < row["f32_mean_rel_diff"] < 1e-5, row["f32_mean_rel_diff"]
    assert set(row["cuda"]["phases_ms"]) >= {"forward pass", "pass 1", "host algebra", "pass 2"}
    assert len(s["table"]["rows"]) == 2 and len(s["table"]["rows"][0]) == len(s["table"]["header"])
    names = [c["name"] for c in s["checks"]]
    assert sum("faster than numba" in n for n in names) == 4 and any("float32 GPU run follows" in n for n in names)
    assert any(n.startswith("FD-EKF GPU step") for n in names)
    print("BENCH-OK")
    """
)


@pytest.mark.cuda_script(BENCH)
def test_gpu_bench_runs_its_whole_path_in_the_simulator():
    assert_script_prints(BENCH, "BENCH-OK")


SIM32 = textwrap.dedent(
    """
    import numpy as np
    import pytest
    import refbayes as rb
    from refbayes.device import DeviceDLR, to_device, to_host
    from refbayes.kernels.cuda import step as S
    from launches import watch_launches

    launched = watch_launches()
    U = 2.0**-24  # float32's unit round-off

    def rel(a, b):
        return np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)

    def rounded_close(out, want, before):
        # the float32 GPU step reads the rounded belief as the float64 reference does and computes in
        # float64 (its Gram sums too: rows are staged in float64), so it differs from the reference by the
        # rounding of its outputs, about U normwise; a wrong stride or offset in float32 memory fails
        assert isinstance(out, DeviceDLR) and out.dtype == np.float32, (type(out), out.dtype)
        assert all(getattr(out, f"device_{a}").dtype == np.float32 for a in ("mean", "ups", "Wt"))
        assert rel(out.mean, want.mean) < 2 * U, rel(out.mean, want.mean) / U
        assert rel(out.ups, want.ups) < 2 * U, rel(out.ups, want.ups) / U
        # W is unique up to the signs and order of its columns; the precision's low-rank part is not
        WW = out.W.astype(np.float64) @ out.W.T
        assert rel(WW, want.W @ want.W.T) < 4 * U, rel(WW, want.W @ want.W.T) / U
        assert rel(out.mean, before.mean) > 1e3 * U  # the step moved the mean

    rng = np.random.default_rng(11)
    n = 0
    # a hidden layer with biases, a categorical likelihood (drop_last, C < C_f), gamma < 1 and a q per parameter
    model, lik = rb.MLP([3, 2, 3], activation="relu"), rb.Categorical(3)
    P = model.n_params
    q = rng.uniform(0.0, 0.02, P)
    X = rng.standard_normal((5, model.in_dim))
    Y = rng.integers(0, 3, 5)
    ref = rb.LoFi(model, lik, rank=2, gamma=0.95, q=q)
    gpu = rb.LoFi(model, lik, rank=2, gamma=0.95, q=q, backend="cuda", dtype=np.float32)
    b64, _ = ref.scan(ref.init(0.5 * rng.standard_normal(P), rng.uniform(0.3, 1.0, P)), X[:3], Y[:3])
    b32 = b64.astype(np.float32)
    rounded = b32.astype(np.float64)  # exactly the float32 numbers, in float64
    d32 = to_device(b32)
    assert d32.dtype == np.float32 and "float32" in repr(d32)
    np.testing.assert_array_equal(to_host(d32).W, b32.W)
    rounded_close(gpu.predict_update(d32, X[3], Y[3]), ref.predict_update(rounded, X[3], Y[3]), rounded)
    pred = gpu.predict(d32)  # the predict step alone, on the GPU
    want = ref.predict(rounded)
    assert isinstance(pred, DeviceDLR) and pred.dtype == np.float32
    assert rel(pred.ups, want.ups) < 2 * U and rel(pred.W.astype(np.float64) @ pred.W.T, want.W @ want.W.T) < 4 * U
    # a host float32 DLR goes to the GPU as it is; a scan stays on the GPU in float32
    bs, rs = gpu.scan(b32, X[4:], Y[4:])
    br, rr = ref.scan(rounded, X[4:], Y[4:])
    assert isinstance(bs, DeviceDLR) and bs.dtype == np.float32
    assert rel(bs.mean, br.mean) < 1e-5 and np.allclose(rs.log_pred, rr.log_pred, rtol=1e-5)
    n += 1

    # a float64 belief is not silently converted (nor the other way round); astype keeps it on the GPU
    model, lik = rb.MLP([2, 3, 2]), rb.Gaussian(0.3)
    g32 = rb.LoFi(model, lik, rank=2, backend="cuda", dtype=np.float32)
    g64 = rb.LoFi(model, lik, rank=2, backend="cuda")
    b0 = g64.init(0.3 * rng.standard_normal(model.n_params), 0.5)
    with pytest.raises(ValueError, match=r"astype\\(np.float32\\)"):
        g32.update(b0, np.ones(2), np.ones(2))
    c0 = b0.astype(np.float32)
    assert isinstance(c0, DeviceDLR) and c0.dtype == np.float32 and c0.astype("float32") is c0
    with pytest.raises(ValueError, match=r"astype\\(np.float64\\)"):
        g64.update(c0, np.ones(2), np.ones(2))
    # a result beyond float32's range is a DivergenceError at the step, though it is finite in float64
    # (each kernel checks its outputs as stored); the old belief is untouched
    before = c0.device_mean.copy_to_host()
    assert np.all(np.isfinite(rb.LoFi(model, lik, rank=2).update(to_host(c0).astype(np.float64), np.ones(2),
                                                                  np.full(2, 1e100)).mean))
    import gc
    gc.collect()
    S._POOL.clear()
    S._PENDING.clear()
    with pytest.raises(rb.DivergenceError):
        g32.update(c0, np.ones(2), np.full(2, 1e100))
    np.testing.assert_array_equal(c0.device_mean.copy_to_host(), before)
    # the failed step's new arrays are recycled, under float32 keys: for float32 steps only
    S._collect()
    keys = {dt for (_, dt) in S._POOL}
    assert keys == {np.dtype(np.float32).str}, keys
    # a missing output takes the host route and comes back to the GPU in float32; save and load keep float32
    b2 = g32.update(c0, np.ones(2), np.array([np.nan, 1.0]))
    assert isinstance(b2, DeviceDLR) and b2.dtype == np.float32
    r2 = rb.LoFi(model, lik, rank=2).update(to_host(c0).astype(np.float64), np.ones(2), np.array([np.nan, 1.0]))
    assert rel(b2.mean, r2.mean) < 2 * U
    import tempfile, os
    with tempfile.TemporaryDirectory() as d:
        back = rb.load(rb.save(b2, os.path.join(d, "b.npz")))
        assert type(back) is rb.DLR and back.dtype == np.float32
        np.testing.assert_array_equal(back.W, b2.W)
    # (FD-EKF and VD-EKF in float32 on the GPU: tests/test_cuda_diag_step.py)
    assert {"_fwd_partial", "_fwd_finish", "pass1", "_reduce", "pass2"} <= set(launched), launched
    print("STEP32-SIM-OK", n)
    """
)


@pytest.mark.cuda_script(SIM32)
def test_float32_gpu_step_is_the_reference_step_rounded_in_the_simulator():
    assert_script_prints(SIM32, "STEP32-SIM-OK 1")


SIMSPH = textwrap.dedent(
    """
    import numpy as np
    import refbayes as rb
    from problems import close
    from refbayes.device import DeviceDLR, to_host
    from refbayes.kernels.cuda import step as S

    # spherical LO-FI on the GPU: the same chain with the discarded directions dropped (ups' = ubar, the
    # same for every parameter); predict alone is the exact DLR predict, eqs 110-111 for orthogonal columns
    rng = np.random.default_rng(5)
    model, lik = rb.MLP([2, 3, 2]), rb.Gaussian(0.3)
    P = model.n_params
    X, Y = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    ref = rb.LoFi(model, lik, rank=2, variant="spherical", gamma=0.95, q=0.01)
    gpu = rb.LoFi(model, lik, rank=2, variant="spherical", gamma=0.95, q=0.01, backend="cuda")
    m0 = 0.4 * rng.standard_normal(P)
    S.TRANSFERS.reset()
    bg, rg = gpu.scan(gpu.init(m0, 0.7), X[:2], Y[:2])
    assert S.TRANSFERS.count > 0  # the GPU chain ran
    br, rr = ref.scan(ref.init(m0, 0.7), X[:2], Y[:2])
    probe = rng.standard_normal((P, 2))
    for out, want in ((bg, br), (gpu.predict(bg), ref.predict(br)),
                      (gpu.update(bg, X[2], Y[2]), ref.update(br, X[2], Y[2]))):
        assert isinstance(out, DeviceDLR), type(out)
        close(out.mean, want.mean)
        ups = out.ups
        assert np.all(ups == ups[0]), ups
        close(ups, want.ups)
        close(out.W @ (out.W.T @ probe), want.W @ (want.W.T @ probe))
    close(rg.log_pred, rr.log_pred)
    # steady_state needs eta, which lives on the GPU: that filter takes the host route, with the same numbers
    st = rb.LoFi(model, lik, rank=2, variant="spherical", gamma=0.95, steady_state=True, backend="cuda")
    sr = rb.LoFi(model, lik, rank=2, variant="spherical", gamma=0.95, steady_state=True)
    close(st.predict_update(to_host(bg), X[2], Y[2]).mean, sr.predict_update(br, X[2], Y[2]).mean)
    sp = st.predict(bg)  # its predict alone of a belief on the GPU: on the host, and back to the GPU
    assert isinstance(sp, DeviceDLR), type(sp)
    close(sp.W @ (sp.W.T @ probe), sr.predict(br).W @ (sr.predict(br).W.T @ probe))
    bs, _ = st.scan(st.init(m0, 0.7), X[:2], Y[:2])
    close(bs.mean, sr.scan(sr.init(m0, 0.7), X[:2], Y[:2])[0].mean)
    print("SPHERICAL-SIM-OK")
    """
)


@pytest.mark.cuda_script(SIMSPH)
def test_spherical_gpu_step_matches_reference_in_the_simulator():
    assert_script_prints(SIMSPH, "SPHERICAL-SIM-OK")
