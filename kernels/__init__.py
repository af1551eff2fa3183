"""Compiled kernels for the hot paths of refbayes (imported as ``refbayes.kernels``).

- ``refbayes.kernels.cpu``: Numba ``njit`` kernels (the ``backend="numba"`` path).
- ``refbayes.kernels.cuda``: ``numba.cuda`` kernels (the ``backend="cuda"`` path),
  imported on first use so that CPU-only installs never load the CUDA toolchain.

Both expose the same wrappers with the same arguments, so a filter picks one with
``backend(name)``:

    K = refbayes.kernels.backend("numba")
    mean, var = K.vd_update(bel.mean, bel.var, H, R, e, mean_rule="paper")

The kernels do not import the reference filters; the tests compare the two.
"""

import importlib

__all__ = ["cpu", "cuda", "backend", "BACKENDS"]

BACKENDS = ("numba", "cuda")


def backend(name):
    """The kernel module for ``name``: "numba" -> ``cpu``, "cuda" -> ``cuda``."""
    if name == "numba":
        return importlib.import_module(".cpu", __name__)
    if name == "cuda":
        return importlib.import_module(".cuda", __name__)
    raise ValueError(f"backend must be one of {BACKENDS}; got {name!r}")


def __getattr__(name):
    if name in ("cpu", "cuda"):
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
