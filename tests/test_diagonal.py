"""FD-EKF and VD-EKF against the full-covariance EKF and the exact oracles
(the checklist of diagonal_ekf.md section 5, O1-O12)."""

import tracemalloc

import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes import exact
from refbayes.filters import diagonal, ekf

from problems import linear_model, random_spd, small_mlp

seeds = st.integers(0, 2**32 - 1)


def one_step(rng, P, C, nonlinear=True):
    """A random diagonal prior and one linearised observation (H, R, e)."""
    mean = rng.standard_normal(P)
    var = rng.uniform(0.1, 2.0, P)
    H = rng.standard_normal((C, P)) * (1.5 if nonlinear else 1.0)
    R = random_spd(rng, C)
    e = rng.standard_normal(C)
    return mean, var, H, R, e


def fc_from_diag(mean, var, H, R, e):
    return ekf.update(rb.FullCov(mean, np.diag(var)), H, R, e)


@settings(max_examples=40, deadline=None)
@given(P=st.integers(1, 8), C=st.integers(1, 4), seed=seeds)
def test_one_step_fd_is_marginal_and_vd_is_precision_diagonal(P, C, seed):
    rng = np.random.default_rng(seed)
    mean, var, H, R, e = one_step(rng, P, C)
    fc = fc_from_diag(mean, var, H, R, e)
    fd = diagonal.fd_update(rb.Diag(mean, var), H, R, e)
    vd_ekf = diagonal.vd_update(rb.Diag(mean, var), H, R, e, mean_rule="ekf")
    vd_paper = diagonal.vd_update(rb.Diag(mean, var), H, R, e, mean_rule="paper")
    # O3
    np.testing.assert_allclose(fd.mean, fc.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fd.var, np.diag(fc.cov), rtol=1e-9, atol=1e-12)
    # O4
    np.testing.assert_allclose(1 / vd_ekf.var, np.diag(np.linalg.inv(fc.cov)), rtol=1e-8)
    np.testing.assert_allclose(vd_ekf.mean, fc.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(vd_paper.var, vd_ekf.var)
    # O5: 0 < v_VD <= v_FD <= v
    tol = 1e-12 * var
    assert np.all(vd_ekf.var > 0)
    assert np.all(vd_ekf.var <= fd.var + tol)
    assert np.all(fd.var <= var + tol)


def test_vd_paper_mean_equals_ekf_when_posterior_is_diagonal():
    rng = np.random.default_rng(0)
    P = 5
    mean, var = rng.standard_normal(P), rng.uniform(0.5, 1.5, P)
    H = np.zeros((2, P))
    H[0, 1], H[1, 3] = 1.3, -0.7  # disjoint supports, diagonal R: H^T R^-1 H diagonal
    R = np.diag([0.4, 0.9])
    e = np.array([0.3, -1.1])
    fc = fc_from_diag(mean, var, H, R, e)
    assert np.count_nonzero(fc.cov - np.diag(np.diag(fc.cov))) == 0 or np.allclose(fc.cov, np.diag(np.diag(fc.cov)), atol=1e-15)
    vd = diagonal.vd_update(rb.Diag(mean, var), H, R, e, mean_rule="paper")
    np.testing.assert_allclose(vd.mean, fc.mean, rtol=1e-12)


def test_vd_first_inequality_strict_iff_coupled():
    """O5: v_VD,i = v_FD,i exactly when row i of the EKF precision is decoupled."""
    rng = np.random.default_rng(1)
    P = 4
    mean, var = rng.standard_normal(P), rng.uniform(0.5, 1.5, P)
    H = np.array([[1.0, 0.5, 0.0, 0.0]])  # couples 0 and 1; 2, 3 untouched
    R = np.eye(1) * 0.5
    e = np.array([0.2])
    fd = diagonal.fd_update(rb.Diag(mean, var), H, R, e)
    vd = diagonal.vd_update(rb.Diag(mean, var), H, R, e)
    assert np.all(vd.var[:2] < fd.var[:2] * (1 - 1e-6))
    np.testing.assert_allclose(vd.var[2:], fd.var[2:], rtol=1e-15)


def kl_gauss(m0, S0, m1, S1):
    """KL(N(m0, S0) || N(m1, S1))."""
    P = len(m0)
    S1inv = np.linalg.inv(S1)
    d = m1 - m0
    return 0.5 * (np.trace(S1inv @ S0) + d @ S1inv @ d - P + np.linalg.slogdet(S1)[1] - np.linalg.slogdet(S0)[1])


@settings(max_examples=20, deadline=None)
@given(P=st.integers(2, 6), C=st.integers(1, 3), seed=seeds)
def test_kl_optimality_of_fd_and_vd(P, C, seed):
    """O6: FD minimises KL(p || q), VD minimises KL(q || p) over diagonal q with the EKF mean."""
    rng = np.random.default_rng(seed)
    mean, var, H, R, e = one_step(rng, P, C)
    fc = fc_from_diag(mean, var, H, R, e)
    fd = diagonal.fd_update(rb.Diag(mean, var), H, R, e)
    vd = diagonal.vd_update(rb.Diag(mean, var), H, R, e, mean_rule="ekf")
    best_fd = kl_gauss(fc.mean, fc.cov, fc.mean, np.diag(fd.var))
    best_vd = kl_gauss(fc.mean, np.diag(vd.var), fc.mean, fc.cov)
    for _ in range(20):
        f = np.exp(rng.normal(0, 0.3, P))
        assert kl_gauss(fc.mean, fc.cov, fc.mean, np.diag(fd.var * f)) >= best_fd - 1e-12
        assert kl_gauss(fc.mean, np.diag(vd.var * f), fc.mean, fc.cov) >= best_vd - 1e-12
    # stationarity: d KL / d log v = 0 at the solution (central differences)
    h = 1e-5
    for i in range(P):
        step = np.zeros(P)
        step[i] = h
        g_fd = (kl_gauss(fc.mean, fc.cov, fc.mean, np.diag(fd.var * np.exp(step)))
                - kl_gauss(fc.mean, fc.cov, fc.mean, np.diag(fd.var * np.exp(-step)))) / (2 * h)
        g_vd = (kl_gauss(fc.mean, np.diag(vd.var * np.exp(step)), fc.mean, fc.cov)
                - kl_gauss(fc.mean, np.diag(vd.var * np.exp(-step)), fc.mean, fc.cov)) / (2 * h)
        assert abs(g_fd) < 1e-7 and abs(g_vd) < 1e-7


@settings(max_examples=20, deadline=None)
@given(C=st.integers(1, 3), T=st.integers(1, 5), gamma=st.floats(0.5, 1.0), q=st.floats(0, 0.3), seed=seeds)
def test_single_parameter_all_variants_agree(C, T, gamma, q, seed):
    """O1: with P = 1, FC = FD = VD (both mean rules) on a nonlinear model."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(C)
    model = rb.Function(lambda th, x: anp.tanh(w * th[0] * x[0]) + 0.3 * th[0] ** 2, n_params=1, out_dim=C, in_dim=1)
    lik = rb.Gaussian(random_spd(rng, C))
    X, Y = rng.standard_normal((T, 1)), rng.standard_normal((T, C))
    theta0 = rng.standard_normal(1)
    filters = [rb.FullEKF(model, lik, gamma=gamma, q=q), rb.FDEKF(model, lik, gamma=gamma, q=q),
               rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="paper"), rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="ekf")]
    outs = [f.scan(f.init(theta0, 0.7), X, Y)[0] for f in filters]
    for bel in outs[1:]:
        np.testing.assert_allclose(bel.mean, outs[0].mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(bel.marginal_variance(), outs[0].marginal_variance(), rtol=1e-10)


def test_single_block_equals_full_ekf():
    """O2: block variants with one block = FC-EKF, for FD and for VD (paper mean)."""
    rng = np.random.default_rng(3)
    model = small_mlp(2, 3, 2)
    P = model.n_params
    lik = rb.Gaussian(0.2)
    X, Y = rng.standard_normal((6, 2)), rng.standard_normal((6, 2))
    theta0 = model.init_params(rng)
    full = rb.FullEKF(model, lik, gamma=0.9, q=0.02)
    ref, _ = full.scan(full.init(theta0, 0.5), X, Y)
    for filt in (rb.FDEKF(model, lik, gamma=0.9, q=0.02, blocks=[np.arange(P)]),
                 rb.VDEKF(model, lik, gamma=0.9, q=0.02, blocks=[np.arange(P)])):
        bel, _ = filt.scan(filt.init(theta0, 0.5), X, Y)
        np.testing.assert_allclose(bel.mean, ref.mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(bel.covariance(), ref.cov, rtol=1e-8, atol=1e-12)


def test_singleton_blocks_equal_diagonal_variants():
    rng = np.random.default_rng(5)
    model = small_mlp(2, 3, 1)
    P = model.n_params
    lik = rb.Gaussian(0.5)
    X, Y = rng.standard_normal((5, 2)), rng.standard_normal((5, 1))
    theta0 = model.init_params(rng)
    singles = [np.array([i]) for i in rng.permutation(P)]
    for diag_f, block_f in ((rb.FDEKF(model, lik, q=0.01), rb.FDEKF(model, lik, q=0.01, blocks=singles)),
                            (rb.VDEKF(model, lik, vd_mean="ekf"), rb.VDEKF(model, lik, vd_mean="ekf", blocks=singles))):
        a, _ = diag_f.scan(diag_f.init(theta0, 0.3), X, Y)
        b, _ = block_f.scan(block_f.init(theta0, 0.3), X, Y)
        np.testing.assert_allclose(b.mean, a.mean, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(b.marginal_variance(), a.var, rtol=1e-10)


def test_block_fd_is_block_marginal_of_fc():
    """One step from a block-diagonal prior: block FD keeps the EKF's diagonal blocks."""
    rng = np.random.default_rng(6)
    P, C = 6, 2
    groups = (np.array([0, 3, 4]), np.array([1, 2, 5]))
    covs = tuple(random_spd(rng, 3) for _ in groups)
    bel = rb.BlockDiag(rng.standard_normal(P), groups, covs)
    H, R, e = rng.standard_normal((C, P)), random_spd(rng, C), rng.standard_normal(C)
    fc = ekf.update(rb.FullCov(bel.mean, bel.covariance()), H, R, e)
    fd = diagonal.fd_block_update(bel, H, R, e)
    vd = diagonal.vd_block_update(bel, H, R, e, mean_rule="ekf")
    np.testing.assert_allclose(fd.mean, fc.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vd.mean, fc.mean, rtol=1e-10, atol=1e-12)
    fc_prec = np.linalg.inv(fc.cov)
    for g, c_fd, c_vd in zip(groups, fd.covs, vd.covs):
        np.testing.assert_allclose(c_fd, fc.cov[np.ix_(g, g)], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(np.linalg.inv(c_vd), fc_prec[np.ix_(g, g)], rtol=1e-8, atol=1e-10)


@settings(max_examples=15, deadline=None)
@given(K=st.integers(2, 4), seed=seeds)
def test_categorical_modes_agree(K, seed):
    """O7: drop-last-class and full-K pseudo-inverse give the same FC, FD and VD updates;
    the VD precision increment is diag(J^T Lambda J), and H^T R^-1 e is the score."""
    rng = np.random.default_rng(seed)
    model = small_mlp(3, 3, K)
    theta0 = model.init_params(rng)
    X, Y = rng.standard_normal((5, 3)), rng.integers(0, K, 5)
    for make in (lambda lik: rb.FullEKF(model, lik, q=0.01),
                 lambda lik: rb.FDEKF(model, lik, q=0.01),
                 lambda lik: rb.VDEKF(model, lik, q=0.01, vd_mean="paper"),
                 lambda lik: rb.VDEKF(model, lik, q=0.01, vd_mean="ekf")):
        a, b = make(rb.Categorical(K, mode="drop_last")), make(rb.Categorical(K, mode="full"))
        ba, _ = a.scan(a.init(theta0, 0.4), X, Y)
        bb, _ = b.scan(b.init(theta0, 0.4), X, Y)
        np.testing.assert_allclose(bb.mean, ba.mean, rtol=1e-8, atol=1e-11)
        np.testing.assert_allclose(bb.covariance(), ba.covariance(), rtol=1e-8, atol=1e-11)
    # one VD step written in the logits form
    x, y = X[0], Y[0]
    eta, J = model.value_and_jacobian(theta0, x)
    p = np.exp(eta - eta.max())
    p /= p.sum()
    Lam = np.diag(p) - np.outer(p, p)
    vd = rb.VDEKF(model, rb.Categorical(K), vd_mean="paper")
    bel = vd.update(vd.init(theta0, 0.4), x, y)
    np.testing.assert_allclose(1 / bel.var, 1 / 0.4 + np.diag(J.T @ Lam @ J), rtol=1e-10)
    np.testing.assert_allclose(bel.mean, theta0 + bel.var * (J.T @ (np.eye(K)[y] - p)), rtol=1e-10, atol=1e-13)


@settings(max_examples=25, deadline=None)
@given(P=st.integers(1, 6), T=st.integers(1, 8), gamma=st.floats(0.5, 1.0), seed=seeds)
def test_axis_aligned_linear_gaussian_all_exact(P, T, gamma, seed):
    """O8: one active coordinate per step, diagonal prior and Q: FC = FD = VD = Kalman filter."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0, 0.3, P)
    k = rng.integers(0, P, T)
    c = rng.normal(0, 2, T)
    Hs = np.zeros((T, 1, P))
    Hs[np.arange(T), 0, k] = c
    ys = rng.standard_normal((T, 1))
    r = 0.3
    var0 = rng.uniform(0.2, 2, P)
    mu0 = rng.standard_normal(P)
    kf = exact.kalman_filter(mu0, np.diag(var0), Hs, ys, r * np.eye(1), gamma, q)
    model, lik = linear_model(P, 1), rb.Gaussian(r)
    for filt in (rb.FDEKF(model, lik, gamma=gamma, q=q), rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="paper"),
                 rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="ekf")):
        bel = filt.init(mu0, var0)
        for t in range(T):
            bel = filt.update(filt.predict(bel), Hs[t].ravel(), ys[t])
            np.testing.assert_allclose(bel.mean, kf.means[t], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(bel.var, np.diag(kf.covs[t]), rtol=1e-10, atol=1e-14)
    # static case: the per-coordinate conjugate posterior in closed form
    lam = 1 / var0 + np.bincount(k, weights=c**2 / r, minlength=P)
    mu = (mu0 / var0 + np.bincount(k, weights=c * ys[:, 0] / r, minlength=P)) / lam
    filt = rb.VDEKF(model, lik)
    bel, _ = filt.scan(filt.init(mu0, var0), Hs.reshape(T, -1), ys)
    np.testing.assert_allclose(bel.mean, mu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(1 / bel.var, lam, rtol=1e-10)


@settings(max_examples=20, deadline=None)
@given(P=st.integers(1, 6), T=st.integers(1, 8), seed=seeds)
def test_vd_precision_is_order_invariant_for_linear_models(P, T, seed):
    """O10: 1/v_T = 1/v_0 + diag(X^T R^-1 X), whatever the order and the targets."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((T, P))
    r, var0 = 0.5, rng.uniform(0.2, 2, P)
    filt = rb.VDEKF(linear_model(P, 1), rb.Gaussian(r))
    expected = 1 / var0 + (X**2).sum(0) / r
    for order in (np.arange(T), rng.permutation(T)):
        bel, _ = filt.scan(filt.init(np.zeros(P), var0), X[order], rng.standard_normal((T, 1)))
        np.testing.assert_allclose(1 / bel.var, expected, rtol=1e-10)


def test_predict_and_uninformative_update():
    """O11: v <- gamma^2 v + q; an observation with H = 0 changes nothing."""
    rng = np.random.default_rng(8)
    P = 5
    bel = rb.Diag(rng.standard_normal(P), rng.uniform(0.1, 1, P))
    q = rng.uniform(0, 0.2, P)
    pred = diagonal.predict(bel, 0.8, q)
    np.testing.assert_allclose(pred.var, 0.64 * bel.var + q, rtol=1e-15)
    np.testing.assert_allclose(pred.mean, 0.8 * bel.mean, rtol=1e-15)
    H, R, e = np.zeros((2, P)), np.eye(2), rng.standard_normal(2)
    for out in (diagonal.fd_update(bel, H, R, e), diagonal.vd_update(bel, H, R, e, "paper"),
                diagonal.vd_update(bel, H, R, e, "ekf")):
        np.testing.assert_array_equal(out.mean, bel.mean)
        np.testing.assert_array_equal(out.var, bel.var)


def test_equivariance_under_permutation_and_scaling():
    """O12: permuting parameters permutes outputs; theta' = D theta maps v' = D^2 v, mu' = D mu."""
    rng = np.random.default_rng(9)
    P, C = 6, 2
    mean, var, H, R, e = one_step(rng, P, C)
    perm = rng.permutation(P)
    d = rng.uniform(0.5, 2, P)
    for upd in (diagonal.fd_update, lambda b, H, R, e: diagonal.vd_update(b, H, R, e, "paper"),
                lambda b, H, R, e: diagonal.vd_update(b, H, R, e, "ekf")):
        base = upd(rb.Diag(mean, var), H, R, e)
        permuted = upd(rb.Diag(mean[perm], var[perm]), H[:, perm], R, e)
        np.testing.assert_allclose(permuted.mean, base.mean[perm], rtol=1e-12)
        np.testing.assert_allclose(permuted.var, base.var[perm], rtol=1e-12)
        # y = H theta = (H D^-1)(D theta)
        scaled = upd(rb.Diag(d * mean, d**2 * var), H / d, R, e)
        np.testing.assert_allclose(scaled.mean, d * base.mean, rtol=1e-10)
        np.testing.assert_allclose(scaled.var, d**2 * base.var, rtol=1e-10)


def test_diagonal_updates_at_a_million_parameters_without_p_by_p_memory():
    rng = np.random.default_rng(10)
    P, C = 1_000_000, 10
    bel = rb.Diag(np.zeros(P), np.full(P, 0.5))
    H = rng.standard_normal((C, P)) / np.sqrt(P)
    R, e = np.eye(C), rng.standard_normal(C)
    tracemalloc.start()
    fd = diagonal.fd_update(bel, H, R, e)
    vd = diagonal.vd_update(bel, H, R, e, "ekf")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * P * 8  # a P x P float64 matrix would be 8e12 bytes
    assert fd.var.shape == vd.var.shape == (P,)
    assert np.all(vd.var <= fd.var + 1e-15) and np.all(fd.var <= 0.5)
    np.testing.assert_allclose(fd.mean, vd.mean, rtol=1e-12, atol=1e-15)


class TestBadInput:
    def setup_method(self):
        self.rng = np.random.default_rng(0)
        self.model = small_mlp(3, 4, 2)
        self.theta = self.model.init_params(self.rng)

    @pytest.mark.parametrize("Filt", [rb.FullEKF, rb.FDEKF, rb.VDEKF])
    @pytest.mark.parametrize(
        "x, y, match",
        [
            (np.array([0.0, np.nan, 1.0]), np.zeros(2), "x"),
            (np.zeros(4), np.zeros(2), "x"),
            (np.zeros(3), np.array([0.0, np.inf]), "y"),
            (np.zeros(3), np.zeros(3), "y"),
        ],
    )
    def test_bad_observation_leaves_belief_unchanged(self, Filt, x, y, match):
        filt = Filt(self.model, rb.Gaussian(0.5))
        bel = filt.init(self.theta, 0.3)
        before = {k: np.array(v, copy=True) for k, v in vars(bel).items() if isinstance(v, np.ndarray)}
        with pytest.raises(ValueError, match=match):
            filt.update(bel, x, y)
        with pytest.raises(ValueError, match=f"(?i){match}"):  # scan names X / Y
            filt.scan(bel, np.stack([x, x]), [np.zeros(2), y])
        for k, v in before.items():
            np.testing.assert_array_equal(getattr(bel, k), v)

    def test_label_out_of_range(self):
        model = small_mlp(3, 4, 3)
        filt = rb.VDEKF(model, rb.Categorical(3))
        bel = filt.init(model.init_params(self.rng), 0.3)
        for bad in (3, -1, 1.5):
            with pytest.raises(ValueError, match="y"):
                filt.update(bel, np.zeros(3), bad)

    @pytest.mark.parametrize("kwargs, match", [
        (dict(gamma=0.0), "gamma"), (dict(gamma=np.nan), "gamma"), (dict(q=-1.0), "q"),
    ])
    def test_bad_hyperparameters(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            rb.FDEKF(self.model, rb.Gaussian(0.5), **kwargs)

    def test_bad_prior_and_likelihood(self):
        filt = rb.VDEKF(self.model, rb.Gaussian(0.5))
        with pytest.raises(ValueError, match="prior_var"):
            filt.init(self.theta, 0.0)
        with pytest.raises(ValueError, match="mean"):
            filt.init(self.theta[:-1], 1.0)
        with pytest.raises(ValueError, match="obs_var"):
            rb.Gaussian(-1.0)
        with pytest.raises(ValueError):
            rb.VDEKF(self.model, rb.Categorical(5))  # model has 2 outputs
        with pytest.raises(ValueError, match="vd_mean"):
            rb.VDEKF(self.model, rb.Gaussian(0.5), vd_mean="nope")

    def test_wrong_belief_type(self):
        filt = rb.FDEKF(self.model, rb.Gaussian(0.5))
        with pytest.raises(TypeError, match="bel"):
            filt.update(rb.FullCov(self.theta, np.eye(len(self.theta))), np.zeros(3), np.zeros(2))
