"""Parameter interchange: round trips and forward passes in each library's own convention.

Each library's forward pass is written here in plain NumPy from that library's documented
convention (torch: x @ W.T + b with W (out, in); flax, haiku, Keras: x @ kernel + b with kernel
(in, out)), independently of refbayes's own forward pass, and compared with ``model.apply``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes import interchange as ic

ACT = {
    "tanh": np.tanh,
    "relu": lambda a: np.maximum(a, 0.0),
    "sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)),
    "elu": lambda a: np.where(a > 0, a, np.exp(np.minimum(a, 0.0)) - 1.0),
    "linear": lambda a: a,
}

sizes_st = st.lists(st.integers(1, 6), min_size=2, max_size=5)
act_st = st.sampled_from(sorted(ACT))


def _random_theta(model, seed):
    # not init_params: biases must be non-zero for the layout to be checked
    return np.random.default_rng(seed).standard_normal(model.n_params)


def _torch_forward(sd, keys, act, X):
    H = X
    for i, (wk, bk) in enumerate(keys):
        H = H @ sd[wk].T + sd[bk]
        if i < len(keys) - 1:
            H = ACT[act](H)
    return H


def _kernel_forward(pairs, act, X):
    H = X
    for i, (K, b) in enumerate(pairs):
        H = H @ K + (0.0 if b is None else b)
        if i < len(pairs) - 1:
            H = ACT[act](H)
    return H


def _reference(model, theta, X):
    return np.array([model.apply(theta, x) for x in X])


@settings(max_examples=25, deadline=None)
@given(sizes=sizes_st, act=act_st, seed=st.integers(0, 2**31 - 1))
def test_mlp_round_trips_and_forward_passes(sizes, act, seed):
    model = rb.MLP(sizes, activation=act)
    theta = _random_theta(model, seed)
    X = np.random.default_rng(seed + 1).standard_normal((4, sizes[0]))
    expected = _reference(model, theta, X)
    L = len(sizes) - 1

    sd = ic.to_torch_state_dict(model, theta)
    keys = [(f"{2 * l}.weight", f"{2 * l}.bias") for l in range(L)]
    assert list(sd) == [k for pair in keys for k in pair]
    for l, (wk, bk) in enumerate(keys):
        assert sd[wk].shape == (sizes[l + 1], sizes[l]) and sd[bk].shape == (sizes[l + 1],)
    np.testing.assert_allclose(_torch_forward(sd, keys, act, X), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ic.from_torch_state_dict(model, sd), theta)

    fl = ic.to_flax(model, theta)
    pairs = [(fl["params"][f"Dense_{l}"]["kernel"], fl["params"][f"Dense_{l}"]["bias"]) for l in range(L)]
    np.testing.assert_allclose(_kernel_forward(pairs, act, X), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ic.from_flax(model, fl), theta)
    np.testing.assert_array_equal(ic.from_flax(model, fl["params"]), theta)

    hk = ic.to_haiku(model, theta)
    names = ["linear"] + [f"linear_{l}" for l in range(1, L)]
    assert list(hk) == names
    pairs = [(hk[n]["w"], hk[n]["b"]) for n in names]
    np.testing.assert_allclose(_kernel_forward(pairs, act, X), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ic.from_haiku(model, hk), theta)

    ks = ic.to_keras(model, theta)
    assert len(ks) == 2 * L
    pairs = [(ks[2 * l], ks[2 * l + 1]) for l in range(L)]
    np.testing.assert_allclose(_kernel_forward(pairs, act, X), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ic.from_keras(model, ks), theta)


@settings(max_examples=20, deadline=None)
@given(n_in=st.integers(1, 5), n_out=st.integers(1, 5), bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_linear_round_trips_and_forward_passes(n_in, n_out, bias, seed):
    model = rb.Linear(n_in, n_out, bias=bias)
    theta = _random_theta(model, seed)
    X = np.random.default_rng(seed + 1).standard_normal((3, n_in))
    expected = _reference(model, theta, X)

    sd = ic.to_torch_state_dict(model, theta)  # one nn.Linear
    assert sorted(sd) == (["bias", "weight"] if bias else ["weight"])
    np.testing.assert_allclose(X @ sd["weight"].T + sd.get("bias", 0.0), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ic.from_torch_state_dict(model, sd), theta)
    seq = ic.to_torch_state_dict(model, theta, indices=[0])  # nn.Sequential(nn.Linear)
    assert "0.weight" in seq
    np.testing.assert_array_equal(ic.from_torch_state_dict(model, seq), theta)

    for tree, wkey, name in ((ic.to_flax(model, theta)["params"], "kernel", "Dense_0"),
                             (ic.to_haiku(model, theta), "w", "linear")):
        entry = tree[name]
        assert (("bias" in entry) or ("b" in entry)) == bias
        b = entry.get("bias", entry.get("b"))
        np.testing.assert_allclose(_kernel_forward([(entry[wkey], b)], "linear", X), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ic.from_flax(model, ic.to_flax(model, theta)), theta)
    np.testing.assert_array_equal(ic.from_haiku(model, ic.to_haiku(model, theta)), theta)
    ks = ic.to_keras(model, theta)
    assert len(ks) == (2 if bias else 1)
    np.testing.assert_allclose(_kernel_forward([(ks[0], ks[1] if bias else None)], "linear", X), expected,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ic.from_keras(model, ks), theta)


def test_layout_matches_documented_theta_order():
    """theta = [vec(W_0) row by row, b_0, vec(W_1), b_1]: written out by hand for a [2, 3, 1] MLP."""
    model = rb.MLP([2, 3, 1])
    theta = np.arange(model.n_params, dtype=float)  # 6 + 3 + 3 + 1 = 13
    sd = ic.to_torch_state_dict(model, theta)
    np.testing.assert_array_equal(sd["0.weight"], [[0, 1], [2, 3], [4, 5]])
    np.testing.assert_array_equal(sd["0.bias"], [6, 7, 8])
    np.testing.assert_array_equal(sd["2.weight"], [[9, 10, 11]])
    np.testing.assert_array_equal(sd["2.bias"], [12])
    np.testing.assert_array_equal(ic.to_keras(model, theta)[0], [[0, 2, 4], [1, 3, 5]])


def test_inferred_prefix_indices_and_ordering():
    model = rb.MLP([3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2])  # 11 layers: name order 0, 1, ..., 10 not 0, 1, 10, 2
    theta = _random_theta(model, 0)
    # nn.Sequential with dropout modules: indices 0, 3, 6, ... under a "module." prefix (DataParallel)
    idx = [3 * l for l in range(model.n_layers)]
    sd = {"module." + k: v for k, v in ic.to_torch_state_dict(model, theta, indices=idx).items()}
    np.testing.assert_array_equal(ic.from_torch_state_dict(model, sd), theta)
    fl = ic.to_flax(model, theta, names=[f"layers_{2 * l}" for l in range(model.n_layers)])
    np.testing.assert_array_equal(ic.from_flax(model, fl), theta)
    hk = ic.to_haiku(model, theta, names=[f"mlp/~/linear_{l}" for l in range(model.n_layers)])
    np.testing.assert_array_equal(ic.from_haiku(model, dict(reversed(list(hk.items())))), theta)
    np.testing.assert_array_equal(ic.from_haiku(model, ic.to_haiku(model, theta)), theta)


class _FakeTensor:
    """Stands in for a torch tensor: .detach().cpu().numpy() is the only route to its values."""

    def __init__(self, arr):
        self._arr = np.asarray(arr, dtype=np.float32)

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self._arr


def test_tensor_like_inputs_and_dtypes():
    model = rb.MLP([2, 3, 1])
    theta = _random_theta(model, 1)
    sd = {k: _FakeTensor(v) for k, v in ic.to_torch_state_dict(model, theta).items()}
    out = ic.from_torch_state_dict(model, sd)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, theta, rtol=1e-6)  # float32 storage
    ks = [a.tolist() for a in ic.to_keras(model, theta)]  # nested lists
    np.testing.assert_array_equal(ic.from_keras(model, ks), theta)


def test_outputs_are_copies():
    model = rb.MLP([2, 2, 1])
    theta = _random_theta(model, 2)
    keep = theta.copy()
    sd = ic.to_torch_state_dict(model, theta)
    sd["0.weight"][:] = 0.0
    ic.to_keras(model, theta)[0][:] = 0.0
    np.testing.assert_array_equal(theta, keep)


def test_shape_mismatch_names_key_and_shapes():
    model = rb.MLP([3, 4, 2])
    theta = _random_theta(model, 3)
    sd = ic.to_torch_state_dict(model, theta)
    sd["2.weight"] = np.zeros((4, 2))  # transposed
    with pytest.raises(ValueError, match=r"'2\.weight'.*expected shape \(2, 4\), got shape \(4, 2\)"):
        ic.from_torch_state_dict(model, sd)
    fl = ic.to_flax(model, theta)
    fl["params"]["Dense_0"]["kernel"] = np.zeros((4, 3))  # torch orientation given to flax
    with pytest.raises(ValueError, match=r"Dense_0.*kernel.*expected shape \(3, 4\), got shape \(4, 3\)"):
        ic.from_flax(model, fl)
    hk = ic.to_haiku(model, theta)
    hk["linear_1"]["b"] = np.zeros(3)
    with pytest.raises(ValueError, match=r"linear_1.*'b'.*expected shape \(2,\), got shape \(3,\)"):
        ic.from_haiku(model, hk)
    ks = ic.to_keras(model, theta)
    with pytest.raises(ValueError, match=r"weights must have 4 arrays.*got 3"):
        ic.from_keras(model, ks[:3])
    ks[2] = np.zeros((2, 4))
    with pytest.raises(ValueError, match=r"weights\[2\].*expected shape \(4, 2\), got shape \(2, 4\)"):
        ic.from_keras(model, ks)


def test_missing_extra_and_bad_entries():
    model = rb.MLP([3, 4, 2])
    theta = _random_theta(model, 4)
    sd = ic.to_torch_state_dict(model, theta)
    del sd["2.bias"]
    with pytest.raises(ValueError, match=r"no key '2\.bias'"):
        ic.from_torch_state_dict(model, sd)
    sd = ic.to_torch_state_dict(model, theta)
    sd["1.running_mean"] = np.zeros(4)
    with pytest.raises(ValueError, match="running_mean"):
        ic.from_torch_state_dict(model, sd)
    np.testing.assert_array_equal(ic.from_torch_state_dict(model, sd, strict=False), theta)
    sd = ic.to_torch_state_dict(model, theta)
    sd["4.weight"], sd["4.bias"] = np.zeros((2, 2)), np.zeros(2)
    with pytest.raises(ValueError, match="3 linear layers.*model has 2"):
        ic.from_torch_state_dict(model, sd)
    sd = ic.to_torch_state_dict(model, theta)
    sd["0.bias"] = np.full(4, np.nan)
    with pytest.raises(ValueError, match="NaN"):
        ic.from_torch_state_dict(model, sd)
    sd["0.bias"] = np.array(["a"] * 4)
    with pytest.raises(TypeError, match="real numbers"):
        ic.from_torch_state_dict(model, sd)
    fl = ic.to_flax(model, theta)
    fl["batch_stats"] = {}
    with pytest.raises(ValueError, match="batch_stats"):
        ic.from_flax(model, fl)
    np.testing.assert_array_equal(ic.from_flax(model, fl, strict=False), theta)
    with pytest.raises(ValueError, match="theta must have shape"):
        ic.to_keras(model, theta[:-1])
    with pytest.raises(TypeError, match="rb.MLP or rb.Linear"):
        ic.to_keras(rb.Function(lambda th, x: th[0] * x, 1, 1, in_dim=1), np.ones(1))
    lin = rb.Linear(2, 1, bias=False)
    with pytest.raises(ValueError, match="no bias in the model"):
        ic.from_flax(lin, {"Dense_0": {"kernel": np.zeros((2, 1)), "bias": np.zeros(1)}}, strict=False)


def test_loaded_weights_seed_a_filter():
    """A network's weights from another layout become a filter's prior mean unchanged."""
    model = rb.MLP([2, 5, 1])
    theta = _random_theta(model, 5)
    filt = rb.FDEKF(model, rb.Gaussian(0.1))
    bel = filt.init(ic.from_keras(model, ic.to_keras(model, theta)), prior_var=0.1)
    np.testing.assert_array_equal(bel.mean, theta)
    x = np.array([0.3, -0.2])
    np.testing.assert_allclose(filt.predict_obs(bel, x, method="plugin")[0], model.apply(theta, x), rtol=1e-12)


def test_real_torch_sequential():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    model = rb.MLP([3, 5, 4, 2], activation="tanh")
    theta = ic.from_torch_state_dict(model, net.state_dict())
    X = np.random.default_rng(0).standard_normal((6, 3))
    with torch.no_grad():
        ref = net(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(_reference(model, theta, X), ref, rtol=1e-12, atol=1e-12)
    theta2 = _random_theta(model, 7)
    net.load_state_dict({k: torch.from_numpy(v) for k, v in ic.to_torch_state_dict(model, theta2).items()})
    with torch.no_grad():
        ref2 = net(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(_reference(model, theta2, X), ref2, rtol=1e-12, atol=1e-12)


def test_interchange_guide_runs():
    """docs/interchange.md runs as written: its Python blocks, in order, in one namespace."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "interchange.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    env = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/interchange.md block {i + 1}", "exec"), env)
    assert "expected shape (4, 8), got shape (8, 4)" in env["message"]
    assert env["accuracy"] > 0.85


