"""LO-FI (refbayes.filters.lofi) against exact oracles: dense algebra, FullEKF, VDEKF,
the Kalman filter and conjugate Bayesian linear regression (docs/lofi.md §9, T1-T14)."""

import time
import tracemalloc

import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes import exact, linalg, predictive
from refbayes.beliefs import DLR, FullCov
from refbayes.errors import NotPositiveDefiniteError
from refbayes.filters import lofi
from refbayes.filters.lofi import LoFi, LoFiBelief
from refbayes.likelihoods import logits_factor

from problems import linear_gaussian_stream, linear_model, random_spd, small_mlp

FAST = settings(max_examples=30, deadline=None)
seeds = st.integers(0, 2**32 - 1)


# ---------------------------------------------------------------------------------------------
# helpers (dense, test-only)


def random_dlr(rng, P, L, scale=1.0):
    return DLR(rng.standard_normal(P), rng.uniform(0.3, 2.0, P), scale * rng.standard_normal((P, L)))


def dense_ekf_mean(bel, H, R, e):
    S = bel.covariance()
    return bel.mean + S @ H.T @ np.linalg.solve(H @ S @ H.T + R, e)


def close(a, b, rtol):
    """max|a - b| <= rtol * max(1, max|b|): round-off relative to the matrix size."""
    a, b = np.asarray(a), np.asarray(b)
    err = np.max(np.abs(a - b), initial=0.0)
    scale = max(1.0, np.max(np.abs(b), initial=0.0))
    assert err <= rtol * scale, f"max error {err:.3e} > {rtol:.1e} * {scale:.3e}"
    return err / scale


def rank_projection(M, L):
    """Best rank-L approximation of a symmetric PSD matrix M (Eckart-Young), and the eigen-gap."""
    w, V = np.linalg.eigh(M)
    w, V = w[::-1], V[:, ::-1]
    gap = w[L - 1] - w[L] if 0 < L < len(w) else np.inf
    return (V[:, :L] * w[:L]) @ V[:, :L].T, gap, w[0]


def orthogonal(rng, n):
    Q, R = np.linalg.qr(rng.standard_normal((n, n)))
    return Q * np.sign(np.diag(R))


# ---------------------------------------------------------------------------------------------
# T1: the predict step is exact


@FAST
@given(P=st.integers(1, 8), L=st.integers(0, 6), gamma=st.floats(0.3, 1.3), q=st.floats(0.0, 1.0),
       vector_q=st.booleans(), seed=seeds)
def test_predict_is_exact(P, L, gamma, q, vector_q, seed):  # T1
    rng = np.random.default_rng(seed)
    bel = random_dlr(rng, P, L)
    W0 = bel.W.copy()
    qv = rng.uniform(0, 1, P) * q if vector_q else q
    out = lofi.predict(bel, gamma, qv)
    assert out.rank == L
    np.testing.assert_allclose(out.mean, gamma * bel.mean, rtol=1e-15)
    close(out.covariance(), gamma**2 * bel.covariance() + np.diag(np.broadcast_to(qv, (P,))), 1e-10)
    np.testing.assert_array_equal(bel.W, W0)  # input untouched
    assert not out.W.flags.writeable


