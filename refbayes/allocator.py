"""glibc's malloc thresholds for the compiled backends: keep freed step buffers instead of page-faulting them back.

A compiled step allocates its outputs (the new belief's P-sized arrays) and a few P-sized
buffers, and frees the previous ones. Under glibc's defaults these blocks (above 128 KiB) come
from fresh ``mmap`` pages, or the heap's free top is handed back to the kernel once it exceeds
twice the largest freed block; either way the next step touches new pages and pays one page
fault per 4 KiB. glibc adapts its thresholds from what a process frees, so the cost depends on
the process's history: on the 2-core reference machine an FD-EKF step on an MLP 100-300-300-10
(P = 123,610, backend "numba", one thread) took 1.7-1.8 ms in a fresh process and 0.47 ms once
the thresholds were up (docs/threads.md, "Memory allocator").

:func:`tune` sets both thresholds once per process, when the numba backend is first loaded:
``M_MMAP_THRESHOLD`` to 32 MiB (glibc's own upper limit for its adaptive value) and
``M_TRIM_THRESHOLD`` to 128 MiB, so that up to 128 MiB of freed memory stays with the process.
It does nothing when ``REFBAYES_MALLOC=0``, when the user set one of glibc's own ``MALLOC_*``
variables for these thresholds, or where the C library is not glibc. :func:`status` says what
happened. The NumPy reference does not load it (its steps showed no difference).
"""

import ctypes
import os

__all__ = ["tune", "status", "ENV", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

ENV = "REFBAYES_MALLOC"
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
_USER_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_state = {"status": "not tried"}


def _glibc():
    """The process's C library when it is glibc (it has gnu_get_libc_version and mallopt), else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        return libc
    except (OSError, AttributeError, TypeError):  # no such symbol, or no process handle (Windows)
        return None


def tune():
    """Set glibc's mmap and trim thresholds once per process (see the module docstring).

    Returns :func:`status`. Safe to call any number of times; only the first call acts."""
    if _state["status"] != "not tried":
        return status()
    raw = os.environ.get(ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{ENV} must be 0 or 1; got {raw!r}")
    if raw == "0":
        _state["status"] = f"off ({ENV}=0)"
        return status()
    user = [v for v in _USER_VARS if os.environ.get(v)]
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        user.append("GLIBC_TUNABLES")
    if user:
        _state["status"] = f"left to the user ({', '.join(user)} set)"
        return status()
    libc = _glibc()
    if libc is None:
        _state["status"] = "not glibc"
        return status()
    ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    _state["status"] = "set" if ok else "mallopt refused"
    return status()


def status():
    """What :func:`tune` did in this process: "set", "not tried", "off (REFBAYES_MALLOC=0)",
    "left to the user (...)", "not glibc" or "mallopt refused"."""
    return _state["status"]
