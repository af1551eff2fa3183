"""Test-session settings.

The tests work with many small matrices; a multi-threaded BLAS spends more
time waking its threads than computing them, so the session pins BLAS to one
thread (results do not depend on the thread count). threadpoolctl limits only
libraries already loaded, hence the imports first.
"""

import numpy  # noqa: F401
import scipy.linalg  # noqa: F401
from threadpoolctl import threadpool_info, threadpool_limits

_BLAS_LIMIT = threadpool_limits(limits=1, user_api="blas")


def pytest_report_header(config):
    blas = [f"{i['internal_api']} {i['num_threads']} thread(s)" for i in threadpool_info() if i["user_api"] == "blas"]
    return "BLAS: " + ", ".join(blas)


def pytest_collection_finish(session):
    """Start the CUDA scripts of the selected tests (marker ``cuda_script``) ahead, in a background thread
    (_cuda_helpers.start_ahead); REFBAYES_TESTS_AHEAD=0 runs each when its test asks for it."""
    import os

    if os.environ.get("REFBAYES_TESTS_AHEAD", "1") == "0" or session.config.option.collectonly:
        return
    scripts = [(m.args[0], m.kwargs.get("simulator", True)) for item in session.items
               for m in item.iter_markers("cuda_script")]
    if scripts:
        from _cuda_helpers import start_ahead

        start_ahead(scripts)


def pytest_sessionfinish(session):
    import sys

    helpers = sys.modules.get("_cuda_helpers")
    if helpers is not None:
        helpers.stop_ahead()
