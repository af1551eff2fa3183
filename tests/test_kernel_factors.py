"""The shared inverse factors of the compiled kernels (kernels/cpu/_blocks.py) and the output count of
the compiled MLP steps (kernels/cpu/step.n_outputs), checked against NumPy."""

import numpy as np
import pytest

from refbayes.kernels.cpu._blocks import chol_inverse_factor, eig_inverse_factor, whitener
from refbayes.kernels.cpu.step import LIKELIHOOD_CODES, n_outputs


def _spd(C, seed):
    X = np.random.default_rng(seed).standard_normal((C, C + 2))
    return X @ X.T + 0.1 * np.eye(C)


@pytest.mark.parametrize("C", [1, 3, 6])
def test_chol_inverse_factor_whitens(C):
    S = _spd(C, C)
    A, ok = chol_inverse_factor(S)
    assert ok
    np.testing.assert_allclose(A.T @ A, np.linalg.inv(S), rtol=1e-10, atol=1e-12)
    assert not np.any(np.triu(A, 1))  # the inverse of a lower Cholesky factor is lower triangular


def test_chol_inverse_factor_reports_an_indefinite_matrix():
    S = np.diag([1.0, -1.0, 2.0])
    assert not chol_inverse_factor(S)[1]


def test_eig_inverse_factor_is_the_pseudo_inverse_over_the_kept_directions():
    rng = np.random.default_rng(0)
    V, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    w = np.array([1e-20, 0.5, 2.0, 3.0])  # ascending, as eigh returns them; the first is below the cut
    A = eig_inverse_factor(w, V, 1e-12)
    assert A.shape == (3, 4)
    S = V @ np.diag(w) @ V.T
    P = V[:, 1:] @ np.diag(1.0 / w[1:]) @ V[:, 1:].T
    np.testing.assert_allclose(A.T @ A, P, rtol=1e-10, atol=1e-12)
    A2, ok = whitener(S, True)  # whitener's singular branch keeps the same three directions
    assert ok
    np.testing.assert_allclose(A2.T @ A2, P, rtol=1e-8, atol=1e-10)


def test_n_outputs():
    sizes = np.array([5, 7, 4])
    assert n_outputs(sizes, LIKELIHOOD_CODES["gaussian"]) == 4
    assert n_outputs(sizes, LIKELIHOOD_CODES["categorical-full"]) == 4
    assert n_outputs(sizes, LIKELIHOOD_CODES["categorical-drop_last"]) == 3
