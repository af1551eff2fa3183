"""Bong(..., backend="numba") gives the NumPy reference's numbers (float64, rtol 1e-10).

Every (algorithm, family, estimator) with family "diag-moment", "diag" or "dlr" is run on
both backends from the same belief with the same seed, for an MLP and a Linear model with
Gaussian (scalar, vector noise) and categorical ("drop_last", "full") likelihoods. A DLR
factor W is defined up to a right orthogonal factor, so W W^T is compared.

After a BONG/BLR projection the two backends hold the same belief with W's columns signed
differently (two SVD routes); the DLR sampler (refbayes.linalg.dlr_sample) takes its draw for
W's columns signed by ``column_signs``, so the Monte Carlo combinations, too, are compared over
whole scans.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes.beliefs import DLR, Diag
from refbayes.errors import NotPositiveDefiniteError
from refbayes.filters.bong import COMBINATIONS, algorithms
from refbayes.filters.bong import estimators as est
from refbayes.filters.bong.estimators import Curvature
from refbayes.kernels.cpu import bong as kb
from problems import close, same_belief

SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KERNEL_FAMILIES = ("diag-moment", "diag", "dlr")
KERNEL_COMBOS = [c for c in COMBINATIONS if c[1] in KERNEL_FAMILIES]
seeds = st.integers(0, 2**32 - 1)


# ------------------------------------------------------------------------------------------
# problems


@st.composite
def problems(draw):
    """A model, a likelihood, 4 observations and a random (non-trivial) prior."""
    rng = np.random.default_rng(draw(seeds))
    in_dim = draw(st.integers(1, 3))
    task = draw(st.sampled_from(["gaussian", "gaussian-vector", "drop_last", "full"]))
    C = draw(st.integers(1, 2)) if task.startswith("gaussian") else draw(st.integers(2, 4))
    if draw(st.booleans()):
        model = rb.MLP([in_dim, draw(st.integers(1, 4)), C], activation=draw(st.sampled_from(["tanh", "relu"])))
    else:
        model = rb.Linear(in_dim, C)
    if task == "gaussian":
        lik = rb.Gaussian(float(rng.uniform(0.2, 1.0)))
    elif task == "gaussian-vector":
        lik = rb.Gaussian(rng.uniform(0.2, 1.0, C))
    else:
        lik = rb.Categorical(C, mode=task)
    X = rng.standard_normal((4, in_dim))
    Y = rng.standard_normal((4, C)) if task.startswith("gaussian") else rng.integers(0, C, 4)
    P = model.n_params
    return {
        "model": model, "lik": lik, "X": X, "Y": Y, "rng": rng, "P": P,
        # P < rank + C happens for the small Linear models; a rank above P is clipped to P by the filter
        "rank": draw(st.integers(0, min(4, P))),
        "mean": 0.5 * rng.standard_normal(P),
        "seed": draw(seeds),
    }


def prior(pb, family, rank):
    rng = pb["rng"]
    P = pb["P"]
    if family == "dlr":
        return DLR(pb["mean"], rng.uniform(1.0, 4.0, P), 0.4 * rng.standard_normal((P, rank)))
    return Diag(pb["mean"], rng.uniform(0.05, 0.5, P))


def options(algorithm, family, estimator, pb, n_iter):
    kw = dict(algorithm=algorithm, family=family, estimator=estimator, rank=pb["rank"], n_samples=3,
              n_probes=2, gamma=0.9, q=1e-3)
    if algorithm == "blr":
        kw.update(lr=0.6 if family == "dlr" else 0.5, n_iter=n_iter)
    elif algorithm == "bbb":
        kw.update(lr=0.02, n_iter=n_iter)
    elif algorithm == "bog":
        kw.update(lr=0.02)
    return kw


def pair(pb, **kw):
    return [rb.Bong(pb["model"], pb["lik"], backend=b, **kw) for b in ("numpy", "numba")]


def run_both(fn, ref_arg, out_arg):
    """(fn(ref_arg), fn(out_arg)); a numerical failure of the reference must be one of the kernels too."""
    try:
        ref = fn(ref_arg)
    except NotPositiveDefiniteError:
        with pytest.raises(NotPositiveDefiniteError):
            fn(out_arg)
        return None, None
    return ref, fn(out_arg)


# ------------------------------------------------------------------------------------------
# every combination


@pytest.mark.parametrize("combo", KERNEL_COMBOS, ids=["-".join(c) for c in KERNEL_COMBOS])
@SETTINGS
@given(pb=problems(), n_iter=st.integers(2, 3))
def test_numba_update_equals_reference(combo, pb, n_iter):
    algorithm, family, estimator = combo
    fnp, fnb = pair(pb, **options(algorithm, family, estimator, pb, n_iter))
    assert fnb.kernels.__name__ == "refbayes.kernels.cpu"
    bel = prior(pb, family, pb["rank"])
    seed = pb["seed"]
    x, y = pb["X"][0], pb["Y"][0]

    def one(f):
        return f.update(bel, x, y, rng=np.random.default_rng(seed))

    ref, out = run_both(one, fnp, fnb)
    if ref is not None:
        same_belief(out, ref)

    def batch(f):
        return f.update_batch(bel, pb["X"][:2], pb["Y"][:2], rng=np.random.default_rng(seed))

    ref, out = run_both(batch, fnp, fnb)
    if ref is not None:
        same_belief(out, ref)

    def scan(f):
        return f.scan(bel, pb["X"][1:], pb["Y"][1:], rng=np.random.default_rng(seed))

    ref, out = run_both(scan, fnp, fnb)
    if ref is not None:
        same_belief(out[0], ref[0])
        close(out[1]["yhat"], ref[1]["yhat"])


@pytest.mark.parametrize("combo", [c for c in KERNEL_COMBOS if c[1] == "dlr" and c[0] == "blr"],
                         ids=lambda c: c[2])
@SETTINGS
@given(pb=problems())
def test_numba_blr_inner_iterations_equal_reference(combo, pb):
    # BLR's later inner iterations (cur != prior): each step from the reference's iterate
    algorithm, family, estimator = combo
    fnp, fnb = pair(pb, **options(algorithm, family, estimator, pb, 3))
    prior_bel = prior(pb, family, pb["rank"])
    rng = np.random.default_rng(pb["seed"])
    cur = prior_bel
    xs, ys = [pb["X"][0]], [pb["Y"][0]]
    for _ in range(3):
        e = fnp.estimate(cur, xs, ys, rng=rng)
        ref = fnp.step(cur, prior_bel, e)
        same_belief(fnb.step(cur, prior_bel, e), ref)
        cur = ref


@pytest.mark.parametrize("family, hess_diag", [("diag-moment", "hutchinson"), ("diag", "exact"),
                                               ("diag", "vdekf_mean")])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pb=problems())
def test_numba_mc_hess_and_vdekf_mean_equal_reference(family, hess_diag, pb):
    if hess_diag == "vdekf_mean":  # the full-gain mean of natural-diagonal BONG (a factor estimator)
        fnp, fnb = pair(pb, algorithm="bong", family="diag", estimator="lin-hess", vd_mean="ekf")
        bel = prior(pb, "diag", 0)
    else:
        fnp, fnb = pair(pb, algorithm="blr", family=family, estimator="mc-hess", lr=0.3, n_iter=2,
                        hess_diag=hess_diag, n_probes=2, n_samples=2)
        bel = prior(pb, family, 0)
    ref, out = run_both(lambda f: f.scan(bel, pb["X"][:2], pb["Y"][:2], rng=np.random.default_rng(pb["seed"])),
                        fnp, fnb)
    if ref is not None:
        same_belief(out[0], ref[0])


# ------------------------------------------------------------------------------------------
# dynamics


@pytest.mark.parametrize("dynamics", ["scalar-q", "vector-q", "ou"])
@settings(max_examples=10, deadline=None)
@given(P=st.integers(1, 40), rank=st.integers(0, 5), gamma=st.floats(0.3, 0.999), seed=seeds)
def test_numba_dlr_predict_equals_reference(dynamics, P, rank, gamma, seed):
    rank = min(rank, P)  # a filter clips a rank above P to P
    rng = np.random.default_rng(seed)
    model = rb.Function(lambda th, x: th[:1] * x, n_params=P, out_dim=1, in_dim=1)
    kw = dict(family="dlr", rank=rank, gamma=gamma)
    if dynamics == "scalar-q":
        kw["q"] = float(rng.uniform(0.01, 1.0))
    elif dynamics == "vector-q":
        kw["q"] = rng.uniform(0.0, 1.0, P)
    else:
        kw.update(dynamics="ou", ou_mean=rng.standard_normal(P), ou_var=rng.uniform(0.1, 2.0, P))
    fnp, fnb = (rb.Bong(model, rb.Gaussian(1.0), backend=b, **kw) for b in ("numpy", "numba"))
    bel = DLR(rng.standard_normal(P), rng.uniform(0.2, 3.0, P), rng.standard_normal((P, rank)))
    same_belief(fnb.predict(bel), fnp.predict(bel))


# ------------------------------------------------------------------------------------------
# estimates: g = U coef, and the fast whitening


@pytest.mark.parametrize("task", ["gaussian", "drop_last", "full"])
@settings(max_examples=10, deadline=None)
@given(P=st.integers(1, 30), C=st.integers(2, 4), n=st.integers(1, 3), seed=seeds)
def test_estimates_carry_coefficients_of_g_in_the_factor(task, P, C, n, seed):
    rng = np.random.default_rng(seed)
    model = rb.Linear(P, C, bias=False)
    lik = rb.Gaussian(rng.uniform(0.2, 1.0, C)) if task == "gaussian" else rb.Categorical(C, mode=task)
    theta = rng.standard_normal(model.n_params)
    X = rng.standard_normal((n, P))
    Y = rng.standard_normal((n, C)) if task == "gaussian" else rng.integers(0, C, n)
    for name in ("lin-hess", "lin-ef", "mc-ef"):
        for fast in (False, True):
            e = est.estimate(name, model, lik, Diag(theta, np.full(model.n_params, 0.3)), list(X), list(Y),
                             rng=np.random.default_rng(seed), n_samples=3, fast=fast)
            U = e.curvature.factor()
            close(U @ e.coef, e.g, 1e-12)
            if fast:  # the same estimate as the reference's whitening
                ref = est.estimate(name, model, lik, Diag(theta, np.full(model.n_params, 0.3)), list(X), list(Y),
                                   rng=np.random.default_rng(seed), n_samples=3)
                close(e.g, ref.g)
                close(U @ U.T, ref.curvature.factor() @ ref.curvature.factor().T)


# ------------------------------------------------------------------------------------------
# the kernels directly (independent of the filter class)


@pytest.mark.parametrize("family", ["diag-natural", "diag"])
@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS)
@settings(max_examples=10, deadline=None)
@given(P=st.integers(1, 50), K=st.integers(0, 4), factor=st.booleans(), seed=seeds)
def test_diag_step_kernel_equals_reference_step(family, algorithm, P, K, factor, seed):
    rng = np.random.default_rng(seed)
    cur = Diag(rng.standard_normal(P), rng.uniform(0.1, 1.0, P))
    pri = Diag(rng.standard_normal(P), rng.uniform(0.1, 1.0, P))
    g = rng.standard_normal(P)
    U = 0.5 * rng.standard_normal((P, K))
    curv = Curvature.from_factor(U) if factor else Curvature.from_diag(-rng.uniform(0, 1, P))
    alpha = 0.05
    kw = {"U": U} if factor else {"d": curv.data}
    ref, out = run_both(lambda f: f(), lambda: algorithms.STEPS[(family, algorithm)](cur, pri, g, curv, alpha),
                        lambda: kb.diag_step(family, algorithm, cur.mean, cur.var, pri.mean, pri.var, g,
                                             alpha=alpha, **kw))
    if ref is not None:
        close(out[0], ref.mean)
        close(out[1], ref.var)


@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS)
@pytest.mark.parametrize("with_coef", [True, False])
@settings(max_examples=10, deadline=None)
@given(P=st.integers(1, 40), R=st.integers(0, 4), K=st.integers(1, 4), seed=seeds)
def test_dlr_step_kernels_equal_reference_steps(algorithm, with_coef, P, R, K, seed):
    rng = np.random.default_rng(seed)
    cur = DLR(rng.standard_normal(P), rng.uniform(1.0, 3.0, P), 0.5 * rng.standard_normal((P, R)))
    pri = DLR(rng.standard_normal(P), rng.uniform(1.0, 3.0, P), 0.5 * rng.standard_normal((P, R)))
    U = 0.5 * rng.standard_normal((P, K))
    coef = rng.standard_normal(K)
    g = U @ coef
    alpha = {"bong": 1.0, "blr": 0.7, "bog": 0.1, "bbb": 0.1}[algorithm]
    ref = algorithms.STEPS[("dlr", algorithm)](cur, pri, g, Curvature.from_factor(U), alpha)
    c = coef if with_coef else None
    if algorithm == "bong":
        out = kb.dlr_bong(pri.mean, pri.ups, pri.W, U, g, coef=c, alpha=alpha)
    elif algorithm == "blr":
        out = kb.dlr_blr(cur.mean, cur.ups, cur.W, pri.mean, pri.ups, pri.W, U, g, coef=c, alpha=alpha)
    elif algorithm == "bog":
        out = kb.dlr_bog(pri.mean, pri.ups, pri.W, U, g, alpha)
    else:
        out = kb.dlr_bbb(cur.mean, cur.ups, cur.W, pri.mean, pri.ups, pri.W, U, g, alpha)
    same_belief(DLR(*out), ref)


def test_dlr_bong_kernel_is_the_dense_posterior_then_the_projection():  # oracle independent of the reference
    rng = np.random.default_rng(3)
    P, R, K = 7, 2, 3
    mu, ups, W = rng.standard_normal(P), rng.uniform(1, 2, P), rng.standard_normal((P, R))
    U, g = rng.standard_normal((P, K)), rng.standard_normal(P)
    m, u, Wn = kb.dlr_bong(mu, ups, W, U, g)
    Wtil = np.hstack([W, U])
    close(m, mu + np.linalg.solve(np.diag(ups) + Wtil @ Wtil.T, g), 1e-12)
    lam, V = np.linalg.eigh(Wtil @ Wtil.T)
    top = (V[:, -R:] * lam[-R:]) @ V[:, -R:].T  # best rank-R part of W~ W~^T
    close(Wn @ Wn.T, top, 1e-12)
    close(u + np.diag(Wn @ Wn.T), ups + np.diag(Wtil @ Wtil.T), 1e-12)  # the diagonal is kept (eq. 286)


def test_kernel_bad_input_is_rejected_and_inputs_are_untouched():
    rng = np.random.default_rng(0)
    P = 6
    m, v, g, U = rng.standard_normal(P), rng.uniform(0.1, 1, P), rng.standard_normal(P), rng.standard_normal((P, 2))
    W = rng.standard_normal((P, 2))
    copies = [a.copy() for a in (m, v, g, U, W)]
    with pytest.raises(ValueError, match="family, algorithm"):
        kb.diag_step("full", "bong", m, v, m, v, g, U=U)
    with pytest.raises(TypeError, match="exactly one"):
        kb.diag_step("diag", "bong", m, v, m, v, g)
    with pytest.raises(TypeError, match="exactly one"):
        kb.diag_step("diag", "bong", m, v, m, v, g, d=v, U=U)
    with pytest.raises(ValueError, match="g must have shape"):
        kb.diag_step("diag", "bong", m, v, m, v, g[:-1], U=U)
    with pytest.raises(ValueError, match="U must have shape"):
        kb.diag_step("diag", "bong", m, v, m, v, g, U=U[:-1])
    with pytest.raises(ValueError, match="var_p must be > 0"):
        kb.diag_step("diag", "bog", m, v, m, -v, g, U=U)
    with pytest.raises(ValueError, match="alpha"):
        kb.diag_step("diag", "bog", m, v, m, v, g, U=U, alpha=-1.0)
    with pytest.raises(ValueError, match="step applies"):
        kb.diag_step("diag", "bog", m, v, m, v, g, U=U, step=g)
    with pytest.raises(TypeError, match="g must contain real"):
        kb.diag_step("diag", "bong", m, v, m, v, g.astype(complex), U=U)
    with pytest.raises(ValueError, match="alpha"):
        kb.dlr_blr(m, v, W, m, v, W, U, g, alpha=1.5)
    with pytest.raises(ValueError, match="coef"):
        kb.dlr_bong(m, v, W, U, g, coef=np.ones(3))
    with pytest.raises(ValueError, match="ups_p must be > 0"):
        kb.dlr_bog(m, -v, W, U, g, 0.1)
    with pytest.raises(ValueError, match="W must have shape"):
        kb.dlr_bbb(m, v, W[:-1], m, v, W, U, g, 0.1)
    with pytest.raises(NotPositiveDefiniteError):  # a variance pushed below zero (eq. 257)
        kb.diag_step("diag", "bog", m, v, m, v, g, d=-10 * np.ones(P), alpha=1.0)
    Ubad = U.copy()
    Ubad[2, 1] = np.inf  # large inputs are not scanned up front; a failure names the culprit
    with pytest.raises(ValueError, match="U contains NaN"):
        kb.diag_step("diag", "bong", m, v, m, v, g, U=Ubad)
    for call in (lambda: kb.dlr_bong(m, v, W, Ubad, g), lambda: kb.dlr_bong(m, v, W, Ubad, g, coef=np.ones(2)),
                 lambda: kb.dlr_blr(m, v, W, m + 1, v, W, Ubad, g, coef=np.ones(2), alpha=0.5),
                 lambda: kb.dlr_bog(m, v, W, Ubad, g, 0.1), lambda: kb.dlr_bbb(m, v, W, m, v, W, Ubad, g, 0.1)):
        with pytest.raises(ValueError, match="U contains NaN"):
            call()
    for a, b in zip((m, v, g, U, W), copies):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------
# the filter: refused configurations, bad input, numerical failure


def test_full_families_and_other_backends_are_refused():
    model, lik = rb.MLP([2, 3, 1]), rb.Gaussian(1.0)
    for family in ("full-moment", "full"):
        # numba over a full family: BONG and BOG with a LIN estimator (the compiled update pass) only
        for kw in ({"algorithm": "blr", "lr": 0.5}, {"algorithm": "bbb", "lr": 0.5}, {"estimator": "mc-ef"},
                   {"algorithm": "bog", "lr": 0.1, "estimator": "mc-hess"}):
            with pytest.raises(ValueError, match="backend='numba' supports family"):
                rb.Bong(model, lik, family=family, backend="numba", **kw)
        for algorithm in ("bong", "bog"):
            for estimator in ("lin-hess", "lin-ef"):
                kw = {"lr": 0.1} if algorithm == "bog" else {}
                rb.Bong(model, lik, family=family, algorithm=algorithm, estimator=estimator, backend="numba", **kw)
        rb.Bong(model, lik, family=family, algorithm="blr", lr=0.5)  # the reference takes every combination
    # backend "cuda": BONG with LIN-HESS over "diag" and "dlr" only, checked in tests/test_cuda_diag_step.py
    assert rb.Bong.backends == ("numpy", "numba", "cuda")
    assert "backend='numba'" in repr(rb.Bong(model, lik, family="diag-moment", backend="numba"))


@pytest.mark.parametrize("name", ["bong-dlr2-hess_lin", "blr-diag-ef_mc3", "bbb-dlr2-ef_lin", "bog-diag_mom-hess_lin"])
def test_bad_input_is_rejected_identically_and_the_belief_is_unchanged(name):
    rng = np.random.default_rng(1)
    model, lik = rb.MLP([2, 3, 3]), rb.Categorical(3)
    kw = {} if name.startswith("bong") else {"lr": 0.1}
    filters = [rb.Bong.from_name(model, lik, name, backend=b, **kw) for b in ("numpy", "numba")]
    bel = filters[0].predict(filters[0].init(model.init_params(rng), 0.5))
    saved = {k: np.array(v) for k, v in vars(bel).items()}
    other = DLR(bel.mean, np.ones(bel.n_params), np.zeros((bel.n_params, 1))) if isinstance(bel, Diag) else \
        Diag(bel.mean, np.ones(bel.n_params))
    x, y = np.ones(2), 1
    cases = [
        lambda f: f.update(bel, np.ones(3), y, rng=rng),  # x of the wrong size
        lambda f: f.update(bel, np.array([np.nan, 1.0]), y, rng=rng),
        lambda f: f.update(bel, x, 7, rng=rng),  # label out of range
        lambda f: f.update(other, x, y, rng=rng),  # wrong belief type
        lambda f: f.update(bel, x, y, rng="seed"),
        lambda f: f.update_batch(bel, np.ones((2, 2)), [y], rng=rng),
        lambda f: f.scan(bel, np.ones((2, 2)), [0, 5], rng=rng),
        lambda f: f.predict(other),
    ]
    if isinstance(bel, DLR):
        cases.append(lambda f: f.update(DLR(bel.mean, bel.ups, np.zeros((bel.n_params, 3))), x, y))  # wrong rank
    if name.endswith("mc3"):
        cases.append(lambda f: f.update(bel, x, y))  # no rng
    for case in cases:
        kinds = []
        for f in filters:
            with pytest.raises((ValueError, TypeError)) as info:
                case(f)
            kinds.append(type(info.value))
        assert kinds[0] is kinds[1]
    for k, v in saved.items():
        np.testing.assert_array_equal(getattr(bel, k), v)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
@pytest.mark.parametrize("family", ["diag-moment", "diag", "dlr"])
def test_numerical_failure_raises_on_both_backends(family):
    # a huge learning rate drives BOG's variance/precision (eqs 224, 257, 311) below zero
    model, lik = rb.Linear(2, 1), rb.Gaussian(0.01)
    fs = [rb.Bong(model, lik, algorithm="bog", family=family, estimator="lin-hess", lr=1e4, rank=1, backend=b)
          for b in ("numpy", "numba")]
    bel = fs[0].init(np.full(model.n_params, 0.5), 1.0)
    if family == "dlr":  # BOG's ups+ = ups + (alpha/2) rowsumsq(B) stays > 0: push the mean to inf instead
        fs = [rb.Bong(model, lik, algorithm="bog", family=family, estimator="lin-ef", lr=1e306, rank=1, backend=b)
              for b in ("numpy", "numba")]
    # a variance below zero is a NotPositiveDefiniteError; a mean that overflows is a DivergenceError
    expected = rb.DivergenceError if family == "dlr" else NotPositiveDefiniteError
    for f in fs:
        with pytest.raises(expected):
            f.update(bel, np.array([30.0, -20.0]), np.array([500.0]))


@pytest.mark.parametrize("family", KERNEL_FAMILIES)
@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_estimate_fails_identically(family, algorithm):
    model, lik = rb.Linear(2, 2), rb.Gaussian(0.5)
    fs = [rb.Bong(model, lik, algorithm=algorithm, family=family, estimator="lin-hess", rank=1,
                  lr=None if algorithm == "bong" else 0.1, backend=b) for b in ("numpy", "numba")]
    bel = fs[0].init(np.full(model.n_params, 0.3), 0.5)
    e = fs[0].estimate(bel, [np.ones(2)], [np.ones(2)])
    g, U = e.g.copy(), e.curvature.data.copy()
    g[1] = np.nan
    U[1, 0] = np.inf
    for bad in (est.Estimate(g, e.curvature, coef=e.coef), est.Estimate(e.g, Curvature.from_factor(U), coef=e.coef)):
        kinds = []
        for f in fs:
            with pytest.raises(rb.DivergenceError, match="estimate is not finite") as info:
                f.step(bel, bel, bad)
            kinds.append(type(info.value))
        assert kinds[0] is kinds[1]


@pytest.mark.parametrize("combo", [c for c in KERNEL_COMBOS if c[1] == "dlr"], ids=lambda c: f"{c[0]}-{c[2]}")
@pytest.mark.parametrize("rank", [0, 2])
def test_rank_zero_and_more_directions_than_parameters(combo, rank):
    # P = 2 < rank + C = 3: the projection keeps every direction (rank = P is the largest a filter keeps)
    algorithm, family, estimator = combo
    rng = np.random.default_rng(rank)
    model, lik = rb.Linear(1, 1), rb.Gaussian(0.3)
    kw = dict(algorithm=algorithm, family=family, estimator=estimator, rank=rank, n_samples=2, gamma=0.8, q=0.1,
              lr=None if algorithm == "bong" else 0.5, n_iter=1 if algorithm in ("bong", "bog") else 2)
    if algorithm == "blr" and estimator == "mc-ef":
        kw["n_iter"] = 1
    fnp, fnb = (rb.Bong(model, lik, backend=b, **kw) for b in ("numpy", "numba"))
    bel = DLR(rng.standard_normal(2), rng.uniform(1, 2, 2), rng.standard_normal((2, rank)))
    X, Y = rng.standard_normal((3, 1)), rng.standard_normal((3, 1))
    for t in range(3):  # from the reference's belief each time (see the module docstring)
        ref = fnp.update(fnp.predict(bel), X[t], Y[t], rng=np.random.default_rng(t))
        out = fnb.update(fnb.predict(bel), X[t], Y[t], rng=np.random.default_rng(t))
        same_belief(out, ref)
        bel = ref


def scan_and_steps_agree(fnp, fnb, bel, X, Y):
    """The compiled filter fnb equals the reference fnp on a scan over (X, Y) from bel, then on one
    predict_update and one update from the reference's belief."""
    ref, href = fnp.scan(bel, X, Y)
    out, hout = fnb.scan(bel, X, Y)
    same_belief(out, ref)
    close(hout["yhat"], href["yhat"])
    same_belief(fnb.predict_update(ref, X[0], Y[0]), fnp.update(fnp.predict(ref), X[0], Y[0]))
    same_belief(fnb.update(ref, X[1], Y[1]), fnp.update(ref, X[1], Y[1]))


