"""numba.cuda kernels (refbayes.kernels.cuda) against the NumPy reference.

Without a GPU they run in Numba's CUDA simulator. NUMBA_ENABLE_CUDASIM must be set
before numba.cuda is first imported, so the checks run in a fresh interpreter; sizes
are tiny because the simulator runs every GPU thread as a Python thread.
"""

import os
import subprocess
import sys
import textwrap

import pytest

CHECKS = textwrap.dedent(
    """
    import numpy as np
    from numba import cuda
    from refbayes import linalg
    from refbayes.beliefs import DLR, Diag
    from refbayes.errors import NotPositiveDefiniteError
    from refbayes.filters import diagonal as ref_diag
    from refbayes.filters import lofi as ref_lofi
    from refbayes.kernels import backend

    G = backend("cuda")
    assert G.is_available()

    def close(a, b, rtol=1e-10):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, (a.shape, b.shape)
        err = np.max(np.abs(a - b), initial=0.0)
        assert err <= rtol * max(1.0, np.max(np.abs(b), initial=0.0)), err

    def problem(rng, P, C, singular):
        mean, var = rng.standard_normal(P), rng.uniform(0.3, 2.0, P)
        if singular:  # full-class categorical: R = diag(p) - p p^T, H = R J, e = onehot - p
            p = rng.dirichlet(np.ones(C))
            R = np.diag(p) - np.outer(p, p)
            return mean, var, R @ rng.standard_normal((C, P)), R, np.eye(C)[0] - p
        A = rng.standard_normal((C, C))
        return mean, var, rng.standard_normal((C, P)), A @ A.T / C + 0.3 * np.eye(C), rng.standard_normal(C)

    n = 0
    # (P, C, L, singular): C = 1, rank 0, P < L + C, P = 150 across two 128-thread blocks (the
    # hardware launch configuration, kernels/cuda/_device.py TPB; 150 is not a multiple of it)
    for seed, (P, C, L, singular) in enumerate([(1, 1, 0, False), (5, 2, 3, False), (3, 3, 4, True),
                                                 (150, 2, 2, False)]):
        rng = np.random.default_rng(seed)
        mean, var, H, R, e = problem(rng, P, C, singular)
        m, v = G.fd_update(mean, var, H, R, e, singular=singular)
        ref = ref_diag.fd_update(Diag(mean, var), H, R, e, singular=singular)
        close(m, ref.mean); np.testing.assert_allclose(v, ref.var, rtol=1e-10)
        for rule in G.VD_MEAN_RULES:
            m, v = G.vd_update(mean, var, H, R, e, mean_rule=rule, singular=singular)
            ref = ref_diag.vd_update(Diag(mean, var), H, R, e, mean_rule=rule, singular=singular)
            close(m, ref.mean); np.testing.assert_allclose(v, ref.var, rtol=1e-10)
        W = rng.standard_normal((P, L))
        close(G.rowsumsq(W), linalg.rowsumsq(W))
        for gamma, q in [(1.0, 0.0), (0.9, 0.3), (1.2, rng.uniform(0, 1, P))]:
            m, u, Wn = G.dlr_predict(mean, 1 / var, W, gamma, q)
            ref = ref_lofi.predict(DLR(mean, 1 / var, W), gamma, q)
            close(m, ref.mean); np.testing.assert_allclose(u, ref.ups, rtol=1e-10)
            close(Wn @ Wn.T, ref.W @ ref.W.T)
        n += 1

    # LO-FI update (eqs 31-43): (P, C, L, rank, singular, W, route); P = 150 rows are two tiles of 128 (a partial second tile)
    from refbayes.kernels.cuda import _device as D
    lofi_cases = [(150, 2, 14, 3, False, "random", "gram"),  # L + C = 16: 136 pair sums > 128 threads
                  (150, 1, 3, 0, False, "random", "gram"),    # C = 1, rank 0
                  (150, 3, 2, 2, True, "random", "gram"),     # full-class categorical R (singular)
                  (150, 2, 3, 3, False, "zero", "gram"),      # prior W = 0: zero columns, 2 < rank components
                  (3, 2, 3, 2, False, "random", "tsqr"),     # P < L + C: W~ rank deficient
                  (150, 2, 3, 2, False, 1e-2, "cholqr2"),     # two close columns: second GPU pass
                  (150, 2, 3, 2, False, 1e-6, "tsqr")]        # nearly equal columns: CPU fallback
    for seed, (P, C, L, rank, singular, kind, expected) in enumerate(lofi_cases):
        rng = np.random.default_rng(100 + seed)
        mean, var, H, R, e = problem(rng, P, C, singular)
        W = np.zeros((P, L)) if kind == "zero" else rng.standard_normal((P, L))
        if not isinstance(kind, str):
            W[:, 1] = W[:, 0] + kind * rng.standard_normal(P)
        ref = ref_lofi.update(DLR(mean, 1 / var, W), H, R, e, rank=rank, singular=singular)
        for blocks in ([D.MAX_BLOCKS, 1] if seed == 0 else [D.MAX_BLOCKS]):  # 1: one block walks both tiles
            saved, D.MAX_BLOCKS = D.MAX_BLOCKS, blocks
            try:
                m, u, Wn, route = G.lofi_update(mean, 1 / var, W, H, R, e, rank, singular=singular, return_route=True)
            finally:
                D.MAX_BLOCKS = saved
            assert route == expected, (seed, route)
            close(m, ref.mean); np.testing.assert_allclose(u, ref.ups, rtol=1e-10)
            assert Wn.shape == (P, rank)
            close(Wn @ Wn.T, ref.W @ ref.W.T)
        n += 1
    # a forced route runs where the guard would not pick it
    mean, var, H, R, e = problem(np.random.default_rng(7), 150, 2, False)
    W = np.random.default_rng(8).standard_normal((150, 3))
    W0, H0 = W.copy(), H.copy()
    ref = ref_lofi.update(DLR(mean, 1 / var, W), H, R, e, rank=2)
    m, u, Wn, route = G.lofi_update(mean, 1 / var, W, H, R, e, 2, method="cholqr2", return_route=True)
    assert route == "cholqr2"
    close(m, ref.mean); np.testing.assert_allclose(u, ref.ups, rtol=1e-10); close(Wn @ Wn.T, ref.W @ ref.W.T)
    Wbad = W.copy(); Wbad[5, 1] = np.nan
    for call, exc_type, word in [(lambda: G.lofi_update(mean, 1 / var, W[:4], H, R, e), ValueError, "W"),
                                 (lambda: G.lofi_update(mean, 1 / var, W, H, R, e, method="x"), ValueError, "method"),
                                 (lambda: G.lofi_update(mean, 1 / var, W, H, R, e, rank=-1), ValueError, "rank"),
                                 (lambda: G.lofi_update(mean, 1 / var, Wbad, H, R, e), ValueError, "W contains NaN"),
                                 (lambda: G.lofi_update(mean, 1 / var, W, H, -R, e), NotPositiveDefiniteError, "R")]:
        try:
            call()
        except exc_type as exc:
            assert word in str(exc), exc
        else:
            raise AssertionError("no error for " + word)
    np.testing.assert_array_equal(W, W0); np.testing.assert_array_equal(H, H0)

    # errors: named bad input, round-off loss of a variance, inputs untouched
    mean, var, H, R, e = problem(np.random.default_rng(9), 4, 2, False)
    H0 = H.copy()
    for call, word in [(lambda: G.fd_update(mean, var, H[:, :3], R, e), "H"),
                       (lambda: G.vd_update(mean, var, H, R, e, mean_rule="x"), "mean_rule"),
                       (lambda: G.dlr_predict(mean, var, H.T, 0.0, 0.0), "gamma")]:
        try:
            call()
        except ValueError as exc:
            assert word in str(exc), exc
        else:
            raise AssertionError("no ValueError for " + word)
    Hn = H.copy(); Hn[1, 2] = np.nan
    try:
        G.vd_update(mean, var, Hn, R, e)
    except ValueError as exc:
        assert "H contains NaN" in str(exc), exc
    else:
        raise AssertionError("NaN in H not reported")
    try:
        G.fd_update(np.zeros(1), np.ones(1), np.ones((1, 1)), np.array([[1e-30]]), np.zeros(1))
    except NotPositiveDefiniteError:
        pass
    else:
        raise AssertionError("lost variance not reported")
    np.testing.assert_array_equal(H, H0)
    print("CUDA-SIM-OK", n)
    """
)

