"""Running the CUDA checks in a fresh interpreter (shared by test_cuda_step.py and test_kernels_cuda.py).

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so each check is a script run in a
new Python (:func:`run_script`) that prints a marker line for the test to find. The scripts can import the
modules of this folder (``from problems import close``).

:func:`assert_kernels_compile` adds the compile loop to a script that lists the kernels as ``todo``, a list
of (py_func, signature, name), and names as ``probe`` one (py_func, signature) that calls no device
function: it is compiled first, to tell a machine without the compiler from a kernel that does not compile.
"""

import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import Future

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

# how each target compiles one kernel; "NO-TOOLCHAIN <reason>" and exit 0 where the compiler is missing
_COMPILE_ONE = {
    # typing and lowering to LLVM IR, the step before NVVM: catches what the simulator lets through
    "llvm": """
        try:
            from numba.cuda.compiler import compile_cuda
        except ImportError:
            print("NO-TOOLCHAIN numba.cuda.compiler.compile_cuda is not available in this numba-cuda")
            raise SystemExit(0)

        def compile_one(fn, sig):
            compile_cuda(fn, T.void, sig, cc=(8, 0)).library.get_llvm_str()
        """,
    # PTX for sm_80: needs NVVM, not a GPU
    "ptx": """
        try:
            cuda.compile_ptx(*probe, cc=(8, 0))
        except Exception as exc:
            print("NO-TOOLCHAIN no CUDA compiler libraries (NVVM/NVRTC) on this machine:", type(exc).__name__)
            raise SystemExit(0)

        def compile_one(fn, sig):
            ptx, _ = cuda.compile_ptx(fn, sig, cc=(8, 0))
            assert ".entry" in ptx, fn.__name__
        """,
}

_COMPILE_ALL = """
    from numba.cuda.cudadrv.error import CudaSupportError
    compiled, driver = 0, 0
    for fn, sig, name in todo:
        try:
            compile_one(fn, sig)
            compiled += 1
        except CudaSupportError:  # a kernel that calls a (not inlined) device function asks the driver for the device
            driver += 1
    print("COMPILED", compiled, "NEED-DRIVER", driver)
    """


# The simulator runs each GPU thread of a block as a Python thread, and the launching thread polls them in a
# loop until all are done. At Python's default switch interval (5 ms) each of a block's threads waits that
# long for the interpreter lock between its turns: a block of 128 threads takes about 0.3 s, a LO-FI step on a
# tiny network 4.2 s. At 0.1 ms the same step takes 1.7-1.8 s. The interval decides only how often threads
# swap, never what runs: launch configuration, block size and every number stay those of the hardware.
#
# Finer switching exposes a race in the simulator itself (numba-cuda 0.30): a block's threads share one array
# per ``cuda.shared.array`` call site, which the first of them creates, but the lookup and the creation are not
# one atomic step, so two threads can each create an array and the block's sums split between them (seen as
# FD-EKF and LO-FI results 3e-4 off the reference in 1 of 4 runs). The prelude therefore makes that step
# atomic: the same arrays, keyed by the calling line as the simulator keys them, created under a lock.
SIM_PRELUDE = textwrap.dedent(
    """
    import sys, threading
    sys.setswitchinterval(1e-4)

    def _atomic_shared_arrays():
        import numpy as np
        from numba.core import types
        from numba.np import numpy_support
        from numba.cuda.simulator import kernelapi

        plain = kernelapi.FakeCUDAShared.array
        lock = threading.Lock()

        def array(self, shape, dtype, alignment=None):
            if shape == 0 or alignment is not None:  # dynamic shared memory, or the simulator's own error
                return plain(self, shape, dtype, alignment)
            if isinstance(dtype, types.Type):
                dtype = numpy_support.as_dtype(dtype)
            caller = sys._getframe(1)
            key = (caller.f_code.co_filename, caller.f_lineno)
            with lock:
                arr = self._allocations.get(key)
                if arr is None:
                    arr = self._allocations[key] = np.empty(shape, dtype)
            return arr

        kernelapi.FakeCUDAShared.array = array

    _atomic_shared_arrays()
    """
)


