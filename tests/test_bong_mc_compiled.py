"""MC-EF over the diagonal and DLR families with backend="numba": the compiled step equals the NumPy
reference (float64, rtol 1e-10) for the same random draws (docs/bong.md §6).

Both filters get a Generator with the same seed; the compiled path must consume it as the
reference does (per inner iteration, from the current iterate: one ``standard_normal((M, P))`` over
the diagonal families, the DLR sampler's draws over "dlr"), or the beliefs part after the first draw. The reference's generic estimator is replaced by one
that fails during the compiled run, and ``compiled.mc_calls`` counts the compiled estimates, so a
silent fall back to the general route fails the test.
"""

import numpy as np
import pytest

import refbayes as rb
from refbayes.filters.bong import compiled
from problems import close, mc_likelihood as likelihood, mc_run_both, same_belief

PURE_RELATIVE = 1e-300  # relative to max|b| alone, however small

COMBOS = compiled.mc_combinations()
# learning rates that keep every step of these small problems positive definite with MC-EF
LR = {"bong": None, "blr": 0.5, "bog": 0.001, "bbb": 0.0005}
N_ITER = {"bong": 1, "blr": 3, "bog": 1, "bbb": 3}
SIZES = {"two-hidden": [3, 5, 4, 3], "no-hidden": [3, 3]}
T = 4


def problem(net, lik_name, seed=0):
    rng = np.random.default_rng(seed)
    model = rb.MLP(SIZES[net], activation="tanh")
    lik = likelihood(lik_name)
    X = 0.5 * rng.standard_normal((T, 3))
    Y = rng.standard_normal((T, 3)) if lik_name.startswith("gaussian") else rng.integers(0, 3, T)
    return model, lik, model.init_params(rng), X, Y


def filters(model, lik, algorithm, family, **extra):
    kw = dict(algorithm=algorithm, family=family, estimator="mc-ef", lr=LR[algorithm], n_iter=N_ITER[algorithm],
              n_samples=6, gamma=0.97, q=1e-3, **extra)
    return rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)


def same_rel(out, ref):
    same_belief(out, ref, floor=PURE_RELATIVE)


def test_the_mc_grid_is_every_algorithm_over_the_diagonal_and_dlr_families_with_mc_ef():
    assert len(COMBOS) == len(set(COMBOS)) == 4 * 3
    assert {c[0] for c in COMBOS} == {"bong", "blr", "bog", "bbb"}
    assert {c[1] for c in COMBOS} == {"diag", "diag-moment", "dlr"}
    assert {c[2] for c in COMBOS} == {"mc-ef"}


@pytest.mark.parametrize("lik_name", ["gaussian", "categorical"])
@pytest.mark.parametrize("net", ["two-hidden", "no-hidden"])
@pytest.mark.parametrize("algorithm,family,estimator", COMBOS)
def test_compiled_mc_ef_equals_reference_for_the_same_draws(algorithm, family, estimator, net, lik_name):
    model, lik, theta, X, Y = problem(net, lik_name)
    ref_f, fast_f = filters(model, lik, algorithm, family)
    assert ref_f._fused_spec is None and fast_f._fused_spec is not None
    bel = ref_f.init(theta, prior_var=0.05)
    ref, out = mc_run_both(ref_f, fast_f, bel, X, Y)
    for r, o in zip(ref, out):
        if isinstance(r, np.ndarray):
            close(o, r, 1e-10, floor=PURE_RELATIVE)
        else:
            same_rel(o, r)