@pytest.mark.parametrize("task", ["drop_last", "full", "gaussian-matrix"])
@pytest.mark.parametrize("vector_q", [False, True])
def test_fused_mlp_step_is_used_and_equals_reference(task, vector_q):
    # BONG + DLR + LIN-HESS on an MLP is one compiled LO-FI step (Jones et al. 2024, eqs 287-292),
    # with the predict step fused in by scan and predict_update
    rng = np.random.default_rng(5)
    C = 3
    model = rb.MLP([4, 6, C])
    lik = rb.Gaussian(np.eye(C) * 0.5 + 0.1) if task == "gaussian-matrix" else rb.Categorical(C, mode=task)
    q = rng.uniform(0, 1e-2, model.n_params) if vector_q else 1e-3
    fnp, fnb = (rb.Bong.from_name(model, lik, "bong-dlr3-hess_lin", backend=b, gamma=0.95, q=q)
                for b in ("numpy", "numba"))
    assert fnb._fused_spec is not None and fnp._fused_spec is None
    X = rng.standard_normal((5, 4))
    Y = rng.standard_normal((5, C)) if task.startswith("gaussian") else rng.integers(0, C, 5)
    bel = fnp.init(model.init_params(rng), 0.5)
    scan_and_steps_agree(fnp, fnb, bel, X, Y)


