"""Kernel launches and per-step copies of the device-resident steps, without numba-cuda's per-call
argument handling (docs/gpu.md §2c).

numba-cuda turns every argument of every launch into kernel parameters in Python
(``_Kernel._prepare_args``: the device array's memory view, its pointer, shape and strides; a ctypes
object per scalar), and checks and converts both arrays of every copy. Measured on one NVIDIA H200's
16-core host (numba-cuda 0.30.4): a launch of a 9-argument kernel took 77-81 us, 45-50 us of it in that
conversion; handing the same parameters, converted once, to the driver took 11-12 us. A LO-FI step on
a three-layer MLP launches 13 kernels and makes 4 copies, an FD-EKF step on ``rb.Linear`` 5 and 4.

``launch(kernel, grid, block, *args)`` is ``kernel[grid, block](*args)``. Its first call for a kernel
and a tuple of argument kinds goes through numba-cuda (which compiles, where needed, and launches) and
then records the compiled kernel's driver function and one converter per parameter. Later calls with
arguments of the same kinds build the parameters in the layout numba-cuda uses, for the two kinds of
argument these kernels take:

- a C-contiguous device array: meminfo (0), parent (0), size, itemsize, data pointer, shape, strides
  (numba's array data model);
- a Python int, float or bool: a ctypes integer of the parameter's width, a c_double or c_float, the
  bool itself,

and launch through cuda.core, as numba-cuda does. Anything else (a host array, which numba-cuda would
copy; a non-contiguous view; a numpy scalar; a debug or cooperative kernel; the CUDA simulator) takes
numba-cuda's own launch, every time. ``to_device(dev, host)`` and ``to_host(host, dev)`` are
``dev.copy_to_device(host)`` and ``dev.copy_to_host(host)`` as one cuMemcpyHtoD / cuMemcpyDtoH call
each (synchronous, on the default stream, as numba-cuda's), for arrays of one shape and dtype.

``ENABLED = False`` (or REFBAYES_CUDA_FAST_LAUNCH=0 in the environment) sends every launch and copy
through numba-cuda; ``VERIFY = True`` compares every converted parameter list with numba-cuda's own
conversion before the launch and raises on a difference (tests/test_gpu.py runs the steps so, and
checks that both settings give the same bits). The small-grid launches of these kernels are by design
(a block per unit, per slice, per reduction), so numba-cuda's low-occupancy warning is silenced on the
launches that go through it here.

The recorded driver functions belong to the CUDA context of the first launch: the device steps run on
the device current when they first ran in the process (as their workspaces and pooled arrays do);
``step.release_pool()`` drops them with the workspaces (``forget``).
"""

import ctypes
import os
import warnings

__all__ = ["launch", "to_device", "to_host", "forget", "ENABLED", "VERIFY", "COUNTS"]

#: False: every launch and copy through numba-cuda's own argument handling (REFBAYES_CUDA_FAST_LAUNCH=0)
ENABLED = os.environ.get("REFBAYES_CUDA_FAST_LAUNCH", "1").strip() != "0"
#: True: compare each converted parameter list with numba-cuda's before launching (tests)
VERIFY = False
#: launches so far: "fast" (parameters converted here) and "numba" (numba-cuda's own launch)
COUNTS = {"fast": 0, "numba": 0}

_SLOW = object()  # a cache entry: this (kernel, kinds) always takes numba-cuda's launch
_CACHE = {}  # (dispatcher, argument kinds) -> (driver function, converters) or _SLOW
_CONFIGS = {}  # (grid, block) -> cuda.core LaunchConfig
_CORE = []  # [cuda.core launch, LaunchConfig, the default stream], filled on the first recorded kernel
_DEVARRAY = []  # [numba-cuda's DeviceNDArray class], filled on the first launch (a stand-in class in the simulator)


def _identity(v):
    return v


def _kind(a):
    """The part of an argument's type that selects a compiled kernel and a conversion: int, float, bool,
    (dtype number, ndim) for a C-contiguous device array, None for anything else."""
    t = type(a)
    if t is float or t is int or t is bool:
        return t
    if t is _DEVARRAY[0] and a.is_c_contiguous():
        return (a.dtype.num, a.ndim)
    return None


