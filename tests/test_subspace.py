"""Tests for refbayes.filters.subspace: the EKF on subspace coordinates and the subspace builders.

Oracles (subspace_ekf.md section 9): A = I equals the EKF on theta (T1); an orthogonal change of
coordinates commutes with the EKF (T2); a rank-d prior in theta-space reproduces the subspace EKF
(T3); a linear reward model gives the conjugate posterior in any data order (T4); d = 1 makes the
diagonal and full filters agree (T5); PCA and random bases (T6, T7); trivial steps (T12).
Thompson draws are checked against the belief's covariance with a bound from the sample size.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refbayes import exact
from refbayes.beliefs import Diag, FullCov
from refbayes.filters import ekf
from refbayes.filters.diagonal import FDEKF, VDEKF
from refbayes.filters.ekf import FullEKF
from refbayes.filters.subspace import (
    Subspace,
    SubspaceEKF,
    SubspaceModel,
    build_subspace,
    gd_trajectory,
    pca_basis,
    random_basis,
)
from refbayes.likelihoods import Gaussian
from refbayes.models import MLP, Function, Linear

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RTOL = 1e-9


def stream(rng, model, T, scale=1.0):
    X = rng.standard_normal((T, model.in_dim))
    Y = scale * rng.standard_normal((T, model.out_dim))
    return X, Y


def close(a, b, rtol=RTOL, atol_scale=1e-12):
    a, b = np.asarray(a), np.asarray(b)
    atol = atol_scale * max(1.0, float(np.max(np.abs(b), initial=0.0)))
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# T1: A = I, theta_star = 0 is the EKF on theta
# ---------------------------------------------------------------------------------------------


@FAST
@given(seed=st.integers(0, 2**31), gamma=st.floats(0.8, 1.0), q=st.sampled_from([0.0, 1e-3, 0.05]),
       form=st.sampled_from(["covariance", "joseph", "information"]))
def test_identity_basis_equals_full_ekf(seed, gamma, q, form):
    rng = np.random.default_rng(seed)
    model = MLP([3, 4, 2], activation="tanh")
    lik = Gaussian(0.3)
    P = model.n_params
    sub = SubspaceEKF(model, lik, basis=np.eye(P), offset=np.zeros(P), cov="full", gamma=gamma, q=q, form=form)
    ref = FullEKF(model, lik, gamma=gamma, q=q, form=form)
    mu0 = model.init_params(rng)
    bz, bt = sub.init(mu0, 0.5), ref.init(mu0, 0.5)
    X, Y = stream(rng, model, 6)
    for x, y in zip(X, Y):
        bz = sub.update(sub.predict(bz), x, y)
        bt = ref.update(ref.predict(bt), x, y)
        close(bz.mean, bt.mean)
        close(bz.cov, bt.cov)
    close(sub.params(bz), bt.mean)


@FAST
@given(seed=st.integers(0, 2**31), q=st.sampled_from([0.0, 1e-3]), rule=st.sampled_from(["fd", "vd-paper", "vd-ekf"]))
def test_identity_basis_diag_equals_diagonal_ekfs(seed, q, rule):
    rng = np.random.default_rng(seed)
    model = MLP([2, 3, 2], activation="tanh")
    lik = Gaussian(0.5)
    P = model.n_params
    if rule == "fd":
        sub = SubspaceEKF(model, lik, basis=np.eye(P), cov="diag", q=q, gamma=0.95)
        ref = FDEKF(model, lik, q=q, gamma=0.95)
    else:
        mean_rule = rule.split("-")[1]
        sub = SubspaceEKF(model, lik, basis=np.eye(P), cov="diag", diag_update="vd", vd_mean=mean_rule, q=q, gamma=0.95)
        ref = VDEKF(model, lik, q=q, gamma=0.95, vd_mean=mean_rule)
    mu0 = model.init_params(rng)
    bz, bt = sub.init(mu0, 0.7), ref.init(mu0, 0.7)
    X, Y = stream(rng, model, 5)
    bz, hz = sub.scan(bz, X, Y)
    bt, ht = ref.scan(bt, X, Y)
    close(bz.mean, bt.mean)
    close(bz.var, bt.var)
    close(hz["yhat"], ht["yhat"])


@pytest.mark.parametrize("mode", ["drop_last", "full"])
def test_identity_basis_equals_full_ekf_for_a_categorical_likelihood(mode):
    from refbayes.likelihoods import Categorical

    rng = np.random.default_rng(21)
    model = MLP([2, 3, 3], activation="tanh")
    lik = Categorical(3, mode=mode)
    P = model.n_params
    sub = SubspaceEKF(model, lik, basis=np.eye(P), cov="full")
    ref = FullEKF(model, lik)
    mu0 = model.init_params(rng)
    X = rng.standard_normal((6, 2))
    y = rng.integers(0, 3, 6)
    bz, _ = sub.scan(sub.init(mu0, 0.5), X, y)
    bt, _ = ref.scan(ref.init(mu0, 0.5), X, y)
    close(bz.mean, bt.mean)
    close(bz.cov, bt.cov)


# ---------------------------------------------------------------------------------------------
# T2: orthogonal change of coordinates
# ---------------------------------------------------------------------------------------------


@FAST
@given(seed=st.integers(0, 2**31), q=st.sampled_from([0.0, 1e-2]))
def test_orthogonal_basis_is_affine_equivariant(seed, q):
    rng = np.random.default_rng(seed)
    model = MLP([2, 3, 1], activation="tanh")
    lik = Gaussian(0.2)
    P = model.n_params
    A, _ = np.linalg.qr(rng.standard_normal((P, P)))
    off = rng.standard_normal(P)
    sub = SubspaceEKF(model, lik, basis=A, offset=off, cov="full", q=q)
    ref = FullEKF(model, lik, q=q)  # Q_theta = q A A^T = q I for orthogonal A
    mu_z = 0.3 * rng.standard_normal(P)
    Sz = np.diag(rng.uniform(0.2, 1.0, P))
    bz = FullCov(mu_z, Sz)
    bt = FullCov(A @ mu_z + off, ekf.linalg.symmetrize(A @ Sz @ A.T))
    X, Y = stream(rng, model, 5)
    for x, y in zip(X, Y):
        bz = sub.update(sub.predict(bz), x, y)
        bt = ref.update(ref.predict(bt), x, y)
        close(A @ bz.mean + off, bt.mean)
        close(A @ bz.cov @ A.T, bt.cov, atol_scale=1e-11)


def test_signed_permutation_basis_is_equivariant_for_the_diagonal_filter():
    rng = np.random.default_rng(4)
    model = MLP([2, 3, 1], activation="tanh")
    lik = Gaussian(0.2)
    P = model.n_params
    perm = rng.permutation(P)
    A = np.zeros((P, P))
    A[np.arange(P), perm] = rng.choice([-1.0, 1.0], P)
    off = rng.standard_normal(P)
    sub = SubspaceEKF(model, lik, basis=A, offset=off, cov="diag")
    ref = FDEKF(model, lik)
    vz = rng.uniform(0.2, 1.0, P)
    bz = Diag(np.zeros(P), vz)
    bt = Diag(off, A**2 @ vz)
    X, Y = stream(rng, model, 5)
    bz, _ = sub.scan(bz, X, Y)
    bt, _ = ref.scan(bt, X, Y)
    close(A @ bz.mean + off, bt.mean)
    close(A**2 @ bz.var, bt.var)


# ---------------------------------------------------------------------------------------------
# T3: rank-d prior in theta-space
# ---------------------------------------------------------------------------------------------


@FAST
@given(seed=st.integers(0, 2**31), d=st.integers(1, 5), gamma=st.sampled_from([1.0, 0.9]),
       q=st.sampled_from([0.0, 1e-2]))
def test_rank_d_prior_full_ekf_reproduces_subspace_ekf(seed, d, gamma, q):
    rng = np.random.default_rng(seed)
    model = MLP([2, 3, 2], activation="tanh")
    lik = Gaussian(np.array([0.3, 0.5]))
    P = model.n_params
    A = rng.standard_normal((P, d))
    off = model.init_params(rng)
    sub = SubspaceEKF(model, lik, basis=A, offset=off, gamma=gamma, q=q)
    bz = sub.init(None, 0.4)
    mean_t, cov_t = off.copy(), 0.4 * A @ A.T
    X, Y = stream(rng, model, 6)
    for x, y in zip(X, Y):
        bz = sub.update(sub.predict(bz), x, y)
        # theta-space: predict with Q = q A A^T, then the ordinary EKF update at the same mean
        # (the offset does not decay with gamma, so work with theta - off: mean_t = A mu_z + off)
        mean_t = off + gamma * (mean_t - off)
        cov_t = gamma**2 * cov_t + q * A @ A.T
        bt = FullCov(mean_t, ekf.linalg.symmetrize(cov_t))
        eta, J = model.value_and_jacobian(mean_t, x)
        bt = ekf.update(bt, J, lik.cov(eta), y - eta)
        mean_t, cov_t = bt.mean, bt.cov
        close(A @ bz.mean + off, mean_t)
        close(A @ bz.cov @ A.T, cov_t, atol_scale=1e-11)


def test_rank_d_prior_through_fullekf_class():
    rng = np.random.default_rng(11)
    model = MLP([3, 5, 2], activation="relu")
    lik = Gaussian(0.1)
    P, d = model.n_params, 4
    A = rng.standard_normal((P, d))
    off = model.init_params(rng)
    sub = SubspaceEKF(model, lik, basis=A, offset=off)
    ref = FullEKF(model, lik)
    bz = sub.init(None, 0.2)
    bt = FullCov(off, 0.2 * A @ A.T)
    X, Y = stream(rng, model, 8)
    bz, hz = sub.scan(bz, X, Y)
    bt, ht = ref.scan(bt, X, Y)
    close(sub.params(bz), bt.mean)
    close(sub.param_covariance(bz), bt.cov, atol_scale=1e-11)
    close(hz["yhat"], ht["yhat"])


# ---------------------------------------------------------------------------------------------
# T4: linear rewards give the conjugate posterior
# ---------------------------------------------------------------------------------------------


@FAST
@given(seed=st.integers(0, 2**31), d=st.integers(1, 6))
def test_linear_reward_subspace_posterior_is_conjugate_in_any_order(seed, d):
    rng = np.random.default_rng(seed)
    n_arms, n_feat, T, obs_var, prior_var = 3, 2, 9, 0.3, 0.7
    P = n_arms * n_feat
    net = Linear(n_feat, n_arms, bias=False)  # reward theta_a^T s = x^T theta with x = e_a kron s
    S = rng.standard_normal((T, n_feat))
    acts = rng.integers(0, n_arms, T)
    Xk = np.zeros((T, P))
    for t in range(T):
        Xk[t, acts[t] * n_feat:(acts[t] + 1) * n_feat] = S[t]
    y = rng.standard_normal(T)
    A = rng.standard_normal((P, d))
    off = rng.standard_normal(P)
    mu_z, Sigma_z = exact.blr_posterior(np.zeros(d), prior_var * np.eye(d), Xk @ A, y - Xk @ off, obs_var)

    from refbayes.bandits import ArmModel

    arm = ArmModel(net)
    filt = SubspaceEKF(arm, Gaussian(obs_var), basis=A, offset=off)
    X = arm.arm_inputs(S, acts)
    for order in (np.arange(T), rng.permutation(T)):
        bel, _ = filt.scan(filt.init(None, prior_var), X[order], y[order])
        close(bel.mean, mu_z)
        close(bel.cov, Sigma_z)


def test_linear_reward_identity_basis_is_per_arm_rls_and_block_diagonal():
    from refbayes.bandits import ArmModel
    from refbayes.bandits.linear import rls_update

    rng = np.random.default_rng(3)
    n_arms, n_feat, T, obs_var, prior_var = 3, 4, 20, 0.5, 2.0
    arm = ArmModel(Linear(n_feat, n_arms, bias=False))
    P = n_arms * n_feat
    filt = SubspaceEKF(arm, Gaussian(obs_var), basis=np.eye(P))
    S = rng.standard_normal((T, n_feat))
    acts = rng.integers(0, n_arms, T)
    y = rng.standard_normal(T)
    bel, _ = filt.scan(filt.init(None, prior_var), arm.arm_inputs(S, acts), y)
    for k in range(n_arms):
        mu, Sig = np.zeros(n_feat), prior_var * np.eye(n_feat)
        for t in np.flatnonzero(acts == k):
            mu, Sig = rls_update(mu, Sig, S[t], y[t], obs_var)
        blk = slice(k * n_feat, (k + 1) * n_feat)
        close(bel.mean[blk], mu)
        close(bel.cov[blk, blk], Sig)
        for j in range(n_arms):
            if j != k:
                assert np.max(np.abs(bel.cov[blk, j * n_feat:(j + 1) * n_feat])) <= 1e-14 * prior_var


# ---------------------------------------------------------------------------------------------
# T5: d = 1
# ---------------------------------------------------------------------------------------------


@FAST
@given(seed=st.integers(0, 2**31), rule=st.sampled_from(["fd", "vd"]), n_out=st.integers(1, 3))
def test_one_dimensional_subspace_diag_equals_full(seed, rule, n_out):
    rng = np.random.default_rng(seed)
    model = MLP([2, 3, n_out], activation="tanh")
    lik = Gaussian(0.4)
    A = rng.standard_normal((model.n_params, 1))
    off = model.init_params(rng)
    full = SubspaceEKF(model, lik, basis=A, offset=off, cov="full", q=1e-3)
    diag = SubspaceEKF(model, lik, basis=A, offset=off, cov="diag", diag_update=rule, q=1e-3)
    X, Y = stream(rng, model, 6)
    bf, _ = full.scan(full.init(None, 0.5), X, Y)
    bd, _ = diag.scan(diag.init(None, 0.5), X, Y)
    close(bd.mean, bf.mean)
    close(bd.var, np.diag(bf.cov))


# ---------------------------------------------------------------------------------------------
# T12: trivial steps
# ---------------------------------------------------------------------------------------------


def test_zero_jacobian_update_is_identity_and_predict_adds_q():
    rng = np.random.default_rng(0)
    P, d, q = 5, 3, 0.037
    flat = Function(lambda th, x: 0.0 * th[:1] + x[:1], P, 1, in_dim=2)
    A = rng.standard_normal((P, d))
    for cov in ("full", "diag"):
        filt = SubspaceEKF(flat, Gaussian(0.2), basis=A, offset=rng.standard_normal(P), cov=cov, q=q)
        bel = filt.init(rng.standard_normal(d), rng.uniform(0.5, 1.0, d))
        new = filt.update(bel, np.array([0.3, -1.0]), 2.0)
        np.testing.assert_array_equal(new.mean, bel.mean)
        np.testing.assert_array_equal(new.covariance(), bel.covariance())
        pred = filt.predict(bel)
        np.testing.assert_array_equal(pred.mean, bel.mean)
        np.testing.assert_array_equal(pred.covariance(), bel.covariance() + q * np.eye(d))


def test_predict_with_vector_q_of_length_d():
    rng = np.random.default_rng(1)
    model = MLP([2, 4, 1])
    d = 3
    q = np.array([0.1, 0.2, 0.3])
    filt = SubspaceEKF(model, Gaussian(1.0), basis=rng.standard_normal((model.n_params, d)), q=q, gamma=0.5)
    bel = filt.init(np.ones(d), 1.0)
    pred = filt.predict(bel)
    close(pred.mean, 0.5 * np.ones(d))
    close(pred.cov, np.diag(0.25 + q))


# ---------------------------------------------------------------------------------------------
# Thompson draws have the belief's moments
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cov", ["full", "diag"])
def test_thompson_draws_have_the_belief_covariance(cov):
    from refbayes.bandits import thompson_params

    rng = np.random.default_rng(123)
    P, d, n = 5, 3, 4000
    A = rng.standard_normal((P, d))
    off = rng.standard_normal(P)
    L = rng.standard_normal((d, d))
    Sz = L @ L.T + 0.5 * np.eye(d) if cov == "full" else np.diag(rng.uniform(0.2, 2.0, d))
    mz = rng.standard_normal(d)
    bel = FullCov(mz, Sz) if cov == "full" else Diag(mz, np.diag(Sz))
    draws = np.array([thompson_params(bel, rng, A, off) for _ in range(n)])
    Sig = A @ Sz @ A.T
    mean = A @ mz + off
    se_mean = np.sqrt(np.diag(Sig) / n)
    assert np.all(np.abs(draws.mean(0) - mean) <= 6 * se_mean)
    C = np.cov(draws.T)
    se_cov = np.sqrt((np.outer(np.diag(Sig), np.diag(Sig)) + Sig**2) / n)
    assert np.all(np.abs(C - Sig) <= 6 * se_cov)
    # the filter's own sampler agrees with the affine map of the belief's draws
    model = MLP([2, 1, 1])
    filt = SubspaceEKF(model, Gaussian(1.0), basis=rng.standard_normal((model.n_params, d)), cov=cov)
    b = filt.init(mz, np.diag(Sz))
    th = filt.sample_params(b, np.random.default_rng(5), n=3)
    z = b.sample(np.random.default_rng(5), 3)
    close(th, z @ filt.basis.T + filt.offset)


# ---------------------------------------------------------------------------------------------
# T6, T7: building the subspace
# ---------------------------------------------------------------------------------------------


@FAST
@given(seed=st.integers(0, 2**31), k=st.integers(1, 4), extra=st.integers(0, 3))
def test_pca_basis_recovers_the_span_of_low_rank_iterates(seed, k, extra):
    rng = np.random.default_rng(seed)
    P, n = 12, 30
    B = rng.standard_normal((P, k))
    theta0 = rng.standard_normal(P)
    iters = theta0 + rng.standard_normal((n, k)) @ B.T
    d = k + extra
    A, explained = pca_basis(iters, d, thin=1)
    close(A.T @ A, np.eye(d), atol_scale=1e-13)
    centred = iters - iters.mean(0)
    resid = centred - (centred @ A) @ A.T
    assert np.max(np.abs(resid)) <= 1e-10 * np.max(np.abs(centred))
    proj_A = A[:, :k] @ A[:, :k].T
    proj_B = B @ np.linalg.solve(B.T @ B, B.T)
    close(proj_A, proj_B, rtol=0, atol_scale=1e-9)
    assert explained[:k].sum() == pytest.approx(1.0, rel=1e-10)


def test_pca_basis_thins_every_second_iterate_and_keeps_the_last():
    rng = np.random.default_rng(0)
    P = 8
    e = np.eye(P)
    iters = np.zeros((10, P))
    iters[0::2] = rng.standard_normal((5, 1)) * e[0]  # theta_1, theta_3, ... move along e_0
    iters[1::2] = rng.standard_normal((5, 1)) * e[1]  # theta_2, theta_4, ... along e_1 only
    A, _ = pca_basis(iters, 1, thin=2)
    close(np.abs(A[:, 0]), e[0], rtol=0)
    # n_keep keeps the last kept iterates: the last two thinned rows lie along e_0 (rows 6, 8)
    iters[0:6:2] += rng.standard_normal((3, 1)) * e[2]
    A2, _ = pca_basis(iters, 1, thin=2, n_keep=2)
    close(np.abs(A2[:, 0]), e[0], rtol=0)


def test_pca_basis_fraction_and_randomized():
    rng = np.random.default_rng(2)
    P, n = 40, 25
    scales = np.array([10.0, 3.0, 1.0, 0.01])
    iters = rng.standard_normal((n, 4)) * scales @ np.linalg.qr(rng.standard_normal((P, 4)))[0].T
    A_all, ex_all = pca_basis(iters, 4, thin=1)
    cum = np.cumsum(ex_all)
    A_f, ex_f = pca_basis(iters, 0.999, thin=1)
    assert A_f.shape[1] == int(np.argmax(cum >= 0.999)) + 1
    A_r, ex_r = pca_basis(iters, 4, thin=1, method="randomized", rng=np.random.default_rng(0))
    close(A_r @ A_r.T, A_all @ A_all.T, rtol=0, atol_scale=1e-9)
    close(ex_r, ex_all)


def test_gd_on_linear_least_squares_stays_in_a_low_rank_span():
    rng = np.random.default_rng(5)
    model = Linear(10, 3)  # P = 33
    N = 4
    X = rng.standard_normal((N, 10))
    Y = rng.standard_normal((N, 3))
    theta0 = model.init_params(rng)
    traj = gd_trajectory(model, X, Y, theta0, n_steps=60, lr=0.05, momentum=0.9)
    # gradients of 1/2 ||W x + b - y||^2 lie in span{e_c kron [x_n, 1]}: rank <= 3 N
    k = 3 * N
    A, _ = pca_basis(traj, k, thin=1)
    c = traj - traj.mean(0)
    assert np.max(np.abs(c - (c @ A) @ A.T)) <= 1e-9 * np.max(np.abs(c))
    # the descent decreases the loss and follows the momentum recursion
    loss = lambda th: 0.5 * np.mean(np.sum((model.apply_batch(th, X) - Y) ** 2, axis=1))
    assert loss(traj[-1]) < loss(theta0)
    g = lambda th: np.mean([model.jacobian(th, x).T @ (model.apply(th, x) - y) for x, y in zip(X, Y)], axis=0)
    m1 = g(theta0)
    close(traj[0], theta0 - 0.05 * m1)
    close(traj[1], traj[0] - 0.05 * (g(traj[0]) + 0.9 * m1))


def test_random_basis_unit_columns_and_determinism():
    A1 = random_basis(50, 7, np.random.default_rng(9))
    A2 = random_basis(50, 7, np.random.default_rng(9))
    np.testing.assert_array_equal(A1, A2)
    np.testing.assert_allclose(np.linalg.norm(A1, axis=0), 1.0, rtol=1e-14)
    assert not np.allclose(A1, random_basis(50, 7, np.random.default_rng(10)))


def test_build_subspace_offsets_and_kinds():
    rng = np.random.default_rng(0)
    model = MLP([3, 4, 2], activation="tanh")
    X = rng.standard_normal((10, 3))
    Y = rng.standard_normal((10, 2))
    sub = build_subspace(model, X, Y, 3, np.random.default_rng(1), n_steps=20)
    traj = gd_trajectory(model, X, Y, sub.init, n_steps=20)
    np.testing.assert_array_equal(sub.offset, traj[-1])
    A, _ = pca_basis(traj, 3)
    close(np.abs(np.sum(sub.basis * A, axis=0)), np.ones(3))
    assert isinstance(sub, Subspace) and sub.dim == 3 and sub.kind == "svd"
    rnd = build_subspace(model, X, Y, 5, np.random.default_rng(1), kind="random", offset="init")
    np.testing.assert_array_equal(rnd.offset, rnd.init)
    np.testing.assert_allclose(np.linalg.norm(rnd.basis, axis=0), 1.0, rtol=1e-14)
    close(rnd.to_params(np.ones(5)), rnd.basis @ np.ones(5) + rnd.offset)
    again = build_subspace(model, X, Y, 5, np.random.default_rng(1), kind="random", offset="init")
    np.testing.assert_array_equal(again.basis, rnd.basis)


# ---------------------------------------------------------------------------------------------
# the z-space model and input checks
# ---------------------------------------------------------------------------------------------


def test_subspace_model_jacobian_is_the_chain_rule():
    import autograd

    rng = np.random.default_rng(0)
    net = MLP([3, 4, 2], activation="tanh")
    A = rng.standard_normal((net.n_params, 5))
    off = net.init_params(rng)
    g = SubspaceModel(net, A, off)
    z, x = rng.standard_normal(5), rng.standard_normal(3)
    close(g.apply(z, x), net.apply(A @ z + off, x))
    J = autograd.jacobian(lambda zz: g._forward(zz, x))(z)
    close(g.jacobian(z, x), J)
    eta, J2 = g.value_and_jacobian(z, x)
    close(J2, J)
    close(g.apply_batch(z, np.stack([x, 2 * x])), net.apply_batch(A @ z + off, np.stack([x, 2 * x])))
    np.testing.assert_array_equal(g.init_params(rng), np.zeros(5))


def test_bad_inputs_raise_before_any_change():
    rng = np.random.default_rng(0)
    net = MLP([2, 3, 1])
    P = net.n_params
    lik = Gaussian(1.0)
    with pytest.raises(ValueError, match="basis"):
        SubspaceEKF(net, lik, basis=np.ones((P + 1, 2)))
    with pytest.raises(ValueError, match="offset"):
        SubspaceEKF(net, lik, basis=np.ones((P, 2)), offset=np.full(P, np.nan))
    with pytest.raises(ValueError, match="cov"):
        SubspaceEKF(net, lik, basis=np.ones((P, 2)), cov="dense")
    with pytest.raises(ValueError, match="diag_update"):
        SubspaceEKF(net, lik, basis=np.ones((P, 2)), cov="diag", diag_update="xx")
    with pytest.raises(ValueError, match="q"):
        SubspaceEKF(net, lik, basis=np.ones((P, 2)), q=np.ones(P))  # q is per subspace coordinate
    with pytest.raises(ValueError, match="d must be"):
        pca_basis(rng.standard_normal((6, P)), 7, thin=1)
    with pytest.raises(ValueError, match="fraction"):
        pca_basis(rng.standard_normal((6, P)), 1.5)
    with pytest.raises(TypeError, match="rng"):
        random_basis(P, 2, 0)
    filt = SubspaceEKF(net, lik, basis=rng.standard_normal((P, 2)))
    bel = filt.init(None, 1.0)
    with pytest.raises(ValueError, match="parameters"):
        filt.update(FullCov(np.zeros(3), np.eye(3)), np.ones(2), 0.0)
    with pytest.raises(TypeError, match="FullCov"):
        filt.update(Diag(np.zeros(2), np.ones(2)), np.ones(2), 0.0)
    with pytest.raises(ValueError, match="x"):
        filt.update(bel, np.ones(3), 0.0)
    before = bel.mean.copy(), bel.cov.copy()
    with pytest.raises(ValueError):
        filt.scan(bel, np.ones((3, 2)), [0.0, np.inf, 1.0])  # inf is an error (NaN is a missing observation)
    np.testing.assert_array_equal(bel.mean, before[0])
    np.testing.assert_array_equal(bel.cov, before[1])


def test_never_builds_a_p_by_p_matrix_for_the_diagonal_path():
    # P = 2e5 parameters: a P x P float64 matrix would need 320 GB
    rng = np.random.default_rng(0)
    P, d = 200_000, 4
    model = Linear(P - 1, 1)
    filt = SubspaceEKF(model, Gaussian(0.1), basis=random_basis(P, d, rng), cov="diag")
    bel = filt.init(None, 1e-2)
    x = rng.standard_normal(P - 1) / np.sqrt(P)
    bel = filt.update(filt.predict(bel), x, 0.5)
    assert bel.var.shape == (d,) and np.all(bel.var < 1e-2)
