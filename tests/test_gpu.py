"""Checks that need a real NVIDIA GPU (skipped elsewhere): the GPU LO-FI step against the NumPy
reference at P >= 1e6, and a 100-step scan that copies nothing P-sized between host and device.

Each check runs in a fresh interpreter without the CUDA simulator (other test modules set
NUMBA_ENABLE_CUDASIM=1 in theirs); it prints NO-GPU and the test skips where there is no GPU.
tests/test_cuda_step.py runs the same step in the simulator on every machine.
"""

import os
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

PRELUDE = textwrap.dedent(
    """
    import numpy as np
    from numba import cuda
    try:
        ok = cuda.is_available()
    except Exception:
        ok = False
    if not ok:
        print("NO-GPU")
        raise SystemExit(0)
    import refbayes as rb
    from refbayes.device import DeviceDLR
    from refbayes.kernels.cuda import _launch, step as S
    # each launch whose parameters refbayes converts is checked against numba-cuda's own conversion first
    _launch.VERIFY = True

    def close(a, b, rtol=1e-10):
        a, b = np.asarray(a), np.asarray(b)
        err = np.max(np.abs(a - b), initial=0.0)
        assert err <= rtol * max(1.0, np.max(np.abs(b), initial=0.0)), err
        return err
    """
)

LARGE = PRELUDE + textwrap.dedent(
    """
    rng = np.random.default_rng(3)
    # the bench's two workloads at P >= 1e6: h = reshape(theta, (C, P / C)) x and a tanh MLP
    for model in (rb.Linear(100_000, 10, bias=False), rb.MLP([100, 1000, 1000, 10])):
        P = model.n_params
        lik = rb.Gaussian(1.0)
        X = rng.standard_normal((3, model.in_dim)) / np.sqrt(model.in_dim)
        Y = rng.standard_normal((3, 10))
        m0 = rng.standard_normal(P) / np.sqrt(model.in_dim)
        ref = rb.LoFi(model, lik, rank=10, q=1e-6)
        gpu = rb.LoFi(model, lik, rank=10, q=1e-6, backend="cuda")
        br, rr = ref.scan(ref.init(m0, 0.1), X, Y)
        bg, rg = gpu.scan(gpu.init(m0, 0.1), X, Y)
        assert isinstance(bg, DeviceDLR)
        probe = rng.standard_normal((P, 2))
        errs = [close(bg.mean, br.mean), close(bg.ups, br.ups),
                close(bg.W @ (bg.W.T @ probe), br.W @ (br.W.T @ probe)), close(rg.yhat, rr.yhat)]
        print("P", P, "max errors (mean, ups, W W^T probe, yhat)", errs)
    # rank 70: more 2 x 2 column blocks than threads in a block of pass 1 (each thread takes several)
    model = rb.Linear(3000, 2)
    P = model.n_params
    X, Y = rng.standard_normal((75, 3000)) / 50, rng.standard_normal((75, 2))
    ref = rb.LoFi(model, rb.Gaussian(0.5), rank=70, q=1e-4)
    gpu = rb.LoFi(model, rb.Gaussian(0.5), rank=70, q=1e-4, backend="cuda")
    br, _ = ref.scan(ref.init(np.zeros(P), 0.1), X, Y)
    bg, _ = gpu.scan(gpu.init(np.zeros(P), 0.1), X, Y)
    probe = rng.standard_normal((P, 2))
    print("rank 70 errors", close(bg.mean, br.mean), close(bg.ups, br.ups),
          close(bg.W @ (bg.W.T @ probe), br.W @ (br.W.T @ probe)))
    # spherical LO-FI (the same chain, discarded directions dropped) on the MLP at P = 1,112,010
    model = rb.MLP([100, 1000, 1000, 10])
    P = model.n_params
    X, Y = rng.standard_normal((3, 100)) / 10, rng.standard_normal((3, 10))
    m0 = rng.standard_normal(P) / 10
    ref = rb.LoFi(model, rb.Gaussian(1.0), rank=10, variant="spherical", gamma=0.999, q=1e-6)
    gpu = rb.LoFi(model, rb.Gaussian(1.0), rank=10, variant="spherical", gamma=0.999, q=1e-6, backend="cuda")
    br, _ = ref.scan(ref.init(m0, 0.1), X, Y)
    bg, _ = gpu.scan(gpu.init(m0, 0.1), X, Y)
    assert isinstance(bg, DeviceDLR)
    ups = bg.ups
    assert np.all(ups == ups[0])
    probe = rng.standard_normal((P, 2))
    print("spherical errors", close(bg.mean, br.mean), close(ups, br.ups),
          close(bg.W @ (bg.W.T @ probe), br.W @ (br.W.T @ probe)))
    print("LARGE-OK")
    """
)

