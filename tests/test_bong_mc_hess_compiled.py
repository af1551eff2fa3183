"""MC-HESS over the diagonal families with backend="numba" (Hutchinson's diagonal): the compiled step
equals the NumPy reference (float64, rtol 1e-10) for the same draws and probes (docs/bong.md §6).

The reference forms each draw's Hessian-vector products by reverse-over-reverse autograd; the
compiled step by forward and reverse passes of directional derivatives (kernels.cpu.hutchinson).
Both filters get a Generator with the same seed, and the compiled step must consume it as the
reference does (per inner iteration: the M draws, then each draw's probes), or the beliefs part.
The reference's generic estimator is replaced by one that fails during the compiled run, and
``compiled.mc_calls`` counts the compiled estimates, so a silent fall back to the general route fails.
"""

import warnings

import numpy as np
import pytest

import refbayes as rb
from refbayes.errors import DivergenceError
from refbayes.filters.bong import compiled
from refbayes.filters.bong import estimators as est_mod
from refbayes.kernels.cpu.hutchinson import mlp_mc_hess_draw
from refbayes.kernels.cpu.mlp import ACTIVATION_CODES, layer_bias
from problems import close, mc_likelihood as likelihood, mc_run_both, same_belief

PURE_RELATIVE = 1e-300
COMBOS = compiled.mc_hess_combinations()
LR = {"bong": None, "blr": 0.5, "bog": 0.001, "bbb": 0.0005}
N_ITER = {"bong": 1, "blr": 3, "bog": 1, "bbb": 3}
T = 4


def problem(sizes, lik_name, activation="tanh", seed=0):
    rng = np.random.default_rng(seed)
    model = rb.MLP(sizes, activation=activation)
    lik = likelihood(lik_name)
    X = 0.7 * rng.standard_normal((T, sizes[0]))
    Y = rng.standard_normal((T, 3)) if lik_name.startswith("gaussian") else rng.integers(0, 3, T)
    return model, lik, model.init_params(rng), X, Y


def filters(model, lik, algorithm, family, **extra):
    kw = dict(algorithm=algorithm, family=family, estimator="mc-hess", lr=LR[algorithm], n_iter=N_ITER[algorithm],
              n_samples=4, n_probes=5, gamma=0.97, q=1e-3)
    kw.update(extra)
    return rb.Bong(model, lik, **kw), rb.Bong(model, lik, backend="numba", **kw)


def bits(Z):
    """The int64 zeros and ones B of probes Z = 2 B - 1 (what the kernel takes)."""
    return ((Z + 1.0) / 2.0).astype(np.int64)


def check_same(ref, out):
    for r, o in zip(ref, out):
        if isinstance(r, np.ndarray):
            close(o, r, 1e-10, floor=PURE_RELATIVE)
        else:
            same_belief(o, r, floor=PURE_RELATIVE)


def test_the_mc_hess_grid_is_every_algorithm_over_the_diagonal_families():
    assert len(COMBOS) == len(set(COMBOS)) == 4 * 2
    assert {c[0] for c in COMBOS} == {"bong", "blr", "bog", "bbb"}
    assert {c[1] for c in COMBOS} == {"diag", "diag-moment"}
    assert {c[2] for c in COMBOS} == {"mc-hess"}


@pytest.mark.parametrize("lik_name", ["gaussian", "categorical"])
@pytest.mark.parametrize("sizes", [[3, 5, 4, 3], [3, 3]], ids=["two-hidden", "no-hidden"])
@pytest.mark.parametrize("algorithm,family,estimator", COMBOS)
def test_compiled_mc_hess_equals_reference_for_the_same_draws_and_probes(algorithm, family, estimator, sizes,
                                                                         lik_name):
    model, lik, theta, X, Y = problem(sizes, lik_name)
    ref_f, fast_f = filters(model, lik, algorithm, family)
    assert ref_f._fused_spec is None and fast_f._fused_spec is not None
    ref, out = mc_run_both(ref_f, fast_f, ref_f.init(theta, prior_var=0.05), X, Y)
    check_same(ref, out)


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "elu", "linear"])
@pytest.mark.parametrize("lik_name", ["gaussian-diag-jitter", "categorical-full"])
def test_compiled_mc_hess_other_activations_likelihoods_antithetic_draws(activation, lik_name):
    model, lik, theta, X, Y = problem([3, 5, 4, 3], lik_name, activation=activation, seed=3)
    ref_f, fast_f = filters(model, lik, "blr", "diag-moment", antithetic=True)
    ref, out = mc_run_both(ref_f, fast_f, ref_f.init(theta, prior_var=0.05), X, Y)
    check_same(ref, out)


