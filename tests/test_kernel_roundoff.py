"""The variance round-off error of the diagonal kernels (kernels/_host.raise_variance_roundoff).

An FD/VD-EKF update whose new variance v_i - v_i^2 h_i^T S^{-1} h_i cancels to <= 0 raises
NotPositiveDefiniteError naming the filter and the variance's index, with the same message as the
NumPy reference (refbayes.filters.diagonal), docs/diagonal_ekf.md.
"""

import numpy as np
import pytest

from refbayes.beliefs import Diag
from refbayes.errors import NotPositiveDefiniteError
from refbayes.filters import diagonal as ref
from refbayes.kernels import _host
from refbayes.kernels import cpu as K


def _cancelling(P=4, j=2):
    """Unit variances and one observation of parameter j with a huge gain over a negligible noise:
    v_j' = 1 - 1e16 / (1e16 + 1e-300) is exactly 0 in float64; the other variances stay 1."""
    H = np.zeros((1, P))
    H[0, j] = 1e8
    return np.zeros(P), np.ones(P), H, np.array([[1e-300]]), np.zeros(1)


@pytest.mark.parametrize("kind", ["fd", "vd"])
def test_cpu_kernel_names_the_variance_as_the_reference_does(kind):
    mean, var, H, R, e = _cancelling()
    with pytest.raises(NotPositiveDefiniteError) as got:
        (K.fd_update if kind == "fd" else K.vd_update)(mean, var, H, R, e)
    with pytest.raises(NotPositiveDefiniteError) as want:
        (ref.fd_update if kind == "fd" else ref.vd_update)(Diag(mean, var), H, R, e)
    assert f"{kind.upper()}-EKF variance 2 became" in str(got.value)
    assert str(got.value) == str(want.value)


def test_helper_takes_the_smallest_variance_or_the_given_index():
    var = np.array([1.0, -2.0, 0.0])
    with pytest.raises(NotPositiveDefiniteError, match=r"^X variance 1 became -2\.0 \(round-off\)"):
        _host.raise_variance_roundoff("X", var)
    with pytest.raises(NotPositiveDefiniteError, match=r"^X variance 2 became 0\.0 "):
        _host.raise_variance_roundoff("X", var, 2)
