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