@pytest.mark.parametrize("act, sk_act", [("tanh", "tanh"), ("relu", "relu"), ("sigmoid", "logistic"),
                                         ("linear", "identity")])
def test_real_sklearn_mlp_through_the_keras_layout(act, sk_act):
    """scikit-learn's MLPRegressor is a real independent network with Keras's layout
    (coefs_[l] of shape (n_l, n_(l+1)), intercepts_[l]): its trained weights read through
    from_keras give the same outputs in rb.MLP, and to_keras writes weights it runs."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 3))
    Y = np.stack([np.sin(X[:, 0]), X[:, 1] * X[:, 2]], axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        net = MLPRegressor(hidden_layer_sizes=(5, 4), activation=sk_act, max_iter=50, random_state=0).fit(X, Y)
    model = rb.MLP([3, 5, 4, 2], activation=act)
    weights = [a for pair in zip(net.coefs_, net.intercepts_) for a in pair]
    theta = ic.from_keras(model, weights)
    np.testing.assert_allclose(model.apply_batch(theta, X), net.predict(X), rtol=1e-10, atol=1e-12)
    # and back: weights written by to_keras drive sklearn's forward pass
    theta2 = _random_theta(model, 11)
    ks = ic.to_keras(model, theta2)
    net.coefs_, net.intercepts_ = ks[0::2], ks[1::2]
    np.testing.assert_allclose(net.predict(X), _reference(model, theta2, X), rtol=1e-10, atol=1e-12)
