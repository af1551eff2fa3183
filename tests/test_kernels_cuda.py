"""numba.cuda kernels (refbayes.kernels.cuda) against the NumPy reference.

Without a GPU they run in Numba's CUDA simulator. NUMBA_ENABLE_CUDASIM must be set
before numba.cuda is first imported, so the checks run in a fresh interpreter; sizes
are tiny because the simulator runs every GPU thread as a Python thread.
"""

import textwrap

import pytest
from _cuda_helpers import assert_kernels_compile, compile_targets, assert_script_prints

CHECKS = textwrap.dedent(
    """
    import numpy as np
    import pytest
    from numba import cuda
    from problems import close
    from refbayes import linalg
    from refbayes.beliefs import DLR, Diag
    from refbayes.errors import NotPositiveDefiniteError
    from refbayes.filters import diagonal as ref_diag
    from refbayes.filters import lofi as ref_lofi
    from refbayes.kernels import backend

    G = backend("cuda")
    assert G.is_available()

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
        with pytest.raises(exc_type, match=word):
            call()
    np.testing.assert_array_equal(W, W0); np.testing.assert_array_equal(H, H0)

    # errors: named bad input, round-off loss of a variance, inputs untouched
    mean, var, H, R, e = problem(np.random.default_rng(9), 4, 2, False)
    H0 = H.copy()
    for call, word in [(lambda: G.fd_update(mean, var, H[:, :3], R, e), "H"),
                       (lambda: G.vd_update(mean, var, H, R, e, mean_rule="x"), "mean_rule"),
                       (lambda: G.dlr_predict(mean, var, H.T, 0.0, 0.0), "gamma")]:
        with pytest.raises(ValueError, match=word):
            call()
    Hn = H.copy(); Hn[1, 2] = np.nan
    with pytest.raises(ValueError, match="H contains NaN"):
        G.vd_update(mean, var, Hn, R, e)
    with pytest.raises(NotPositiveDefiniteError):  # the variance is lost to round-off
        G.fd_update(np.zeros(1), np.ones(1), np.ones((1, 1)), np.array([[1e-30]]), np.zeros(1))
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
    todo = [(getattr(D, name).py_func, sig, name) for name, sig in sigs.items()]
    probe = (D.rowsumsq.py_func, sigs["rowsumsq"])
    """
)


@pytest.mark.cuda_script(CHECKS)
def test_cuda_kernels_match_reference_in_the_simulator():
    assert_script_prints(CHECKS, "CUDA-SIM-OK 11")


@pytest.mark.parametrize("target", compile_targets(SIGS))
def test_cuda_kernels_compile(target):
    """Every kernel is typed and lowered to LLVM IR (no NVVM, no GPU needed) and compiled to PTX for sm_80
    (needs NVVM, not a GPU; skipped without it)."""
    # _block_sum_to is inlined: a called device function would ask the driver for the device
    assert_kernels_compile(SIGS, target, 8)