@pytest.mark.parametrize("net", ["mlp", "mlp-deep", "linear-nobias", "mlp-wide", "mlp-wide-input"])
@pytest.mark.parametrize("task", ["drop_last", "full", "gaussian-matrix"])
@pytest.mark.parametrize("algorithm", ["blr", "bbb"])
def test_lin_hess_by_units_is_used_and_equals_reference(algorithm, net, task, monkeypatch):
    # BLR and BBB + DLR + LIN-HESS on an MLP: each inner iteration folds U's columns into per-unit sums
    # (kernels.cpu.blr_mlp, kernels.cpu.bbb_mlp) instead of forming them; scan, predict_update and update
    # against the reference
    from refbayes.kernels.cpu import bbb_mlp, blr_mlp

    module, name = {"blr": (blr_mlp, "mlp_blr_lin_hess_iteration"),
                    "bbb": (bbb_mlp, "mlp_bbb_lin_hess_iteration")}[algorithm]
    calls = {"used": 0, "declined": 0}
    real = getattr(module, name)

    def counted(*args, **kw):
        out = real(*args, **kw)
        calls["used" if out is not None else "declined"] += 1
        return out

    monkeypatch.setattr(module, name, counted)
    rng = np.random.default_rng(11)
    C = 3
    model = {"mlp": rb.MLP([4, 6, C]), "mlp-deep": rb.MLP([4, 5, 4, C], activation="relu"),
             "linear-nobias": rb.Linear(4, C, bias=False),
             # P = 4,403: the Gram sums run over three blocks of lofi.GRAM_BLOCK columns, and BBB's
             # output pass cuts the 400 inputs of the second layer's units across blocks of bong.BBB_BLOCK rows
             "mlp-wide": rb.MLP([4, 400, 7, C]),
             # units with more inputs than step.WIDE_UNIT: the passes walk them as pieces (kind 2 chunks),
             # here three per unit (pieces of 1,000 rows below), each cut into blocks of bong.BBB_BLOCK rows
             "mlp-wide-input": rb.MLP([2100, 2, C])}[net]
    if net == "mlp-wide-input":  # the chunk table is plain data (step._chunks): smaller pieces, rebuilt
        from refbayes.kernels.cpu import step

        monkeypatch.setattr(step, "PIECE_ROWS", 1000)
        monkeypatch.setattr(step, "_LAYOUTS", {})
    lik = rb.Gaussian(np.eye(C) * 0.5 + 0.1) if task == "gaussian-matrix" else rb.Categorical(C, mode=task)
    lr = {"blr": 0.6, "bbb": 0.05}[algorithm]
    fnp, fnb = (rb.Bong(model, lik, algorithm=algorithm, family="dlr", estimator="lin-hess", rank=3, lr=lr,
                        n_iter=3, gamma=0.95, q=1e-3, backend=b) for b in ("numpy", "numba"))
    X = rng.standard_normal((5, model.in_dim)) / np.sqrt(model.in_dim / 4)
    Y = rng.standard_normal((5, C)) if task.startswith("gaussian") else rng.integers(0, C, 5)
    # a generic prior: from init's constant diagonal and zero W a linear model can meet exactly tied
    # eigenvalues at the rank cut, where the projection is not unique (each backend picks a valid one)
    P = model.n_params
    bel = DLR(model.init_params(rng), rng.uniform(1.0, 4.0, P), 0.4 * rng.standard_normal((P, 3)))
    scan_and_steps_agree(fnp, fnb, bel, X, Y)
    assert calls["used"] >= 5 * 3, calls  # the scan's iterations at least, where the eigen-gap allows