COPIES_DIAG_BODY = textwrap.dedent(
    """
    # FD-EKF on the GPU: a 100-step scan copies x up, the mailbox (eta, |h_l|^2, Dl, zeta) down, sq and dd up
    # and the overflow flag down per step, nothing of P numbers (docs/gpu.md §2b)
    rng = np.random.default_rng(6)
    P = model.n_params
    fd = rb.FDEKF(model, rb.Gaussian(1.0), q=1e-6, backend="cuda")
    n0, C = model.in_dim, model.out_dim
    X = rng.standard_normal((101, n0)) / np.sqrt(n0)
    Y = rng.standard_normal((101, C))
    bel, _ = fd.scan(fd.init(rng.standard_normal(P) / np.sqrt(n0), 0.1), X[:1], Y[:1])  # compile, build the tables
    S.TRANSFERS.reset()
    bel, res = fd.scan(bel, X[1:], Y[1:])
    assert type(bel).__name__ == "DeviceDiag"
    sizes = model.layer_sizes
    NO, nl = sum(sizes[1:]), len(sizes) - 1
    box = C + nl + C * NO + NO
    bound = 8 * (n0 + box + 2 * NO + 1)
    print("FD copies", S.TRANSFERS.count, "largest bytes", S.TRANSFERS.largest, "per step", S.TRANSFERS.total / 100,
          "bound", bound, "8P", 8 * P)
    assert S.TRANSFERS.count == 400, S.TRANSFERS.count  # four copies per step
    assert S.TRANSFERS.largest <= 8 * box, (S.TRANSFERS.largest, 8 * box)
    assert S.TRANSFERS.total / 100 <= bound, (S.TRANSFERS.total / 100, bound)
    assert np.all(np.isfinite(res.yhat))
    print("COPIES-DIAG-OK")
    """
)

COPIES_DIAG = PRELUDE + "model = rb.MLP([100, 1000, 1000, 10])\n" + COPIES_DIAG_BODY

LARGE32 = PRELUDE + textwrap.dedent(
    """
    # float32 beliefs at P = 1e6: one step from a rounded belief against the float64 reference on the same
    # numbers (docs/float32.md: within 2u normwise; W W^T within 4u, on two directions)
    U = 2.0**-24
    rng = np.random.default_rng(5)
    model = rb.Linear(100_000, 10, bias=False)
    P = model.n_params
    lik = rb.Gaussian(1.0)
    X = rng.standard_normal((3, model.in_dim)) / np.sqrt(model.in_dim)
    Y = rng.standard_normal((3, 10))
    ref = rb.LoFi(model, lik, rank=10, q=1e-6)
    b64, _ = ref.scan(ref.init(rng.standard_normal(P) / 300, 0.1), X[:2], Y[:2])
    rounded = b64.astype(np.float32).astype(np.float64)
    gpu = rb.LoFi(model, lik, rank=10, q=1e-6, backend="cuda", dtype=np.float32)
    out = gpu.predict_update(b64.astype(np.float32), X[2], Y[2])
    want = ref.predict_update(rounded, X[2], Y[2])
    assert isinstance(out, DeviceDLR) and out.dtype == np.float32
    rel = lambda a, b: np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)
    probe = rng.standard_normal((P, 2))
    errs = [rel(out.mean, want.mean) / U, rel(out.ups, want.ups) / U,
            rel(out.W.astype(np.float64) @ (out.W.T @ probe), want.W @ (want.W.T @ probe)) / U]
    print("float32 P", P, "errors in u (mean, ups, W W^T probe)", errs)
    assert errs[0] < 2 and errs[1] < 2 and errs[2] < 4, errs
    print("LARGE32-OK")
    """
)

