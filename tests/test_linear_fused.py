"""rb.Linear has the parameter layout of an MLP with no hidden layer (with or without bias), so the
compiled one-call steps serve it; they must give the NumPy reference's numbers."""

import numpy as np
import pytest

import refbayes as rb

MAKERS = {
    "LoFi": lambda m, l, b: rb.LoFi(m, l, rank=4, gamma=0.95, q=0.01, backend=b),
    "FDEKF": lambda m, l, b: rb.FDEKF(m, l, gamma=0.95, q=0.01, backend=b),
    "VDEKF": lambda m, l, b: rb.VDEKF(m, l, gamma=0.95, q=0.01, backend=b),
    "Bong-dlr": lambda m, l, b: rb.Bong(m, l, family="dlr", rank=4, gamma=0.95, q=0.01, backend=b),
    "Bong-diag": lambda m, l, b: rb.Bong(m, l, family="diag", gamma=0.95, q=0.01, backend=b),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("kind", ["gaussian", "categorical"])
def test_linear_model_on_the_compiled_step_equals_the_reference(name, kind, bias):
    rng = np.random.default_rng(0)
    model = rb.Linear(20, 3, bias=bias)
    lik = rb.Gaussian(0.3) if kind == "gaussian" else rb.Categorical(3)
    X = rng.standard_normal((30, 20))
    Y = rng.standard_normal((30, 3)) if kind == "gaussian" else rng.integers(0, 3, 30)
    theta = model.init_params(rng)
    if bias:
        theta[-3:] = rng.standard_normal(3)  # non-zero biases, so that a bias read at the wrong offset shows
    prior_var = rng.uniform(0.3, 1.0, model.n_params)  # distinct variances: no ties in LO-FI's truncation
    ref, fast = MAKERS[name](model, lik, "numpy"), MAKERS[name](model, lik, "numba")
    assert fast._fused_step(fast.init(theta, prior_var), X[0], Y[0]) is not None  # the compiled step serves it
    b0, r0 = ref.scan(ref.init(theta, prior_var), X, Y)
    b1, r1 = fast.scan(fast.init(theta, prior_var), X, Y)
    np.testing.assert_allclose(b1.mean, b0.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b1.marginal_variance(), b0.marginal_variance(), rtol=1e-10)
    np.testing.assert_allclose(r1.log_pred, r0.log_pred, rtol=1e-10)
    assert not np.allclose(b1.mean, theta)  # the observations moved the mean


def test_no_bias_step_is_the_bias_step_with_the_bias_pinned():
    # a Linear(bias=False) belief is the Linear(bias=True) one whose biases have zero mean and
    # (nearly) zero variance: the weights' posterior must agree (an independent check of the layout)
    rng = np.random.default_rng(3)
    D, C = 15, 3
    lik = rb.Gaussian(0.2)
    X, Y = rng.standard_normal((10, D)), rng.standard_normal((10, C))
    W0 = rng.standard_normal(C * D) / np.sqrt(D)
    var = rng.uniform(0.5, 1.0, C * D)
    nb = rb.FDEKF(rb.Linear(D, C, bias=False), lik, backend="numba")
    wb = rb.FDEKF(rb.Linear(D, C, bias=True), lik, backend="numba")
    b_nb, _ = nb.scan(nb.init(W0, var), X, Y)
    b_wb, _ = wb.scan(wb.init(np.concatenate([W0, np.zeros(C)]), np.concatenate([var, np.full(C, 1e-300)])), X, Y)
    np.testing.assert_allclose(b_wb.mean[:C * D], b_nb.mean, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(b_wb.var[:C * D], b_nb.var, rtol=1e-10)


def test_kernels_check_the_parameter_count_against_the_layout():
    from refbayes.kernels.cpu.mlp import layer_bias

    sizes = np.array([5, 2])
    assert layer_bias(sizes, 12) is True and layer_bias(sizes, 10) is False
    with pytest.raises(ValueError, match="parameters"):
        layer_bias(sizes, 11)
    with pytest.raises(ValueError, match="bias=True"):
        layer_bias(sizes, 10, bias=True)


@pytest.mark.parametrize("q", [0.0, 0.01], ids=["q0", "q"])
@pytest.mark.parametrize("sizes", [(2_500, 3), (2_600, 3, 2)], ids=["linear", "mlp"])
def test_units_wider_than_a_chunk_are_passed_over_by_blocks_with_the_reference_numbers(sizes, q):
    # a unit with more inputs than WIDE_UNIT is one chunk that both passes of the fused LO-FI step
    # walk by blocks of BLOCK_ROWS rows (sums added block by block); 2,500 and 2,600 inputs are not
    # multiples of the block, and the MLP has a narrow layer after the wide one
    from refbayes.kernels.cpu.step import BLOCK_ROWS, WIDE_UNIT

    assert sizes[0] > WIDE_UNIT and sizes[0] % BLOCK_ROWS
    rng = np.random.default_rng(4)
    model = rb.Linear(sizes[0], sizes[1]) if len(sizes) == 2 else rb.MLP(list(sizes), activation="tanh")
    lik = rb.Gaussian(0.3)
    X = rng.standard_normal((6, sizes[0])) / np.sqrt(sizes[0])
    Y = rng.standard_normal((6, sizes[-1]))
    theta = model.init_params(rng)
    prior_var = rng.uniform(0.3, 1.0, model.n_params)
    # rank 3 = C: with q = 0 the Linear model's singular values come in groups of C equal ones
    # (docs/lofi.md, "Ties at the cut"), and a rank inside a group has no unique truncation
    ref, fast = (rb.LoFi(model, lik, rank=3, gamma=0.95, q=q, backend=b) for b in ("numpy", "numba"))
    assert fast._fused_step(fast.init(theta, prior_var), X[0], Y[0]) is not None
    b0, r0 = ref.scan(ref.init(theta, prior_var), X, Y)
    b1, r1 = fast.scan(fast.init(theta, prior_var), X, Y)
    np.testing.assert_allclose(b1.mean, b0.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b1.marginal_variance(), b0.marginal_variance(), rtol=1e-10)
    np.testing.assert_allclose(r1.log_pred, r0.log_pred, rtol=1e-10)
    assert not np.allclose(b1.mean, theta)


def test_pieces_of_a_wide_unit_give_the_reference_numbers_and_the_same_bits_on_any_thread_count():
    # rb.Linear(40_000, 1): one unit, cut into three pieces (16,384 + 16,384 + 7,232 rows) that the
    # threads share; their sums are added in chunk order, so one thread and three give the same bits
    from refbayes.kernels import _host
    from refbayes.kernels.cpu.step import PIECE_ROWS, WIDE_UNIT

    D = 40_000
    assert D > WIDE_UNIT and -(-D // PIECE_ROWS) == 3
    rng = np.random.default_rng(5)
    model, lik = rb.Linear(D, 1), rb.Gaussian(0.3)
    X, Y = rng.standard_normal((4, D)) / np.sqrt(D), rng.standard_normal((4, 1))
    theta = model.init_params(rng)
    prior_var = rng.uniform(0.3, 1.0, model.n_params)
    ref, fast = (rb.LoFi(model, lik, rank=3, gamma=0.95, q=0.01, backend=b) for b in ("numpy", "numba"))
    b0, r0 = ref.scan(ref.init(theta, prior_var), X, Y)
    saved = _host.n_threads
    try:
        _host.n_threads = lambda: 1
        b1, r1 = fast.scan(fast.init(theta, prior_var), X, Y)
        _host.n_threads = lambda: 3
        b3, r3 = fast.scan(fast.init(theta, prior_var), X, Y)
    finally:
        _host.n_threads = saved
    np.testing.assert_allclose(b1.mean, b0.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b1.marginal_variance(), b0.marginal_variance(), rtol=1e-10)
    np.testing.assert_allclose(r1.log_pred, r0.log_pred, rtol=1e-10)
    for a, b in ((b1.mean, b3.mean), (b1.ups, b3.ups), (b1.W, b3.W), (r1.log_pred, r3.log_pred)):
        np.testing.assert_array_equal(a, b)