SIGS = textwrap.dedent(
    """
    from numba import cuda, types as T
    from refbayes.kernels.cuda import _device as D
    f8, i8, b1 = T.float64, T.int64, T.boolean
    A1, A2, I1 = f8[::1], f8[:, ::1], i8[::1]
    sigs = {"gram_rows_partial": (A2, A1, I1, I1, A2), "gram_cols_partial": (A2, A1, b1, I1, I1, A2),
            "diag_pass": (A1, A1, A2, A2, A1, i8, A1, A1), "rowsumsq": (A2, A1),
            "dlr_predict_diag": (A1, f8, A1, i8, A1, A1), "dlr_predict_rows": (A1, A1, A1, A2, f8, A2, b1, A1, A2),
            "lofi_tile_gram": (A2, A2, A1, A2, A2, i8, i8, i8, I1, I1, I1, A2),
            "lofi_output_rows": (A1, A1, A2, A2, A2, A2, A1, A1, A2)}
    kernels = {k for k, v in vars(D).items()
               if hasattr(v, "py_func") and not getattr(v, "targetoptions", {}).get("device")}
    assert set(sigs) == kernels, sorted(kernels ^ set(sigs))  # every kernel has a signature here
    """
)

PTX = SIGS + textwrap.dedent(
    """
    try:
        cuda.compile_ptx(D.rowsumsq.py_func, sigs["rowsumsq"], cc=(8, 0))
    except Exception as exc:  # no NVVM / NVRTC on this machine
        print("NO-TOOLCHAIN", type(exc).__name__)
        raise SystemExit(0)
    from numba.cuda.cudadrv.error import CudaSupportError
    compiled, driver = 0, 0
    for name, sig in sigs.items():
        try:
            ptx, _ = cuda.compile_ptx(getattr(D, name).py_func, sig, cc=(8, 0))
            assert ".entry" in ptx, name
            compiled += 1
        except CudaSupportError:  # a kernel that calls a device function asks the driver for the device
            driver += 1
    print("PTX-OK", compiled, "NEED-DRIVER", driver)
    """
)