COPIES = PRELUDE + textwrap.dedent(
    """
    rng = np.random.default_rng(4)
    model = rb.MLP([100, 1000, 1000, 10])
    P = model.n_params
    gpu = rb.LoFi(model, rb.Gaussian(1.0), rank=10, q=1e-6, backend="cuda")
    X = rng.standard_normal((101, 100)) / 10
    Y = rng.standard_normal((101, 10))
    bel, _ = gpu.scan(gpu.init(rng.standard_normal(P) / 10, 0.1), X[:1], Y[:1])  # compile, build the tables
    S.TRANSFERS.reset()
    bel, res = gpu.scan(bel, X[1:], Y[1:])
    assert isinstance(bel, DeviceDLR)
    per_step = S.TRANSFERS.total / 100
    print("copies", S.TRANSFERS.count, "largest bytes", S.TRANSFERS.largest, "bytes per step", per_step, "8P", 8 * P)
    # what may cross per step (docs/gpu.md §3): x up; the mailbox down (eta, |h_l|^2, Dl, the three Gram
    # matrices, the unit sums); ESt and F up; the overflow flag down. Units NO = 2010, L = rank = 10, C = 10.
    NO, L, C, nl = 2010, 10, 10, 3
    box = C + nl + C * NO + 3 * L * (L + 1) // 2 + (2 * L + 1) * NO
    mmax = 10 + L + C + 1
    bound = 8 * (100 + box + mmax * L + NO * mmax + 1)
    assert S.TRANSFERS.largest <= 8 * box, (S.TRANSFERS.largest, 8 * box)
    assert S.TRANSFERS.count == 400, S.TRANSFERS.count  # four copies per step
    assert per_step <= bound, (per_step, bound)
    assert bound < 8 * P // 5  # all of it is a small fraction of one P-vector
    assert np.all(np.isfinite(res.yhat))
    print("COPIES-OK")
    """
)


THREADS = PRELUDE + textwrap.dedent(
    """
    import threading
    rng = np.random.default_rng(5)
    model = rb.MLP([20, 30, 3])
    P = model.n_params
    X, Y = rng.standard_normal((20, 20)), rng.standard_normal((20, 3))
    outs = {}

    def run(k):
        f = rb.LoFi(model, rb.Gaussian(0.5), rank=4, q=1e-3 * (k + 1), backend="cuda")
        outs[k] = f.scan(f.init(np.full(P, 0.05), 0.2), X, Y)[0].mean

    # two threads stepping at once share the workspace and the pool: one step at a time uses them
    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for k in range(4):
        f = rb.LoFi(model, rb.Gaussian(0.5), rank=4, q=1e-3 * (k + 1))
        close(outs[k], f.scan(f.init(np.full(P, 0.05), 0.2), X, Y)[0].mean)
    print("THREADS-OK")
    """
)


