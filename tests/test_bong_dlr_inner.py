"""The compiled DLR BLR inner step (kernels.cpu.bong.dlr_blr) against the NumPy reference
(refbayes.filters.bong.algorithms.dlr_blr, Jones et al. 2024 eqs 293-301) on the inputs its
fast route sees in a filter: the first inner iteration (W = W_p, so [W, W_p] is rank-deficient),
a later one, and a near-tie at the rank cut (the route that falls back to LO-FI's truncation).
Oracle: the reference, rtol 1e-10 (W compared as W W^T, which is what the belief defines)."""

import numpy as np
import pytest

from refbayes.beliefs import DLR
from refbayes.filters.bong import algorithms
from refbayes.filters.bong.estimators import Curvature
from refbayes.kernels.cpu import bong as kb


def close(a, b, rtol=1e-10):
    scale = max(1.0, float(np.max(np.abs(b)))) if np.size(b) else 1.0
    np.testing.assert_allclose(a, b, rtol=0, atol=rtol * scale)


def check(cur, pri, U, coef, alpha, with_coef):
    g = U @ coef
    ref = algorithms.dlr_blr(cur, pri, g, Curvature.from_factor(U), alpha)
    m, u, W = kb.dlr_blr(cur.mean, cur.ups, cur.W, pri.mean, pri.ups, pri.W, U, g,
                         coef=coef if with_coef else None, alpha=alpha)
    close(m, ref.mean)
    close(u, ref.ups)
    close(W @ W.T, ref.W @ ref.W.T)
    assert W.shape == ref.W.shape


def problem(seed, P, R, K):
    rng = np.random.default_rng(seed)
    pri = DLR(rng.standard_normal(P), rng.uniform(1.0, 3.0, P), 0.5 * rng.standard_normal((P, R)))
    return rng, pri, 0.5 * rng.standard_normal((P, K)), rng.standard_normal(K)