@FAST
@given(P=st.integers(1, 6), L=st.integers(1, 4), gamma=st.floats(0.3, 1.3), seed=seeds)
def test_predict_without_noise_rescales(P, L, gamma, seed):
    rng = np.random.default_rng(seed)
    bel = random_dlr(rng, P, L)
    out = lofi.predict(bel, gamma, 0.0)
    np.testing.assert_allclose(out.ups, bel.ups / gamma**2, rtol=1e-14)
    close(out.W @ out.W.T, bel.W @ bel.W.T / gamma**2, 1e-13)
    same = lofi.predict(bel, 1.0, 0.0)
    np.testing.assert_allclose(same.precision(), bel.precision(), rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# T2, T3: one update step


@FAST
@given(P=st.integers(1, 8), L=st.integers(0, 5), C=st.integers(1, 4), rank=st.integers(0, 9),
       svd=st.sampled_from(lofi.SVD_METHODS), seed=seeds)
def test_update_mean_is_the_ekf_mean_for_any_rank(P, L, C, rank, svd, seed):  # T2
    rng = np.random.default_rng(seed)
    bel = random_dlr(rng, P, L)
    H, R, e = rng.standard_normal((C, P)), random_spd(rng, C), rng.standard_normal(C)
    out = lofi.update(bel, H, R, e, rank=rank, svd=svd)
    assert out.rank == rank
    close(out.mean, dense_ekf_mean(bel, H, R, e), 1e-10)


@FAST
@given(P=st.integers(2, 9), L=st.integers(0, 5), C=st.integers(1, 4), rank=st.integers(1, 8),
       svd=st.sampled_from(lofi.SVD_METHODS), seed=seeds)
def test_update_keeps_the_diagonal_and_the_best_rank_L_part(P, L, C, rank, svd, seed):  # T3
    rng = np.random.default_rng(seed)
    bel = random_dlr(rng, P, L)
    H, R, e = rng.standard_normal((C, P)), random_spd(rng, C), rng.standard_normal(C)
    out = lofi.update(bel, H, R, e, rank=rank, svd=svd)
    exact_prec = bel.precision() + H.T @ np.linalg.solve(R, H)
    close(np.diag(out.precision()), np.diag(exact_prec), 1e-11)
    assert np.all(out.ups >= bel.ups)
    gram = out.W.T @ out.W
    close(gram - np.diag(np.diag(gram)), np.zeros_like(gram), 1e-8 if svd == "gram" else 1e-11)
    d = np.diag(gram)
    assert np.all(np.diff(d) <= 1e-10 * max(1.0, d.max(initial=0.0)))
    best, gap, top = rank_projection(exact_prec - np.diag(bel.ups), rank)
    assume(gap > 1e-4 * top)  # the projection is unique
    close(out.W @ out.W.T, best, 1e-7 if svd == "gram" else 1e-9)


def test_truncate_pads_with_zero_columns_and_handles_empty_input():
    rng = np.random.default_rng(0)
    ups = rng.uniform(1, 2, 3)
    Wtil = rng.standard_normal((3, 5))
    for svd in lofi.SVD_METHODS:
        u, W = lofi.truncate(ups, Wtil, 7, svd=svd)
        assert W.shape == (3, 7)
        close(W @ W.T, Wtil @ Wtil.T, 1e-12)
        close(u, ups, 1e-10)  # nothing discarded beyond round-off
    u, W = lofi.truncate(ups, np.zeros((3, 0)), 2)
    np.testing.assert_array_equal(u, ups)
    assert W.shape == (3, 2) and not W.any()


# ---------------------------------------------------------------------------------------------
# T4: no truncation => LO-FI = FullEKF (nonlinear models, any gamma and q)


def run_pair(filt_a, filt_b, theta0, prior_var, X, Y, check):
    a, b = filt_a.init(theta0, prior_var), filt_b.init(theta0, prior_var)
    for x, y in zip(X, Y):
        a, b = filt_a.predict(a), filt_b.predict(b)
        check(a, b)
        a, b = filt_a.update(a, x, y), filt_b.update(b, x, y)
        check(a, b)
    return a, b


def check_same_gaussian(rtol):
    def check(lo, ek):
        close(lo.mean, ek.mean, rtol)
        close(lo.precision(), ek.precision(), rtol)
        close(lo.covariance(), ek.covariance(), rtol)
    return check


@settings(max_examples=25, deadline=None)
@given(hidden=st.integers(1, 3), C=st.integers(1, 2), T=st.integers(1, 5), extra=st.integers(0, 2),
       gamma=st.floats(0.7, 1.0), q=st.floats(0.0, 0.3), prior_var=st.floats(0.2, 2.0),
       obs_var=st.floats(0.1, 2.0), variant=st.sampled_from(lofi.VARIANTS),
       svd=st.sampled_from(lofi.SVD_METHODS), seed=seeds)
def test_full_rank_lofi_equals_full_ekf_on_mlp_regression(hidden, C, T, extra, gamma, q, prior_var, obs_var,
                                                          variant, svd, seed):  # T4
    rng = np.random.default_rng(seed)
    model = small_mlp(2, hidden, C)
    lik = rb.Gaussian(obs_var)
    L = min(model.n_params, T * C) + extra
    X, Y = rng.standard_normal((T, 2)), rng.standard_normal((T, C))
    filt = LoFi(model, lik, rank=L, variant=variant, gamma=gamma, q=q, svd=svd)
    ekf = rb.FullEKF(model, lik, gamma=gamma, q=q)
    run_pair(filt, ekf, model.init_params(rng), prior_var, X, Y, check_same_gaussian(1e-8))


@settings(max_examples=20, deadline=None)
@given(K=st.integers(2, 4), T=st.integers(1, 4), gamma=st.floats(0.7, 1.0), q=st.floats(0.0, 0.2),
       prior_var=st.floats(0.2, 2.0), mode=st.sampled_from(["drop_last", "full"]), seed=seeds)
def test_full_rank_lofi_equals_full_ekf_on_classification(K, T, gamma, q, prior_var, mode, seed):  # T4
    rng = np.random.default_rng(seed)
    model = small_mlp(2, 2, K)
    lik = rb.Categorical(K, mode=mode)
    L = min(model.n_params, T * (K - 1))
    X, Y = rng.standard_normal((T, 2)), rng.integers(0, K, T)
    filt = LoFi(model, lik, rank=L, gamma=gamma, q=q)
    ekf = rb.FullEKF(model, lik, gamma=gamma, q=q)
    theta0 = 2.0 * model.init_params(rng)
    run_pair(filt, ekf, theta0, prior_var, X, Y, check_same_gaussian(1e-8))


def test_rank_above_P_is_clipped_to_P_and_exact():  # T4 with L > P
    rng = np.random.default_rng(3)
    model = small_mlp(1, 1, 1)  # P = 4
    lik = rb.Gaussian(0.5)
    X, Y = rng.standard_normal((6, 1)), rng.standard_normal((6, 1))
    with pytest.warns(UserWarning, match="using rank 4"):
        filt = LoFi(model, lik, rank=9, gamma=0.9, q=0.05)
    a, _ = run_pair(filt, rb.FullEKF(model, lik, gamma=0.9, q=0.05), model.init_params(rng), 1.0, X, Y,
                    check_same_gaussian(1e-8))
    assert a.W.shape == (4, 4)


# ---------------------------------------------------------------------------------------------
# T5, T6: linear-Gaussian models


lg_dims = dict(T=st.integers(1, 6), C=st.integers(1, 3), P=st.integers(1, 6), gamma=st.floats(0.5, 1.0),
               q=st.floats(0.0, 0.5), prior_var=st.floats(0.1, 3.0), seed=seeds)


@FAST
@given(vector_q=st.booleans(), variant=st.sampled_from(lofi.VARIANTS), **lg_dims)
def test_linear_gaussian_lofi_equals_kalman_filter(T, C, P, gamma, q, prior_var, vector_q, variant, seed):  # T5
    rng = np.random.default_rng(seed)
    assume(not (vector_q and variant == "spherical"))
    Hs, ys, R = linear_gaussian_stream(rng, T, C, P)
    mu0 = rng.standard_normal(P)
    qv = rng.uniform(0, 1, P) * q if vector_q else q
    kf = exact.kalman_filter(mu0, prior_var * np.eye(P), Hs, ys, R, gamma, qv)
    filt = LoFi(linear_model(P, C), rb.Gaussian(R), rank=min(P, T * C), variant=variant, gamma=gamma, q=qv)
    bel = filt.init(mu0, prior_var)
    for t in range(T):
        bel = filt.predict(bel)
        close(bel.covariance(), kf.pred_covs[t], 1e-9)
        bel = filt.update(bel, Hs[t].ravel(), ys[t])
        close(bel.mean, kf.means[t], 1e-9)
        close(bel.covariance(), kf.covs[t], 1e-9)


@FAST
@given(svd=st.sampled_from(lofi.SVD_METHODS), **lg_dims)
def test_static_lofi_equals_bayesian_linear_regression(T, C, P, gamma, q, prior_var, svd, seed):  # T6
    rng = np.random.default_rng(seed)
    Hs, ys, R = linear_gaussian_stream(rng, T, C, P)
    mu0 = rng.standard_normal(P)
    mean, cov = exact.blr_posterior(mu0, prior_var * np.eye(P), Hs, ys, R)
    filt = LoFi(linear_model(P, C), rb.Gaussian(R), rank=min(P, T * C), svd=svd)
    bel0 = filt.init(mu0, prior_var)
    total, bel = predictive.prequential_log_likelihood(filt, bel0, Hs.reshape(T, -1), ys)
    close(bel.mean, mean, 1e-9)
    close(bel.precision(), np.linalg.inv(cov), 1e-9)
    np.testing.assert_allclose(bel.ups, 1.0 / prior_var, rtol=1e-7 if svd == "gram" else 1e-10)
    evidence = exact.blr_log_evidence(mu0, prior_var * np.eye(P), Hs, ys, R)
    assert total == pytest.approx(evidence, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------------------------------------
# T7, T8: rank 0 and P = 1


@FAST
@given(hidden=st.integers(1, 4), C=st.integers(1, 3), T=st.integers(1, 6), gamma=st.floats(0.5, 1.0),
       q=st.floats(0.0, 0.5), prior_var=st.floats(0.1, 3.0), classify=st.booleans(), seed=seeds)
def test_rank_zero_lofi_equals_vdekf_with_ekf_mean(hidden, C, T, gamma, q, prior_var, classify, seed):  # T7
    rng = np.random.default_rng(seed)
    K = C + 1
    model = small_mlp(3, hidden, K if classify else C)
    lik = rb.Categorical(K) if classify else rb.Gaussian(0.4)
    X = rng.standard_normal((T, 3))
    Y = rng.integers(0, K, T) if classify else rng.standard_normal((T, C))
    lo = LoFi(model, lik, rank=0, gamma=gamma, q=q)
    vd = rb.VDEKF(model, lik, gamma=gamma, q=q, vd_mean="ekf")

    def check(a, b):
        close(a.mean, b.mean, 1e-11)
        np.testing.assert_allclose(a.ups, 1.0 / b.var, rtol=1e-11)

    run_pair(lo, vd, model.init_params(rng), prior_var, X, Y, check)


def test_one_parameter_all_filters_agree():  # T8
    rng = np.random.default_rng(8)
    model = rb.Function(lambda th, x: anp.tanh(th * x) + 0.5 * th, n_params=1, out_dim=1, in_dim=1)
    lik = rb.Gaussian(0.3)
    X, Y = rng.standard_normal((10, 1)), rng.standard_normal((10, 1))
    ref, _ = rb.FullEKF(model, lik, gamma=0.9, q=0.1).scan(rb.FullEKF(model, lik).init([0.4], 2.0), X, Y)
    for filt in (rb.FDEKF(model, lik, gamma=0.9, q=0.1), rb.VDEKF(model, lik, gamma=0.9, q=0.1),
                 LoFi(model, lik, rank=1, gamma=0.9, q=0.1), LoFi(model, lik, rank=0, gamma=0.9, q=0.1)):
        bel, _ = filt.scan(filt.init([0.4], 2.0), X, Y)
        np.testing.assert_allclose(bel.mean, ref.mean, rtol=1e-12)
        np.testing.assert_allclose(bel.covariance(), ref.cov, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# T9: invariances


@FAST
@given(P=st.integers(1, 7), L=st.integers(0, 4), C=st.integers(1, 3), rank=st.integers(0, 6),
       gamma=st.floats(0.5, 1.2), q=st.floats(0.0, 1.0), seed=seeds)
def test_invariances(P, L, C, rank, gamma, q, seed):  # T9
    rng = np.random.default_rng(seed)
    bel = random_dlr(rng, P, L)
    # A -> Q A: the new columns H^T A^T Q^T
    H, R, e = rng.standard_normal((C, P)), random_spd(rng, C), rng.standard_normal(C)
    G, g = rb.likelihoods.whiten(H, R, e)
    a = lofi.update_whitened(bel, G, g, rank)
    b = lofi.update_whitened(bel, G @ orthogonal(rng, C).T, g, rank)
    close(b.mean, a.mean, 1e-10)
    close(b.ups, a.ups, 1e-10)
    s = np.linalg.svd(np.hstack([bel.W, G]), compute_uv=False)
    if rank == 0 or len(s) <= rank or s[rank - 1] - s[rank] > 1e-5 * s[0]:  # unique truncation
        close(b.W @ b.W.T, a.W @ a.W.T, 1e-9)
    # W -> W O before predict, and the symmetric square root of C_t
    O = orthogonal(rng, L)
    p1, p2 = lofi.predict(bel, gamma, q), lofi.predict(bel.replace(W=bel.W @ O), gamma, q)
    close(p2.ups, p1.ups, 1e-13)
    close(p2.W @ p2.W.T, p1.W @ p1.W.T, 1e-11)
    D = p1.ups / bel.ups
    Cinv = np.eye(L) + bel.W.T @ (bel.W * (q * D)[:, None])
    wc, Vc = np.linalg.eigh(Cinv)
    Wsym = gamma * D[:, None] * bel.W @ (Vc / np.sqrt(wc)) @ Vc.T
    close(Wsym @ Wsym.T, p1.W @ p1.W.T, 1e-11)


# ---------------------------------------------------------------------------------------------
# T10: spherical LO-FI


def spherical_belief(rng, P, L, eta):
    U = np.linalg.qr(rng.standard_normal((P, L)))[0] if L else np.zeros((P, 0))
    return DLR(rng.standard_normal(P), np.full(P, eta), U * rng.uniform(0.1, 3.0, U.shape[1]))


@FAST
@given(P=st.integers(1, 8), L=st.integers(0, 5), eta=st.floats(0.1, 5.0), gamma=st.floats(0.3, 1.2),
       q=st.floats(0.0, 1.0), seed=seeds)
def test_spherical_predict_equals_diagonal_predict(P, L, eta, gamma, q, seed):  # T10
    rng = np.random.default_rng(seed)
    bel = spherical_belief(rng, P, min(L, P), eta)
    a, b = lofi.spherical_predict(bel, gamma, q), lofi.predict(bel, gamma, q)
    close(a.ups, b.ups, 1e-13)
    close(a.W @ a.W.T, b.W @ b.W.T, 1e-11)
    close(a.mean, b.mean, 1e-15)


@FAST
@given(P=st.integers(2, 8), L=st.integers(0, 4), C=st.integers(1, 3), rank=st.integers(0, 6),
       eta=st.floats(0.2, 5.0), svd=st.sampled_from(lofi.SVD_METHODS), seed=seeds)
def test_spherical_update(P, L, C, rank, eta, svd, seed):
    rng = np.random.default_rng(seed)
    bel = spherical_belief(rng, P, min(L, P), eta)
    H, R, e = rng.standard_normal((C, P)), random_spd(rng, C), rng.standard_normal(C)
    out = lofi.spherical_update(bel, H, R, e, rank=rank, svd=svd)
    close(out.mean, dense_ekf_mean(bel, H, R, e), 1e-9)  # eq. 116 uses every component
    np.testing.assert_array_equal(out.ups, bel.ups)
    gram = out.W.T @ out.W
    close(gram - np.diag(np.diag(gram)), np.zeros_like(gram), 1e-8 if svd == "gram" else 1e-11)
    best, gap, top = rank_projection(bel.W @ bel.W.T + H.T @ np.linalg.solve(R, H), rank)
    assume(gap > 1e-4 * top)
    close(out.W @ out.W.T, best, 1e-7 if svd == "gram" else 1e-9)


def test_steady_state_keeps_eta_fixed():  # T10
    rng = np.random.default_rng(10)
    model = small_mlp(2, 4, 1)
    lik = rb.Gaussian(0.5)
    X, Y = rng.standard_normal((40, 2)), rng.standard_normal((40, 1))
    filt = LoFi(model, lik, rank=3, variant="spherical", gamma=0.95, steady_state=True)
    eta0 = 2.5
    bel = filt.init(model.init_params(rng), 1.0 / eta0)
    lam2 = []
    for x, y in zip(X, Y):
        pred = filt.predict(bel)
        # eq. 97: q = (1 - gamma^2) / eta0; the same step through the diagonal predict
        ref = lofi.predict(bel, 0.95, (1 - 0.95**2) / eta0)
        close(pred.precision(), ref.precision(), 1e-11)
        bel = filt.update(pred, x, y)
        lam2.append(np.sum(bel.W**2, axis=0))
    np.testing.assert_allclose(bel.ups, eta0, rtol=1e-13)
    assert np.all(lam2[-1] > 0)  # all three directions in use after 40 steps


# ---------------------------------------------------------------------------------------------
# orthogonal projection (App. F.5.2)


@FAST
@given(P=st.integers(3, 9), L=st.integers(1, 4), C=st.integers(1, 3), eta=st.floats(0.2, 3.0), seed=seeds)
def test_orthogonal_projection_update(P, L, C, eta, seed):
    rng = np.random.default_rng(seed)
    L = min(L, P - 1)
    bel = spherical_belief(rng, P, L, eta)
    H, R, e = rng.standard_normal((C, P)), random_spd(rng, C), rng.standard_normal(C)
    out = lofi.orth_update(bel, H, R, e, rng=rng)
    close(out.mean, dense_ekf_mean(bel, H, R, e), 1e-9)
    np.testing.assert_array_equal(out.ups, bel.ups)
    lam = np.linalg.norm(out.W, axis=0)
    assert np.all(lam >= np.linalg.norm(bel.W, axis=0).min() - 1e-12)
    U = out.W / lam
    close(U.T @ U, np.eye(L), 1e-10)


def test_orthogonal_projection_matches_svd_for_orthogonal_columns():
    """With new columns orthogonal to each other and to U, greedy replacement keeps the top L."""
    rng = np.random.default_rng(5)
    P, L, C, eta = 12, 3, 4, 0.7
    Q = np.linalg.qr(rng.standard_normal((P, L + C)))[0]
    bel = DLR(rng.standard_normal(P), np.full(P, eta), Q[:, :L] * np.array([3.0, 1.0, 0.5]))
    G = Q[:, L:] * np.array([2.0, 0.2, 4.0, 0.8])
    R = np.eye(C)
    H = G.T  # whiten(H, I) gives G back
    e = rng.standard_normal(C)
    a = lofi.orth_update(bel, H, R, e, rng=np.random.default_rng(1))
    b = lofi.spherical_update(bel, H, R, e)
    close(a.W @ a.W.T, b.W @ b.W.T, 1e-12)
    close(a.mean, b.mean, 1e-12)
    np.testing.assert_allclose(np.sort(np.linalg.norm(a.W, axis=0)), [2.0, 3.0, 4.0], rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# T11: classification forms


@FAST
@given(K=st.integers(2, 5), P=st.integers(2, 8), L=st.integers(0, 3), rank=st.integers(0, 4), seed=seeds)
def test_classification_forms_give_the_same_update(K, P, L, rank, seed):  # T11
    rng = np.random.default_rng(seed)
    bel = random_dlr(rng, P, L)
    eta = 2 * rng.standard_normal(K)
    Jf = rng.standard_normal((K, P))
    y = int(rng.integers(0, K))
    outs = []
    for mode in ("drop_last", "full"):
        lik = rb.Categorical(K, mode=mode)
        H = lik.mean_jacobian(eta) @ Jf
        e = lik.encode(y, K) - lik.mean(eta)
        outs.append(lofi.update(bel, H, lik.cov(eta), e, rank=rank, singular=lik.singular))
    p = rb.Categorical(K).probs(eta)
    B = logits_factor(eta)
    outs.append(lofi.update_whitened(bel, Jf.T @ B, Jf.T @ (np.eye(K)[y] - p), rank=rank))
    best, gap, top = rank_projection(outs[0].W @ outs[0].W.T, max(rank, 1))
    w = np.linalg.svd(np.hstack([bel.W, Jf.T @ B]), compute_uv=False)
    assume(rank == 0 or len(w) <= rank or w[rank - 1] - w[rank] > 1e-5 * w[0])  # unique truncation
    for out in outs[1:]:
        close(out.mean, outs[0].mean, 1e-9)
        close(out.ups, outs[0].ups, 1e-9)
        close(out.W @ out.W.T, outs[0].W @ outs[0].W.T, 1e-8)


def test_classification_jitter_converges_to_the_exact_form():  # T11
    rng = np.random.default_rng(6)
    K, P = 4, 7
    bel = random_dlr(rng, P, 2)
    eta, Jf = rng.standard_normal(K), rng.standard_normal((K, P))
    exact_lik = rb.Categorical(K)
    H = exact_lik.mean_jacobian(eta) @ Jf
    e = exact_lik.encode(1, K) - exact_lik.mean(eta)
    ref = lofi.update(bel, H, exact_lik.cov(eta), e, rank=2)
    errs = []
    for eps in (1e-2, 1e-4, 1e-6):
        out = lofi.update(bel, H, rb.Categorical(K, jitter=eps).cov(eta), e, rank=2)
        errs.append(np.max(np.abs(out.precision() - ref.precision())) + np.max(np.abs(out.mean - ref.mean)))
    assert errs[0] > errs[1] > errs[2] > 0
    assert errs[2] < 1e-3 * errs[0]


# ---------------------------------------------------------------------------------------------
# T12: sampling from a DLR precision


def test_dlr_sampler_is_exact_as_a_linear_map():  # T12, exact part
    rng = np.random.default_rng(12)
    P, L = 6, 3
    bel = random_dlr(rng, P, L)
    D = np.diag(1 / bel.ups)
    M = np.linalg.solve(linalg.dlr_inner(bel.ups, bel.W), (bel.W / bel.ups[:, None]).T).T
    A = np.eye(P) - M @ bel.W.T
    cov = A @ D @ A.T + M @ M.T  # Cov of x - M W^T x + M eps
    close(cov, bel.covariance(), 1e-12)


def test_dlr_sampler_statistics_after_lofi_steps():  # T12, Monte Carlo
    rng = np.random.default_rng(13)
    model = small_mlp(2, 3, 1)
    filt = LoFi(model, rb.Gaussian(0.2), rank=3, gamma=0.95, q=0.01)
    bel, _ = filt.scan(filt.init(model.init_params(rng), 1.0), rng.standard_normal((8, 2)), rng.standard_normal((8, 1)))
    n = 40000
    draws = bel.sample(np.random.default_rng(99), n)
    assert draws.shape == (n, model.n_params)
    S = bel.covariance()
    dev = draws - bel.mean
    # mean: 6 standard errors per coordinate
    assert np.all(np.abs(dev.mean(0)) <= 6 * np.sqrt(np.diag(S) / n))
    # covariance with known mean: Var[(x_i x_j)] = S_ii S_jj + S_ij^2
    emp = dev.T @ dev / n
    se = np.sqrt((np.outer(np.diag(S), np.diag(S)) + S**2) / n)
    assert np.all(np.abs(emp - S) <= 6 * se)
    # a wrong covariance (no low-rank part) is rejected by the same bound
    Sd = np.diag(1.0 / bel.ups)
    assert np.any(np.abs(emp - Sd) > 6 * np.sqrt((np.outer(np.diag(Sd), np.diag(Sd)) + Sd**2) / n))


# ---------------------------------------------------------------------------------------------
# T13: predictives


def test_probit_with_no_uncertainty_is_the_plugin_softmax():  # T13
    rng = np.random.default_rng(14)
    K = 3
    model = small_mlp(2, 3, K)
    theta = model.init_params(rng)
    bel = DLR(theta, np.full(model.n_params, 1e24), 1e-3 * rng.standard_normal((model.n_params, 2)))
    x = rng.standard_normal(2)
    filt = LoFi(model, rb.Categorical(K), rank=2)
    pm, _ = filt.predict_obs(bel, x, method="probit")
    plug, _ = filt.predict_obs(bel, x, method="plugin")
    np.testing.assert_allclose(pm, plug, rtol=1e-12)
    logits = model.apply(theta, x)
    np.testing.assert_allclose(plug, np.exp(logits) / np.exp(logits).sum(), rtol=1e-12)


def test_probit_and_linearized_predictives_match_dense_formulas():  # T13, eqs 63-66
    rng = np.random.default_rng(15)
    K = 3
    model = small_mlp(2, 3, K)
    bel = random_dlr(rng, model.n_params, 2, scale=0.5)
    bel = bel.replace(mean=model.init_params(rng))
    x = rng.standard_normal(2)
    eta, J = model.value_and_jacobian(bel.mean, x)
    S = bel.covariance()
    s2 = np.diag(J @ S @ J.T)
    z = eta / np.sqrt(1 + np.pi * s2 / 8)
    pm, _ = LoFi(model, rb.Categorical(K), rank=2).predict_obs(bel, x, method="probit")
    np.testing.assert_allclose(pm, np.exp(z) / np.exp(z).sum(), rtol=1e-12)
    reg = small_mlp(2, 3, 2)
    belr = random_dlr(rng, reg.n_params, 2).replace(mean=reg.init_params(rng))
    Rn = random_spd(rng, 2)
    mean, cov = LoFi(reg, rb.Gaussian(Rn), rank=2).predict_obs(belr, x, method="linearized")
    eta, J = reg.value_and_jacobian(belr.mean, x)
    np.testing.assert_allclose(mean, eta, rtol=1e-14)
    close(cov, J @ belr.covariance() @ J.T + Rn, 1e-12)


@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 4), gamma=st.floats(0.7, 1.0), q=st.floats(0.0, 0.2), classify=st.booleans(), seed=seeds)
def test_full_rank_linearized_predictive_equals_ekf(T, gamma, q, classify, seed):  # T13
    rng = np.random.default_rng(seed)
    K = 3
    model = small_mlp(2, 2, K if classify else 2)
    lik = rb.Categorical(K) if classify else rb.Gaussian(0.3)
    X = rng.standard_normal((T, 2))
    Y = rng.integers(0, K, T) if classify else rng.standard_normal((T, 2))
    lo = LoFi(model, lik, rank=min(model.n_params, T * 2), gamma=gamma, q=q)
    ek = rb.FullEKF(model, lik, gamma=gamma, q=q)
    theta0 = model.init_params(rng)
    a, _ = lo.scan(lo.init(theta0, 0.7), X, Y)
    b, _ = ek.scan(ek.init(theta0, 0.7), X, Y)
    xt = rng.standard_normal(2)
    for method in ("linearized", "probit") if classify else ("linearized",):
        ma, ca = lo.predict_obs(lo.predict(a), xt, method=method)
        mb, cb = ek.predict_obs(ek.predict(b), xt, method=method)
        close(ma, mb, 1e-8)
        close(ca, cb, 1e-8)


def test_monte_carlo_predictives_run_on_dlr_beliefs():
    rng = np.random.default_rng(16)
    model = small_mlp(2, 3, 1)
    filt = LoFi(model, rb.Gaussian(0.1), rank=2)
    bel = filt.init(model.init_params(rng), 0.01)
    x = rng.standard_normal(2)
    m_lin, c_lin = filt.predict_obs(bel, x, method="linearized")
    n = 20000
    m_mc, c_mc = filt.predict_obs(bel, x, method="linearized-mc", rng=np.random.default_rng(1), n_samples=n)
    epi = c_lin - 0.1  # the linear map's variance
    assert abs(m_mc[0] - m_lin[0]) <= 6 * np.sqrt(epi[0, 0] / n)
    assert abs(c_mc[0, 0] - c_lin[0, 0]) <= 6 * epi[0, 0] * np.sqrt(2 / n)
    m, c = filt.predict_obs(bel, x, method="mc", rng=np.random.default_rng(2), n_samples=50)
    assert m.shape == (1,) and c.shape == (1, 1)


# ---------------------------------------------------------------------------------------------
# T14: truncation sanity (not exact)


def test_truncation_error_shrinks_with_rank():  # T14
    rng = np.random.default_rng(17)
    P, C, T = 16, 1, 30
    scales = np.linspace(2.0, 0.2, P)  # anisotropic inputs, so the rank matters
    Hs = rng.standard_normal((T, C, P)) * scales
    theta = rng.standard_normal(P)
    R = 0.5 * np.eye(C)
    ys = np.einsum("tcp,p->tc", Hs, theta) + rng.standard_normal((T, C)) * np.sqrt(0.5)
    kf = exact.kalman_filter(np.zeros(P), np.eye(P), Hs, ys, R, 0.98, 0.01)
    Xtest = rng.standard_normal((50, P)) * scales
    ref_var = np.einsum("np,pq,nq->n", Xtest, kf.covs[-1], Xtest)
    errs = []
    for L in (0, 2, 4, 8, 16):
        filt = LoFi(linear_model(P, C), rb.Gaussian(R), rank=L, gamma=0.98, q=0.01)
        bel, _ = filt.scan(filt.init(np.zeros(P), 1.0), Hs.reshape(T, -1), ys)
        var = np.diag(bel.project(Xtest))
        errs.append(np.mean(np.abs(var - ref_var) / ref_var))
        if L < P:
            assert np.max(np.abs(bel.mean - kf.means[-1])) > 1e-6  # truncation is an approximation
    assert all(a > b for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 1e-9


# ---------------------------------------------------------------------------------------------
# scale: P = 10^6 without a P x P matrix


def test_update_and_predict_at_a_million_parameters():
    rng = np.random.default_rng(18)
    P, L, C = 10**6, 10, 10
    bel = DLR(np.zeros(P), rng.uniform(0.5, 2.0, P), 0.01 * rng.standard_normal((P, L)))
    H = rng.standard_normal((C, P))
    e = rng.standard_normal(C)
    tracemalloc.start()
    t0 = time.perf_counter()
    upd = lofi.update(bel, H, np.eye(C), e)
    out = lofi.predict(upd, 0.99, 1e-4)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert out.W.shape == (P, L) and np.all(np.isfinite(out.mean))
    assert peak < 10 * P * (L + C) * 8  # linear in P; a P x P matrix would need 8e12 bytes
    assert elapsed < 60
    # diagonal exactness at this size, in O(P (L + C))
    close(upd.ups + linalg.rowsumsq(upd.W), bel.ups + linalg.rowsumsq(bel.W) + linalg.rowsumsq(H.T), 1e-12)


# ---------------------------------------------------------------------------------------------
# minibatches, scan, options


def test_minibatch_update_equals_full_ekf_batch_update():
    rng = np.random.default_rng(19)
    model = small_mlp(2, 3, 2)
    lik = rb.Gaussian(0.3)
    X, Y = rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    theta0 = model.init_params(rng)
    lo = LoFi(model, lik, rank=8)
    ek = rb.FullEKF(model, lik)
    a = lo.update_batch(lo.init(theta0, 0.5), X, Y)
    b = ek.update_batch(ek.init(theta0, 0.5), X, Y)
    close(a.mean, b.mean, 1e-9)
    close(a.precision(), b.precision(), 1e-9)
    # linear model: one batch equals the sequence of single updates
    P, C = 4, 2
    Hs, ys, R = linear_gaussian_stream(rng, 3, C, P)
    lin = LoFi(linear_model(P, C), rb.Gaussian(R), rank=2)
    bel0 = lin.init(np.zeros(P), 1.0)
    seq = bel0
    for H, y in zip(Hs, ys):
        seq = lin.update(seq, H.ravel(), y)
    mean, cov = exact.blr_posterior(np.zeros(P), np.eye(P), Hs, ys, R)
    batch = LoFi(linear_model(P, C), rb.Gaussian(R), rank=P).update_batch(bel0.replace(W=np.zeros((P, P))),
                                                                          Hs.reshape(3, -1), ys)
    close(batch.mean, mean, 1e-9)
    close(batch.covariance(), cov, 1e-9)


def test_scan_matches_a_hand_loop_and_leaves_inputs_untouched():
    rng = np.random.default_rng(20)
    model = small_mlp(3, 4, 2)
    filt = LoFi(model, rb.Gaussian(0.3), rank=3, gamma=0.95, q=0.01)
    X, Y = rng.standard_normal((7, 3)), rng.standard_normal((7, 2))
    bel0 = filt.init(model.init_params(rng), 0.5)
    before = (bel0.mean.copy(), bel0.ups.copy(), bel0.W.copy())
    bel = bel0
    for x, y in zip(X, Y):
        bel = filt.update(filt.predict(bel), x, y)
    out, hist = filt.scan(bel0, X, Y)
    np.testing.assert_array_equal(out.mean, bel.mean)
    np.testing.assert_array_equal(out.W, bel.W)
    assert hist["yhat"].shape == (7, 2)
    for a, b in zip(before, (bel0.mean, bel0.ups, bel0.W)):
        np.testing.assert_array_equal(a, b)
    assert isinstance(out, DLR) and not isinstance(out, LoFiBelief)


def test_inflation_formulas_against_dense_algebra():
    rng = np.random.default_rng(21)
    P, L, alpha = 6, 2, 0.3
    bel = random_dlr(rng, P, L)
    m0, eta0 = rng.standard_normal(P), rng.uniform(0.5, 2, P)
    a = alpha / (1 + alpha)
    Lam = bel.precision()
    simple = lofi.inflate(bel, alpha, "simple")
    close(simple.covariance(), (1 + alpha) * bel.covariance(), 1e-12)
    np.testing.assert_array_equal(simple.mean, bel.mean)
    bayes = lofi.inflate(bel, alpha, "bayesian", m0, eta0)
    Lam_b = Lam / (1 + alpha) + a * np.diag(eta0)
    close(bayes.precision(), Lam_b, 1e-12)
    close(bayes.mean, np.linalg.solve(Lam_b, Lam @ bel.mean / (1 + alpha) + a * eta0 * m0), 1e-11)
    hybrid = lofi.inflate(bel, alpha, "hybrid", m0, eta0)
    close(hybrid.precision(), Lam_b, 1e-12)
    np.testing.assert_array_equal(hybrid.mean, bel.mean)
    # spherical: eta0 = eta leaves eta unchanged under the Bayesian and hybrid forms (eqs 122-130)
    sph = spherical_belief(rng, P, L, 1.7)
    out = lofi.inflate(sph, alpha, "hybrid", sph.mean, np.full(P, 1.7))
    np.testing.assert_allclose(out.ups, 1.7, rtol=1e-15)
    close(out.W, sph.W / np.sqrt(1 + alpha), 1e-15)
    assert lofi.inflate(bel, 0.0, "bayesian", m0, eta0) is bel


def test_inflation_in_the_filter_tracks_the_latent_prior():
    rng = np.random.default_rng(22)
    model = small_mlp(2, 2, 1)
    lik = rb.Gaussian(0.5)
    X, Y = rng.standard_normal((5, 2)), rng.standard_normal((5, 1))
    theta0 = model.init_params(rng)
    g, q, alpha = 0.9, 0.05, 0.2
    filt = LoFi(model, lik, rank=2, gamma=g, q=q, inflation="bayesian", alpha=alpha)
    plain = LoFi(model, lik, rank=2, gamma=g, q=q)
    bel = filt.init(theta0, 0.5)
    ref = plain.init(theta0, 0.5)
    m0, e0 = theta0.copy(), np.full(model.n_params, 2.0)
    for x, y in zip(X, Y):
        ref = plain.update(lofi.predict(lofi.inflate(ref, alpha, "bayesian", m0, e0), g, q), x, y)
        m0, e0 = g * m0, e0 / (g**2 + q * e0)
        bel = filt.update(filt.predict(bel), x, y)
        close(bel.prior_mean, m0, 1e-14)
        close(bel.prior_prec, e0, 1e-14)
        close(bel.mean, ref.mean, 1e-12)
        close(bel.precision(), ref.precision(), 1e-12)
    zero = LoFi(model, lik, rank=2, gamma=g, q=q, inflation="simple", alpha=0.0)
    a, _ = zero.scan(zero.init(theta0, 0.5), X, Y)
    b, _ = plain.scan(plain.init(theta0, 0.5), X, Y)
    np.testing.assert_array_equal(a.mean, b.mean)


def test_adaptive_observation_noise_is_a_running_average():
    rng = np.random.default_rng(23)
    model = small_mlp(2, 3, 2)
    filt = LoFi(model, rb.Gaussian(0.7), rank=2, adaptive_obs_noise=True)
    X, Y = rng.standard_normal((6, 2)), 2.0 * rng.standard_normal((6, 2))
    bel = filt.init(model.init_params(rng), 0.5)
    assert bel.obs_var == 0.7 and bel.n_obs == 0
    sq = []
    for x, y in zip(X, Y):
        pred = filt.predict(bel)
        lin = rb.filters.base.linearize(model, filt.likelihood, pred.mean, x, y)
        ref = lofi.update(pred, lin.H, bel.obs_var * np.eye(2), lin.e, rank=2)  # R_t = r_{t-1} I
        bel = filt.update(pred, x, y)
        close(bel.mean, ref.mean, 1e-13)
        sq.append(np.sum((y - model.apply(bel.mean, x)) ** 2) / 2)
        assert bel.obs_var == pytest.approx(max(1e-6, np.mean(sq)), rel=1e-12)  # eq. 68
    out, _ = filt.scan(filt.init(model.init_params(np.random.default_rng(0)), 0.5), X, Y)
    assert out.n_obs == 6
    m, c = filt.predict_obs(out, X[0], method="plugin")
    np.testing.assert_allclose(c, out.obs_var * np.eye(2), rtol=1e-14)
    batch = filt.update_batch(filt.init(model.init_params(rng), 0.5), X[:3], Y[:3])
    assert batch.n_obs == 3


def test_spherical_filter_and_orth_option_run():
    rng = np.random.default_rng(24)
    model = small_mlp(2, 4, 3)
    X, Y = rng.standard_normal((10, 2)), rng.integers(0, 3, 10)
    for svd in ("svd", "orth"):
        filt = LoFi(model, rb.Categorical(3), rank=3, variant="spherical", gamma=0.99, q=1e-3, svd=svd)
        bel, _ = filt.scan(filt.init(model.init_params(rng), 1.0), X, Y, rng=np.random.default_rng(0))
        assert np.all(bel.ups == bel.ups[0])
        G = bel.W.T @ bel.W
        close(G - np.diag(np.diag(G)), np.zeros((3, 3)), 1e-10)


# ---------------------------------------------------------------------------------------------
# input checks


def test_bad_input_is_rejected_before_any_work():
    rng = np.random.default_rng(25)
    model = small_mlp(2, 2, 1)
    lik = rb.Gaussian(1.0)
    bel = random_dlr(rng, 4, 2)
    H, R, e = rng.standard_normal((1, 4)), np.eye(1), np.ones(1)
    with pytest.raises(ValueError, match="rank"):
        lofi.update(bel, H, R, e, rank=-1)
    with pytest.raises(TypeError, match="rank"):
        lofi.update(bel, H, R, e, rank=1.5)
    with pytest.raises(ValueError, match="svd"):
        lofi.update(bel, H, R, e, svd="eig")
    with pytest.raises(ValueError, match="H must have shape"):
        lofi.update(bel, rng.standard_normal((1, 5)), R, e)
    with pytest.raises(ValueError, match="NaN"):
        lofi.update(bel, H * np.nan, R, e)
    with pytest.raises(TypeError, match="DLR"):
        lofi.update(FullCov(np.zeros(4), np.eye(4)), H, R, e)
    with pytest.raises(ValueError, match="gamma"):
        lofi.predict(bel, 0.0, 0.1)
    with pytest.raises(ValueError, match="q"):
        lofi.predict(bel, 1.0, -0.1)
    with pytest.raises(ValueError, match="constant"):
        lofi.spherical_predict(bel, 1.0, 0.1)
    with pytest.raises(NotPositiveDefiniteError):
        lofi.update(bel, H, -np.eye(1), e)
    with pytest.raises(ValueError, match="variant"):
        LoFi(model, lik, variant="round")
    with pytest.raises(ValueError, match="spherical"):
        LoFi(model, lik, steady_state=True)
    with pytest.raises(ValueError, match="spherical"):
        LoFi(model, lik, svd="orth")
    with pytest.raises(ValueError, match="inflation"):
        LoFi(model, lik, alpha=0.1)
    with pytest.raises(ValueError, match="Gaussian"):
        LoFi(small_mlp(2, 2, 3), rb.Categorical(3), adaptive_obs_noise=True)
    with pytest.raises(ValueError, match="scalar"):
        LoFi(model, lik, variant="spherical", q=np.ones(model.n_params))
    filt = LoFi(model, lik, rank=2, variant="spherical")
    with pytest.raises(ValueError, match="prior_var"):
        filt.init(np.zeros(model.n_params), np.arange(1.0, model.n_params + 1))
    stateful = LoFi(model, lik, rank=2, adaptive_obs_noise=True)
    with pytest.raises(TypeError, match="LoFiBelief"):
        stateful.predict(DLR(np.zeros(model.n_params), np.ones(model.n_params), np.zeros((model.n_params, 2))))


def test_rank_above_the_parameter_count_is_clipped_to_it_with_a_warning():
    model = rb.MLP([1, 5, 1])  # P = 16
    with pytest.warns(UserWarning, match=r"rank = 1000 exceeds the number of parameters P = 16; using rank 16"):
        filt = rb.LoFi(model, rb.Gaussian(0.1), rank=1000)
    assert filt.rank == 16 and filt.init(np.zeros(16)).W.shape == (16, 16)
    assert rb.LoFi(model, rb.Gaussian(0.1), rank=16).rank == 16