FAST_LAUNCH = PRELUDE + textwrap.dedent(
    """
    # the steps with every launch and copy through numba-cuda's argument handling, then with launch
    # parameters converted by refbayes and copies as single driver calls (kernels/cuda/_launch.py): the same
    # kernels on the same numbers, so the same bits; after the first step of each filter every launch takes the
    # converted route
    rng = np.random.default_rng(8)
    model = rb.MLP([20, 30, 30, 3])
    P = model.n_params
    X, Y = rng.standard_normal((12, 20)) / 4, rng.standard_normal((12, 3))
    m0 = rng.standard_normal(P) / 5
    lik = rb.Gaussian(0.5)
    makers = [lambda: rb.LoFi(model, lik, rank=4, gamma=0.99, q=1e-4, backend="cuda"),
              lambda: rb.LoFi(model, lik, rank=4, gamma=0.99, q=1e-4, backend="cuda", dtype=np.float32),
              lambda: rb.LoFi(model, lik, rank=4, q=1e-4, variant="spherical", backend="cuda"),
              lambda: rb.FDEKF(model, lik, gamma=0.99, q=1e-4, backend="cuda"),
              lambda: rb.VDEKF(model, lik, q=1e-4, backend="cuda")]

    def run():
        out = []
        for make in makers:
            f = make()
            b, r = f.scan(f.init(m0, 0.1), X, Y)
            p = f.predict(b)
            out += [b.mean, p.mean, r.yhat] + ([b.ups, p.ups, b.W] if hasattr(b, "ups") else [b.var, p.var])
        return out

    _launch.ENABLED = False
    slow = run()
    _launch.ENABLED = True
    run()  # first sight of each kernel and argument kinds: numba-cuda launches it and it is recorded
    before = dict(_launch.COUNTS)
    fast = run()
    n_fast = _launch.COUNTS["fast"] - before["fast"]
    n_numba = _launch.COUNTS["numba"] - before["numba"]
    print("launches converted", n_fast, "through numba-cuda", n_numba)
    assert n_fast > 500 and n_numba == 0, (n_fast, n_numba)
    for a, b in zip(slow, fast):
        np.testing.assert_array_equal(a, b)
    print("FAST-LAUNCH-OK")
    """
)


def _run(code):
    # no simulator; this folder on the path, for the scripts that import its modules (``problems``)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200, env=env)
    if "NO-GPU" in r.stdout:
        pytest.skip("needs an NVIDIA GPU")
    return r


def _assert_prints(code, marker):
    """Run ``code`` on the GPU (skipped without one); it must exit cleanly and print ``marker``."""
    r = _run(code)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert marker in r.stdout, r.stdout


def test_simulator_checks_pass_on_the_gpu():
    """tests/test_cuda_step.py's simulator checks (odd sizes, two slices, rank 0, errors), on the hardware."""
    from test_cuda_step import SIM

    _assert_prints(PRELUDE + SIM, "STEP-SIM-OK 7")


def test_diag_simulator_checks_pass_on_the_gpu():
    """tests/test_cuda_diag_step.py's simulator checks (FD-EKF, VD-EKF, float32, the host route), on the hardware."""
    from test_cuda_diag_step import SIM as DIAG

    _assert_prints(PRELUDE + DIAG, "DIAG-SIM-OK 5")


def test_bong_simulator_checks_pass_on_the_gpu():
    """tests/test_cuda_diag_step.py's Bong(backend="cuda") checks, on the hardware."""
    from test_cuda_diag_step import BONG

    _assert_prints(PRELUDE + BONG, "BONG-SIM-OK 2")


def test_float32_simulator_checks_pass_on_the_gpu():
    """tests/test_cuda_step.py's float32 simulator checks, on the hardware."""
    from test_cuda_step import SIM32

    _assert_prints(PRELUDE + SIM32, "STEP32-SIM-OK 1")


def test_spherical_simulator_checks_pass_on_the_gpu():
    """tests/test_cuda_step.py's spherical LO-FI simulator checks, on the hardware."""
    from test_cuda_step import SIMSPH

    _assert_prints(PRELUDE + SIMSPH, "SPHERICAL-SIM-OK")


def test_float32_gpu_step_matches_reference_at_a_million_parameters():
    _assert_prints(LARGE32, "LARGE32-OK")


def test_gpu_step_matches_reference_at_a_million_parameters():
    _assert_prints(LARGE, "LARGE-OK")


def test_gpu_scan_copies_nothing_parameter_sized():
    _assert_prints(COPIES, "COPIES-OK")


def test_gpu_fdekf_scan_copies_nothing_parameter_sized():
    _assert_prints(COPIES_DIAG, "COPIES-DIAG-OK")


def test_gpu_steps_from_several_threads_keep_their_own_numbers():
    _assert_prints(THREADS, "THREADS-OK")


def test_converted_launches_give_numba_cudas_bits():
    _assert_prints(FAST_LAUNCH, "FAST-LAUNCH-OK")