def test_an_overflow_inside_the_dlr_blr_projection_names_the_blr_step():
    # the general route of kb.dlr_blr projects with LO-FI's update; its divergence is reported as BLR's
    from refbayes.errors import DivergenceError

    rng = np.random.default_rng(0)
    P, R = 12, 2
    m, v = rng.standard_normal(P), rng.uniform(1.0, 2.0, P)
    W = np.full((P, R), 1e200)
    U, g = rng.standard_normal((P, 2)), rng.standard_normal(P)
    with np.errstate(over="ignore"), pytest.raises(DivergenceError, match=r"^BLR \(DLR\) update: "):
        kb.dlr_blr(m, v, W, m, v, W, U, g, coef=np.ones(2), alpha=0.5)


@pytest.mark.parametrize("estimator", ["lin-ef", "lin-hess"])
def test_dense_dlr_blr_step_over_several_gram_blocks_equals_reference(estimator):
    # kernels.cpu.bong._blr_fused (the route of every estimate with a formed factor U) at P = 4,403, where
    # its Gram sums (lofi.gram_blocks) run over three blocks of columns; an rb.Function takes the route
    from refbayes.kernels.cpu import lofi as klofi

    rng = np.random.default_rng(3)
    model = rb.MLP([4, 400, 7, 3])
    assert model.n_params > 2 * klofi.GRAM_BLOCK
    fn = rb.Function(lambda th, x: model.apply(th, x), n_params=model.n_params, out_dim=3, in_dim=4)
    fnp, fnb = (rb.Bong(fn, rb.Gaussian(0.5), algorithm="blr", family="dlr", estimator=estimator, rank=3, lr=0.6,
                        n_iter=2, gamma=0.95, q=1e-3, backend=b) for b in ("numpy", "numba"))
    P = model.n_params
    bel = DLR(model.init_params(rng), rng.uniform(1.0, 4.0, P), 0.4 * rng.standard_normal((P, 3)))
    scan_and_steps_agree(fnp, fnb, bel, rng.standard_normal((3, 4)), rng.standard_normal((3, 3)))