@pytest.mark.parametrize("lik_name", ["gaussian-diag-jitter", "categorical-full"])
@pytest.mark.parametrize("family", ["diag", "diag-moment", "dlr"])
@pytest.mark.parametrize("algorithm", ["bong", "blr"])
def test_compiled_mc_ef_with_antithetic_draws_other_likelihoods_and_ou_dynamics(algorithm, family, lik_name):
    model, lik, theta, X, Y = problem("two-hidden", lik_name, seed=2)
    ref_f, fast_f = filters(model, lik, algorithm, family, antithetic=True)
    bel = ref_f.init(theta, prior_var=0.05)
    ref, out = mc_run_both(ref_f, fast_f, bel, X, Y)
    for r, o in zip(ref, out):
        (close(o, r, 1e-10, floor=PURE_RELATIVE) if isinstance(r, np.ndarray) else same_rel(o, r))
    kw = dict(algorithm=algorithm, family=family, estimator="mc-ef", lr=LR[algorithm], n_iter=N_ITER[algorithm],
              gamma=0.9, dynamics="ou", ou_mean=0.1 * theta, ou_var=0.05)
    ref_f, fast_f = rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)
    ref, out = mc_run_both(ref_f, fast_f, bel, X, Y)
    for r, o in zip(ref, out):
        (close(o, r, 1e-10, floor=PURE_RELATIVE) if isinstance(r, np.ndarray) else same_rel(o, r))


def test_compiled_mc_ef_natural_bong_with_the_full_gain_mean():
    model, lik, theta, X, Y = problem("two-hidden", "gaussian", seed=6)
    ref_f, fast_f = filters(model, lik, "bong", "diag", vd_mean="ekf")
    bel = ref_f.init(theta, prior_var=0.05)
    ref, out = mc_run_both(ref_f, fast_f, bel, X, Y)
    for r, o in zip(ref, out):
        (close(o, r, 1e-10, floor=PURE_RELATIVE) if isinstance(r, np.ndarray) else same_rel(o, r))


def test_compiled_mc_ef_on_a_linear_model_without_bias():
    model = rb.Linear(3, 3, bias=False)
    lik = likelihood("categorical")
    rng = np.random.default_rng(8)
    theta, X, Y = 0.3 * rng.standard_normal(model.n_params), rng.standard_normal((T, 3)), rng.integers(0, 3, T)
    ref_f, fast_f = filters(model, lik, "blr", "diag-moment")
    assert fast_f._fused_spec is not None
    bel = ref_f.init(theta, prior_var=0.1)
    ref, out = mc_run_both(ref_f, fast_f, bel, X, Y)
    for r, o in zip(ref, out):
        (close(o, r, 1e-10, floor=PURE_RELATIVE) if isinstance(r, np.ndarray) else same_rel(o, r))


def test_the_compiled_mc_ef_step_needs_a_generator_and_checks_it_first():
    model, lik, theta, X, Y = problem("two-hidden", "categorical")
    _, fast_f = filters(model, lik, "bong", "diag")
    bel = fast_f.init(theta, prior_var=0.05)
    with pytest.raises(TypeError, match="rng"):
        fast_f.update(bel, X[0], Y[0])
    with pytest.raises(TypeError, match="Generator"):
        fast_f.update(bel, X[0], Y[0], rng=np.random.RandomState(0))


@pytest.mark.parametrize("family", ["diag", "diag-moment"])
def test_a_variance_lost_in_the_compiled_mc_step_is_named_in_the_references_words(family):
    # a learning rate far too large for BBB: some variance turns non-positive; the message must be
    # the reference's (family, quantity, entry), the value equal to round-off
    import re

    from refbayes.errors import NotPositiveDefiniteError

    model, lik, theta, X, Y = problem("two-hidden", "gaussian", seed=2)
    kw = dict(algorithm="bbb", family=family, estimator="mc-ef", lr=0.9, n_iter=4, n_samples=6)
    ref_f, fast_f = rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)
    bel = ref_f.init(theta, 5.0)
    said = []
    for f in (ref_f, fast_f):
        with pytest.raises(NotPositiveDefiniteError) as info:
            f.update(bel, X[0], Y[0], rng=np.random.default_rng(1))
        said.append(str(info.value))
    number = r"\((?:np\.float64\()?([-+0-9.eE]+)\)+(?= \(inner iteration \d+ of 4\)$)"  # the entry's value
    assert re.sub(number, "", said[1]) == re.sub(number, "", said[0]), said
    assert ("(diag moment) variance" if family == "diag-moment" else "(diag) precision") in said[0]
    close(float(re.search(number, said[1]).group(1)), float(re.search(number, said[0]).group(1)), 1e-10,
          floor=PURE_RELATIVE)