# typing and lowering to LLVM IR (the step before NVVM): catches what the simulator lets through
LOWER = SIGS + textwrap.dedent(
    """
    try:
        from numba.cuda.compiler import compile_cuda
    except ImportError:
        print("NO-COMPILER-API")
        raise SystemExit(0)
    from numba.cuda.cudadrv.error import CudaSupportError
    lowered, driver = 0, 0
    for name, sig in sigs.items():
        try:
            compile_cuda(getattr(D, name).py_func, T.void, sig, cc=(8, 0)).library.get_llvm_str()
            lowered += 1
        except CudaSupportError:  # a kernel that calls a device function asks the driver for the device
            driver += 1
    print("LOWERED", lowered, "NEED-DRIVER", driver)
    """
)


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **env})


def test_cuda_kernels_match_reference_in_the_simulator():
    r = _run(CHECKS, NUMBA_ENABLE_CUDASIM="1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "CUDA-SIM-OK 11" in r.stdout


def test_cuda_kernels_compile_for_a_real_gpu():
    """Type-checks and lowers every kernel to PTX (sm_80); needs NVVM, not a GPU."""
    r = _run(PTX, NUMBA_ENABLE_CUDASIM="0")
    assert r.returncode == 0, r.stderr[-4000:]
    if "NO-TOOLCHAIN" in r.stdout:
        pytest.skip("no CUDA compiler libraries (NVVM/NVRTC) on this machine")
    # _block_sum_to is inlined: a called device function would ask the driver for the device
    assert "PTX-OK 8 NEED-DRIVER 0" in r.stdout, r.stdout


def test_cuda_kernels_type_check_and_lower_without_nvvm():
    """Types every kernel and lowers it to LLVM IR (no NVVM, no GPU needed)."""
    r = _run(LOWER, NUMBA_ENABLE_CUDASIM="0")
    assert r.returncode == 0, r.stderr[-4000:]
    if "NO-COMPILER-API" in r.stdout:
        pytest.skip("numba.cuda.compiler.compile_cuda is not available in this numba-cuda")
    assert "LOWERED 8 NEED-DRIVER 0" in r.stdout, r.stdout
