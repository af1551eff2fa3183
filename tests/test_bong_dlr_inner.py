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


def near_tie(lam, with_coef, seed=7, mixed=False):
    # W~ = [sqrt(1-a) W, sqrt(a) W_p, sqrt(a) U] = Q diag(sqrt(lam)) O^T with orthonormal Q (40 x 8): the
    # Gram matrix's eigenvalues are lam; R = 3, so the rank cut falls between lam[2] and lam[3]. O = I
    # unless ``mixed`` (then a random rotation: every column of W~ holds every direction, as in a filter,
    # and the Gram matrix's round-off is about eps lam[0] in every entry)
    rng = np.random.default_rng(seed)
    P, R, K, alpha = 40, 3, 2, 0.5
    Q, _ = np.linalg.qr(rng.standard_normal((P, 2 * R + K)))
    Wt = Q * np.sqrt(np.asarray(lam, dtype=float))
    if mixed:
        Wt = Wt @ np.linalg.qr(rng.standard_normal((2 * R + K, 2 * R + K)))[0].T
    W = Wt[:, :R] / np.sqrt(1 - alpha)
    W_p = Wt[:, R:2 * R] / np.sqrt(alpha)
    U = Wt[:, 2 * R:] / np.sqrt(alpha)
    cur = DLR(rng.standard_normal(P), rng.uniform(1.0, 3.0, P), W)
    pri = DLR(rng.standard_normal(P), rng.uniform(1.0, 3.0, P), W_p)
    check(cur, pri, U, rng.standard_normal(K), alpha, with_coef)


def truncations(monkeypatch):
    # the calls of the fused step's small-gap ending (LO-FI's truncation of W~ V), and whether each applied
    calls = []
    fn = kb._blr_fused_truncate
    monkeypatch.setattr(kb, "_blr_fused_truncate", lambda *a: calls.append(fn(*a) is not None) or fn(*a))
    return calls


@pytest.mark.parametrize("with_coef", [True, False])
@pytest.mark.parametrize("rel_gap", [1e-4, 3e-4, 1e-3, 0.5])
def test_near_tie_at_the_rank_cut_equals_reference(rel_gap, with_coef, monkeypatch):
    # cut eigenvalues next to the largest (2 of 4), a gap of rel_gap of it: the eigenvectors' error moves
    # W W^T by about eps / (2 rel_gap) of the largest eigenvalue, over kb.TRUNC_TOL (1e-12) at 1e-4 (LO-FI's
    # truncation of the rotated factor), under it from 3e-4 (the Gram matrix's eigenvectors, 3e-4 where
    # their error bound is largest)
    calls = truncations(monkeypatch)
    near_tie([4.0, 3.0, 2.0, 2.0 - 4.0 * rel_gap, 1.0, 0.5, 0.3, 0.2], with_coef)
    assert calls == ([True] if rel_gap < 2e-4 else [])


@pytest.mark.parametrize("with_coef", [True, False])
@pytest.mark.parametrize("level, rel_gap, truncated", [(1e-7, 1e-3, False), (1e-9, 1e-2, False),
                                                       (1e-6, 1e-7, True), (1e-8, 1e-9, True)])
def test_gap_at_the_cut_is_judged_by_its_effect_on_w_wt(level, rel_gap, truncated, with_coef, monkeypatch):
    # cut eigenvalues at ``level`` of the largest, apart by rel_gap of themselves, in mixed columns: the
    # Gram matrix's eigenvectors turn by about eps / (level rel_gap), but W W^T moves only by about
    # eps / rel_gap of the largest eigenvalue (the turn times the cut's eigenvalues). That is 2e-13 and
    # 2e-14 of it for the first two, which keep the eigenvectors (a rule on the gap alone, below 2.2e-4
    # of the largest eigenvalue, sent both to the truncation), and 2e-9 and 2e-7 for the last two, which
    # take LO-FI's truncation of the rotated factor: with the eigenvectors they miss the reference by
    # 6e-10 and 4e-9 (over this test's 2.8e-10), so a rule that let them through fails here
    calls = truncations(monkeypatch)
    c = 4.0 * level
    near_tie([4.0, 3.0, c, c * (1.0 - rel_gap), 0.5 * c, 0.3 * c, 0.2 * c, 0.1 * c], with_coef, mixed=True)
    assert calls == ([True] if truncated else [])


def test_gram_truncation_bound():
    lam = np.array([1.0, 0.5, 1e-6, 1e-6 * (1 - 1e-3), 1e-8])
    eps = np.finfo(float).eps
    d = eps / (1e-9)  # eps * lam[0] / gap
    err = d * (np.sqrt(lam[2] * lam[3]) + d * lam[2])  # about 2.2e-13
    assert kb.gram_truncation_ok(lam, 3, 1e-13, 1.01 * err) and not kb.gram_truncation_ok(lam, 3, 1e-13, 0.99 * err)
    assert kb.gram_truncation_ok(lam, 4, 1e-13, 0.0) is False  # 1e-8 is not at round-off level
    assert kb.gram_truncation_ok(lam, 4, 1e-7, 0.0)  # at 1e-7 it is: it goes to the diagonal either way
    tie = np.array([1.0, 0.3, 0.3, 0.1])
    assert not kb.gram_truncation_ok(tie, 2, 1e-13, 1.0)  # an exact tie: no basis is accurate


@pytest.mark.parametrize("P, R, K", [(50, 3, 2), (80, 5, 5), (30, 1, 4), (6, 4, 4), (40, 0, 3), (600, 4, 3),
                                     (600, 3, 1)])
@pytest.mark.parametrize("seed", [0, 1])
def test_bbb_inner_iterations_equal_reference(seed, P, R, K):
    # kernels.cpu.bong.dlr_bbb shares one factor of I + W^T diag(1/ups) W between its Sigma products;
    # P = 600: its passes run over two whole blocks of kb.BBB_BLOCK = 256 rows and a partial one (K = 1:
    # LIN-EF's single column, an outer product instead of BLAS)
    assert kb.BBB_BLOCK == 256
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
    near_tie([4.0, 3.0, 2.0, 2.0 - 4e-4, 1.0, 0.5, 0.3, 0.2], True)
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
