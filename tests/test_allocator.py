"""refbayes.allocator: glibc's malloc thresholds, set once when the numba backend loads, so that a
step's freed P-sized buffers are reused instead of page-faulted back (docs/threads.md)."""

import os
import subprocess
import sys

import pytest

from refbayes import allocator

pytestmark = pytest.mark.skipif(allocator._glibc() is None, reason="the thresholds are glibc's")

# the pattern of a step: three 1 MiB buffers touched, then freed, twenty times; prints the status
# and the minor page faults of the last twenty rounds
PROBE = """
import resource
import numpy as np
import refbayes.kernels.cpu  # noqa: F401
from refbayes import allocator

def step():
    blocks = [np.ones(131072) for _ in range(3)]
    return sum(float(b[-1]) for b in blocks)

for _ in range(3):
    step()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(allocator.status(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _probe(**env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("REFBAYES_MALLOC",
                                                                                                 "GLIBC_TUNABLES")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    status, faults = out.stdout.strip().rsplit(" ", 1)
    return status, int(faults)


def test_loading_the_numba_backend_sets_the_thresholds_and_stops_the_page_faults_of_reused_buffers():
    tuned_status, tuned = _probe()
    off_status, untuned = _probe(REFBAYES_MALLOC="0")
    assert tuned_status == "set"
    assert off_status == "off (REFBAYES_MALLOC=0)"
    assert untuned > 1000  # glibc's defaults hand the freed blocks back: every round faults them in again
    assert tuned < untuned / 10


def test_a_users_own_malloc_settings_are_left_alone():
    status, _ = _probe(MALLOC_TRIM_THRESHOLD_="200000")
    assert status == "left to the user (MALLOC_TRIM_THRESHOLD_ set)"
    status, _ = _probe(GLIBC_TUNABLES="glibc.malloc.trim_threshold=200000")
    assert status == "left to the user (GLIBC_TUNABLES set)"


def test_a_bad_switch_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(allocator._state, "status", "not tried")
    monkeypatch.setenv(allocator.ENV, "yes")
    with pytest.raises(ValueError, match="REFBAYES_MALLOC must be 0 or 1; got 'yes'"):
        allocator.tune()
    assert allocator.status() == "not tried"
