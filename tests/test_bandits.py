"""Tests for refbayes.bandits: conjugate linear-bandit identities, agents, environments, run loop.

Oracles (subspace_ekf.md section 9): the linear-bandit update forms agree with each other and
with refbayes.exact.blr_posterior (T8); Neural-Linear with frozen features is Linear TS on the
features (T9); the LiM2 projected gradient step (T10); degenerate policies and the warm-up (T11).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refbayes import exact

# the public names of refbayes/bandits/__init__.py, sorted as there: an import list, not logic to share
from refbayes.bandits import (
    ArmModel,
    BanditEnvironment,
    LiM2Agent,
    LinearTSAgent,
    LoFiAgent,
    Memory,
    NeuralGreedyAgent,
    NeuralLinearAgent,
    NeuralTSAgent,
    OracleAgent,
    OrigEKFAgent,
    RandomAgent,
    SubspaceAgent,
    classification_bandit,
    compare_agents,
    mlp_features,
    pgd_covariance,
    ratings_bandit,
    run_bandit,
    sklearn_bandit,
    thompson_params,
    ucb_scores,
    wheel_bandit,
)
from refbayes.bandits.agents import FilterState
from refbayes.bandits.linear import (
    ArmPosteriors,
    blr_batch,
    nig_batch,
    nig_from_stats,
    nig_incremental,
    rls_update,
    sample_nig_weights,
    sherman_morrison,
    west_harrison_update,
)
from refbayes.beliefs import Diag, FullCov
from refbayes.filters.subspace import SubspaceEKF
from refbayes.likelihoods import Gaussian
from refbayes.models import MLP

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def close(a, b, rtol=1e-9, atol_scale=1e-12):
    a, b = np.asarray(a), np.asarray(b)
    atol = atol_scale * max(1.0, float(np.max(np.abs(b), initial=0.0)))
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def toy_env(rng, T=120, n_arms=3, n_feat=4):
    """A small classification bandit from a random linear rule (no scikit-learn needed)."""
    X = rng.standard_normal((T, n_feat))
    W = rng.standard_normal((n_feat, n_arms))
    return classification_bandit(X, np.argmax(X @ W, axis=1), rng, n_classes=n_arms, name="toy")


# ---------------------------------------------------------------------------------------------
# T8: linear-bandit identities
# ---------------------------------------------------------------------------------------------


@FAST
@given(seed=st.integers(0, 2**31), N=st.integers(1, 12), D=st.integers(1, 5))
def test_known_variance_forms_agree_with_blr(seed, N, D):
    rng = np.random.default_rng(seed)
    X, y = rng.standard_normal((N, D)), rng.standard_normal(N)
    obs_var, k2 = rng.uniform(0.1, 2.0), rng.uniform(0.5, 3.0)
    mu0, S0 = np.zeros(D), k2 * np.eye(D)
    mu_ref, S_ref = exact.blr_posterior(mu0, S0, X, y, obs_var)
    mu_b, S_b = blr_batch(mu0, S0, X, y, obs_var)  # eqs 5-7
    close(mu_b, mu_ref)
    close(S_b, S_ref)
    mu, S, S_sm, psi = mu0, S0, S0, np.zeros(D)
    for x, yy in zip(X, y):
        mu, S = rls_update(mu, S, x, yy, obs_var)  # eqs 11-15
        S_sm = sherman_morrison(S_sm, x, obs_var)  # eq 8
        psi = psi + x * yy  # eq 10
    close(mu, mu_ref)
    close(S, S_ref)
    close(S_sm, np.linalg.inv(np.linalg.inv(S0) + X.T @ X / obs_var))
    close(S_ref @ psi / obs_var, mu_ref)  # eq 9 with mu0 = 0


@FAST
@given(seed=st.integers(0, 2**31), N=st.integers(1, 12), D=st.integers(1, 5))
def test_unknown_variance_forms_agree(seed, N, D):
    rng = np.random.default_rng(seed)
    X, y = rng.standard_normal((N, D)), 2.0 * rng.standard_normal(N)
    mu0 = rng.standard_normal(D)
    L = rng.standard_normal((D, D))
    S0 = L @ L.T + np.eye(D)
    a0, b0 = rng.uniform(1, 6), rng.uniform(1, 6)
    mu, S, a, b = nig_batch(mu0, S0, a0, b0, X, y)  # eqs 16-20
    # the mean and scaled covariance are the unit-noise BLR posterior
    mu_ref, S_ref = exact.blr_posterior(mu0, S0, X, y, 1.0)
    close(mu, mu_ref)
    close(S, S_ref)
    # b by completing the square: b0 + 1/2 (||y - X mu||^2 + (mu - mu0)^T S0^{-1} (mu - mu0))
    r, dm = y - X @ mu, mu - mu0
    close(b, b0 + 0.5 * (r @ r + dm @ np.linalg.solve(S0, dm)))
    assert a == pytest.approx(a0 + N / 2, rel=1e-15)
    # eqs 21-25 (precision form)
    m_i, P_i, a_i, b_i = mu0, np.linalg.inv(S0), a0, b0
    # eqs 31-37 (West-Harrison), nu0 = 2 a0, nu0 tau0 = 2 b0
    m_w, S_w, nu, nutau = mu0, S0, 2 * a0, 2 * b0
    for x, yy in zip(X, y):
        m_i, P_i, a_i, b_i = nig_incremental(m_i, P_i, a_i, b_i, x, yy)
        m_w, S_w, nu, nutau = west_harrison_update(m_w, S_w, nu, nutau, x, yy)
    close(m_i, mu)
    close(np.linalg.inv(P_i), S)
    close([a_i, b_i], [a, b])
    close(m_w, mu)
    close(S_w, S)
    close([nu / 2, nutau / 2], [a, b])
    # Algorithm 3's update-bel from sufficient statistics
    close(np.concatenate([np.ravel(v) for v in nig_from_stats(mu0, S0, a0, b0, X.T @ X, X.T @ y, y @ y, N)]),
          np.concatenate([np.ravel(v) for v in (mu, S, a, b)]))


def test_nig_thompson_draws_have_the_student_moments():
    # marginal of w_k under NIG: mean mu_k, covariance b / (a - 1) Sigma_k (a > 1)
    rng = np.random.default_rng(0)
    K, D, n = 2, 2, 20000
    mu = rng.standard_normal((K, D))
    cov = np.stack([np.array([[1.0, 0.3], [0.3, 0.5]]), np.array([[0.2, -0.1], [-0.1, 0.4]])])
    a, b = np.array([8.0, 12.0]), np.array([6.0, 3.0])
    post = ArmPosteriors(mu, cov, a, b)
    W = np.array([sample_nig_weights(post, rng) for _ in range(n)])
    for k in range(K):
        Sig = b[k] / (a[k] - 1) * cov[k]
        se = np.sqrt(np.diag(Sig) / n)
        assert np.all(np.abs(W[:, k].mean(0) - mu[k]) <= 6 * se)
        # the variance of a sample variance under heavy tails: use the empirical fourth moment
        dev = W[:, k] - mu[k]
        for i in range(D):
            v = dev[:, i] ** 2
            assert abs(v.mean() - Sig[i, i]) <= 6 * v.std() / np.sqrt(n)


@pytest.mark.parametrize("form", ["incremental", "batch", "rls"])
def test_linear_ts_update_forms_give_the_same_posteriors(form):
    rng = np.random.default_rng(7)
    env = toy_env(rng, T=90)
    warm = env.warmup(5)
    ref_agent = LinearTSAgent(update="west-harrison")
    agent = LinearTSAgent(update=form)
    s_ref, s = ref_agent.init(warm, rng), agent.init(warm, rng)
    acts = rng.integers(0, env.n_arms, env.n_steps)
    for t in range(warm.n_steps, env.n_steps):
        y = env.reward(t, acts[t])
        s_ref = ref_agent.update(s_ref, env.contexts[t], acts[t], y)
        s = agent.update(s, env.contexts[t], acts[t], y)
    close(s.post.mu, s_ref.post.mu)
    close(s.post.cov, s_ref.post.cov)
    if form != "rls":
        close(s.post.a, s_ref.post.a)
        close(s.post.b, s_ref.post.b)
    # and each arm's (mu, Sigma) is the unit-noise BLR posterior on that arm's data
    all_a = np.concatenate([warm.actions, acts[warm.n_steps:]])
    for k in range(env.n_arms):
        m = all_a == k
        X = env.contexts[m]
        y = env.rewards[np.flatnonzero(m), k]
        mu_ref, S_ref = exact.blr_posterior(np.zeros(env.n_features), np.eye(env.n_features) / 0.25, X, y, 1.0)
        close(s.post.mu[k], mu_ref)
        close(s.post.cov[k], S_ref)


# ---------------------------------------------------------------------------------------------
# T9: Neural-Linear with frozen features is Linear TS on phi
# ---------------------------------------------------------------------------------------------


def test_neural_linear_with_frozen_features_is_linear_ts_on_phi():
    rng = np.random.default_rng(3)
    env = toy_env(rng, T=70)
    net = MLP([env.n_features, 6, env.n_arms], activation="tanh")
    warm = env.warmup(4)
    nl = NeuralLinearAgent(net, update_every=None, n_epochs=20)
    st_nl = nl.init(warm, np.random.default_rng(0))
    theta = st_nl.theta
    feats = lambda S: mlp_features(net, theta, S)
    lin = LinearTSAgent(update="batch")
    fw = type(warm)(feats(warm.contexts), warm.actions, warm.rewards, warm.full_rewards, warm.n_arms)
    st_lin = lin.init(fw, None)
    for t in range(warm.n_steps, env.n_steps):
        s = env.contexts[t]
        a1 = nl.choose(st_nl, s, np.random.default_rng(t))
        a2 = lin.choose(st_lin, feats(s[None])[0], np.random.default_rng(t))
        assert a1 == a2
        y = env.reward(t, a1)
        st_nl = nl.update(st_nl, s, a1, y)
        st_lin = lin.update(st_lin, feats(s[None])[0], a1, y)
    np.testing.assert_array_equal(st_nl.theta, theta)
    close(st_nl.post.mu, st_lin.post.mu)
    close(st_nl.post.cov, st_lin.post.cov)
    close(st_nl.post.b, st_lin.post.b)
    # recomputing from the whole memory gives the incremental result
    stats, post = nl._refresh(st_nl.theta, st_nl.memory, st_nl.prior)
    close(post.mu, st_nl.post.mu)
    close(post.cov, st_nl.post.cov)
    close(post.b, st_nl.post.b)


def test_neural_linear_refits_on_schedule_and_limits_memory():
    rng = np.random.default_rng(4)
    env = toy_env(rng, T=60)
    net = MLP([env.n_features, 5, env.n_arms], activation="relu")
    agent = NeuralLinearAgent(net, update_every=10, n_epochs=5, memory=25)
    warm = env.warmup(3)
    st_ = agent.init(warm, np.random.default_rng(0))
    thetas = [st_.theta]
    for t in range(warm.n_steps, warm.n_steps + 20):
        st_ = agent.update(st_, env.contexts[t], t % env.n_arms, env.reward(t, t % env.n_arms))
        thetas.append(st_.theta)
    changed = [i for i in range(1, len(thetas)) if not np.array_equal(thetas[i], thetas[i - 1])]
    assert changed == [10, 20]
    assert len(st_.memory) == 25
    np.testing.assert_array_equal(st_.memory.contexts[-1], env.contexts[warm.n_steps + 19])


# ---------------------------------------------------------------------------------------------
# T10: LiM2 projected gradient descent
# ---------------------------------------------------------------------------------------------


@FAST
@given(seed=st.integers(0, 2**31), n=st.integers(1, 8), D=st.integers(1, 5))
def test_pgd_fixed_point_psd_and_descent(seed, n, D):
    rng = np.random.default_rng(seed)
    L = rng.standard_normal((D, D))
    A0 = L @ L.T
    phi_old = rng.standard_normal((n, D))
    close(pgd_covariance(A0, phi_old, phi_old, n_steps=3), A0, atol_scale=1e-12)
    phi_new = phi_old + 0.5 * rng.standard_normal((n, D))
    obj = lambda A: np.sum((np.einsum("ji,ik,jk->j", phi_new, A, phi_new)
                            - np.einsum("ji,ik,jk->j", phi_old, A0, phi_old)) ** 2)
    A = A0
    for _ in range(5):
        A_next = pgd_covariance(A, phi_old, phi_new)  # the default step is 1 / Lipschitz bound
        assert np.linalg.eigvalsh(A_next).min() >= -1e-12 * max(1.0, np.abs(A_next).max())
        # A is the current iterate; the objective keeps matching the original A0 variances
        A = A_next
    # one safe step from A0 does not increase the objective
    A1 = pgd_covariance(A0, phi_old, phi_new)
    assert obj(A1) <= obj(A0) * (1 + 1e-12)
    # a large step still returns a PSD matrix
    Abig = pgd_covariance(A0, phi_old, phi_new, lr=10.0)
    assert np.linalg.eigvalsh(Abig).min() >= -1e-12 * max(1.0, np.abs(Abig).max())


def test_pgd_objective_decreases_over_steps():
    rng = np.random.default_rng(1)
    D, n = 4, 10
    L = rng.standard_normal((D, D))
    A0 = L @ L.T
    phi_old = rng.standard_normal((n, D))
    phi_new = phi_old + 0.3 * rng.standard_normal((n, D))
    s2 = np.einsum("ji,ik,jk->j", phi_old, A0, phi_old)
    obj = lambda A: np.sum((np.einsum("ji,ik,jk->j", phi_new, A, phi_new) - s2) ** 2)
    vals = [obj(pgd_covariance(A0, phi_old, phi_new, n_steps=k)) for k in (1, 2, 4, 8)]
    assert all(v2 <= v1 * (1 + 1e-12) for v1, v2 in zip(vals, vals[1:]))
    assert vals[-1] < obj(A0)


# ---------------------------------------------------------------------------------------------
# T11: degenerate policies, oracle, warm-up
# ---------------------------------------------------------------------------------------------


def test_thompson_with_vanishing_covariance_and_ucb_alpha_zero_are_greedy():
    rng = np.random.default_rng(0)
    net = MLP([4, 6, 3], activation="tanh")
    arm = ArmModel(net)
    P, d = net.n_params, 5
    A = rng.standard_normal((P, d))
    off = net.init_params(rng)
    for _ in range(20):
        mz = rng.standard_normal(d)
        s = rng.standard_normal(4)
        greedy = int(np.argmax(net.apply(A @ mz + off, s)))
        tiny = Diag(mz, np.full(d, 1e-300))
        assert int(np.argmax(arm.arm_values(thompson_params(tiny, rng, A, off), s))) == greedy
        bel = FullCov(mz, np.eye(d))
        np.testing.assert_array_equal(ucb_scores(arm, bel, s, 0.0, 0.1, A, off), net.apply(A @ mz + off, s))


def test_ucb_variance_is_the_linearized_predictive_variance():
    rng = np.random.default_rng(1)
    net = MLP([3, 5, 4], activation="tanh")
    arm = ArmModel(net)
    d, obs_var = 6, 0.2
    A = rng.standard_normal((net.n_params, d))
    off = net.init_params(rng)
    filt = SubspaceEKF(arm, Gaussian(obs_var), basis=A, offset=off)
    L = rng.standard_normal((d, d))
    bel = FullCov(rng.standard_normal(d), 0.1 * L @ L.T + 0.01 * np.eye(d))
    s = rng.standard_normal(3)
    scores = ucb_scores(arm, bel, s, 2.0, obs_var, A, off)
    for a in range(4):
        m, v = filt.predict_obs(bel, arm.arm_input(s, a), method="linearized")
        close(scores[a], m[0] + 2.0 * np.sqrt(v[0, 0]))


def test_oracle_gets_every_reward_and_warmup_is_round_robin():
    rng = np.random.default_rng(2)
    env = toy_env(rng, T=100, n_arms=4)
    res = run_bandit(env, OracleAgent(env), rng, n_warmup_per_arm=5, count_warmup=False)
    assert res.total_reward == env.n_steps - 20
    assert res.total_regret == 0.0
    np.testing.assert_array_equal(res.actions[:20], np.arange(20) % 4)
    warm = env.warmup(5)
    np.testing.assert_array_equal(warm.actions, np.arange(20) % 4)
    np.testing.assert_array_equal(warm.rewards, env.rewards[np.arange(20), np.arange(20) % 4])
    full = run_bandit(env, OracleAgent(env), rng, n_warmup_per_arm=5, count_warmup=True)
    assert full.total_reward == res.total_reward + env.rewards[np.arange(20), np.arange(20) % 4].sum()


def test_run_records_and_regret_of_a_classification_bandit():
    rng = np.random.default_rng(3)
    env = toy_env(rng, T=80)
    res = run_bandit(env, RandomAgent(), np.random.default_rng(0), n_warmup_per_arm=2)
    assert res.actions.shape == res.rewards.shape == res.regrets.shape == (80,)
    np.testing.assert_array_equal(res.regrets, 1.0 - res.rewards)
    np.testing.assert_array_equal(res.rewards, env.rewards[np.arange(80), res.actions])
    assert res.step_times.shape == (74,) and np.all(res.step_times >= 0)
    assert res.total_reward + res.total_regret == 80
    again = run_bandit(env, RandomAgent(), np.random.default_rng(0), n_warmup_per_arm=2)
    np.testing.assert_array_equal(again.actions, res.actions)
    # a random policy earns about T / N_a: binomial bound with 6 standard deviations
    n = 74
    online = res.rewards[6:].sum()
    assert abs(online - n / 3) <= 6 * np.sqrt(n * (1 / 3) * (2 / 3))


# ---------------------------------------------------------------------------------------------
# filter agents
# ---------------------------------------------------------------------------------------------


def test_subspace_agent_state_is_the_subspace_ekf_on_bandit_feedback():
    rng = np.random.default_rng(5)
    env = toy_env(rng, T=60)
    net = MLP([env.n_features, 6, env.n_arms], activation="relu")
    agent = SubspaceAgent(net, d=8, n_warmup_steps=30, obs_var=0.05, prior_var=0.01, q=1e-4)
    warm = env.warmup(4)
    st_ = agent.init(warm, np.random.default_rng(0))
    assert isinstance(st_, FilterState)
    close(st_.basis.T @ st_.basis, np.eye(8), atol_scale=1e-12)
    # the kept belief is the prediction: prior covariance + q
    close(st_.bel.cov, (0.01 + 1e-4) * np.eye(8))
    filt = SubspaceEKF(ArmModel(net), Gaussian(0.05), basis=st_.basis, offset=st_.offset, q=1e-4)
    bel = filt.predict(filt.init(None, 0.01))
    for t in range(warm.n_steps, env.n_steps):
        a = agent.choose(st_, env.contexts[t], rng)
        y = env.reward(t, a)
        st_ = agent.update(st_, env.contexts[t], a, y, rng)
        bel = filt.predict(filt.update(bel, ArmModel(net).arm_input(env.contexts[t], a), y))
    close(st_.bel.mean, bel.mean)
    close(st_.bel.cov, bel.cov)


@pytest.mark.parametrize("kwargs", [
    dict(cov="diag"),
    dict(basis="random"),
    dict(policy="ucb", alpha=0.5),
    dict(feedback="full", ekf_on_warmup=True),
    dict(d=0.99),
    dict(cov="diag", diag_update="vd", offset="init", basis="random"),
    dict(svd="randomized", form="joseph"),
])
def test_subspace_agent_variants_run_and_are_deterministic(kwargs):
    rng = np.random.default_rng(6)
    env = toy_env(rng, T=50)
    net = MLP([env.n_features, 5, env.n_arms], activation="tanh")
    kw = dict(d=6, n_warmup_steps=20)
    kw.update(kwargs)
    agent = SubspaceAgent(net, **kw)
    r1 = run_bandit(env, agent, np.random.default_rng(1), n_warmup_per_arm=3)
    r2 = run_bandit(env, agent, np.random.default_rng(1), n_warmup_per_arm=3)
    np.testing.assert_array_equal(r1.actions, r2.actions)
    assert 0 <= r1.total_reward <= env.n_steps


@pytest.mark.parametrize("cov,init", [("diag", "warm"), ("full", "warm"), ("diag", "zero")])
def test_orig_ekf_agent(cov, init):
    rng = np.random.default_rng(7)
    env = toy_env(rng, T=40)
    net = MLP([env.n_features, 4, env.n_arms], activation="relu")
    agent = OrigEKFAgent(net, cov=cov, init=init, n_warmup_steps=10)
    st_ = agent.init(env.warmup(2), np.random.default_rng(0))
    if init == "zero":
        np.testing.assert_array_equal(st_.bel.mean, np.zeros(net.n_params))
    res = run_bandit(env, agent, np.random.default_rng(0), n_warmup_per_arm=2)
    assert res.rewards.shape == (40,)


def test_lofi_agent_runs():
    rng = np.random.default_rng(8)
    env = toy_env(rng, T=40)
    net = MLP([env.n_features, 4, env.n_arms], activation="tanh")
    res = run_bandit(env, LoFiAgent(net, rank=2, n_warmup_steps=10), np.random.default_rng(0), n_warmup_per_arm=2)
    assert res.rewards.shape == (40,)


# ---------------------------------------------------------------------------------------------
# neural baselines
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda net: LinearTSAgent(),
    lambda net: NeuralLinearAgent(net, update_every=10, n_epochs=5),
    lambda net: NeuralLinearAgent(net, update_every=10, n_epochs=5, memory=15),
    lambda net: LiM2Agent(net, memory=20, n_sgd=2, n_epochs=5),
    lambda net: NeuralGreedyAgent(net, update_every=5, n_epochs=5),
    lambda net: NeuralTSAgent(net, update_every=5, n_epochs=5),
    lambda net: NeuralTSAgent(net, update_every=5, n_epochs=5, precision="diag", reg=0.01),
])
def test_baselines_run_and_are_deterministic(make):
    rng = np.random.default_rng(9)
    env = toy_env(rng, T=45)
    net = MLP([env.n_features, 5, env.n_arms], activation="relu")
    agent = make(net)
    r1 = run_bandit(env, agent, np.random.default_rng(2), n_warmup_per_arm=3)
    r2 = run_bandit(env, agent, np.random.default_rng(2), n_warmup_per_arm=3)
    np.testing.assert_array_equal(r1.actions, r2.actions)
    assert r1.rewards.shape == (45,)


def test_neural_ts_precision_is_lam_plus_sum_of_outer_products():
    rng = np.random.default_rng(10)
    env = toy_env(rng, T=30)
    net = MLP([env.n_features, 3, env.n_arms], activation="tanh")
    warm = env.warmup(2)
    full = NeuralTSAgent(net, update_every=None, n_epochs=3, lam=0.5)
    diag = NeuralTSAgent(net, update_every=None, n_epochs=3, lam=0.5, precision="diag")
    sf, sd = full.init(warm, np.random.default_rng(0)), diag.init(warm, np.random.default_rng(0))
    arm = ArmModel(net)
    theta = sf.theta
    feats = [full.scale * arm.jacobian(theta, arm.arm_input(s, int(a)))[0] for s, a in zip(warm.contexts, warm.actions)]
    for t in range(warm.n_steps, env.n_steps):
        a = t % env.n_arms
        sf = full.update(sf, env.contexts[t], a, env.reward(t, a))
        sd = diag.update(sd, env.contexts[t], a, env.reward(t, a))
        feats.append(full.scale * arm.jacobian(theta, arm.arm_input(env.contexts[t], a))[0])
    F = np.array(feats)
    B = 0.5 * np.eye(net.n_params) + F.T @ F
    close(sf.extra[1], np.linalg.inv(B), atol_scale=1e-10)
    close(sd.extra[1], 1.0 / np.diag(B))
    assert full.scale == pytest.approx(1 / np.sqrt(3))


def test_neural_greedy_plays_the_argmax():
    rng = np.random.default_rng(11)
    env = toy_env(rng, T=30)
    net = MLP([env.n_features, 4, env.n_arms], activation="tanh")
    agent = NeuralGreedyAgent(net, update_every=None, n_epochs=3)
    st_ = agent.init(env.warmup(2), np.random.default_rng(0))
    for s in env.contexts[:10]:
        assert agent.choose(st_, s, rng) == int(np.argmax(net.apply(st_.theta, s)))


# ---------------------------------------------------------------------------------------------
# reward model, memory, environments
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("input_", ["heads", "blocks"])
def test_arm_model_selects_the_pulled_arm(input_):
    import autograd

    rng = np.random.default_rng(0)
    n_s, n_a = 3, 4
    net = MLP([n_s, 5, n_a]) if input_ == "heads" else MLP([n_s * n_a, 5, 1])
    arm = ArmModel(net, n_arms=n_a, input=input_)
    theta = net.init_params(rng) + 0.1 * rng.standard_normal(net.n_params)
    s = rng.standard_normal(n_s)
    vals, J = arm.arm_values_and_jacobians(theta, s)
    for a in range(n_a):
        x = arm.arm_input(s, a)
        if input_ == "heads":
            ref = net.apply(theta, s)[a]
        else:
            blk = np.zeros(n_s * n_a)
            blk[a * n_s:(a + 1) * n_s] = s
            ref = net.apply(theta, blk)[0]
        close(arm.apply(theta, x)[0], ref)
        close(vals[a], ref)
        Jref = autograd.jacobian(lambda th: arm._forward(th, x))(theta)
        close(arm.jacobian(theta, x), Jref)
        close(J[a], Jref[0])
    S = rng.standard_normal((5, n_s))
    acts = rng.integers(0, n_a, 5)
    close(arm.apply_batch(theta, arm.arm_inputs(S, acts))[:, 0],
          np.array([arm.arm_values(theta, s_)[a] for s_, a in zip(S, acts)]))
    close(arm.arm_values_batch(theta, S), np.array([arm.arm_values(theta, s_) for s_ in S]))
    with pytest.raises(ValueError, match="action"):
        arm.arm_input(s, n_a)
    with pytest.raises(ValueError, match="context"):
        arm.arm_input(np.ones(n_s + 1), 0)


def test_memory_fifo_and_immutability():
    mem = Memory(2, capacity=3)
    views = []
    for i in range(5):
        mem = mem.push(np.array([i, -i]), i % 2, float(i))
        views.append(mem)
    np.testing.assert_array_equal(mem.rewards, [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(mem.contexts[:, 0], [2, 3, 4])
    # branching from an older view does not change the newer one
    branch = views[2].push(np.array([9, 9]), 1, 9.0)
    np.testing.assert_array_equal(branch.rewards, [1.0, 2.0, 9.0])
    np.testing.assert_array_equal(views[4].rewards, [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(views[2].rewards, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError):
        mem.rewards[0] = 1.0
    unl = Memory.from_arrays(np.zeros((40, 1)), np.zeros(40, int), np.arange(40.0))
    assert len(unl) == 40 and unl.rewards[-1] == 39.0


def test_classification_bandit_is_deterministic_and_standardized():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 3)) * [1.0, 5.0, 0.0] + [0.0, 2.0, 7.0]
    labels = rng.integers(0, 3, 50)
    e1 = classification_bandit(X, labels, np.random.default_rng(1))
    e2 = classification_bandit(X, labels, np.random.default_rng(1))
    np.testing.assert_array_equal(e1.contexts, e2.contexts)
    np.testing.assert_array_equal(e1.contexts[:, 0], 1.0)
    close(e1.contexts[:, 1:3].mean(0), np.zeros(2), atol_scale=1e-14)
    close(e1.contexts[:, 1:3].std(0), np.ones(2))
    np.testing.assert_array_equal(e1.contexts[:, 3], 0.0)  # a constant feature keeps s.d. 1
    np.testing.assert_array_equal(e1.rewards.sum(1), 1.0)
    np.testing.assert_array_equal(np.sort(np.argmax(e1.rewards, 1)), np.sort(labels))
    e3 = classification_bandit(X, labels, np.random.default_rng(1), n_steps=200, replace=True)
    assert e3.n_steps == 200
    with pytest.raises(ValueError, match="labels"):
        classification_bandit(X, labels + 5, rng, n_classes=3)
    with pytest.raises(ValueError, match="n_steps"):
        classification_bandit(X, labels, rng, n_steps=51)
    with pytest.raises(TypeError, match="rng"):
        classification_bandit(X, labels, 0)


def test_sklearn_bandits():
    env = sklearn_bandit("digits", np.random.default_rng(0), n_steps=300)
    assert (env.n_arms, env.n_features, env.n_steps) == (10, 65, 300)
    assert env.contexts[:, 1:].min() >= 0 and env.contexts[:, 1:].max() <= 1
    wine = sklearn_bandit("wine", np.random.default_rng(0), n_steps=500)
    assert wine.n_arms == 3 and wine.n_steps == 500
    imb = sklearn_bandit("synthetic_imbalanced", np.random.default_rng(0), n_steps=2000)
    assert imb.n_arms == 7 and imb.rewards[:, 0].mean() > 0.6
    with pytest.raises(ValueError, match="name"):
        sklearn_bandit("mnist", np.random.default_rng(0))


def test_wheel_bandit_reward_structure():
    env = wheel_bandit(2000, np.random.default_rng(0), delta=0.6)
    r = np.linalg.norm(env.contexts, axis=1)
    assert r.max() <= 1.0
    inside = r <= 0.6
    best = env.best_actions()
    np.testing.assert_array_equal(best[inside], 0)
    x, y = env.contexts[~inside].T
    quad = np.where(x > 0, np.where(y > 0, 1, 2), np.where(y > 0, 4, 3))
    np.testing.assert_array_equal(best[~inside], quad)
    np.testing.assert_array_equal(np.sort(np.unique(env.mean_rewards)), [1.0, 1.2, 50.0])
    noise = env.rewards - env.mean_rewards
    assert abs(noise.std() - 0.01) <= 6 * 0.01 / np.sqrt(2 * noise.size)
    # uniform in the disc: P(r <= 0.6) = 0.36
    assert abs(inside.mean() - 0.36) <= 6 * np.sqrt(0.36 * 0.64 / 2000)


def test_ratings_bandit_is_the_rank_k_svd():
    rng = np.random.default_rng(0)
    R = rng.integers(0, 6, (40, 6)).astype(float)
    R[3] = 0.0  # a user with no rating is dropped
    env = ratings_bandit(np.random.default_rng(1), ratings=R, rank=3)
    kept = R[np.any(R != 0, axis=1)]
    assert env.n_steps == 39 and env.n_arms == 6 and env.n_features == 3
    U, s, Vt = np.linalg.svd(kept, full_matrices=False)
    Xhat = U[:, :3] * s[:3] @ Vt[:3]
    # same rows up to the shuffle
    close(np.sort(env.rewards.sum(1)), np.sort(Xhat.sum(1)))
    close(env.contexts.T @ env.contexts, np.diag(s[:3]), atol_scale=1e-12)
    full = ratings_bandit(np.random.default_rng(2), ratings=R, rank=6)
    close(np.sort(full.rewards.ravel()), np.sort(kept.ravel()), atol_scale=1e-12)
    syn = ratings_bandit(np.random.default_rng(3), n_users=100)
    assert syn.n_arms == 20 and syn.n_steps <= 100


def test_environment_checks():
    with pytest.raises(ValueError, match="rewards"):
        BanditEnvironment(np.zeros((3, 2)), np.zeros((4, 2)), np.zeros((4, 2)))
    env = BanditEnvironment(np.zeros((3, 2)), np.eye(3)[:, :2], np.eye(3)[:, :2])
    with pytest.raises(ValueError, match="action"):
        env.reward(0, 2)
    with pytest.raises(ValueError, match="t must"):
        env.reward(3, 0)
    with pytest.raises(ValueError, match="warm-up"):
        env.warmup(2)


def test_compare_agents_summary():
    rng_env = lambda r: toy_env(r, T=40)
    out = compare_agents(rng_env, {"random": RandomAgent(), "linear": LinearTSAgent()}, seeds=[0, 1],
                         n_warmup_per_arm=2)
    for name in ("random", "linear"):
        rec = out[name]
        assert len(rec["rewards"]) == 2
        assert rec["reward_mean"] == pytest.approx(np.mean(rec["rewards"]))
        assert rec["reward_std"] == pytest.approx(np.std(rec["rewards"], ddof=1))
    assert len(out["_results"]) == 4


def test_a_missing_reward_teaches_an_agent_nothing():
    """NaN reward: the same state back (static agents), or the filter's predict-only step (filter agents)."""
    rng = np.random.default_rng(13)
    env = toy_env(rng, T=30)
    net = MLP([env.n_features, 3, env.n_arms], activation="tanh")
    warm = env.warmup(2)
    s = env.contexts[-1]
    for agent in (LinearTSAgent(), NeuralLinearAgent(net, n_epochs=2), NeuralGreedyAgent(net, n_epochs=2),
                  NeuralTSAgent(net, n_epochs=2), LiM2Agent(net, n_epochs=2, memory=10)):
        st_ = agent.init(warm, np.random.default_rng(0))
        assert agent.update(st_, s, 0, np.nan, np.random.default_rng(0)) is st_, type(agent).__name__
        assert agent.update(st_, s, 0, 1.0, np.random.default_rng(0)) is not st_
    for agent in (SubspaceAgent(net, d=3, n_warmup_steps=10, q=1e-3),
                  LoFiAgent(net, rank=2, n_warmup_steps=10)):
        st_ = agent.init(warm, np.random.default_rng(0))
        out = agent.update(st_, s, 1, np.nan, np.random.default_rng(0))
        expected = st_.filter.predict(st_.bel)
        for field in type(expected).__dataclass_fields__:  # the mean and every covariance factor
            np.testing.assert_array_equal(getattr(out.bel, field), getattr(expected, field))
        seen = agent.update(st_, s, 1, 1.0, np.random.default_rng(0))
        assert not np.array_equal(seen.bel.mean, expected.mean)


