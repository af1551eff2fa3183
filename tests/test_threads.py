"""Thread policy (refbayes.threads): counts, caps, restoration of process-wide settings."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import refbayes as rb
from refbayes import threads


def test_import_does_not_import_numba():
    code = "import sys, refbayes, refbayes.threads; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_small_problems_use_one_thread_and_never_oversubscribe():
    cores = threads.available_cores()
    assert threads.plan(1000, "numba") == (1, 1)
    assert threads.plan(1000, "numpy") == (1, 1)
    for backend in ("numpy", "numba"):
        nb, bl = threads.plan(10**7, backend)
        assert nb >= 1 and bl >= 1
        assert nb + bl - 1 <= cores
        assert max(nb, bl) == cores


def test_set_threads_and_env_cap(monkeypatch):
    try:
        threads.set_threads(numba=1, blas=1)
        assert threads.plan(10**7, "numba") == (1, 1)
        assert threads.get_threads()["numba"] == 1
    finally:
        threads.set_threads()
    monkeypatch.setenv("REFBAYES_NUM_THREADS", "1")
    assert threads.plan(10**7, "numpy") == (1, 1)
    monkeypatch.setenv("REFBAYES_NUM_THREADS", "zero")
    with pytest.raises(ValueError, match="REFBAYES_NUM_THREADS"):
        threads.plan(10**7, "numpy")


def test_thresholds_differ_by_backend(monkeypatch):
    # numba's passes take the cores from MIN_PARALLEL_P["numba"]; the reference's BLAS only from the
    # (higher) numpy threshold (measurements in docs/threads.md)
    monkeypatch.delenv("REFBAYES_NUM_THREADS", raising=False)
    cores = threads.available_cores()
    nb_min, np_min = threads.MIN_PARALLEL_P["numba"], threads.MIN_PARALLEL_P["numpy"]
    assert nb_min < np_min
    assert threads.plan(nb_min - 1, "numba") == (1, 1)
    assert threads.plan(nb_min, "numba") == (cores, 1)
    assert threads.plan(nb_min, "numpy") == (1, 1)
    assert threads.plan(np_min, "numpy") == (1, cores)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_set_threads_rejects_bad_counts(bad):
    with pytest.raises((TypeError, ValueError), match="numba"):
        threads.set_threads(numba=bad)
    assert threads.get_threads()["numba"] is None


def test_step_restores_process_blas_setting():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    libs = [c for c in threadpoolctl.ThreadpoolController().lib_controllers if c.user_api == "blas"]
    if not libs or threads.available_cores() < 2:
        pytest.skip("needs a threadpoolctl-visible BLAS and 2 cores")
    model = rb.MLP([3, 4, 2])
    f = rb.LoFi(model, rb.Gaussian(0.2), rank=2)
    bel = f.init(np.zeros(model.n_params) + 0.1)
    seen = []
    orig = type(f)._update if hasattr(type(f), "_update") else None
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = [c.get_num_threads() for c in libs]
        f.predict_update(bel, np.ones(3), np.ones(2))
        assert [c.get_num_threads() for c in libs] == before
    del seen, orig


def test_steps_are_wrapped():
    for cls in (rb.LoFi, rb.FDEKF, rb.VDEKF, rb.FullEKF, rb.RVGA, rb.Bong):
        for name in ("predict", "update", "predict_update", "scan"):
            assert getattr(getattr(cls, name), "__refbayes_threads__", False), (cls, name)


def test_workqueue_layer_two_python_threads(tmp_path):
    pytest.importorskip("numba")
    code = textwrap.dedent("""
        import threading, numpy as np, refbayes as rb
        model = rb.MLP([8, 16, 2])
        rng = np.random.default_rng(0)
        X, Y = rng.normal(size=(40, 8)), rng.normal(size=(40, 2))
        errs = []
        def work():
            try:
                f = rb.LoFi(model, rb.Gaussian(0.2), rank=3, backend="numba")
                bel = f.init(rng.normal(size=model.n_params) * 0.1)
                for x, y in zip(X, Y):
                    bel = f.predict_update(bel, x, y)
            except Exception as exc:
                errs.append(exc)
        rb.threads.set_threads(numba=2)
        ts = [threading.Thread(target=work) for _ in range(2)]
        [t.start() for t in ts]; [t.join() for t in ts]
        assert not errs, errs
        print("ok")
    """)
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue", NUMBA_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_helper_edit_invalidates_dependent_cached_kernel(tmp_path):
    """A constant changed in _blocks.py reaches a cached kernel of another file (kernels/cpu/__init__.py)."""
    pytest.importorskip("numba")
    import shutil

    src = os.path.join(os.path.dirname(rb.__file__), os.pardir, "kernels")
    pkg = tmp_path / "kcopy"
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    blocks, dlr = pkg / "cpu" / "_blocks.py", pkg / "cpu" / "dlr.py"
    blocks.write_text(blocks.read_text() + "\n\nPROBE = 1.0\n\n\n@numba.njit(cache=True)\ndef probe():\n    return PROBE\n")
    dlr.write_text(dlr.read_text() + "\n\nfrom ._blocks import probe\n\n\n@numba.njit(cache=True)\n"
                   "def probe_user(x):\n    return probe() * x\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    code = "from kcopy.cpu import dlr; print(dlr.probe_user(3.0))"

    def run():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return float(out.stdout.strip().splitlines()[-1])

    assert run() == 3.0
    assert run() == 3.0  # now from the cache
    blocks.write_text(blocks.read_text().replace("PROBE = 1.0", "PROBE = 2.0"))
    assert run() == 6.0


def test_middle_signature_is_the_one_every_fused_lofi_step_uses():
    """The helper process compiles the small algebra for step.middle_signature() only: every network,
    likelihood and q of the fused step must call it with exactly those types, or the step would
    compile it again."""
    pytest.importorskip("numba")
    from refbayes.kernels.cpu import step

    cases = [(rb.MLP([6, 4, 3]), rb.Gaussian(0.1), 1e-4), (rb.MLP([6, 3]), rb.Categorical(3), None),
             (rb.Linear(6, 3, bias=False), rb.Gaussian(0.1), 0.0), (rb.Linear(6, 3), rb.Categorical(3), 1e-3)]
    rng = np.random.default_rng(0)
    for model, lik, q in cases:
        qq = np.full(model.n_params, 1e-4) if q is None else q
        f = rb.LoFi(model, lik, rank=2, q=qq, backend="numba")
        bel = f.init(model.init_params(rng), 0.1)
        y = rng.normal(size=3) if isinstance(lik, rb.Gaussian) else 1
        f.predict_update(bel, rng.normal(size=6), y)
    assert step.mlp_lofi_middle.signatures == [step.middle_signature()]


def test_compile_helper_switch(monkeypatch):
    from refbayes.kernels.cpu import _compile_helper

    monkeypatch.setenv("REFBAYES_COMPILE_HELPER", "0")
    assert not _compile_helper.enabled()
    monkeypatch.setenv("REFBAYES_COMPILE_HELPER", "yes")
    with pytest.raises(ValueError, match="REFBAYES_COMPILE_HELPER must be 0 or 1"):
        _compile_helper.enabled()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the compile helper runs only with two or more cores")
def test_first_lofi_step_loads_the_small_algebra_the_helper_compiled(tmp_path):
    """Empty kernel cache: the first fused LO-FI step's small algebra comes from the helper process (a
    cache hit in this process, no compile), and the step equals the NumPy reference."""
    pytest.importorskip("numba")
    code = textwrap.dedent("""
        import numpy as np, refbayes as rb
        from refbayes.kernels.cpu import FIRST_USE, step
        model = rb.MLP([5, 4, 3])
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=5), rng.normal(size=3)
        theta = model.init_params(rng)
        out = {}
        for backend in ("numba", "numpy"):
            f = rb.LoFi(model, rb.Gaussian(0.3), rank=2, gamma=0.99, q=1e-3, backend=backend)
            out[backend] = f.predict_update(f.init(theta, 0.5), x, y)
        sig = step.middle_signature()
        assert FIRST_USE
        assert step.mlp_lofi_middle.stats.cache_hits.get(sig) == 1, step.mlp_lofi_middle.stats
        assert not step.mlp_lofi_middle.stats.cache_misses, step.mlp_lofi_middle.stats
        assert len(step._pass2_range.signatures) == 1  # compiled ahead for the types the step then passes
        a, b = out["numba"], out["numpy"]
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a.ups, b.ups, rtol=1e-10)
        np.testing.assert_allclose(a.W @ a.W.T, b.W @ b.W.T, rtol=1e-10, atol=1e-12)
        print("ok")
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), REFBAYES_COMPILE_HELPER="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
