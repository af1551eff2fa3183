"""A check that the CUDA scripts (tests/test_cuda_step.py, tests/test_cuda_diag_step.py, and on a GPU
tests/test_gpu.py) make of every kernel launch of the device steps: each argument is a Python int, float
or bool, or a C-contiguous device array, the kinds whose parameters ``refbayes.kernels.cuda._launch``
converts itself on a GPU. An argument of another kind (a numpy scalar, a host array, a strided view)
would send that launch through numba-cuda's slower argument handling at every step."""


def watch_launches():
    """Wrap ``_launch.launch`` with the check above; returns a dict, kernel name -> launches so far."""
    from numba import cuda

    from refbayes.kernels.cuda import _launch

    devarray = type(cuda.device_array(1))
    seen = {}
    inner = _launch.launch

    def launch(kernel, grid, block, *args):
        name = kernel.py_func.__name__
        for i, a in enumerate(args):
            ok = type(a) in (int, float, bool) or (type(a) is devarray and a.is_c_contiguous())
            assert ok, f"{name}: argument {i} is a {type(a).__name__}"
        seen[name] = seen.get(name, 0) + 1
        return inner(kernel, grid, block, *args)

    _launch.launch = launch
    return seen