@pytest.mark.parametrize("bias", [True, False])
def test_compiled_mc_hess_on_a_linear_model_and_with_ou_dynamics(bias):
    model = rb.Linear(3, 3, bias=bias)
    lik = likelihood("categorical")
    rng = np.random.default_rng(8)
    theta, X, Y = 0.3 * rng.standard_normal(model.n_params), rng.standard_normal((T, 3)), rng.integers(0, 3, T)
    ref_f, fast_f = filters(model, lik, "bong", "diag", dynamics="ou", gamma=0.9, q=0.0, ou_mean=0.1 * theta,
                            ou_var=0.05)
    assert fast_f._fused_spec is not None
    ref, out = mc_run_both(ref_f, fast_f, ref_f.init(theta, prior_var=0.1), X, Y)
    check_same(ref, out)


def test_exact_hessian_diagonals_take_the_general_route_with_the_references_numbers():
    model, lik, theta, X, Y = problem([3, 4, 3], "gaussian")
    ref_f, fast_f = filters(model, lik, "bong", "diag", hess_diag="exact")
    assert fast_f._fused_spec is None  # documented (docs/bong.md §6): each draw's P x P Hessian is the reference's
    n0 = compiled.mc_calls[0]
    ref, _ = ref_f.scan(ref_f.init(theta, 0.05), X, Y, rng=np.random.default_rng(1))
    out, _ = fast_f.scan(fast_f.init(theta, 0.05), X, Y, rng=np.random.default_rng(1))
    assert compiled.mc_calls[0] == n0
    same_belief(out, ref, floor=PURE_RELATIVE)


@pytest.mark.parametrize("activation", sorted(set(ACTIVATION_CODES) - {"identity"}))
def test_one_draws_products_equal_autograds_hessian_vector_products(activation):
    """The kernel alone, one draw, against the reference's gradient and its reverse-over-reverse
    products H Z, at parameters large enough that every activation leaves its linear range."""
    rng = np.random.default_rng(11)
    model = rb.MLP([3, 5, 4, 3], activation=activation)
    for lik, y in ((likelihood("gaussian"), rng.standard_normal(3)), (likelihood("categorical"), 2)):
        theta = model.init_params(rng) + 0.5 * rng.standard_normal(model.n_params)
        x = rng.standard_normal(3)
        P, N = model.n_params, 6
        Z = est_mod.rademacher_probes(rng, P, N)
        expect_d = np.sum(Z * est_mod.loglik_hvp(model, lik, theta, [x], [y], Z), axis=1)
        expect_g = est_mod.loglik_grad(model, lik, theta, [x], [y])
        sizes, act, code, _, _ = compiled.mlp_lofi_spec(model, lik)
        C = int(sizes[-1])
        Lam = lik.hessian(np.zeros(C), np.zeros(C)) if isinstance(lik, rb.Gaussian) else np.zeros((1, 1))
        g, d = np.zeros(P), np.zeros(P)
        status = mlp_mc_hess_draw(sizes, act, code, compiled._gaussian_precision(lik, C), Lam, theta, bits(Z),
                                  model.validate_x(x), lik.encode(y, C), g, d, layer_bias(sizes, P))
        assert status == 0
        close(g, expect_g, 1e-12, floor=PURE_RELATIVE)
        close(d, expect_d, 1e-12, floor=PURE_RELATIVE)


def test_the_compiled_mc_hess_step_needs_a_generator():
    model, lik, theta, X, Y = problem([3, 4, 3], "categorical")
    _, fast_f = filters(model, lik, "bong", "diag")
    bel = fast_f.init(theta, prior_var=0.05)
    with pytest.raises(TypeError, match="Generator"):
        fast_f.update(bel, X[0], Y[0], rng=np.random.RandomState(0))


# the network of tests/test_backend_failures.py, which compares the failure types on both backends
# (and the one setup where they differ: autograd's tanh'' past |a| = 710, shown below)
MODEL = rb.MLP([2, 3, 1], activation="tanh")