TIMEOUT = 900  # seconds a script may take


def _command(code, simulator):
    path = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1" if simulator else "0", "PYTHONPATH": path}
    return [sys.executable, "-c", SIM_PRELUDE + code if simulator else code], env


def run_script(code, simulator):
    """Run ``code`` (``python -c``) in a fresh interpreter with NUMBA_ENABLE_CUDASIM=1 when ``simulator``
    (after :data:`SIM_PRELUDE`), else 0, and this folder on the path. Returns the
    subprocess.CompletedProcess (text stdout, stderr): that of the run :func:`start_ahead` made, where it
    ran this script."""
    ahead = _AHEAD.pop((code, bool(simulator)), None)
    if ahead is not None:
        return ahead.result()  # raises what the run raised (a timeout, say)
    args, env = _command(code, simulator)
    return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, env=env)


# ---------------------------------------------------------------------------------------------
# Scripts run ahead. The CUDA checks are single-threaded Python (the simulator) and take minutes; the rest of
# the suite keeps about one core busy. conftest.py hands the scripts of the selected tests that carry the
# ``cuda_script`` marker to start_ahead at the end of collection; they then run one after the other in a
# background thread, on the second core, while the other tests run. Each test still runs its own checks on
# its script's output, and a script that was not run ahead runs when its test asks for it.

_AHEAD = {}  # (code, simulator) -> Future of its subprocess.CompletedProcess
_CHILDREN = []  # the scripts' processes, for stop_ahead


def start_ahead(scripts):
    """Run ``scripts``, (code, simulator) pairs, one after the other in a background thread (each once)."""
    todo = []
    for code, simulator in scripts:
        key = (code, bool(simulator))
        if key not in _AHEAD:
            _AHEAD[key] = Future()
            todo.append((key, _AHEAD[key]))
    if not todo:
        return

    def work():
        for (code, simulator), run in todo:
            try:
                args, env = _command(code, simulator)
                child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                _CHILDREN.append(child)
                try:
                    out, err = child.communicate(timeout=TIMEOUT)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.communicate()
                    raise
                run.set_result(subprocess.CompletedProcess(args, child.returncode, out, err))
            except BaseException as exc:  # handed to the test that asks for this script
                run.set_exception(exc)

    threading.Thread(target=work, name="cuda-scripts-ahead", daemon=True).start()


def stop_ahead():
    """Kill the scripts still running ahead (the session ends)."""
    for child in _CHILDREN:
        if child.poll() is None:
            child.kill()


def kernels_compile_script(setup, target):
    """The script :func:`assert_kernels_compile` runs (not in the simulator)."""
    return setup + textwrap.dedent(_COMPILE_ONE[target]) + textwrap.dedent(_COMPILE_ALL)


def compile_targets(setup):
    """The ``target`` parameters of a kernels-compile test, each marked with its script."""
    return [pytest.param(t, marks=pytest.mark.cuda_script(kernels_compile_script(setup, t), simulator=False))
            for t in _COMPILE_ONE]


def assert_script_prints(code, marker):
    """Run ``code`` in the CUDA simulator; it must exit cleanly and print ``marker``."""
    r = run_script(code, simulator=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert marker in r.stdout, r.stdout


def assert_kernels_compile(setup, target, n):
    """Compile every kernel of ``todo`` in the script ``setup`` for ``target`` ("llvm": type and lower to
    LLVM IR; "ptx": PTX for sm_80), without the simulator. Skips where the compiler is missing; otherwise
    all ``n`` kernels must compile without asking the driver for a device."""
    r = run_script(kernels_compile_script(setup, target), simulator=False)
    assert r.returncode == 0, r.stderr[-4000:]
    if "NO-TOOLCHAIN" in r.stdout:
        pytest.skip(r.stdout.split("NO-TOOLCHAIN", 1)[1].strip())
    assert f"COMPILED {n} NEED-DRIVER 0" in r.stdout, r.stdout
