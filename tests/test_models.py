"""Tests for refbayes.models: layouts, forward passes, Jacobians, initialisation, input checks.

Reference values are built independently here: forward passes from explicitly constructed
weight matrices with plain NumPy, Jacobians from central finite differences and autograd.
"""

import re

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from refbayes.models import ACTIVATIONS, MLP, Function, Linear, Model

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# plain-NumPy activations, written independently of the module
REF_ACT = {
    "tanh": np.tanh,
    "relu": lambda a: np.maximum(a, 0.0),
    "sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)),
    "elu": lambda a: np.where(a > 0, a, np.exp(np.minimum(a, 0.0)) - 1.0),
    "linear": lambda a: a,
}

layer_sizes_st = st.lists(st.integers(1, 6), min_size=2, max_size=4)  # depth 1..3
activation_st = st.sampled_from(ACTIVATIONS)
seed_st = st.integers(0, 2**32 - 1)


def random_layers(rng, sizes, scale=1.0):
    return [
        (scale * rng.standard_normal((n_out, n_in)), scale * rng.standard_normal(n_out))
        for n_in, n_out in zip(sizes[:-1], sizes[1:])
    ]


def pack(layers):
    """The documented layout: vec(W_0) (C order), b_0, vec(W_1), b_1, ..."""
    return np.concatenate([np.concatenate([W.reshape(-1), b]) for W, b in layers])


def ref_mlp(layers, x, act):
    h = x
    for l, (W, b) in enumerate(layers):
        a = W @ h + b
        h = a if l == len(layers) - 1 else REF_ACT[act](a)
    return h


def pre_activations(layers, x, act):
    h, out = x, []
    for l, (W, b) in enumerate(layers):
        a = W @ h + b
        out.append(a)
        h = a if l == len(layers) - 1 else REF_ACT[act](a)
    return out


def central_fd(f, theta, step=1e-5):
    """Central differences of f (P,) -> (C,): returns (C, P)."""
    cols = []
    for j in range(theta.size):
        h = step * max(1.0, abs(theta[j]))
        tp, tm = theta.copy(), theta.copy()
        tp[j] += h
        tm[j] -= h
        cols.append((f(tp) - f(tm)) / (2 * h))
    return np.stack(cols, axis=1)