def test_at_saturated_tanh_units_the_compiled_product_is_finite_where_autograds_is_not():
    rng = np.random.default_rng(4)
    theta = 1e5 * MODEL.init_params(rng)  # every hidden pre-activation far past |a| = 710
    x, y = np.ones(2), np.array([3.0])
    lik = rb.Gaussian(1.0)
    P = MODEL.n_params
    Z = est_mod.rademacher_probes(rng, P, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = est_mod.loglik_hvp(MODEL, lik, theta, [x], [y], Z)
    assert np.isnan(ref).any()
    sizes, act, code, _, _ = compiled.mlp_lofi_spec(MODEL, lik)
    g, d = np.zeros(P), np.zeros(P)
    Lam = lik.hessian(np.zeros(1), np.zeros(1))
    status = mlp_mc_hess_draw(sizes, act, code, compiled._gaussian_precision(lik, 1), Lam, theta, bits(Z), x,
                              lik.encode(y, 1), g, d, True)
    assert status == 0 and np.all(np.isfinite(d))
    # the hidden units are saturated (tanh' = tanh'' = 0), so the Hessian is that of the output layer
    # alone: eta = w . h + b with h = sign(W1 x + b1) exactly, hess = -h~ h~^T over (w, b), h~ = [h, 1],
    # and Hutchinson's sums are -sum_n z_in h~_i (h~ . z_n) there, 0 elsewhere
    W1, b1 = theta[:6].reshape(3, 2), theta[6:9]
    ht = np.append(np.sign(W1 @ x + b1), 1.0)
    Zo = Z[P - 4:]
    close(d[P - 4:], -np.sum(Zo * ht[:, None] * (ht @ Zo)[None, :], axis=1), 1e-15, floor=PURE_RELATIVE)
    assert np.all(d[:P - 4] == 0.0)


class _CountingPool:
    """A one-worker pool that counts what it runs (the pipelined route of the compiled MC-HESS step)."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=1)
        self.submitted = 0

    def submit(self, fn, *args):
        self.submitted += 1
        return self.pool.submit(fn, *args)


def test_pipelined_draws_give_the_sequential_numbers_bit_for_bit(monkeypatch):
    # with two threads (large P under the thread policy) draw j's kernel runs on a worker while the next
    # draw's probes are drawn: forced here on a small network, it must give the one-thread numbers exactly
    model, lik, theta, X, Y = problem([3, 5, 4, 3], "gaussian", seed=5)
    _, fast_f = filters(model, lik, "blr", "diag")
    bel = fast_f.init(theta, prior_var=0.05)
    r1 = np.random.default_rng(9)
    one, one_res = fast_f.scan(bel, X, Y, rng=r1)
    pool = _CountingPool()
    monkeypatch.setattr(compiled, "_host_threads", lambda: 2)
    monkeypatch.setattr(compiled, "_host_pool", lambda: pool)
    r2 = np.random.default_rng(9)
    two, two_res = fast_f.scan(bel, X, Y, rng=r2)
    assert pool.submitted == T * fast_f.n_iter * fast_f.n_samples
    assert np.array_equal(two.mean, one.mean) and np.array_equal(two.var, one.var)
    assert np.array_equal(two_res.yhat, one_res.yhat)
    assert r1.random() == r2.random()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failed_draw_leaves_the_generator_where_the_reference_leaves_it(monkeypatch, threads):
    # the reference draws every draw's probes before it checks the estimate; the compiled step, which
    # sees the failure at its first draw, must still draw the rest, on one thread or pipelined
    monkeypatch.setattr(compiled, "_host_threads", lambda: threads)
    monkeypatch.setattr(compiled, "_host_pool", lambda: _CountingPool())
    after = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for backend in ("numpy", "numba"):
            f = rb.Bong(MODEL, rb.Gaussian(1e-300), family="diag", estimator="mc-hess", n_samples=4, n_probes=3,
                        backend=backend)
            rng = np.random.default_rng(3)
            with pytest.raises(DivergenceError):
                f.update(f.init(MODEL.init_params(np.random.default_rng(0)), 1e300), np.ones(2), np.array([1e300]),
                         rng=rng)
            after.append(rng.random())
    assert after[1] == after[0]
