"""Bong filter: all 76 combinations, names, options, input checks, predict steps, scale."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes.beliefs import DLR, Diag, FullCov
from refbayes.errors import NotPositiveDefiniteError
from refbayes.filters.bong import COMBINATIONS, Bong, format_name, parse_name

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
seed_st = st.integers(0, 2**31 - 1)
TYPES = {"full-moment": FullCov, "full": FullCov, "diag-moment": Diag, "diag": Diag, "dlr": DLR}


def options(algorithm, family, estimator, lr=0.01):
    return dict(algorithm=algorithm, family=family, estimator=estimator,
                lr=None if algorithm == "bong" else lr, n_iter=2 if algorithm in ("blr", "bbb") else 1,
                n_samples=2, rank=2, n_probes=3)


def test_grid_has_76_combinations():
    assert len(COMBINATIONS) == 76 == len(set(COMBINATIONS))
    assert not any(f == "dlr" and e == "mc-hess" for _, f, e in COMBINATIONS)


@pytest.mark.parametrize("algorithm,family,estimator", COMBINATIONS)
def test_every_combination_runs_one_step_on_an_mlp(algorithm, family, estimator):
    rng = np.random.default_rng(0)
    model = rb.MLP([2, 3, 1], activation="tanh")
    filt = Bong(model, rb.Gaussian(1.0), gamma=0.99, q=1e-3, **options(algorithm, family, estimator))
    bel = filt.init(model.init_params(rng), 0.1)
    new = filt.update(filt.predict(bel), np.array([0.3, -0.2]), np.array([0.5]), rng=np.random.default_rng(1))
    assert type(new) is TYPES[family]
    assert new.mean.shape == (model.n_params,)
    assert np.all(np.isfinite(new.mean)) and np.all(np.isfinite(new.marginal_variance()))
    assert np.all(new.marginal_variance() > 0)
    if family == "dlr":
        assert new.rank == 2
    assert not np.array_equal(new.mean, bel.mean)


@pytest.mark.parametrize("algorithm,family,estimator", [c for c in COMBINATIONS if c[2] != "mc-hess"])
def test_every_combination_classifies(algorithm, family, estimator):
    rng = np.random.default_rng(2)
    model = rb.MLP([2, 3, 3])
    filt = Bong(model, rb.Categorical(3), **options(algorithm, family, estimator))
    bel, hist = filt.scan(filt.init(model.init_params(rng), 0.1), rng.standard_normal((2, 2)), [0, 2],
                          rng=np.random.default_rng(3))
    assert hist["yhat"].shape == (2, 2)
    assert np.all(np.isfinite(bel.mean))


@pytest.mark.parametrize("algorithm,family,estimator", COMBINATIONS)
def test_o8_static_linear_gaussian_stays_finite_and_symmetric(algorithm, family, estimator):
    rng = np.random.default_rng(4)
    model = rb.Linear(2, 1)
    X = rng.standard_normal((5, 2))
    Y = X @ np.array([1.0, -0.5]) + 0.1 * rng.standard_normal(5)
    # moment updates subtract (paper Sec. E.2, E.4): keep prior variance well below the noise
    filt = Bong(model, rb.Gaussian(4.0), **options(algorithm, family, estimator, lr=0.005))
    bel, _ = filt.scan(filt.init(np.zeros(3), 0.05), X, Y[:, None], rng=np.random.default_rng(5))
    assert np.all(np.isfinite(bel.mean))
    cov = bel.covariance()
    assert np.array_equal(cov, cov.T) or np.allclose(cov, cov.T, rtol=1e-13, atol=0)
    assert np.all(np.linalg.eigvalsh(cov) > 0)


@pytest.mark.parametrize("alg", [("bong", None), ("blr", 1.0), ("blr", 0.3)], ids=["bong", "blr-1", "blr-0.3"])
@pytest.mark.parametrize("estimator", ["lin-hess", "lin-ef", "mc-ef"])
@pytest.mark.parametrize("family", ["full", "diag", "dlr"])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # 27 cases, 2 draws each
@given(seed=seed_st)
def test_o8_natural_updates_keep_positive_definiteness(family, estimator, alg, seed):
    # G <= 0 for these estimators: BONG adds a PSD term; BLR (alpha <= 1) mixes PD terms.
    rng = np.random.default_rng(seed)
    model = rb.MLP([2, 4, 1])
    filt = Bong(model, rb.Gaussian(0.01), family=family, estimator=estimator, algorithm=alg[0], lr=alg[1],
                n_iter=1 if alg[0] == "bong" else 3, rank=2, n_samples=3)
    bel, _ = filt.scan(filt.init(model.init_params(rng), 5.0), 3 * rng.standard_normal((4, 2)),
                       3 * rng.standard_normal((4, 1)), rng=rng)
    assert np.all(np.linalg.eigvalsh(bel.precision()) > 0)


def test_o8_bog_full_moment_mean_ignores_covariance():
    rng = np.random.default_rng(6)
    model = rb.MLP([2, 3, 1])
    mu = model.init_params(rng)
    filt = Bong(model, rb.Gaussian(4.0), algorithm="bog", family="full-moment", estimator="lin-hess", lr=0.01)
    x, y = rng.standard_normal(2), np.array([0.3])
    a = filt.update(FullCov(mu, 0.1 * np.eye(model.n_params)), x, y)
    b = filt.update(FullCov(mu, np.diag(rng.uniform(0.01, 0.2, model.n_params))), x, y)
    assert np.array_equal(a.mean, b.mean)


# ------------------------------------------------------------------------------------------
# names


@pytest.mark.parametrize("algorithm,family,estimator", COMBINATIONS)
def test_names_round_trip(algorithm, family, estimator):
    rank = 10 if family == "dlr" else None
    M = 100 if estimator.startswith("mc") else None
    name = format_name(algorithm, family, estimator, rank=rank, n_samples=M)
    opts = parse_name(name)
    assert (opts["algorithm"], opts["family"], opts["estimator"]) == (algorithm, family, estimator)
    assert opts.get("rank") == rank and opts.get("n_samples") == M
    if estimator in ("lin-hess", "mc-ef"):
        short = format_name(algorithm, family, estimator, style="short")
        assert parse_name(short) == {"algorithm": algorithm, "family": family, "estimator": estimator}
    filt = Bong.from_name(rb.Linear(10, 1), rb.Gaussian(1.0), name, lr=None if algorithm == "bong" else 0.1,
                          rank=rank if rank is not None else 10)
    assert filt.name == name


@pytest.mark.parametrize("name,expected", [
    ("bong-dlr10-hess_lin", dict(algorithm="bong", family="dlr", rank=10, estimator="lin-hess")),
    ("blr-dlr10-ef_mc100", dict(algorithm="blr", family="dlr", rank=10, estimator="mc-ef", n_samples=100)),
    ("bong-diag_mom-ef_lin", dict(algorithm="bong", family="diag-moment", estimator="lin-ef")),
    ("bong-diag-ef_mc100", dict(algorithm="bong", family="diag", estimator="mc-ef", n_samples=100)),
    ("bog-fc-hess_mc10", dict(algorithm="bog", family="full", estimator="mc-hess", n_samples=10)),
    ("bbb-fc_mom-hess_lin", dict(algorithm="bbb", family="full-moment", estimator="lin-hess")),
    ("dlrg-l-bong", dict(algorithm="bong", family="dlr", estimator="lin-hess")),
    ("dg-rep-l-blr", dict(algorithm="blr", family="diag-moment", estimator="lin-hess")),
    ("fg_rep_bong", dict(algorithm="bong", family="full-moment", estimator="mc-ef")),
    ("fg-bbb", dict(algorithm="bbb", family="full", estimator="mc-ef")),
])
def test_paper_names(name, expected):
    assert parse_name(name) == expected


@pytest.mark.parametrize("bad", ["bong-dlr10-hess_mc100", "dlrg-rep-bong", "bong", "bong-fc-hess", "xyz-fc-ef_lin"])
def test_bad_names(bad):
    with pytest.raises(ValueError):
        parse_name(bad)


def test_from_name_rejects_contradictions():
    with pytest.raises(ValueError, match="contradicts"):
        Bong.from_name(rb.Linear(1, 1), rb.Gaussian(1.0), "bong-dlr10-hess_lin", rank=5)


# ------------------------------------------------------------------------------------------
# input checks: clear errors before any work


@pytest.mark.parametrize("kw,err,match", [
    (dict(family="dlr", estimator="mc-hess"), ValueError, "undefined"),
    (dict(algorithm="bong", n_iter=2), ValueError, "n_iter"),
    (dict(algorithm="bog", lr=0.1, n_iter=3), ValueError, "n_iter"),
    (dict(algorithm="blr"), ValueError, "lr is required"),
    (dict(algorithm="bong", lr=0.5), ValueError, "no learning rate"),
    (dict(algorithm="blr", family="dlr", lr=1.5), ValueError, "lr must be <= 1"),
    (dict(algorithm="bbb", lr=-1.0), ValueError, "lr"),
    (dict(family="dlr", rank=-1), ValueError, "rank"),
    (dict(family="dlr", rank=1.5), TypeError, "rank"),
    (dict(algorithm="sgd"), ValueError, "algorithm"),
    (dict(family="kron"), ValueError, "family"),
    (dict(estimator="mc"), ValueError, "estimator"),
    (dict(estimator="mc-ef", n_samples=0), ValueError, "n_samples"),
    (dict(estimator="mc-ef", n_samples=3, antithetic=True), ValueError, "even"),
    (dict(family="diag-moment", vd_mean="ekf"), ValueError, "vd_mean"),
    (dict(family="diag", vd_mean="fullgain"), ValueError, "vd_mean"),
    (dict(rng=0), TypeError, "rng"),
    (dict(dynamics="ou"), ValueError, "ou_mean"),
    (dict(dynamics="ou", ou_mean=np.zeros(2), ou_var=1.0, q=0.1), ValueError, "q must be 0"),
    (dict(dynamics="ou", ou_mean=np.zeros(2), ou_var=1.0, gamma=1.2), ValueError, "gamma"),
    (dict(dynamics="ou", ou_mean=np.zeros(3), ou_var=1.0, gamma=0.9), ValueError, "ou_mean"),
    (dict(ou_mean=np.zeros(2)), ValueError, "only used"),
])
def test_constructor_checks(kw, err, match):
    with pytest.raises(err, match=match):
        Bong(rb.Linear(1, 1), rb.Gaussian(1.0), **kw)


def test_update_checks_and_leaves_the_belief_intact():
    model = rb.MLP([2, 3, 1])
    filt = Bong(model, rb.Gaussian(1.0), family="dlr", rank=2, estimator="mc-ef", n_samples=2)
    bel = filt.init(np.zeros(model.n_params), 1.0)
    before = (bel.mean.copy(), bel.ups.copy(), bel.W.copy())
    with pytest.raises(TypeError, match="rng"):
        filt.update(bel, np.zeros(2), np.array([1.0]))
    with pytest.raises(ValueError, match="x"):
        filt.update(bel, np.zeros(3), np.array([1.0]), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="inf"):  # (NaN is a missing component: tests/test_missing_bong.py)
        filt.update(bel, np.zeros(2), np.array([np.inf]), rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="DLR"):
        filt.update(Diag(np.zeros(model.n_params), np.ones(model.n_params)), np.zeros(2), np.array([1.0]))
    with pytest.raises(ValueError, match="rank"):
        filt.update(DLR(np.zeros(model.n_params), np.ones(model.n_params), np.zeros((model.n_params, 1))),
                    np.zeros(2), np.array([1.0]), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="Y"):
        filt.scan(bel, np.zeros((3, 2)), np.zeros((2, 1)), rng=np.random.default_rng(0))
    new = filt.update(bel, np.ones(2), np.array([1.0]), rng=np.random.default_rng(0))
    assert not np.array_equal(new.mean, bel.mean)
    assert all(np.array_equal(a, b) for a, b in zip(before, (bel.mean, bel.ups, bel.W)))


def test_moment_update_that_loses_positivity_raises_instead_of_nan():
    model = rb.Linear(1, 1, bias=False)
    filt = Bong(model, rb.Gaussian(0.01), family="diag-moment", estimator="lin-hess")
    with pytest.raises(NotPositiveDefiniteError, match="variance"):
        filt.update(filt.init(np.zeros(1), 1.0), np.array([1.0]), np.array([0.0]))
    filt = Bong(model, rb.Gaussian(0.01), family="full-moment", estimator="lin-hess")
    with pytest.raises(NotPositiveDefiniteError):
        filt.update(filt.init(np.zeros(1), 1.0), np.array([1.0]), np.array([0.0]))


def test_rng_sources_are_equivalent_and_reproducible():
    rng = np.random.default_rng(7)
    model = rb.MLP([2, 3, 1])
    mu = model.init_params(rng)
    X, Y = rng.standard_normal((3, 2)), rng.standard_normal((3, 1))
    kw = dict(algorithm="blr", lr=0.5, n_iter=2, family="diag", estimator="mc-hess", n_samples=2, n_probes=4)
    with pytest.warns(DeprecationWarning, match="rng"):  # the deprecated stored generator still works
        a = Bong(model, rb.Gaussian(1.0), rng=np.random.default_rng(1), **kw)
    b = Bong(model, rb.Gaussian(1.0), **kw)
    ba, _ = a.scan(a.init(mu, 0.3), X, Y)
    bb, _ = b.scan(b.init(mu, 0.3), X, Y, rng=np.random.default_rng(1))
    assert np.array_equal(ba.mean, bb.mean) and np.array_equal(ba.var, bb.var)


def test_lin_filters_work_through_the_base_update_path():
    rng = np.random.default_rng(8)
    model = rb.MLP([2, 3, 1])
    filt = Bong(model, rb.Gaussian(0.5), family="dlr", rank=1, estimator="lin-hess")
    bel = filt.init(model.init_params(rng), 0.5)
    x, y = rng.standard_normal(2), np.array([0.2])
    via_lin = filt._update(bel, filt.linearize(bel, x, y))
    direct = filt.update(bel, x, y)
    assert np.array_equal(via_lin.mean, direct.mean) and np.array_equal(via_lin.ups, direct.ups)
    mc = Bong(model, rb.Gaussian(0.5), family="dlr", rank=1, estimator="mc-ef")
    with pytest.raises(NotImplementedError, match="update"):
        mc._update(bel, filt.linearize(bel, x, y))


# ------------------------------------------------------------------------------------------
# predict steps (spec eqs 1-4)


@pytest.mark.parametrize("family", ["full-moment", "full", "diag-moment", "diag", "dlr"])
def test_predict_matches_dense_dynamics(family):
    rng = np.random.default_rng(9)
    model = rb.MLP([2, 2, 1])
    P = model.n_params
    q = rng.uniform(0, 0.1, P)
    filt = Bong(model, rb.Gaussian(5.0), family=family, estimator="lin-hess", rank=2, gamma=0.9, q=q)
    bel = filt.update(filt.init(model.init_params(rng), rng.uniform(0.1, 0.3, P)), rng.standard_normal(2), [0.4])
    out = filt.predict(bel)
    assert np.allclose(out.mean, 0.9 * bel.mean, rtol=1e-14)
    assert np.allclose(out.covariance(), 0.81 * bel.covariance() + np.diag(q), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("family", ["full-moment", "full", "diag-moment", "diag", "dlr"])
def test_ou_dynamics_revert_to_the_anchor(family):
    rng = np.random.default_rng(10)
    model = rb.MLP([2, 2, 1])
    P = model.n_params
    mu0, var0 = rng.standard_normal(P), rng.uniform(0.1, 0.3, P)
    gamma = 0.8
    filt = Bong(model, rb.Gaussian(5.0), family=family, estimator="lin-hess", rank=2, gamma=gamma,
                dynamics="ou", ou_mean=mu0, ou_var=var0)
    # stationary at the anchor N(mu0, diag(var0))
    anchor = filt.init(mu0, var0)
    out = filt.predict(anchor)
    assert np.allclose(out.mean, mu0, rtol=1e-14)
    assert np.allclose(out.covariance(), np.diag(var0), rtol=1e-9, atol=1e-14)
    # general belief: mu_p = gamma mu + (1 - gamma) mu0, Sigma_p = gamma^2 Sigma + (1 - gamma^2) Sigma0
    bel = filt.update(anchor, rng.standard_normal(2), [1.0])
    out = filt.predict(bel)
    assert np.allclose(out.mean, gamma * bel.mean + (1 - gamma) * mu0, rtol=1e-13)
    assert np.allclose(out.covariance(), gamma**2 * bel.covariance() + (1 - gamma**2) * np.diag(var0),
                       rtol=1e-9, atol=1e-14)


# ------------------------------------------------------------------------------------------
# predictives and samplers


@pytest.mark.parametrize("family", ["full", "diag-moment", "dlr"])
def test_linearized_predictive_uses_the_belief_covariance(family):
    rng = np.random.default_rng(11)
    model = rb.MLP([2, 3, 2])
    lik = rb.Gaussian(0.3)
    filt = Bong(model, lik, family=family, estimator="lin-hess", rank=2)
    bel = filt.update(filt.init(model.init_params(rng), 0.2), rng.standard_normal(2), rng.standard_normal(2))
    x = rng.standard_normal(2)
    mean, cov = filt.predict_obs(bel, x, method="linearized")
    J = model.jacobian(bel.mean, x)
    assert np.allclose(mean, model.apply(bel.mean, x), rtol=1e-14)
    assert np.allclose(cov, J @ bel.covariance() @ J.T + 0.3 * np.eye(2), rtol=1e-9)
    m_mc, _ = filt.predict_obs(bel, x, method="mc", rng=np.random.default_rng(0), n_samples=50)
    assert m_mc.shape == (2,) and np.all(np.isfinite(m_mc))


@pytest.mark.parametrize("family", ["full-moment", "diag-moment", "dlr"])
def test_family_samplers_have_the_belief_moments(family):
    rng = np.random.default_rng(12)
    model = rb.MLP([2, 2, 1])
    filt = Bong(model, rb.Gaussian(5.0), family=family, estimator="lin-hess", rank=2)
    bel = filt.update(filt.init(model.init_params(rng), rng.uniform(0.1, 0.3, model.n_params)),
                      rng.standard_normal(2), [1.0])
    N = 20000
    draws = bel.sample(np.random.default_rng(1), N)
    sd = np.sqrt(bel.marginal_variance())
    assert np.all(np.abs(draws.mean(0) - bel.mean) <= 6 * sd / np.sqrt(N))
    # sample variance: standard error of s^2 for Gaussian data is sigma^2 sqrt(2 / (N - 1))
    assert np.all(np.abs(draws.var(0, ddof=1) - sd**2) <= 6 * sd**2 * np.sqrt(2 / (N - 1)))


# ------------------------------------------------------------------------------------------
# scale: diagonal and DLR paths never build a P x P matrix


@pytest.mark.parametrize("family", ["diag-moment", "diag", "dlr"])
@pytest.mark.parametrize("algorithm", ["bong", "blr", "bog", "bbb"])
def test_million_parameters(family, algorithm):
    P = 1_000_000
    rng = np.random.default_rng(13)
    model = rb.Linear(P - 1, 1)
    x = rng.standard_normal(P - 1) / np.sqrt(P)
    filt = Bong(model, rb.Gaussian(10.0), algorithm=algorithm, family=family, estimator="lin-hess", rank=2,
                lr=None if algorithm == "bong" else 0.5, gamma=0.999, q=1e-6)
    bel = filt.predict(filt.init(np.zeros(P), 0.1))
    new = filt.update(bel, x, np.array([1.0]))
    assert new.mean.shape == (P,) and np.all(np.isfinite(new.mean))
    assert np.abs(new.mean).max() > 0


def test_dlr_rank_above_the_parameter_count_is_clipped_to_it_with_a_warning():
    model = rb.MLP([1, 5, 1])  # P = 16
    with pytest.warns(UserWarning, match=r"rank = 1000 exceeds the number of parameters P = 16; using rank 16"):
        filt = rb.Bong(model, rb.Gaussian(0.1), family="dlr", rank=1000)
    assert filt.rank == 16 and filt.init(np.zeros(16)).W.shape == (16, 16)