def assert_fd_close(J, J_fd):
    # step 1e-5: truncation ~1e-10 |f'''|, round-off ~1e-16 |f| / 1e-5 ~ 1e-11; a wrong entry is O(1)
    assert J.shape == J_fd.shape
    np.testing.assert_allclose(J, J_fd, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# layout and forward pass
# ---------------------------------------------------------------------------------------------


@FAST
@given(sizes=layer_sizes_st)
def test_mlp_n_params_and_offsets(sizes):
    m = MLP(sizes)
    expected = sum(n_out * (n_in + 1) for n_in, n_out in zip(sizes[:-1], sizes[1:]))
    assert m.n_params == expected
    assert (m.in_dim, m.out_dim, m.n_layers) == (sizes[0], sizes[-1], len(sizes) - 1)
    off = m.layer_offsets
    assert off.shape == (len(sizes) - 1, 3)
    pos = 0
    for l, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        assert tuple(off[l]) == (pos, pos + n_out * n_in, pos + n_out * n_in + n_out)
        pos += n_out * (n_in + 1)


@FAST
@given(sizes=layer_sizes_st, seed=seed_st)
def test_mlp_flatten_unflatten_roundtrip(sizes, seed):
    rng = np.random.default_rng(seed)
    m = MLP(sizes)
    layers = random_layers(rng, sizes)
    theta = pack(layers)
    np.testing.assert_array_equal(m.flatten(layers), theta)
    back = m.unflatten(theta)
    assert len(back) == len(layers)
    for (W, b), (W2, b2) in zip(layers, back):
        np.testing.assert_array_equal(W, W2)
        np.testing.assert_array_equal(b, b2)
    np.testing.assert_array_equal(m.flatten(back), theta)


@FAST
@given(sizes=layer_sizes_st, act=activation_st, seed=seed_st)
def test_mlp_apply_matches_hand_built_network(sizes, act, seed):
    rng = np.random.default_rng(seed)
    layers = random_layers(rng, sizes)
    x = rng.standard_normal(sizes[0])
    m = MLP(sizes, activation=act)
    f = m.apply(pack(layers), x)
    assert f.shape == (sizes[-1],) and f.dtype == np.float64
    np.testing.assert_allclose(f, ref_mlp(layers, x, act), rtol=1e-13, atol=1e-14)


def test_mlp_small_example_by_hand():
    # f(x) = v . tanh(W x + b) + c with numbers worked out here
    W = np.array([[1.0, -2.0], [0.5, 0.0]])
    b = np.array([0.1, -0.3])
    v = np.array([[2.0, -1.0]])
    c = np.array([0.25])
    x = np.array([0.3, 0.2])
    theta = np.array([1.0, -2.0, 0.5, 0.0, 0.1, -0.3, 2.0, -1.0, 0.25])
    expected = 2.0 * np.tanh(0.3 - 0.4 + 0.1) - np.tanh(0.15 - 0.3) + 0.25
    m = MLP([2, 2, 1])
    np.testing.assert_allclose(m.apply(theta, x), [expected], rtol=1e-14)
    np.testing.assert_array_equal(m.flatten([(W, b), (v, c)]), theta)


@FAST
@given(in_dim=st.integers(1, 6), out_dim=st.integers(1, 5), bias=st.booleans(), seed=seed_st)
def test_linear_by_hand(in_dim, out_dim, bias, seed):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((out_dim, in_dim))
    b = rng.standard_normal(out_dim) if bias else np.zeros(out_dim)
    x = rng.standard_normal(in_dim)
    theta = np.concatenate([W.reshape(-1), b]) if bias else W.reshape(-1)
    m = Linear(in_dim, out_dim, bias=bias)
    assert m.n_params == theta.size
    np.testing.assert_allclose(m.apply(theta, x), W @ x + b, rtol=1e-13, atol=1e-14)
    # Jacobian built entry by entry
    J = np.zeros((out_dim, theta.size))
    for c in range(out_dim):
        for i in range(in_dim):
            J[c, c * in_dim + i] = x[i]
        if bias:
            J[c, out_dim * in_dim + c] = 1.0
    np.testing.assert_array_equal(m.jacobian(theta, x), J)
    np.testing.assert_allclose(m.jacobian(theta, x, method="autograd"), J, rtol=1e-14, atol=0)
    W2, b2 = m.unflatten(theta)
    np.testing.assert_array_equal(W2, W)
    np.testing.assert_array_equal(b2, b)
    np.testing.assert_array_equal(m.flatten(W, b if bias else None), theta)


@FAST
@given(in_dim=st.integers(1, 6), out_dim=st.integers(1, 5), act=activation_st, seed=seed_st)
def test_linear_equals_one_layer_mlp(in_dim, out_dim, act, seed):
    # a one-layer MLP has only its (linear) output layer, whatever the activation
    rng = np.random.default_rng(seed)
    lin, mlp = Linear(in_dim, out_dim), MLP([in_dim, out_dim], activation=act)
    assert lin.n_params == mlp.n_params
    theta = rng.standard_normal(lin.n_params)
    x = rng.standard_normal(in_dim)
    np.testing.assert_allclose(lin.apply(theta, x), mlp.apply(theta, x), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(lin.jacobian(theta, x), mlp.jacobian(theta, x), rtol=1e-14, atol=0)
    np.testing.assert_allclose(
        lin.init_params(np.random.default_rng(seed)), mlp.init_params(np.random.default_rng(seed))
    )


# ---------------------------------------------------------------------------------------------
# Jacobians
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=layer_sizes_st, act=activation_st, seed=seed_st, scale=st.floats(0.1, 3.0))
def test_mlp_manual_jacobian_equals_autograd(sizes, act, seed, scale):
    rng = np.random.default_rng(seed)
    m = MLP(sizes, activation=act)
    theta = scale * rng.standard_normal(m.n_params)
    x = rng.standard_normal(sizes[0])
    f, J = m.jacobian_manual(theta, x)
    J_ag = m.jacobian(theta, x, method="autograd")
    assert J.shape == J_ag.shape == (sizes[-1], m.n_params)
    tol = 1e-10 * max(1.0, np.abs(J_ag).max())
    np.testing.assert_allclose(J, J_ag, rtol=1e-10, atol=tol)
    np.testing.assert_allclose(m.jacobian(theta, x), J, rtol=0, atol=0)
    np.testing.assert_allclose(f, m.apply(theta, x), rtol=1e-14, atol=1e-15)
    f2, J2 = m.value_and_jacobian(theta, x, method="autograd")
    np.testing.assert_allclose(f2, f, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(J2, J_ag, rtol=0, atol=0)


@FAST
@given(sizes=layer_sizes_st, act=activation_st, seed=seed_st)
def test_mlp_jacobian_vs_finite_differences(sizes, act, seed):
    rng = np.random.default_rng(seed)
    layers = random_layers(rng, sizes)
    x = rng.standard_normal(sizes[0])
    if act in ("relu", "elu"):  # keep clear of the kink, where differences are not derivatives
        assume(all(np.abs(a).min() > 1e-3 for a in pre_activations(layers, x, act)[:-1]))
    theta = pack(layers)
    m = MLP(sizes, activation=act)
    J_fd = central_fd(lambda t: ref_mlp(m.unflatten(t), x, act), theta)
    assert_fd_close(m.jacobian(theta, x), J_fd)
    assert_fd_close(m.jacobian(theta, x, method="autograd"), J_fd)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_jacobian_vs_finite_differences(bias):
    rng = np.random.default_rng(1)
    m = Linear(4, 3, bias=bias)
    theta, x = rng.standard_normal(m.n_params), rng.standard_normal(4)
    assert_fd_close(m.jacobian(theta, x), central_fd(lambda t: m.apply(t, x), theta))


def _two_output_fn(theta, x):
    z = anp.dot(theta[:3], x)
    return anp.array([anp.sin(z) * theta[3], anp.exp(0.5 * theta[3]) + z**2])


def test_function_jacobian_vs_finite_differences():
    rng = np.random.default_rng(2)
    m = Function(_two_output_fn, n_params=4, out_dim=2, in_dim=3)
    theta, x = rng.standard_normal(4), rng.standard_normal(3)
    J = m.jacobian(theta, x)
    assert J.shape == (2, 4) and J.dtype == np.float64
    assert_fd_close(J, central_fd(lambda t: m.apply(t, x), theta))
    # the same derivative written out by hand
    z = theta[:3] @ x
    J_hand = np.zeros((2, 4))
    J_hand[0, :3] = np.cos(z) * theta[3] * x
    J_hand[0, 3] = np.sin(z)
    J_hand[1, :3] = 2 * z * x
    J_hand[1, 3] = 0.5 * np.exp(0.5 * theta[3])
    np.testing.assert_allclose(J, J_hand, rtol=1e-13, atol=1e-14)


def test_function_scalar_output_reshaped():
    m = Function(lambda t, x: anp.sum(t * x) ** 2, n_params=3, out_dim=1, in_dim=3)
    theta, x = np.array([1.0, 2.0, -1.0]), np.array([0.5, 0.25, 1.0])
    f = m.apply(theta, x)
    assert f.shape == (1,)
    np.testing.assert_allclose(f, [0.0])  # 0.5 + 0.5 - 1
    J = m.jacobian(theta, x)
    assert J.shape == (1, 3)
    np.testing.assert_allclose(J, np.zeros((1, 3)), atol=1e-15)
    np.testing.assert_allclose(m.jacobian([1.0, 1.0, 1.0], x), [2 * 1.75 * x], rtol=1e-14)


def test_function_wrong_output_size_raises():
    m = Function(lambda t, x: t, n_params=3, out_dim=2)
    with pytest.raises(ValueError, match="out_dim"):
        m.apply(np.zeros(3), np.zeros(1))


def test_relu_derivative_at_zero_is_zero_and_elu_is_one():
    # MLP([1, 1, 1]): f = w2 act(w1 x + b1) + b2, evaluated where w1 x + b1 = 0 exactly
    theta = np.array([1.0, 0.0, 2.0, 0.0])  # w1, b1, w2, b2
    x = np.array([0.0])
    m = MLP([1, 1, 1], activation="relu")
    for method in ("manual", "autograd"):
        np.testing.assert_array_equal(m.jacobian(theta, x, method=method), [[0.0, 0.0, 0.0, 1.0]])
    m = MLP([1, 1, 1], activation="elu")
    for method in ("manual", "autograd"):
        # d/dw1 = w2 * x = 0, d/db1 = w2 * 1, d/dw2 = elu(0) = 0, d/db2 = 1
        np.testing.assert_allclose(m.jacobian(theta, x, method=method), [[0.0, 2.0, 0.0, 1.0]], atol=1e-15)


def test_models_compose_with_autograd():
    rng = np.random.default_rng(3)
    m = MLP([3, 4, 2], activation="sigmoid")
    theta, x = m.init_params(rng) + 0.1 * rng.standard_normal(m.n_params), rng.standard_normal(3)
    g = autograd.grad(lambda t: anp.sum(m.apply(t, x)))(theta)
    np.testing.assert_allclose(g, m.jacobian(theta, x).sum(axis=0), rtol=1e-12, atol=1e-14)
    # Hessian of f_0 (a model inside autograd.hessian) vs differences of the manual Jacobian
    H = autograd.hessian(lambda t: m.apply(t, x)[0])(theta)
    H_fd = central_fd(lambda t: m.jacobian(t, x)[0], theta)
    np.testing.assert_allclose(H, H_fd, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# batches
# ---------------------------------------------------------------------------------------------


def _models():
    return [
        Linear(3, 2),
        Linear(3, 2, bias=False),
        MLP([3, 5, 2], activation="tanh"),
        MLP([3, 4, 4, 1], activation="relu"),
        Function(_two_output_fn, n_params=4, out_dim=2, in_dim=3),
    ]


@pytest.mark.parametrize("model", _models(), ids=repr)
def test_apply_batch_equals_loop(model):
    rng = np.random.default_rng(4)
    theta = rng.standard_normal(model.n_params)
    X = rng.standard_normal((7, 3))
    F = model.apply_batch(theta, X)
    assert F.shape == (7, model.out_dim) and F.dtype == np.float64
    np.testing.assert_allclose(F, np.stack([model.apply(theta, x) for x in X]), rtol=1e-13, atol=1e-14)
    assert model.apply_batch(theta, np.zeros((0, 3))).shape == (0, model.out_dim)


# ---------------------------------------------------------------------------------------------
# initialisation
# ---------------------------------------------------------------------------------------------


def assert_normal_moments(w, var):
    """Sample mean and variance of n draws within 6 standard errors of N(0, var)."""
    n = w.size
    assert abs(w.mean()) < 6 * np.sqrt(var / n)
    assert abs(w.var() - var) < 6 * var * np.sqrt(2.0 / n)  # se of a normal sample variance


def test_mlp_init_params_lecun_normal():
    sizes = [400, 300, 50]
    m = MLP(sizes)
    theta = m.init_params(np.random.default_rng(5))
    assert theta.shape == (m.n_params,) and theta.dtype == np.float64
    pos = 0
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        W, b = theta[pos : pos + n_out * n_in], theta[pos + n_out * n_in : pos + n_out * (n_in + 1)]
        pos += n_out * (n_in + 1)
        assert_normal_moments(W, 1.0 / n_in)
        np.testing.assert_array_equal(b, np.zeros(n_out))
    # reproducible from the generator alone
    np.testing.assert_array_equal(theta, m.init_params(np.random.default_rng(5)))


def test_linear_init_params_lecun_normal():
    m = Linear(500, 200)
    theta = m.init_params(np.random.default_rng(6))
    assert theta.shape == (m.n_params,)
    assert_normal_moments(theta[: 500 * 200], 1.0 / 500)
    np.testing.assert_array_equal(theta[500 * 200 :], np.zeros(200))


def test_function_init_params():
    m = Function(lambda t, x: anp.sum(t), n_params=50_000, out_dim=1)
    theta = m.init_params(np.random.default_rng(7))
    assert theta.shape == (50_000,)
    assert_normal_moments(theta, 1.0)
    m2 = Function(lambda t, x: anp.sum(t), n_params=3, out_dim=1, init=lambda rng: np.full(3, 0.5))
    np.testing.assert_array_equal(m2.init_params(np.random.default_rng(0)), [0.5, 0.5, 0.5])
    m3 = Function(lambda t, x: anp.sum(t), n_params=3, out_dim=1, init=lambda rng: np.zeros(4))
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)"):
        m3.init_params(np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        MLP([2, 1]).init_params(0)


# ---------------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------------


def _calls(model, theta, x):
    return {
        "apply": lambda: model.apply(theta, x),
        "jacobian": lambda: model.jacobian(theta, x),
        "value_and_jacobian": lambda: model.value_and_jacobian(theta, x),
    }


@pytest.mark.parametrize("model", _models(), ids=repr)
@pytest.mark.parametrize("call", ["apply", "jacobian", "value_and_jacobian"])
def test_bad_inputs_raise_named_errors(model, call):
    P = model.n_params
    good_t, good_x = np.zeros(P), np.zeros(3)
    cases = [
        (np.zeros(P + 1), good_x, ValueError, [r"theta", rf"\({P},\)", rf"\({P + 1},\)"]),
        (np.zeros((P, 1)), good_x, ValueError, [r"theta", rf"\({P},\)", rf"\({P}, 1\)"]),
        (good_t, np.zeros(4), ValueError, [r"\bx\b", r"\(3,\)", r"\(4,\)"]),
        (good_t, np.array([0.0, np.nan, 1.0]), ValueError, [r"x contains NaN or inf"]),
        (np.full(P, np.inf), good_x, ValueError, [r"theta contains NaN or inf"]),
        (good_t, np.array(["a", "b", "c"]), TypeError, [r"\bx\b"]),
        (good_t, np.array([1 + 1j, 0, 0]), TypeError, [r"\bx\b"]),
    ]
    for theta, x, exc, patterns in cases:
        with pytest.raises(exc) as info:
            _calls(model, theta, x)[call]()
        for pat in patterns:
            assert re.search(pat, str(info.value)), (pat, str(info.value))


def test_batch_and_method_checks():
    m = MLP([3, 2, 1])
    theta = np.zeros(m.n_params)
    with pytest.raises(ValueError, match=r"X.*\(\?, 3\).*\(5, 2\)"):
        m.apply_batch(theta, np.zeros((5, 2)))
    with pytest.raises(ValueError, match="X contains NaN"):
        m.apply_batch(theta, np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="method"):
        m.jacobian(theta, np.zeros(3), method="finite")
    with pytest.raises(ValueError, match="activation"):
        MLP([2, 1], activation="swish")
    with pytest.raises(ValueError, match="layer_sizes"):
        MLP([3])
    with pytest.raises(ValueError, match="in_dim"):
        Linear(0, 2)
    with pytest.raises(ValueError, match=r"W_0.*\(2, 3\).*\(3, 2\)"):
        m.flatten([(np.zeros((3, 2)), np.zeros(2)), (np.zeros((1, 2)), np.zeros(1))])
    # lists and ints are converted to float64
    f = m.apply([0] * m.n_params, [1, 2, 3])
    assert f.dtype == np.float64


def test_models_are_immutable_and_repr_informative():
    m = MLP([8, 16, 1], activation="identity")
    assert m.activation == "linear"
    with pytest.raises(AttributeError):
        m.n_params = 3
    with pytest.raises(ValueError):
        m.layer_offsets[0, 0] = 5
    r = repr(m)
    assert "[8, 16, 1]" in r and "linear" in r and str(8 * 16 + 16 + 16 + 1) in r
    assert "in_dim=4" in repr(Linear(4, 2)) and "bias=False" in repr(Linear(4, 2, bias=False))
    assert "n_params=5" in repr(Function(lambda t, x: t[0], 5, 1))
    assert all(isinstance(mod, Model) for mod in _models())