def _device_array_class():
    """numba-cuda's DeviceNDArray; a stand-in that no argument has in the CUDA simulator (whose arrays are
    of another class) or where the class is not found."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        try:
            from numba.cuda.cudadrv.devicearray import DeviceNDArray

            return DeviceNDArray
        except ImportError:
            pass
    return _NoArray


class _NoArray:
    pass


def _numba_launch(kernel, grid, block, args):
    from numba.core.errors import NumbaPerformanceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        kernel[grid, block](*args)


def _record(kernel, args, kinds):
    """(driver function, converters) of the kernel that numba-cuda compiled for ``args``, or _SLOW."""
    from numba import config

    if config.ENABLE_CUDASIM or None in kinds:
        return _SLOW
    try:
        from numba.cuda import types as nt
        from numba.cuda.cudadrv import driver
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        from numba.cuda.dispatcher import LaunchConfig, launch as core_launch

        if getattr(kernel, "specialized", False) or kernel.targetoptions.get("extensions"):
            return _SLOW
        compiled = kernel.overloads.get(tuple(kernel.typeof_pyval(a) for a in args))
        if compiled is None or compiled.debug or compiled.cooperative:
            return _SLOW
        conv = []
        for t, a in zip(compiled.argument_types, args):
            if isinstance(t, nt.Array) and t.layout == "C" and type(a) is DeviceNDArray:
                conv.append(None)
            elif isinstance(t, nt.Integer) and type(a) is int:
                conv.append(getattr(ctypes, f"c_{t}"))
            elif str(t) == "float64" and type(a) is float:
                conv.append(ctypes.c_double)
            elif str(t) == "float32" and type(a) is float:
                conv.append(ctypes.c_float)
            elif str(t) == "bool" and type(a) is bool:
                conv.append(_identity)
            else:
                return _SLOW
        func = compiled._codelibrary.get_cufunc().kernel
        if not _CORE:
            _CORE.extend((core_launch, LaunchConfig, driver._to_core_stream(0)))
        return func, tuple(conv), compiled
    except Exception:  # another numba-cuda layout of these internals: its own launch, always
        return _SLOW


def _params(conv, args):
    params = []
    for c, a in zip(conv, args):
        if c is None:
            params += (0, 0, a.size, a.dtype.itemsize, a.device_ctypes_pointer.value or 0)
            params += a.shape
            params += a.strides
        else:
            params.append(c(a))
    return params


def _same(ours, theirs):
    def key(v):
        return (type(v).__name__, v.value) if isinstance(v, ctypes._SimpleCData) else ("int", int(v))

    return len(ours) == len(theirs) and all(key(a) == key(b) for a, b in zip(ours, theirs))


def launch(kernel, grid, block, *args):
    """``kernel[grid, block](*args)``, with the arguments converted here once their kinds have been
    seen (module docstring). grid and block: ints or tuples, as numba-cuda takes them."""
    if not ENABLED:
        COUNTS["numba"] += 1
        _numba_launch(kernel, grid, block, args)
        return
    if not _DEVARRAY:
        _DEVARRAY.append(_device_array_class())
    kinds = tuple(map(_kind, args))
    entry = _CACHE.get((kernel, kinds))
    if entry is None or entry is _SLOW:
        COUNTS["numba"] += 1
        _numba_launch(kernel, grid, block, args)  # compiles where needed
        if entry is None:
            _CACHE[(kernel, kinds)] = _record(kernel, args, kinds)
        return
    COUNTS["fast"] += 1
    func, conv, compiled = entry
    params = _params(conv, args)
    core_launch, LaunchConfig, stream = _CORE
    if VERIFY:
        theirs = []
        for t, a in zip(compiled.argument_types, args):
            compiled._prepare_args(t, a, stream, [], theirs)
        if not _same(params, theirs):
            raise AssertionError(f"fast launch of {kernel.py_func.__name__}: parameters {params} differ from "
                                 f"numba-cuda's {theirs}")
    cfg = _CONFIGS.get((grid, block))
    if cfg is None:
        g = tuple(map(int, grid if isinstance(grid, tuple) else (grid,)))
        b = tuple(map(int, block if isinstance(block, tuple) else (block,)))
        cfg = _CONFIGS[(grid, block)] = LaunchConfig(grid=g + (1,) * (3 - len(g)), block=b + (1,) * (3 - len(b)),
                                                     shmem_size=0)
    core_launch(stream, cfg, func, *params)


def forget():
    """Drop every recorded kernel, launch configuration and stream (``step.release_pool`` calls it): the next
    launch of each kernel goes through numba-cuda again and is recorded in the context current then."""
    _CACHE.clear()
    _CONFIGS.clear()
    del _CORE[:]


def _direct(dev, host):
    """The driver (numba-cuda's wrapper of the CUDA driver API) where a copy between ``dev`` and ``host``
    can be one driver call, else None: both C-contiguous, same dtype and size, a real device array."""
    if not ENABLED:
        return None
    if not _DEVARRAY:
        _DEVARRAY.append(_device_array_class())
    if type(dev) is not _DEVARRAY[0]:
        return None
    if host.dtype != dev.dtype or host.shape != dev.shape or not host.flags.c_contiguous or not dev.is_c_contiguous():
        raise ValueError(f"copy between a device array {dev.shape} {dev.dtype} and a host array {host.shape} "
                         f"{host.dtype}: both must be C-contiguous, of one shape and dtype")
    from numba.cuda.cudadrv.driver import driver

    return driver


def to_device(dev, host):
    """``dev.copy_to_device(host)`` as one cuMemcpyHtoD call (synchronous, as numba-cuda's copy on the default
    stream): numba-cuda's copy checks and converts both arrays in Python first (module docstring)."""
    drv = _direct(dev, host)
    if drv is None:
        dev.copy_to_device(host)
    elif host.size:
        drv.cuMemcpyHtoD(dev.device_ctypes_pointer.value, host.__array_interface__["data"][0], host.nbytes)


def to_host(host, dev):
    """``dev.copy_to_host(host)`` as one cuMemcpyDtoH call (it waits for the work launched before it on the
    default stream, as numba-cuda's does)."""
    drv = _direct(dev, host)
    if drv is None:
        dev.copy_to_host(host)
    elif host.size:
        drv.cuMemcpyDtoH(host.__array_interface__["data"][0], dev.device_ctypes_pointer.value, host.nbytes)