@pytest.mark.parametrize("algorithm", ["bong", "blr", "bog", "bbb"])
def test_dlr_mc_ef_scans_equal_the_reference_over_several_steps(algorithm):
    # each step's truncation may sign W's columns unlike the reference's SVD, and the compiled
    # sampler's draws must not see it
    model, lik, theta, X, Y = problem("two-hidden", "gaussian")
    kw = dict(algorithm=algorithm, family="dlr", estimator="mc-ef", lr=LR[algorithm], n_iter=N_ITER[algorithm],
              n_samples=6, rank=2, gamma=0.97, q=1e-3)
    ref_f, fast_f = rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)
    bel = ref_f.init(theta, prior_var=0.05)
    ref, ref_res = ref_f.scan(bel, X, Y, rng=np.random.default_rng(4))
    out, out_res = fast_f.scan(bel, X, Y, rng=np.random.default_rng(4))
    same_belief(out, ref, floor=PURE_RELATIVE)
    close(out_res.yhat, ref_res.yhat, 1e-10, floor=PURE_RELATIVE)


@pytest.mark.parametrize("family", ["diag", "diag-moment"])
def test_mc_hess_is_served_by_its_own_compiled_step_not_the_mc_ef_one(family):
    """MC-HESS has its own compiled step (tests/test_bong_mc_hess_compiled.py) and its own list; with the
    exact Hessian diagonal it takes the general route, as docs/bong.md §6 lists."""
    model, lik, _, _, _ = problem("two-hidden", "categorical")
    fast_f = rb.Bong(model, lik, family=family, estimator="mc-hess", rank=2, backend="numba")
    assert fast_f._fused_spec is not None
    assert (fast_f.algorithm, fast_f.family, fast_f.estimator) not in COMBOS
    assert (fast_f.algorithm, fast_f.family, fast_f.estimator) in compiled.mc_hess_combinations()
    exact = rb.Bong(model, lik, family=family, estimator="mc-hess", hess_diag="exact", backend="numba")
    assert exact._fused_spec is None


def test_the_mc_ef_kernel_checks_what_the_step_reads():
    # g_j = x (y - theta x) near 1e160: each g_j and their mean are finite, g_j^2 overflows. With the
    # per-draw rows stored (the factor U = G^T / sqrt(M) is the curvature then) the estimate is finite;
    # without them the curvature is d = -mean g_j^2 = -inf, a DivergenceError as the reference's check gives
    from refbayes.errors import DivergenceError
    from refbayes.filters.bong.compiled import _gaussian_precision, mlp_lofi_spec
    from refbayes.kernels.cpu.bong_mlp import mlp_mc_ef

    model, lik = rb.MLP([1, 1]), rb.Gaussian(1.0)
    sizes, act, code, Rc, jitter = mlp_lofi_spec(model, lik)
    Rinv = _gaussian_precision(lik, 1)
    mean, var = np.array([0.5, 0.0]), np.array([1.0, 1.0])
    x, target = np.array([1.0]), lik.encode(np.array([1e160]), 1)
    z = np.random.default_rng(0).standard_normal((3, 2))
    g, d, G, _ = mlp_mc_ef(sizes, act, code, Rinv, Rc, jitter, mean, var, x, target, z, store=True)
    assert np.all(np.isfinite(g)) and np.all(np.isfinite(G)) and np.all(d == -np.inf)
    np.testing.assert_allclose(g, G.mean(axis=0), rtol=1e-12)
    with pytest.raises(DivergenceError, match="estimate is not finite"):
        mlp_mc_ef(sizes, act, code, Rinv, Rc, jitter, mean, var, x, target, z, store=False)
