"""The O(P^2 C) full-covariance EKF steps against a dense textbook reference with explicit inverses."""

import numpy as np
import pytest

from refbayes.beliefs import FullCov
from refbayes.errors import NotPositiveDefiniteError
from refbayes.filters import ekf


def _instance(rng, P, C):
    A = rng.standard_normal((P, P)) / np.sqrt(P)
    Sigma = A @ A.T + 0.1 * np.eye(P)
    Sigma = 0.5 * (Sigma + Sigma.T)
    mu = rng.standard_normal(P)
    H = rng.standard_normal((C, P))
    Bc = rng.standard_normal((C, C))
    R = Bc @ Bc.T + 0.5 * np.eye(C)
    e = rng.standard_normal(C)
    return FullCov(mu, Sigma), H, R, e


def _reference(mu, Sigma, H, R, e, gamma, q):
    P = mu.shape[0]
    mu = gamma * mu
    Sigma = gamma**2 * Sigma + q * np.eye(P)
    S = H @ Sigma @ H.T + R
    K = Sigma @ H.T @ np.linalg.inv(S)
    return mu + K @ e, Sigma - Sigma @ H.T @ np.linalg.inv(S) @ H @ Sigma, K


@pytest.mark.parametrize("form", ["covariance", "joseph", "information"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_steps_match_dense_reference(form, seed):
    rng = np.random.default_rng(seed)
    P, C = 40, 3
    gamma, q = 0.97, 0.05
    bel, H, R, e = _instance(rng, P, C)
    mu_ref, cov_ref, K = _reference(bel.mean, bel.cov, H, R, e, gamma, q)
    if form == "joseph":  # the textbook Joseph product, dense
        A = np.eye(P) - K @ H
        Sp = gamma**2 * bel.cov + q * np.eye(P)
        cov_ref = A @ Sp @ A.T + K @ R @ K.T
    new = ekf.update(ekf.predict(bel, gamma, q), H, R, e, form=form)
    np.testing.assert_allclose(new.mean, mu_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(new.cov, cov_ref, rtol=1e-10, atol=1e-12 * np.abs(cov_ref).max())
    if form != "information":
        assert np.array_equal(new.cov, new.cov.T)  # symmetric by construction, no symmetrize pass
    assert not new.cov.flags.writeable and not new.mean.flags.writeable


def test_predict_is_exact_and_does_not_alias():
    rng = np.random.default_rng(3)
    bel, *_ = _instance(rng, 10, 1)
    q = rng.uniform(0.01, 0.1, 10)
    new = ekf.predict(bel, 0.9, q)
    np.testing.assert_array_equal(new.cov, 0.81 * bel.cov + np.diag(q))
    assert not np.shares_memory(new.cov, bel.cov)


def test_many_steps_stay_close_to_reference():
    rng = np.random.default_rng(4)
    P, C = 30, 2
    bel, H, R, e = _instance(rng, P, C)
    mu, Sigma = bel.mean.copy(), bel.cov.copy()
    for _ in range(25):
        H = rng.standard_normal((C, P))
        e = rng.standard_normal(C)
        mu, Sigma, _ = _reference(mu, Sigma, H, R, e, 0.99, 0.01)
        Sigma = 0.5 * (Sigma + Sigma.T)
        bel = ekf.update(ekf.predict(bel, 0.99, 0.01), H, R, e)
    np.testing.assert_allclose(bel.mean, mu, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(bel.cov, Sigma, rtol=1e-9, atol=1e-11 * np.abs(Sigma).max())


def test_indefinite_innovation_is_named_error():
    rng = np.random.default_rng(5)
    bel, H, R, e = _instance(rng, 8, 2)
    with pytest.raises(NotPositiveDefiniteError):
        ekf.update(bel, H, -100.0 * R, e)


def test_user_beliefs_still_validated():
    with pytest.raises(ValueError):
        FullCov(np.zeros(2), np.array([[1.0, 0.5], [0.0, 1.0]]))


# ---------------------------------------------------------------------------------------------
# BONG full families with a factor curvature G = -U U^T: O(K P^2) steps against dense formulas

from refbayes.errors import NotPositiveDefiniteError as _NPD  # noqa: E402
from refbayes.filters.bong import algorithms as bong_alg  # noqa: E402
from refbayes.filters.bong.estimators import Curvature  # noqa: E402
from refbayes.filters.bong.families import predict_full  # noqa: E402


def _bong_problem(seed, P=25, K=2, scale=0.3):
    rng = np.random.default_rng(seed)
    bel, *_ = _instance(rng, P, 1)
    prior = predict_full(bel, 0.95, 0.02)
    U = scale * rng.standard_normal((P, K))
    g = rng.standard_normal(P)
    return prior, U, g, Curvature("factor", U)


def _pd(A):
    return bool(np.all(np.linalg.eigvalsh(0.5 * (A + A.T)) > 0))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_bong_natural_factor_matches_explicit_inverse(seed):
    prior, U, g, curv = _bong_problem(seed)
    Sp = prior.cov
    prec = np.linalg.inv(Sp) + U @ U.T
    cov = np.linalg.inv(prec)
    new = bong_alg.full_natural_bong(prior, prior, g, curv, 1.0)
    np.testing.assert_allclose(new.cov, cov, rtol=1e-10, atol=1e-12 * np.abs(cov).max())
    np.testing.assert_allclose(new.mean, prior.mean + cov @ g, rtol=1e-10, atol=1e-12)
    assert np.array_equal(new.cov, new.cov.T)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_bong_moment_factor_matches_dense(seed, scale):
    prior, U, g, curv = _bong_problem(seed, scale=scale)
    Sp = prior.cov
    cov = Sp - Sp @ U @ U.T @ Sp
    if not _pd(cov):
        with pytest.raises(_NPD):
            bong_alg.full_bong(prior, prior, g, curv, 1.0)
        return
    new = bong_alg.full_bong(prior, prior, g, curv, 1.0)
    np.testing.assert_allclose(new.cov, cov, rtol=1e-10, atol=1e-12 * np.abs(cov).max())
    np.testing.assert_allclose(new.mean, prior.mean + Sp @ g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alpha", [1e-3, 0.05, 2.0])
def test_bog_natural_woodbury_matches_explicit_inverse(seed, alpha):
    prior, U, g, curv = _bong_problem(seed)
    Sp, mu = prior.cov, prior.mean
    lam = np.linalg.inv(Sp)
    a = Sp @ g
    prec = lam - 2 * alpha * (np.outer(a, mu) + np.outer(mu, a)) + 2 * alpha * (Sp @ U) @ (Sp @ U).T
    prec = 0.5 * (prec + prec.T)
    if not _pd(prec):
        with pytest.raises(_NPD):
            bong_alg.full_natural_bog(prior, prior, g, curv, alpha)
        return
    cov = np.linalg.inv(prec)
    mean = cov @ (lam @ mu + alpha * a)
    new = bong_alg.full_natural_bog(prior, prior, g, curv, alpha)
    np.testing.assert_allclose(new.cov, cov, rtol=1e-9, atol=1e-11 * np.abs(cov).max())
    np.testing.assert_allclose(new.mean, mean, rtol=1e-9, atol=1e-11 * np.abs(mean).max())
    assert np.array_equal(new.cov, new.cov.T)


def test_bog_natural_fast_path_equals_dense_path():
    prior, U, g, curv = _bong_problem(7)
    with pytest.raises(_NPD):  # alpha = 0.05 loses definiteness here: both paths say so
        bong_alg.full_natural_bog(prior, prior, g, Curvature("dense", -U @ U.T), 0.05)
    with pytest.raises(_NPD):
        bong_alg.full_natural_bog(prior, prior, g, curv, 0.05)
    fast = bong_alg.full_natural_bog(prior, prior, g, curv, 1e-3)
    dense = bong_alg.full_natural_bog(prior, prior, g, Curvature("dense", -U @ U.T), 1e-3)
    np.testing.assert_allclose(fast.cov, dense.cov, rtol=1e-9, atol=1e-12 * np.abs(dense.cov).max())
    np.testing.assert_allclose(fast.mean, dense.mean, rtol=1e-9, atol=1e-12)


def test_lowrank_update_matches_dense_and_is_symmetric():
    from refbayes import linalg

    rng = np.random.default_rng(11)
    for P, K in ((1, 1), (63, 2), (130, 3)):
        A = rng.standard_normal((P, P))
        S = A + A.T
        B = rng.standard_normal((K, P))
        down = linalg.lowrank_update(S, B)
        up = linalg.lowrank_update(S, B, sign=1.0)
        np.testing.assert_allclose(down, S - np.einsum("ki,kj->ij", B, B), rtol=1e-13, atol=1e-12)
        np.testing.assert_allclose(up, S + np.einsum("ki,kj->ij", B, B), rtol=1e-13, atol=1e-12)
        assert np.array_equal(down, down.T) and np.array_equal(up, up.T)


# ---------------------------------------------------------------------------------------------
# predict folded into the update: one pass over the covariance, the numbers of update(predict(.))

from refbayes import linalg as _la  # noqa: E402
from refbayes.filters.bong.families import PredictedFull  # noqa: E402


def test_sym_matmul_and_folded_lowrank_update_match_dense():
    rng = np.random.default_rng(21)
    for P, K in ((1, 1), (57, 2), (90, 4)):
        A = rng.standard_normal((P, P))
        S = A + A.T
        U = rng.standard_normal((P, K))
        np.testing.assert_allclose(_la.sym_matmul(S, U), S @ U, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(_la.sym_matmul(S, U[:, 0]), S @ U[:, 0], rtol=1e-12, atol=1e-12)
        B, E, d = rng.standard_normal((K, P)), rng.standard_normal((2, P)), rng.uniform(0, 1, P)
        dense = 0.7 * S + np.diag(d) - B.T @ B + E.T @ E
        for block in (None, 5):
            out = _la.lowrank_update(S, B, block=block, scale=0.7, diag=d, plus=E)
            np.testing.assert_allclose(out, dense, rtol=1e-12, atol=1e-12 * np.abs(dense).max())
            assert np.array_equal(out, out.T) and not np.shares_memory(out, S)


@pytest.mark.parametrize("compiled", [False, True])
def test_sym_matmul_reads_only_the_lower_triangle(compiled):
    """Both routes of sym_matmul against the dense product, over sizes that end on a full block of
    SYM_ROWS rows, one row past it, one short of it, and none: with NaN above the diagonal (entries
    the contract says are never read) and a NaN-filled output buffer (every entry must be written)."""
    from refbayes.kernels.cpu.cholupdate import SYM_ROWS

    rng = np.random.default_rng(22)
    for P in (0, 1, 2, SYM_ROWS - 1, SYM_ROWS, SYM_ROWS + 1, 2 * SYM_ROWS + 3, 57, 130):
        A = rng.standard_normal((P, P))
        S = A + A.T
        lower = np.where(np.tri(P, dtype=bool), S, np.nan)
        for K in (1, 2, 3, 5):
            U = rng.standard_normal((P, K))
            expect = S @ U
            tol = 1e-13 * max(1.0, np.abs(S).sum() * np.abs(U).max(initial=0.0))
            got = _la.sym_matmul(lower, U, compiled=compiled)
            assert got.shape == (P, K)
            np.testing.assert_allclose(got, expect, rtol=0, atol=tol)
            np.testing.assert_allclose(_la.sym_matmul(lower, U[:, 1 % K], compiled=compiled), S @ U[:, 1 % K],
                                       rtol=0, atol=tol)


def test_sym_lower_times_writes_every_output_entry():
    from refbayes.kernels.cpu.cholupdate import sym_lower_times

    rng = np.random.default_rng(23)
    P, K = 37, 3
    A = rng.standard_normal((P, P))
    S = A + A.T
    Ut = rng.standard_normal((K, P))
    out = np.full((K, P), np.nan)
    assert sym_lower_times(S, Ut, out) is out
    np.testing.assert_allclose(out, (S @ Ut.T).T, rtol=0, atol=1e-12 * np.abs(S).sum(axis=1).max())


def _gershgorin(S):
    return np.min(2.0 * np.diag(S) - np.abs(S).sum(axis=1))


@pytest.mark.parametrize("P,K", [(1, 1), (57, 2), (90, 4), (33, 0), (40, 5), (41, 9)])
def test_lowrank_gershgorin_writes_the_update_and_returns_its_bound(P, K):
    # BOG (moment)'s one pass: the array of linalg.lowrank_update, symmetric bit for bit, and its bound
    from refbayes.kernels.cpu.cholupdate import lowrank_gershgorin

    rng = np.random.default_rng(P + K)
    A = rng.standard_normal((P, P))
    S = A + A.T + 2 * P * np.eye(P)
    B, d = rng.standard_normal((K, P)), rng.uniform(0, 1, P)
    for scale, diag in ((1.0, None), (0.7, d)):
        out = np.empty((P, P))
        low = lowrank_gershgorin(S, scale, np.zeros(P) if diag is None else d, np.ascontiguousarray(-B.T), B, out)
        dense = scale * S - B.T @ B + (0 if diag is None else np.diag(d))
        np.testing.assert_allclose(out, dense, rtol=1e-13, atol=1e-13 * np.abs(dense).max())
        np.testing.assert_allclose(out, _la.lowrank_update(S, B, scale=scale, diag=diag), rtol=1e-13,
                                   atol=1e-13 * np.abs(dense).max())
        assert np.array_equal(out, out.T)
        assert low == pytest.approx(_gershgorin(dense), rel=1e-12, abs=1e-12 * np.abs(dense).max())
    S[3 % P, 5 % P] = S[5 % P, 3 % P] = np.nan  # a NaN never gives a bound that certifies
    assert np.isnan(lowrank_gershgorin(S, 1.0, np.zeros(P), np.ascontiguousarray(-B.T), B, np.empty((P, P))))


@pytest.mark.parametrize("lazy", [False, True])
def test_bog_moment_takes_the_bound_from_the_pass_that_writes_the_covariance(lazy, monkeypatch):
    # without a carried factor the certificate needs Sigma+'s Gershgorin bound: the update pass returns
    # it (families.full_cov_downdate_bound), so the new covariance is not read a second time
    from refbayes.filters.bong import algorithms as alg
    from refbayes.filters.bong.families import full_cov_downdate_bound, full_cov_update
    from refbayes.filters.bong.families import predict_full

    rng = np.random.default_rng(9)
    P = 40
    A = rng.standard_normal((P, P)) / np.sqrt(P)
    M = A @ A.T
    bel = FullCov(rng.standard_normal(P), 0.025 * (M + M.T) + np.eye(P))  # dominant: Gershgorin certifies
    prior = PredictedFull(bel, 0.9, 1e-3) if lazy else predict_full(bel, 0.9, 1e-3)
    U = 0.1 * rng.standard_normal((P, 3))
    cov, low = full_cov_downdate_bound(prior, np.sqrt(0.25) * U.T)
    want = full_cov_update(prior, np.sqrt(0.25) * U.T)
    np.testing.assert_allclose(cov, want, rtol=1e-13, atol=1e-15)
    assert np.array_equal(cov, cov.T) and low == pytest.approx(_gershgorin(want), rel=1e-12)
    reads = []
    real = alg._gershgorin_lower
    monkeypatch.setattr(alg, "_gershgorin_lower", lambda S, *a: reads.append(S.shape) or real(S, *a))
    new = alg.full_bog(prior, prior, np.zeros(P), Curvature("factor", U), 0.5)
    np.testing.assert_allclose(new.cov, prior.cov - 0.25 * U @ U.T, rtol=1e-12, atol=1e-14)
    assert reads == [] and alg.carried_factor(new) is None


@pytest.mark.parametrize("form", ["covariance", "joseph", "information"])
def test_ekf_predict_update_equals_update_of_predict(form):
    rng = np.random.default_rng(22)
    bel, H, R, e = _instance(rng, 45, 3)
    q = rng.uniform(0.0, 0.05, 45)
    for gamma, qq in ((0.93, q), (1.0, 0.02), (0.9, 0.0)):
        two = ekf.update(ekf.predict(bel, gamma, qq), H, R, e, form=form)
        one = ekf.predict_update(bel, H, R, e, gamma, qq, form=form)
        np.testing.assert_allclose(one.mean, two.mean, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(one.cov, two.cov, rtol=1e-11, atol=1e-13 * np.abs(two.cov).max())
        if form != "information":
            assert np.array_equal(one.cov, one.cov.T)
        assert not one.cov.flags.writeable


def _mlp_setup(seed):
    import refbayes as rb

    rng = np.random.default_rng(seed)
    model = rb.MLP([3, 6, 2], activation="tanh")
    return rb, model, rb.Gaussian(0.5), rng, model.init_params(rng)


@pytest.mark.parametrize("form", ["covariance", "joseph"])
def test_fullekf_one_step_equals_predict_then_update(form):
    rb, model, lik, rng, theta = _mlp_setup(23)
    filt = rb.FullEKF(model, lik, gamma=0.95, q=rng.uniform(0, 0.01, model.n_params), form=form)
    bel = filt.init(theta, 0.3)
    for _ in range(5):
        x, y = rng.standard_normal(3), rng.standard_normal(2)
        one = filt.predict_update(bel, x, y)
        two = filt.update(filt.predict(bel), x, y)
        np.testing.assert_allclose(one.mean, two.mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(one.cov, two.cov, rtol=1e-10, atol=1e-12 * np.abs(two.cov).max())
        assert np.array_equal(one.cov, one.cov.T)
        bel = one


@pytest.mark.parametrize("algorithm", ["bong", "bog"])
@pytest.mark.parametrize("family", ["full", "full-moment"])
@pytest.mark.parametrize("estimator", ["lin-hess", "lin-ef"])
@pytest.mark.parametrize("dynamics", ["standard", "ou"])
def test_bong_full_one_step_equals_predict_then_update(algorithm, family, estimator, dynamics):
    rb, model, lik, rng, theta = _mlp_setup(24)
    P = model.n_params
    kw = {"lr": 1e-3} if algorithm == "bog" else {}
    if dynamics == "ou":
        kw.update(dynamics="ou", ou_mean=np.zeros(P), ou_var=0.2)
    else:
        kw.update(q=rng.uniform(0, 0.01, P))
    filt = rb.Bong(model, lik, algorithm=algorithm, family=family, estimator=estimator, gamma=0.97, **kw)
    bel = filt.init(theta, 0.01)
    for _ in range(4):
        x, y = rng.standard_normal(3), rng.standard_normal(2)
        try:
            two = filt.update(filt.predict(bel), x, y)
        except _NPD:  # the moment steps can lose definiteness: the one-step path says so too
            with pytest.raises(_NPD):
                filt.predict_update(bel, x, y)
            break
        one = filt.predict_update(bel, x, y)
        np.testing.assert_allclose(one.mean, two.mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(one.cov, two.cov, rtol=1e-10, atol=1e-12 * np.abs(two.cov).max())
        assert np.array_equal(one.cov, one.cov.T) and not one.cov.flags.writeable
        bel = one


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("algorithm", ["bong", "bog"])
@pytest.mark.parametrize("family", ["full", "full-moment"])
@pytest.mark.parametrize("estimator", ["lin-hess", "lin-ef"])
def test_bong_full_one_step_yhat_is_the_predicted_mean_of_y(algorithm, family, estimator, backend):
    # the one-call step takes yhat from its linearisation at the predicted mean (no second forward
    # pass): the likelihood's mean at the model's output there, as a separate forward pass gives it
    rb, model, lik, rng, theta = _mlp_setup(26)
    kw = {"lr": 1e-5} if algorithm == "bog" else {}
    filt = rb.Bong(model, lik, algorithm=algorithm, family=family, estimator=estimator, gamma=0.97, q=1e-4,
                   backend=backend, **kw)
    bel = filt.init(theta, 1e-3)  # small enough that the moment steps stay definite
    for _ in range(3):
        x, y = rng.standard_normal(3), rng.standard_normal(2)
        new, yhat = bong_alg.full_one_step(filt, bel, x, y)
        want = lik.mean(model.apply(filt.predict(bel).mean, x))
        assert yhat.shape == want.shape
        np.testing.assert_allclose(yhat, want, rtol=1e-12, atol=1e-14)
        bel = new


@pytest.mark.parametrize("step", ["full_natural_bong", "full_bong", "full_natural_bog", "full_bog"])
def test_full_steps_from_a_predicted_full_equal_those_from_its_dense_covariance(step):
    rng = np.random.default_rng(25)
    bel, *_ = _instance(rng, 30, 1)
    U, g = 0.1 * rng.standard_normal((30, 2)), rng.standard_normal(30)
    curv = Curvature("factor", U)
    q = rng.uniform(0, 0.02, 30)
    b = rng.standard_normal(30)
    lazy = PredictedFull(bel, 0.9, q, b)
    dense = predict_full(bel, 0.9, q, b)
    fn = getattr(bong_alg, step)
    one, two = fn(lazy, lazy, g, curv, 1e-2), fn(dense, dense, g, curv, 1e-2)
    np.testing.assert_allclose(one.mean, two.mean, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(one.cov, two.cov, rtol=1e-11, atol=1e-13 * np.abs(two.cov).max())
    np.testing.assert_array_equal(lazy.cov, dense.cov)  # formed on demand, as predict_full


@pytest.mark.parametrize("seed", range(4))
def test_bog_moment_factor_matches_dense_and_its_guard_is_exact_for_an_isotropic_prior(seed):
    rng = np.random.default_rng(30 + seed)
    P, s = 20, 0.5
    U = rng.standard_normal((P, 2))
    g = rng.standard_normal(P)
    prior = FullCov(rng.standard_normal(P), s * np.eye(P))
    lam_max = np.linalg.eigvalsh(U.T @ U)[-1]
    alpha_ok, alpha_bad = 1.8 * s / lam_max, 2.2 * s / lam_max  # Sigma+ = s I - (alpha/2) U U^T
    new = bong_alg.full_bog(prior, prior, g, Curvature("factor", U), alpha_ok)
    np.testing.assert_allclose(new.cov, s * np.eye(P) - 0.5 * alpha_ok * U @ U.T, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(new.mean, prior.mean + alpha_ok * g, rtol=1e-12, atol=1e-14)
    assert np.array_equal(new.cov, new.cov.T)
    with pytest.raises(_NPD):  # indefinite (one eigenvalue s - alpha lam_max / 2 < 0): the guard says so
        bong_alg.full_bog(prior, prior, g, Curvature("factor", U), alpha_bad)


def test_bog_moment_guard_raises_only_for_indefinite_updates():
    rng = np.random.default_rng(40)
    for _ in range(30):
        prior, U, g, curv = _bong_problem(int(rng.integers(1 << 30)), scale=float(rng.uniform(0.5, 3.0)))
        alpha = float(rng.uniform(0.1, 1.0))
        dense = prior.cov - 0.5 * alpha * U @ U.T
        try:
            bong_alg.full_bog(prior, prior, g, curv, alpha)
        except _NPD:
            assert not _pd(dense)  # the guard is a necessary condition: it never rejects a valid update


@pytest.mark.parametrize("kind", ["ekf", "bong", "bog", "bong-moment", "bog-moment"])
def test_one_step_path_never_forms_the_predicted_covariance(kind, monkeypatch):
    """predict_update of the full-covariance filters writes one P x P array: the predict step
    (ekf.predict, families.predict_full) is never called on the way."""
    from refbayes.filters.bong import families as fam

    rb, model, lik, rng, theta = _mlp_setup(26)

    def forbidden(*args, **kwargs):
        raise AssertionError("the predicted covariance was formed")

    if kind == "ekf":
        filt = rb.FullEKF(model, lik, gamma=0.9, q=0.01)
    else:
        alg, _, moment = kind.partition("-")
        filt = rb.Bong(model, lik, algorithm=alg, family="full-moment" if moment else "full", estimator="lin-hess",
                       gamma=0.9, q=0.01, **({"lr": 1e-3} if alg == "bog" else {}))
    bel = filt.init(theta, 0.01)
    x, y = rng.standard_normal(3), rng.standard_normal(2)
    expected = filt.update(filt.predict(bel), x, y)
    monkeypatch.setattr(ekf, "predict", forbidden)
    monkeypatch.setattr(fam, "predict_full", forbidden)
    new = filt.predict_update(bel, x, y)
    np.testing.assert_allclose(new.cov, expected.cov, rtol=1e-10, atol=1e-14)
    with pytest.raises(AssertionError, match="predicted covariance"):  # the patch is live on the two-call route
        filt.predict(bel)


def test_bog_definiteness_check_certificates_and_fallback(monkeypatch):
    # S = Sigma_p - c U U^T: each certificate proves definiteness only when it holds, and a Cholesky
    # factorisation decides the rest (an indefinite S with a positive diagonal must raise)
    from refbayes import linalg
    from refbayes.filters.bong import algorithms as alg

    rng = np.random.default_rng(3)
    P = 30
    calls = []
    real = linalg.cholesky
    monkeypatch.setattr(linalg, "cholesky", lambda S, what="": calls.append(1) or real(S, what))
    prior = FullCov(np.zeros(P), np.eye(P))
    U = 0.1 * rng.standard_normal((P, 2))
    assert alg._gershgorin_certifies(prior.cov - 0.5 * U @ U.T, prior, 0.5, U)  # dominant: no factorisation
    u = np.ones((P, 1)) / np.sqrt(P)  # |u| = 1: S = I - c u u^T, not dominant for c near 1, but PD for c < 1
    assert alg._gershgorin_certifies(np.eye(P) - 0.9 * u @ u.T, prior, 0.9, u)  # the prior's bound 1 > 0.9
    assert calls == []
    A = rng.standard_normal((P, P))
    Sp = A @ A.T / P + 0.05 * np.eye(P)  # dense: neither certificate holds
    V = np.linalg.eigh(Sp)[1][:, :1]
    lam = (V.T @ Sp @ V).item()
    good = Sp - 0.5 * lam * V @ V.T
    assert not alg._gershgorin_certifies(good, FullCov(np.zeros(P), Sp), 0.5 * lam, V)
    dense = FullCov(np.zeros(P), Sp)  # full_bog with alpha = 1: c = 1/2, S = Sp - (1/2) U U^T
    new = alg.full_bog(dense, dense, np.zeros(P), Curvature("factor", np.sqrt(lam) * V), 1.0)
    np.testing.assert_allclose(new.cov, good, rtol=1e-12, atol=1e-14)
    assert calls == [1]  # one factorisation (of Sigma_p, which the certificate downdates)
    bad = Sp - 1.5 * lam * V @ V.T  # its smallest eigenvalue is -lam / 2, the diagonal stays positive
    assert np.all(np.diag(bad) > 0)
    with pytest.raises(NotPositiveDefiniteError):
        alg.full_bog(dense, dense, np.zeros(P), Curvature("factor", np.sqrt(3.0 * lam) * V), 1.0)


@pytest.mark.parametrize("P,K,a", [(1, 1, 1.0), (7, 1, 0.9), (40, 3, 1.0), (65, 2, 0.7)])
def test_chol_downdate_equals_the_factor_of_the_downdated_matrix(P, K, a):
    # R'^T R' = a^2 R^T R - X^T X against numpy's Cholesky of the formed matrix; X untouched, zeros below
    from refbayes.kernels.cpu.cholupdate import chol_downdate

    rng = np.random.default_rng(P + K)
    A = rng.standard_normal((P, P))
    B = A @ A.T / P + 0.5 * np.eye(P)
    R = np.ascontiguousarray(np.linalg.cholesky(B).T)
    X = 0.4 * a * rng.standard_normal((K, P)) / np.sqrt(P * K)
    X0 = X.copy()
    out = np.full((P, P), np.nan)
    assert chol_downdate(R, a, X, out, 0.0) == -1
    ref = np.linalg.cholesky(a * a * B - X.T @ X).T
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13 * np.abs(ref).max())
    assert np.array_equal(np.tril(out, -1), np.zeros((P, P))) and np.array_equal(X, X0)


def test_chol_downdate_stops_at_the_first_pivot_that_is_lost():
    # B = I - x x^T with x = e_2 (1 + d): the pivot of row 2 becomes negative, earlier rows are fine
    from refbayes.kernels.cpu.cholupdate import chol_downdate

    P = 6
    x = np.zeros((1, P))
    x[0, 2] = 1.0 + 1e-3
    out = np.empty((P, P))
    assert chol_downdate(np.eye(P), 1.0, x, out, 0.0) == 2
    x[0, 2] = 1.0 - 1e-3  # pivot 1 - (1 - 1e-3)^2 ~ 2e-3: kept at tol 1e-3, lost at tol 1e-2
    assert chol_downdate(np.eye(P), 1.0, x, out, 1e-3) == -1
    assert chol_downdate(np.eye(P), 1.0, x, out, 1e-2) == 2


def _bog_stream(rng, P, steps, gamma, q, alpha, scale=0.3, lazy=False):
    """A stream of BOG (moment) factor steps from a dense prior whose Gershgorin bounds fail; lazy: the
    predicted belief as the one-call step holds it (PredictedFull), else formed (predict_full)."""
    from refbayes.filters.bong import algorithms as bong_alg
    from refbayes.filters.bong.families import PredictedFull, carried_factor

    A = rng.standard_normal((P, P)) / np.sqrt(P)
    bel = FullCov(rng.standard_normal(P), A @ A.T + 0.05 * np.eye(P))
    out = []
    for _ in range(steps):
        prior = PredictedFull(bel, gamma, q) if lazy else predict_full(bel, gamma, q)
        U = scale * rng.standard_normal((P, 2)) / np.sqrt(P)
        g = rng.standard_normal(P)
        bel = bong_alg.full_bog(prior, prior, g, Curvature("factor", U), alpha)
        out.append((prior, U, g, bel, carried_factor(bel)))  # the bound as the step left it
    return out


@pytest.mark.parametrize("flush", [3, 32])
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("q", [0.0, 1e-3])
def test_bog_moment_carries_a_factor_one_factorisation_per_stream(q, lazy, flush, monkeypatch):
    # the first step without a bound factorises its base once; every later step certifies by a triangular
    # solve with the carried factor (no P x P Cholesky), which is shared until FLUSH_ROWS downdate rows
    # go into a new factor; the beliefs equal the dense formula, the bound lies below them
    from refbayes import linalg
    from refbayes.filters.bong import families as fam

    monkeypatch.setattr(fam, "FLUSH_ROWS", flush)
    calls = []
    real = linalg.cholesky
    monkeypatch.setattr(linalg, "cholesky", lambda S, what="": calls.append(what) or real(S, what))
    rng = np.random.default_rng(5)
    stream = _bog_stream(rng, 30, 8, 0.97, q, 0.2, lazy=lazy)
    assert calls == ["prior covariance"]
    rows, R = [], None
    for prior, U, g, bel, bound in stream:
        dense = prior.cov - 0.1 * U @ U.T
        np.testing.assert_allclose(bel.cov, dense, rtol=1e-12, atol=1e-14 * np.abs(dense).max())
        B = bound.dense()
        gap = np.linalg.eigvalsh(bel.cov - B)  # the carried B is a lower bound of Sigma ...
        assert gap[0] > -1e-12 * np.abs(bel.cov).max()
        if q == 0.0:  # ... and equal to it without process noise
            np.testing.assert_allclose(B, bel.cov, rtol=1e-10, atol=1e-12 * np.abs(bel.cov).max())
        m = bound.X.shape[0]
        assert m < flush and bound.Z.shape == bound.X.shape and bound.G.shape == (m, m)
        # Z^T = R^{-T} X^T and G = Z Z^T, as the bound's algebra needs them
        np.testing.assert_allclose(bound.R.T @ bound.Z.T, bound.X.T, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(bound.G, bound.Z @ bound.Z.T, rtol=1e-12, atol=1e-14)
        assert np.array_equal(np.tril(bound.R, -1), np.zeros_like(bound.R))
        if R is not None:  # the factor is shared from step to step unless the rows were flushed
            assert (bound.R is R) == (m > 0)
        R = bound.R
        rows.append(m)
    # two rows a step: with flush 3 a new factor every second step, with 32 none in 8 steps
    assert rows == ([2, 0] * 4 if flush == 3 else [2, 4, 6, 8, 10, 12, 14, 16])


@pytest.mark.parametrize("P,K", [(1, 1), (2, 3), (9, 1), (40, 2), (70, 5)])
def test_upper_solve_rows_is_the_forward_substitution_with_r_transposed(P, K):
    # R^T Z^T = X^T against scipy's triangular solve; in place (out is X) the same numbers
    import scipy.linalg as sla

    from refbayes.kernels.cpu.cholupdate import upper_solve_rows

    rng = np.random.default_rng(P * K)
    A = rng.standard_normal((P, P))
    R = np.ascontiguousarray(np.linalg.cholesky(A @ A.T / P + 0.3 * np.eye(P)).T)
    R[np.tril_indices(P, -1)] = np.nan  # the strict lower triangle is not read
    X = rng.standard_normal((K, P))
    Z = upper_solve_rows(R, X, np.empty_like(X))
    ref = sla.solve_triangular(np.triu(np.nan_to_num(R)), X.T, trans="T").T
    np.testing.assert_allclose(Z, ref, rtol=1e-11, atol=1e-12 * np.abs(ref).max())
    Y = X.copy()
    assert upper_solve_rows(R, Y, Y) is Y and np.array_equal(Y, Z)


def test_factor_bound_downdated_is_the_scaled_bound_less_the_new_rows_or_none():
    # f^2 B - Y^T Y, dense, for a bound with rows; None where it is indefinite or keeps less than the margin
    from refbayes.filters.bong.families import FactorBound

    rng = np.random.default_rng(9)
    P = 25
    A = rng.standard_normal((P, P))
    B0 = A @ A.T / P + 0.5 * np.eye(P)
    bound = FactorBound(np.ascontiguousarray(np.linalg.cholesky(B0).T), 1.3)
    want = 1.3**2 * B0
    for f, K in ((0.9, 2), (1.0, 1), (0.97, 3)):
        Y = 0.1 * rng.standard_normal((K, P))
        bound = bound.downdated(f, Y, 1e-8)
        want = f * f * want - Y.T @ Y
        np.testing.assert_allclose(bound.dense(), want, rtol=1e-12, atol=1e-13 * np.abs(want).max())
    assert bound.X.shape == (6, P)
    none = FactorBound(bound.R, 2.0).downdated(0.5, np.zeros((0, P)), 1e-8)  # no columns (an empty factor)
    assert none.X.shape == (0, P) and none.R is bound.R and none.a == 1.0
    lam, V = np.linalg.eigh(want)
    edge = V[:, :1].T * np.sqrt(lam[0])  # f = 1: want - edge^T edge is singular
    assert bound.downdated(1.0, 1.001 * edge, 1e-8) is None  # indefinite
    assert bound.downdated(1.0, 0.999 * edge, 1e-2) is None  # positive definite, margin below 1e-2
    kept = bound.downdated(1.0, 0.999 * edge, 1e-8)
    np.testing.assert_allclose(kept.dense(), want - 0.999**2 * edge.T @ edge, rtol=1e-9, atol=1e-11)
    assert np.linalg.eigvalsh(kept.dense())[0] > 0


def test_factor_bound_step_that_reaches_the_flush_downdates_without_a_solve(monkeypatch):
    # K >= FLUSH_ROWS rows in one step (an MC estimate with many draws): the factor is downdated by
    # them at once, as each step did before bounds kept rows, and the triangular solve is skipped
    from refbayes.filters.bong import families as fam
    from refbayes.kernels.cpu import cholupdate

    solves = []
    real = cholupdate.upper_solve_rows
    monkeypatch.setattr(cholupdate, "upper_solve_rows", lambda *a: solves.append(a[1].shape) or real(*a))
    rng = np.random.default_rng(11)
    P = 20
    A = rng.standard_normal((P, P))
    B0 = A @ A.T / P + 0.5 * np.eye(P)
    bound = fam.FactorBound(np.ascontiguousarray(np.linalg.cholesky(B0).T))
    Y = 0.02 * rng.standard_normal((fam.FLUSH_ROWS, P))
    new = bound.downdated(0.9, Y, 1e-8)
    assert solves == [] and new.X.shape == (0, P)
    np.testing.assert_allclose(new.dense(), 0.81 * B0 - Y.T @ Y, rtol=1e-11, atol=1e-13)
    lam, V = np.linalg.eigh(0.81 * B0 - Y.T @ Y)
    big = np.concatenate([Y, 1.001 * np.sqrt(lam[0]) * V[:, :1].T])  # one more row: indefinite along V[:, 0]
    assert np.linalg.eigvalsh(0.81 * B0 - big.T @ big)[0] < 0
    assert bound.downdated(0.9, big, 1e-8) is None and solves == []


def test_factor_bound_flush_is_a_new_factor_of_the_same_bound(monkeypatch):
    # at FLUSH_ROWS rows: R' with R'^T R' = R^T R - X^T X by chol_downdate, no rows left, the same bound
    from refbayes.filters.bong import families as fam

    rng = np.random.default_rng(10)
    P = 30
    A = rng.standard_normal((P, P))
    B0 = A @ A.T / P + 0.5 * np.eye(P)
    R0 = np.ascontiguousarray(np.linalg.cholesky(B0).T)
    monkeypatch.setattr(fam, "FLUSH_ROWS", 4)
    bound = fam.FactorBound(R0, 0.8)
    want = 0.64 * B0
    for K in (1, 2, 1):
        Y = 0.05 * rng.standard_normal((K, P))
        bound = bound.downdated(0.99, Y, 1e-8)
        want = 0.99**2 * want - Y.T @ Y
    assert bound.X.shape == (0, P) and bound.R is not R0 and bound.a == pytest.approx(0.8 * 0.99**3, rel=1e-15)
    np.testing.assert_allclose(bound.dense(), want, rtol=1e-11, atol=1e-13 * np.abs(want).max())
    assert np.array_equal(np.tril(bound.R, -1), np.zeros((P, P))) and np.all(np.diag(bound.R) > 0)


def test_bog_moment_with_a_carried_factor_still_raises_for_an_indefinite_update(monkeypatch):
    from refbayes import linalg
    from refbayes.filters.bong import algorithms as bong_alg

    rng = np.random.default_rng(6)
    stream = _bog_stream(rng, 20, 3, 1.0, 0.0, 0.5)
    bel = stream[-1][3]
    assert bong_alg.carried_factor(bel) is not None
    lam, V = np.linalg.eigh(bel.cov)
    U = V[:, :1] * np.sqrt(lam[0] / 0.5 * 1.01)  # c |U|^2 = 1.01 lam_min along its eigenvector (c = 0.5)
    calls = []
    real = linalg.cholesky
    monkeypatch.setattr(linalg, "cholesky", lambda S, what="": calls.append(what) or real(S, what))
    with pytest.raises(NotPositiveDefiniteError, match=r"^BOG \(moment\) covariance is not positive definite: .*"
                                                      r"a smaller lr keeps it positive definite\)$"):
        bong_alg.full_bog(bel, bel, np.zeros(20), Curvature("factor", U), 1.0)
    assert calls == ["BOG (moment) covariance"]  # the bound failed; the exact factorisation decided
    U = V[:, :1] * np.sqrt(lam[0] / 0.5 * 0.5)  # half of it: certified by the carried bound alone
    calls.clear()
    bong_alg.full_bog(bel, bel, np.zeros(20), Curvature("factor", U), 1.0)
    assert calls == []


def test_bog_moment_factors_go_with_their_beliefs():
    import gc

    from refbayes.filters.bong import families as fam

    rng = np.random.default_rng(7)
    stream = _bog_stream(rng, 12, 3, 1.0, 0.0, 0.5)
    keys = [id(s[3]) for s in stream]
    assert all(k in fam._FACTORS for k in keys[-2:])
    assert len(fam._FACTORS) <= fam.FACTORS_KEPT
    del stream
    gc.collect()
    assert not any(k in fam._FACTORS for k in keys)


def test_a_lost_diagonal_entry_is_named_with_its_value_as_a_number():
    from refbayes.filters.bong.families import full_belief_fast

    with pytest.raises(NotPositiveDefiniteError, match=r"^BOG covariance update made diagonal entry 1 non-positive "
                                                       r"\(-49\.0\)$"):
        full_belief_fast(np.zeros(2), np.diag([1.0, -49.0]), "BOG covariance")


# ---------------------------------------------------------------------------------------------
# backend="numba" over the full families: the reference's steps with the compiled update pass


@pytest.mark.parametrize("K,K2", [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (3, 2), (4, 1), (6, 3), (9, 0)])
def test_compiled_lowrank_update_equals_the_dense_formula_and_blas(K, K2):
    # every sweep of kernels.cpu.cholupdate._lowrank_row: a first sweep of 0-4 terms, then sweeps of
    # four and of one; with and without the folded predict (scale, diag) and the added term
    rng = np.random.default_rng(100 + 10 * K + K2)
    for P in (1, 5, 67):
        A = rng.standard_normal((P, P))
        S = A + A.T
        B, E = rng.standard_normal((K, P)), (rng.standard_normal((K2, P)) if K2 else None)
        for sign in (-1.0, 1.0):
            for scale, diag in ((1.0, None), (0.7, 0.3), (0.9, rng.uniform(0, 1, P))):
                out = _la.lowrank_update(S, B, sign, scale=scale, diag=diag, plus=E, compiled=True)
                dense = scale * S + sign * B.T @ B + (0 if E is None else E.T @ E)
                dense = dense + np.diag(np.broadcast_to(0.0 if diag is None else diag, (P,)))
                tol = 1e-13 * max(np.abs(dense).max(), 1.0)
                np.testing.assert_allclose(out, dense, rtol=1e-13, atol=tol)
                np.testing.assert_allclose(out, _la.lowrank_update(S, B, sign, scale=scale, diag=diag, plus=E),
                                           rtol=1e-13, atol=tol)
                assert np.array_equal(out, out.T) and out.flags.writeable and not np.shares_memory(out, S)


@pytest.mark.parametrize("P", [1, 3, 4, 5, 8, 67, 1157])
def test_update_passes_give_numpys_term_by_term_numbers_bit_for_bit(P):
    # kernels.cpu.cholupdate writes four rows at a time from QUAD_TERMS terms on, one row at a time
    # below (and for the last P % 4 rows), and from COPY_FIRST_P on copies blocks of COPY_ROWS rows
    # scaled before sweeping them in place: every element must be the number NumPy gives when it
    # adds the terms one after the other to scale S (then d on the diagonal), whichever way it was
    # written; K runs over 0 to 4 (one sweep), 5 to 8 (a sweep of four, then 1 to 4 more) and 10
    from refbayes.kernels.cpu.cholupdate import COPY_FIRST_P, COPY_ROWS, QUAD_TERMS, lowrank_gershgorin, lowrank_pass

    assert QUAD_TERMS <= 4  # so that K = 4..10 below takes the four-row sweeps
    if P > 100:  # the copy-first route, its last block holding a four-row sweep and a row left over
        assert P >= COPY_FIRST_P and P % COPY_ROWS == 5
    rng = np.random.default_rng(200 + P)
    A = rng.standard_normal((P, P))
    S = A + A.T
    d = rng.uniform(0, 1, P)
    for K in (*range(9), 10):
        B = rng.standard_normal((K, P))
        Blt = np.ascontiguousarray((np.where(rng.random(K) < 0.5, -1.0, 1.0)[:, None] * B).T)
        expected = 0.7 * S
        for k in range(K):
            expected = expected + Blt[:, k:k + 1] * B[k]
        expected[np.diag_indices(P)] += d
        out = lowrank_pass(S, 0.7, d, Blt, B, np.full((P, P), np.nan))
        assert np.array_equal(out, expected), K
        out = np.full((P, P), np.nan)
        low = lowrank_gershgorin(S, 0.7, d, Blt, B, out)
        assert np.array_equal(out, expected), K
        assert low == pytest.approx(_gershgorin(expected), rel=1e-12, abs=1e-12 * np.abs(expected).max())


def _counting(monkeypatch, module, name):
    calls = []
    inner = getattr(module, name)

    def counted(*args):
        calls.append(args[0].shape)
        return inner(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


def _full_filters(model, lik, backend):
    import refbayes as rb

    for form in ("covariance", "joseph"):
        yield rb.FullEKF(model, lik, gamma=0.99, q=1e-4, form=form, backend=backend)
    for algorithm in ("bong", "bog"):
        for family in ("full", "full-moment"):
            for estimator in ("lin-hess", "lin-ef"):
                kw = {"lr": 1e-6} if algorithm == "bog" else {}
                yield rb.Bong(model, lik, algorithm=algorithm, family=family, estimator=estimator,
                              gamma=0.99, q=1e-4, backend=backend, **kw)


def test_full_filters_backend_numba_equal_the_reference_and_take_the_compiled_pass(monkeypatch):
    import refbayes as rb
    from refbayes.kernels.cpu import cholupdate

    calls = _counting(monkeypatch, cholupdate, "lowrank_pass")
    products = _counting(monkeypatch, cholupdate, "sym_lower_times")
    rng = np.random.default_rng(5)
    model, lik = rb.MLP([3, 6, 2], activation="tanh"), rb.Gaussian(1.0)
    X, Y = rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    theta = model.init_params(rng)
    for ref_filt, fast_filt in zip(_full_filters(model, lik, "numpy"), _full_filters(model, lik, "numba")):
        name = getattr(ref_filt, "name", type(ref_filt).__name__)
        before, before_products = len(calls), len(products)
        ref, ref_hist = ref_filt.scan(ref_filt.init(theta, 1e-3), X, Y)
        assert len(calls) == before, f"{name}: the reference took the compiled pass"
        assert len(products) == before_products, f"{name}: the reference took the compiled product"
        out, hist = fast_filt.scan(fast_filt.init(theta, 1e-3), X, Y)
        # BOG over "full-moment" takes no product with Sigma_p (its mean step is a gradient step), and
        # with LIN-HESS it certifies by Gershgorin here: its pass is then lowrank_gershgorin
        bog_moment = isinstance(fast_filt, rb.Bong) and fast_filt.algorithm == "bog" and fast_filt.family == "full-moment"
        if not bog_moment:
            assert len(products) >= before_products + len(X), f"{name}: Sigma_p U not from the compiled product"
        assert len(calls) > before or bog_moment, f"{name}: no compiled pass"
        scale = np.abs(ref.cov).max()
        np.testing.assert_allclose(out.mean, ref.mean, rtol=1e-10, atol=1e-12 * np.abs(ref.mean).max())
        np.testing.assert_allclose(out.cov, ref.cov, rtol=1e-10, atol=1e-12 * scale)
        np.testing.assert_allclose(hist["yhat"], ref_hist["yhat"], rtol=1e-10, atol=1e-12)
        assert np.array_equal(out.cov, out.cov.T)
        # update after predict (no folded step) runs the reference's numbers on either backend
        b = fast_filt.update(fast_filt.predict(out), X[0], Y[0])
        r = ref_filt.update(ref_filt.predict(ref), X[0], Y[0])
        np.testing.assert_allclose(b.cov, r.cov, rtol=1e-10, atol=1e-12 * scale)
    assert calls and all(shape[0] == model.n_params for shape in calls)