@pytest.mark.parametrize("with_coef", [True, False])
@pytest.mark.parametrize("P, R, K", [(50, 3, 2), (80, 5, 5), (30, 1, 4), (12, 4, 3), (6, 4, 4), (40, 0, 3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_first_and_later_inner_iterations_equal_reference(seed, P, R, K, with_coef):
    rng, pri, U, coef = problem(seed, P, R, K)
    alpha = 0.5
    check(pri, pri, U, coef, alpha, with_coef)  # first iteration: cur = prior
    nxt = algorithms.dlr_blr(pri, pri, U @ coef, Curvature.from_factor(U), alpha)
    U2 = U + 0.01 * rng.standard_normal(U.shape)  # the estimate at the new iterate
    check(nxt, pri, U2, rng.standard_normal(K), alpha, with_coef)
    check(nxt, pri, U2, rng.standard_normal(K), 0.9, with_coef)


@pytest.mark.parametrize("with_coef", [True, False])
@pytest.mark.parametrize("rel_gap", [1e-4, 3e-4, 1e-3, 0.5])
def test_near_tie_at_the_rank_cut_equals_reference(rel_gap, with_coef):
    # 1e-4: below kb.GAP_TOL (about 2.2e-4), LO-FI's truncation of the rotated factor; 3e-4 and above:
    # the eigenvectors of the Gram matrix, 3e-4 where their error bound is largest
    # W~ = [sqrt(1-a) W, sqrt(a) W_p, sqrt(a) U] = Q diag(s): eigenvalues s^2 chosen so that the
    # R-th and (R+1)-th differ by rel_gap of the largest
    rng = np.random.default_rng(7)
    P, R, K, alpha = 40, 3, 2, 0.5
    Q, _ = np.linalg.qr(rng.standard_normal((P, 2 * R + K)))
    s2 = np.array([4.0, 3.0, 2.0, 2.0 - 4.0 * rel_gap, 1.0, 0.5, 0.3, 0.2])
    s = np.sqrt(s2)
    W = Q[:, :R] * s[:R] / np.sqrt(1 - alpha)
    W_p = Q[:, R:2 * R] * s[R:2 * R] / np.sqrt(alpha)
    U = Q[:, 2 * R:] * s[2 * R:] / np.sqrt(alpha)
    cur = DLR(rng.standard_normal(P), rng.uniform(1.0, 3.0, P), W)
    pri = DLR(rng.standard_normal(P), rng.uniform(1.0, 3.0, P), W_p)
    check(cur, pri, U, rng.standard_normal(K), alpha, with_coef)


@pytest.mark.parametrize("P, R, K", [(50, 3, 2), (80, 5, 5), (30, 1, 4), (6, 4, 4), (40, 0, 3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_bbb_inner_iterations_equal_reference(seed, P, R, K):
    # kernels.cpu.bong.dlr_bbb shares one factor of I + W^T diag(1/ups) W between its Sigma products
    rng, pri, U, coef = problem(seed, P, R, K)
    alpha = 0.05
    cur = pri
    for _ in range(3):
        g = U @ coef
        ref = algorithms.dlr_bbb(cur, pri, g, Curvature.from_factor(U), alpha)
        m, u, W = kb.dlr_bbb(cur.mean, cur.ups, cur.W, pri.mean, pri.ups, pri.W, U, g, alpha)
        close(m, ref.mean)
        close(u, ref.ups)
        close(W, ref.W)  # BBB's W is a gradient step, not a projection: compared as is
        cur = ref
        U = U + 0.01 * rng.standard_normal(U.shape)


def test_fused_routes_are_taken(monkeypatch):
    # the fused BBB step and the fused BLR step's small-gap ending must run (not only their fallbacks)
    hits = []
    for name in ("_bbb_fused", "_blr_fused_truncate"):
        fn = getattr(kb, name)
        monkeypatch.setattr(kb, name, lambda *a, _fn=fn, _n=name, **k: hits.append((_n, _fn(*a, **k) is not None))
                            or _fn(*a, **k))
    test_bbb_inner_iterations_equal_reference(0, 50, 3, 2)
    test_near_tie_at_the_rank_cut_equals_reference(1e-4, True)
    assert ("_bbb_fused", True) in hits and ("_blr_fused_truncate", True) in hits


@pytest.mark.parametrize("bad", ["U", "ups", "W"])
def test_bbb_nonfinite_input_is_named(bad):
    rng, pri, U, coef = problem(3, 30, 3, 2)
    args = dict(mean=pri.mean, ups=pri.ups.copy(), W=pri.W.copy(), U=U.copy())
    args[bad].flat[5] = np.nan
    with pytest.raises(ValueError, match=bad):
        kb.dlr_bbb(args["mean"], args["ups"], args["W"], pri.mean, pri.ups, pri.W, args["U"], args["U"] @ coef, 0.05)


@pytest.mark.parametrize("step", ["blr", "bbb"])
def test_inner_steps_give_the_same_bits_for_either_layout_and_return_w_column_major(step):
    # the fused routes read W, W_p and U transposed: a column-major input is read in place, a
    # row-major one copied; either way the same numbers, and W comes back column-major, so that
    # the next inner iteration reads it without a copy
    rng, pri, U, coef = problem(3, 60, 4, 3)
    nxt = algorithms.dlr_blr(pri, pri, U @ coef, Curvature.from_factor(U), 0.5)
    g = U @ coef

    def run(order):
        W, W_p, Uo = (np.asarray(a, order=order) for a in (nxt.W, pri.W, U))
        assert W.flags.f_contiguous == (order == "F") and W.flags.c_contiguous == (order == "C")
        if step == "blr":
            return kb.dlr_blr(nxt.mean, nxt.ups, W, pri.mean, pri.ups, W_p, Uo, g, coef=coef, alpha=0.5)
        return kb.dlr_bbb(nxt.mean, nxt.ups, W, pri.mean, pri.ups, W_p, Uo, g, 0.05)

    c_out, f_out = run("C"), run("F")
    for a, b in zip(c_out, f_out):
        np.testing.assert_array_equal(a, b)
    assert f_out[2].flags.f_contiguous and f_out[2].shape == nxt.W.shape
