"""Beliefs are immutable, their dense forms agree, their samplers have the right moments,
and save/load round-trips them bit-exactly."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes import linalg


def random_spd(rng, n, floor=0.5):
    A = rng.standard_normal((n, n))
    return A @ A.T / n + floor * np.eye(n)


def make_beliefs(rng, P, L):
    mean = rng.standard_normal(P)
    perm = rng.permutation(P)
    groups = (perm[: P // 2], perm[P // 2:])
    return [
        rb.FullCov(mean, random_spd(rng, P)),
        rb.Diag(mean, rng.uniform(0.2, 2.0, P)),
        rb.BlockDiag(mean, groups, tuple(random_spd(rng, len(g)) for g in groups)),
        rb.DLR(mean, rng.uniform(0.5, 2.0, P), rng.standard_normal((P, L))),
    ]


@settings(max_examples=30, deadline=None)
@given(P=st.integers(2, 9), L=st.integers(0, 4), seed=st.integers(0, 2**32 - 1))
def test_dense_forms_are_consistent(P, L, seed):
    rng = np.random.default_rng(seed)
    J = rng.standard_normal((3, P))
    for bel in make_beliefs(rng, P, L):
        cov, prec = bel.covariance(), bel.precision()
        np.testing.assert_allclose(cov @ prec, np.eye(P), atol=1e-10)
        np.testing.assert_allclose(bel.marginal_variance(), np.diag(cov), rtol=1e-12)
        np.testing.assert_allclose(bel.project(J), J @ cov @ J.T, rtol=1e-10, atol=1e-12)


def test_dlr_precision_is_diag_plus_low_rank():
    rng = np.random.default_rng(0)
    ups, W = rng.uniform(1, 2, 6), rng.standard_normal((6, 2))
    bel = rb.DLR(np.zeros(6), ups, W)
    expected = np.diag(ups) + sum(np.outer(W[:, k], W[:, k]) for k in range(2))
    np.testing.assert_allclose(bel.precision(), expected, rtol=1e-14)
    np.testing.assert_allclose(bel.covariance(), np.linalg.inv(expected), rtol=1e-10)


def test_beliefs_are_immutable_and_copy_their_input():
    rng = np.random.default_rng(1)
    mean = rng.standard_normal(4)
    bel = rb.Diag(mean, np.ones(4))
    mean[0] = 100.0
    assert bel.mean[0] != 100.0
    with pytest.raises(ValueError):
        bel.mean[0] = 1.0
    with pytest.raises(Exception):
        bel.mean = np.zeros(4)
    assert bel.mean.dtype == np.float64


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: rb.Diag(np.zeros(3), np.array([1.0, 0.0, 1.0])), "var"),
        (lambda: rb.Diag(np.zeros(3), np.ones(4)), "var"),
        (lambda: rb.Diag(np.array([0.0, np.nan, 0.0]), np.ones(3)), "mean"),
        (lambda: rb.DLR(np.zeros(3), -np.ones(3), np.zeros((3, 1))), "ups"),
        (lambda: rb.DLR(np.zeros(3), np.ones(3), np.zeros((2, 1))), "W"),
        (lambda: rb.FullCov(np.zeros(2), np.array([[1.0, 0.5], [0.0, 1.0]])), "symmetric"),
        (lambda: rb.BlockDiag(np.zeros(3), ([0, 1], [1, 2]), (np.eye(2), np.eye(2))), "partition"),
    ],
)
def test_bad_beliefs_raise(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("kind", range(4))
def test_sample_moments_within_standard_errors(kind):
    rng = np.random.default_rng(7 + kind)
    P, n = 4, 40_000
    bel = make_beliefs(rng, P, 2)[kind]
    draws = bel.sample(np.random.default_rng(123), n)
    assert draws.shape == (n, P)
    cov = bel.covariance()
    sd = np.sqrt(np.diag(cov))
    # mean: standard error sd / sqrt(n)
    assert np.all(np.abs(draws.mean(0) - bel.mean) < 6 * sd / np.sqrt(n))
    # covariance entries: Var(x_i x_j) = S_ii S_jj + S_ij^2 for Gaussians
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    emp = np.cov(draws.T)
    assert np.all(np.abs(emp - cov) < 6 * se)


def test_sample_requires_generator():
    bel = rb.Diag(np.zeros(2), np.ones(2))
    with pytest.raises(TypeError, match="rng"):
        bel.sample(0)
    assert bel.sample(np.random.default_rng(0)).shape == (2,)


def test_save_load_round_trip_is_bit_exact(tmp_path):
    rng = np.random.default_rng(3)
    for i, bel in enumerate(make_beliefs(rng, 7, 3)):
        path = tmp_path / f"b{i}.npz"
        rb.save(bel, path)
        back = rb.load(path)
        assert type(back) is type(bel)
        for name in type(bel).__dataclass_fields__:
            a, b = getattr(bel, name), getattr(back, name)
            if isinstance(a, tuple):
                assert all(np.array_equal(x, y) for x, y in zip(a, b))
            else:
                assert a.tobytes() == b.tobytes()


def test_load_rejects_foreign_files(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, a=np.zeros(2))
    with pytest.raises(ValueError, match="not a refbayes belief"):
        rb.load(path)


def test_dlr_helpers_never_need_dense_matrices():
    rng = np.random.default_rng(5)
    P, L = 50, 3
    ups, W = rng.uniform(1, 2, P), rng.standard_normal((P, L))
    B = rng.standard_normal((P, 2))
    dense = np.diag(ups) + W @ W.T
    np.testing.assert_allclose(linalg.dlr_solve(ups, W, B), np.linalg.solve(dense, B), rtol=1e-10)
    np.testing.assert_allclose(linalg.dlr_solve(ups, W[:, :0], B), B / ups[:, None], rtol=1e-14)


def test_lofi_belief_with_optional_state_round_trips(tmp_path):
    from refbayes.filters.lofi import LoFiBelief

    rng = np.random.default_rng(4)
    P = 5
    full = LoFiBelief(rng.standard_normal(P), rng.uniform(1, 2, P), rng.standard_normal((P, 2)),
                      obs_var=0.37, n_obs=12, prior_mean=rng.standard_normal(P), prior_prec=rng.uniform(1, 2, P))
    bare = LoFiBelief(rng.standard_normal(P), rng.uniform(1, 2, P), rng.standard_normal((P, 0)))
    for i, bel in enumerate((full, bare)):
        rb.save(bel, tmp_path / f"l{i}.npz")
        back = rb.load(tmp_path / f"l{i}.npz")
        assert type(back) is LoFiBelief
        assert back.obs_var == bel.obs_var and back.n_obs == bel.n_obs and isinstance(back.n_obs, int)
        for name in ("mean", "ups", "W", "prior_mean", "prior_prec"):
            a, b = getattr(bel, name), getattr(back, name)
            assert (a is None and b is None) or a.tobytes() == b.tobytes()
