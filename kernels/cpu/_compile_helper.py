"""A second process that compiles one kernel into the kernel cache while this process compiles the others.

numba compiles one function at a time per process (a global compiler lock), so the first fused LO-FI
step of a fresh installation compiles its four pieces one after the other: the forward pass, pass 1,
the small algebra (``step.mlp_lofi_middle``, the largest) and pass 2. On a machine with two or more
cores, the step starts a helper process that compiles the small algebra for the one argument type
signature the step uses (``step.middle_signature``) and writes it to the kernel cache, while this
process compiles the other three. Before its first call of the small algebra the step waits for the
helper; numba then loads the compiled function from the cache instead of compiling it.

The helper runs only when the kernel cache for the current sources did not exist when
``refbayes.kernels.cpu`` was imported (``FIRST_USE``: the compile notice was printed), at most once
per process, and never where ``REFBAYES_COMPILE_HELPER=0``, in a frozen application, or on one core.
If it cannot start, fails or does not finish within ``WAIT_S``, the step compiles the function
itself: the helper changes how long the first step takes, never what it computes.
"""

import os
import subprocess
import sys
import threading

__all__ = ["enabled", "start", "wait", "WAIT_S"]

WAIT_S = 600.0  # the longest the step waits for the helper before compiling the function itself
_lock = threading.Lock()
_state = {"started": False, "proc": None}

_CODE = """
import sys
sys.path[:0] = {path!r}
from refbayes.kernels.cpu import step
step.compile_middle()
"""


def enabled():
    """Whether a helper process may be used here (see the module docstring)."""
    flag = os.environ.get("REFBAYES_COMPILE_HELPER", "1").strip()
    if flag not in ("0", "1"):
        raise ValueError(f"REFBAYES_COMPILE_HELPER must be 0 or 1; got {flag!r}")
    return flag == "1" and not getattr(sys, "frozen", False) and (os.cpu_count() or 1) >= 2


def start():
    """Start the helper, once per process; True if it is running now."""
    with _lock:
        if _state["started"]:
            return _state["proc"] is not None
        _state["started"] = True
        if not enabled():
            return False
        try:
            _state["proc"] = subprocess.Popen(
                [sys.executable, "-c", _CODE.format(path=list(sys.path))], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
        except OSError:
            _state["proc"] = None
        return _state["proc"] is not None


def wait():
    """Wait for a running helper (at most ``WAIT_S``; then it is stopped); returns its exit code, or None
    when no helper ran or it was stopped."""
    with _lock:
        proc = _state["proc"]
        _state["proc"] = None
    if proc is None:
        return None
    try:
        return proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