def test_agents_reject_bad_steps_before_changing_state():
    rng = np.random.default_rng(12)
    env = toy_env(rng, T=30)
    net = MLP([env.n_features, 3, env.n_arms], activation="tanh")
    warm = env.warmup(2)
    for agent in (LinearTSAgent(), NeuralLinearAgent(net, n_epochs=2), NeuralGreedyAgent(net, n_epochs=2),
                  NeuralTSAgent(net, n_epochs=2), SubspaceAgent(net, d=3, n_warmup_steps=10),
                  LiM2Agent(net, n_epochs=2, memory=10)):
        st_ = agent.init(warm, np.random.default_rng(0))
        s = env.contexts[-1]
        with pytest.raises(ValueError, match="action"):
            agent.update(st_, s, env.n_arms, 1.0, np.random.default_rng(0))
        with pytest.raises((ValueError, TypeError), match="action"):
            agent.update(st_, s, 1.5, 1.0, np.random.default_rng(0))
        with pytest.raises(ValueError, match="context"):
            agent.update(st_, np.ones(env.n_features + 1), 0, 1.0, np.random.default_rng(0))
        with pytest.raises(ValueError, match="reward"):
            agent.update(st_, s, 0, np.inf, np.random.default_rng(0))
        with pytest.raises(ValueError, match="context"):
            agent.choose(st_, np.ones(env.n_features + 2), np.random.default_rng(0))
        # the state is still usable
        agent.update(st_, s, 0, 1.0, np.random.default_rng(0))


def test_divergent_warmup_raises_convergence_error():
    from refbayes.errors import ConvergenceError

    rng = np.random.default_rng(13)
    env = toy_env(rng, T=30)
    net = MLP([env.n_features, 3, env.n_arms], activation="tanh")
    with pytest.raises(ConvergenceError, match="lr"):
        SubspaceAgent(net, d=2, n_warmup_steps=50, lr=1e6).init(env.warmup(2), np.random.default_rng(0))
