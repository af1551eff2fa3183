"""Beliefs are immutable, their dense forms agree, their samplers have the right moments,
and save/load round-trips them bit-exactly."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refbayes as rb
from refbayes import linalg


def random_spd(rng, n, floor=0.5):
    A = rng.standard_normal((n, n))
    return A @ A.T / n + floor * np.eye(n)


def make_beliefs(rng, P, L):
    mean = rng.standard_normal(P)
    perm = rng.permutation(P)
    groups = (perm[: P // 2], perm[P // 2:])
    return [
        rb.FullCov(mean, random_spd(rng, P)),
        rb.Diag(mean, rng.uniform(0.2, 2.0, P)),
        rb.BlockDiag(mean, groups, tuple(random_spd(rng, len(g)) for g in groups)),
        rb.DLR(mean, rng.uniform(0.5, 2.0, P), rng.standard_normal((P, L))),
    ]


@settings(max_examples=30, deadline=None)
@given(P=st.integers(2, 9), L=st.integers(0, 4), seed=st.integers(0, 2**32 - 1))
def test_dense_forms_are_consistent(P, L, seed):
    rng = np.random.default_rng(seed)
    J = rng.standard_normal((3, P))
    for bel in make_beliefs(rng, P, L):
        cov, prec = bel.covariance(), bel.precision()
        np.testing.assert_allclose(cov @ prec, np.eye(P), atol=1e-10)
        np.testing.assert_allclose(bel.marginal_variance(), np.diag(cov), rtol=1e-12)
        np.testing.assert_allclose(bel.project(J), J @ cov @ J.T, rtol=1e-10, atol=1e-12)


def test_dlr_precision_is_diag_plus_low_rank():
    rng = np.random.default_rng(0)
    ups, W = rng.uniform(1, 2, 6), rng.standard_normal((6, 2))
    bel = rb.DLR(np.zeros(6), ups, W)
    expected = np.diag(ups) + sum(np.outer(W[:, k], W[:, k]) for k in range(2))
    np.testing.assert_allclose(bel.precision(), expected, rtol=1e-14)
    np.testing.assert_allclose(bel.covariance(), np.linalg.inv(expected), rtol=1e-10)


def test_beliefs_are_immutable_and_copy_their_input():
    rng = np.random.default_rng(1)
    mean = rng.standard_normal(4)
    bel = rb.Diag(mean, np.ones(4))
    mean[0] = 100.0
    assert bel.mean[0] != 100.0
    with pytest.raises(ValueError):
        bel.mean[0] = 1.0
    with pytest.raises(Exception):
        bel.mean = np.zeros(4)
    assert bel.mean.dtype == np.float64


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: rb.Diag(np.zeros(3), np.array([1.0, 0.0, 1.0])), "var"),
        (lambda: rb.Diag(np.zeros(3), np.ones(4)), "var"),
        (lambda: rb.Diag(np.array([0.0, np.nan, 0.0]), np.ones(3)), "mean"),
        (lambda: rb.DLR(np.zeros(3), -np.ones(3), np.zeros((3, 1))), "ups"),
        (lambda: rb.DLR(np.zeros(3), np.ones(3), np.zeros((2, 1))), "W"),
        (lambda: rb.FullCov(np.zeros(2), np.array([[1.0, 0.5], [0.0, 1.0]])), "symmetric"),
        (lambda: rb.BlockDiag(np.zeros(3), ([0, 1], [1, 2]), (np.eye(2), np.eye(2))), "partition"),
    ],
)
def test_bad_beliefs_raise(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("kind", range(4))
def test_sample_moments_within_standard_errors(kind):
    rng = np.random.default_rng(7 + kind)
    P, n = 4, 40_000
    bel = make_beliefs(rng, P, 2)[kind]
    draws = bel.sample(np.random.default_rng(123), n)
    assert draws.shape == (n, P)
    cov = bel.covariance()
    sd = np.sqrt(np.diag(cov))
    # mean: standard error sd / sqrt(n)
    assert np.all(np.abs(draws.mean(0) - bel.mean) < 6 * sd / np.sqrt(n))
    # covariance entries: Var(x_i x_j) = S_ii S_jj + S_ij^2 for Gaussians
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    emp = np.cov(draws.T)
    assert np.all(np.abs(emp - cov) < 6 * se)


def test_sample_requires_generator():
    bel = rb.Diag(np.zeros(2), np.ones(2))
    with pytest.raises(TypeError, match="rng"):
        bel.sample(0)
    assert bel.sample(np.random.default_rng(0)).shape == (2,)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_save_load_round_trip_is_bit_exact(tmp_path, dtype):
    rng = np.random.default_rng(3)
    for i, bel in enumerate(make_beliefs(rng, 7, 3)):
        bel = bel.astype(dtype)
        assert bel.dtype == dtype and bel.mean.dtype == dtype
        path = tmp_path / f"b{i}.npz"
        rb.save(bel, path)
        back = rb.load(path)
        assert type(back) is type(bel)
        assert back.dtype == dtype
        for name in type(bel).__dataclass_fields__:
            a, b = getattr(bel, name), getattr(back, name)
            if name == "dtype":
                assert a == b
            elif isinstance(a, tuple):
                assert all(np.array_equal(x, y) for x, y in zip(a, b))
            else:
                assert a.tobytes() == b.tobytes()


def test_load_rejects_foreign_files(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, a=np.zeros(2))
    with pytest.raises(ValueError, match="not a refbayes belief"):
        rb.load(path)


def test_dlr_helpers_never_need_dense_matrices():
    rng = np.random.default_rng(5)
    P, L = 50, 3
    ups, W = rng.uniform(1, 2, P), rng.standard_normal((P, L))
    B = rng.standard_normal((P, 2))
    dense = np.diag(ups) + W @ W.T
    np.testing.assert_allclose(linalg.dlr_solve(ups, W, B), np.linalg.solve(dense, B), rtol=1e-10)
    np.testing.assert_allclose(linalg.dlr_solve(ups, W[:, :0], B), B / ups[:, None], rtol=1e-14)


def test_lofi_belief_with_optional_state_round_trips(tmp_path):
    from refbayes.filters.lofi import LoFiBelief

    rng = np.random.default_rng(4)
    P = 5
    full = LoFiBelief(rng.standard_normal(P), rng.uniform(1, 2, P), rng.standard_normal((P, 2)),
                      obs_var=0.37, n_obs=12, prior_mean=rng.standard_normal(P), prior_prec=rng.uniform(1, 2, P))
    bare = LoFiBelief(rng.standard_normal(P), rng.uniform(1, 2, P), rng.standard_normal((P, 0)))
    for i, bel in enumerate((full, bare)):
        rb.save(bel, tmp_path / f"l{i}.npz")
        back = rb.load(tmp_path / f"l{i}.npz")
        assert type(back) is LoFiBelief
        assert back.obs_var == bel.obs_var and back.n_obs == bel.n_obs and isinstance(back.n_obs, int)
        for name in ("mean", "ups", "W", "prior_mean", "prior_prec"):
            a, b = getattr(bel, name), getattr(back, name)
            assert (a is None and b is None) or a.tobytes() == b.tobytes()


# --- ReplayBelief (SGD-RB / OGD state) and one belief from every filter class ---------------------------

REPLAY_FIELDS = ("mean", "opt_m", "opt_v")


def assert_same_belief(bel, back):
    """Same type and bit-identical fields (arrays, tuples of arrays, scalars)."""
    assert type(back) is type(bel)
    for name in type(bel).__dataclass_fields__:
        a, b = getattr(bel, name), getattr(back, name)
        if isinstance(a, tuple):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
        else:
            assert type(a) is type(b) and a == b


def round_trip(bel, path):
    rb.save(bel, path)
    back = rb.load(path)
    assert_same_belief(bel, back)
    return back


def replay_problem(kind, rng):
    """(model, likelihood, X (T, 3), Y): 3-class labels or 2-d regression targets."""
    if kind == "classification":
        model = rb.MLP([3, 4, 3], activation="tanh")
        return model, rb.Categorical(3), rng.standard_normal((12, 3)), rng.integers(0, 3, 12)
    model = rb.MLP([3, 4, 2], activation="tanh")
    return model, rb.Gaussian(0.5), rng.standard_normal((12, 3)), rng.standard_normal((12, 2))


@pytest.mark.parametrize("kind", ["classification", "regression"])
@pytest.mark.parametrize("n_obs", [0, 2, 12])  # empty, part-filled and full (buffer 5) buffers
def test_replay_belief_round_trip_is_bit_exact(tmp_path, kind, n_obs):
    rng = np.random.default_rng(11)
    model, lik, X, Y = replay_problem(kind, rng)
    filt = rb.SGDRB(model, lik, buffer_size=5, lr=0.05, optimizer="adam", n_iter=2)
    bel = filt.init(model.init_params(rng))
    if n_obs:
        bel, _ = filt.scan(bel, X[:n_obs], Y[:n_obs])
    assert bel.count == min(n_obs, 5) and bel.n_steps == 2 * n_obs
    back = round_trip(bel, tmp_path / "r.npz")
    assert isinstance(back.n_steps, int)
    target_shape = () if kind == "classification" else (2,)
    assert all(y.shape == target_shape and y.dtype == np.float64 for y in back.targets)
    if n_obs:  # the integer labels come back as the belief holds them (float64, the same values)
        expected = Y[n_obs - back.count:n_obs]
        np.testing.assert_array_equal(np.array(back.targets), expected)
        assert np.any(back.opt_v != 0)


@pytest.mark.parametrize("build", [
    lambda m, lik: rb.SGDRB(m, lik, buffer_size=4, lr=0.05, optimizer="adam", n_iter=2),
    lambda m, lik: rb.SGDRB(m, lik, buffer_size=3, lr=0.1, optimizer="sgd"),
    lambda m, lik: rb.OGD(m, lik, lr=0.1, optimizer="adam"),
], ids=["sgdrb-adam", "sgdrb-sgd", "ogd-adam"])
@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_scan_continued_after_load_matches_an_unbroken_scan(tmp_path, build, kind):
    rng = np.random.default_rng(12)
    model, lik, X, Y = replay_problem(kind, rng)
    filt = build(model, lik)
    bel0 = filt.init(model.init_params(rng))
    whole, hist = filt.scan(bel0, X, Y)
    half, hist_a = filt.scan(bel0, X[:7], Y[:7])
    rb.save(half, tmp_path / "half.npz")
    cont, hist_b = filt.scan(rb.load(tmp_path / "half.npz"), X[7:], Y[7:])
    assert_same_belief(whole, cont)
    np.testing.assert_array_equal(np.concatenate([hist_a["yhat"], hist_b["yhat"]]), hist["yhat"])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 12), P=st.integers(1, 6), in_dim=st.integers(1, 4), out=st.sampled_from([0, 1, 3]),
       n_steps=st.integers(0, 10**6), seed=st.integers(0, 2**32 - 1))
def test_replay_belief_round_trip_over_buffer_sizes(n, P, in_dim, out, n_steps, seed):
    import tempfile

    rng = np.random.default_rng(seed)
    shape = () if out == 0 else (out,)  # 0: scalar class labels
    targets = [rng.integers(0, 5, shape) if out == 0 else rng.standard_normal(shape) for _ in range(n)]
    bel = rb.ReplayBelief(rng.standard_normal(P), tuple(rng.standard_normal((n, in_dim))), tuple(targets),
                          opt_m=rng.standard_normal(P), opt_v=rng.uniform(0, 1, P), n_steps=n_steps)
    with tempfile.TemporaryDirectory() as tmp:
        back = round_trip(bel, os.path.join(tmp, "r.npz"))
    assert back.count == n and back.n_steps == n_steps


def replay_file(tmp_path, keep_checksum=False, **edits):
    """A saved 3-slot ReplayBelief with keys replaced (value) or removed (None).

    The edited file drops ``__checksum__`` (like a file written before checksums were stored) unless
    ``keep_checksum``: a hand edit leaves the stored SHA-256 stale, which load reports before the edit itself.
    """
    rng = np.random.default_rng(13)
    inputs, targets = tuple(rng.standard_normal((3, 2))), tuple(rng.standard_normal((3, 1)))
    bel = rb.ReplayBelief(rng.standard_normal(4), inputs, targets)
    good = tmp_path / "good.npz"
    rb.save(bel, good)
    with np.load(good) as data:
        arrays = {k: data[k] for k in data.files if keep_checksum or k != "__checksum__"}
    for key, value in edits.items():
        if value is None:
            del arrays[key]
        else:
            arrays[key] = value
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("edits, match", [
    ({"input_1": None}, "malformed ReplayBelief.*'input_1' is missing"),
    ({"target_2": None}, "malformed ReplayBelief.*'target_2' is missing"),
    ({"n_buffer": None}, "malformed ReplayBelief.*'n_buffer' is missing"),
    ({"opt_v": None}, "malformed ReplayBelief.*'opt_v' is missing"),
    ({"n_buffer": np.array(2)}, "malformed ReplayBelief.*'input_2' but n_buffer = 2"),
    ({"n_buffer": np.array(-1)}, "'n_buffer' must be an integer >= 0"),
    ({"n_buffer": np.array(3.0)}, "'n_buffer' must be an integer >= 0"),
    ({"n_steps": np.array([1, 2])}, "'n_steps' must be a scalar"),
    ({"n_steps": np.array(1.5)}, "invalid ReplayBelief.*n_steps"),
    ({"mean": np.array([0.0, np.nan, 0.0, 0.0])}, "invalid ReplayBelief.*mean"),
    ({"opt_m": np.zeros(5)}, "invalid ReplayBelief.*opt_m"),
    ({"__type__": np.array("ReplayBuffer")}, "unknown belief type 'ReplayBuffer'"),
    ({"__version__": np.array(2)}, "format version 2"),
    ({"__version__": np.array("1")}, "not a refbayes belief file"),
])
def test_malformed_replay_files_raise_clear_errors(tmp_path, edits, match):
    with pytest.raises(ValueError, match=match):
        rb.load(replay_file(tmp_path, **edits))


@pytest.mark.parametrize("edits", [{"mean": np.array([0.0, 1.0, 2.0, 3.0])}, {"n_steps": np.array(7)},
                                   {"target_0": np.array([5.0])}])
def test_an_edit_that_leaves_the_checksum_stale_is_reported(tmp_path, edits):
    with pytest.raises(ValueError, match="bad.npz: the checksum does not match"):
        rb.load(replay_file(tmp_path, keep_checksum=True, **edits))
    rb.load(replay_file(tmp_path, keep_checksum=False, **edits))  # the same edit without a checksum is valid


def test_load_rejects_a_missing_field_and_a_bare_npy_file(tmp_path):
    rng = np.random.default_rng(14)
    rb.save(rb.DLR(np.zeros(3), np.ones(3), rng.standard_normal((3, 1))), tmp_path / "d.npz")
    with np.load(tmp_path / "d.npz") as data:
        arrays = {k: data[k] for k in data.files if k != "W"}
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="malformed DLR file: key 'W' is missing"):
        rb.load(tmp_path / "bad.npz")
    np.save(tmp_path / "a.npy", np.zeros(3))
    with pytest.raises(ValueError, match="not a refbayes belief file"):
        rb.load(tmp_path / "a.npy")


def _filters():
    """(id, filter, prior mean, x, y) for every filter class; covers each belief type a filter returns."""
    from refbayes.filters.logistic import LogisticQKF, LogisticRVGA
    from refbayes.filters.subspace import SubspaceEKF

    rng = np.random.default_rng(15)
    mlp, lin = rb.MLP([2, 3, 1]), rb.Linear(2, 1)
    gauss = rb.Gaussian(2.0)  # a weak update keeps the moment-form BONG step positive definite
    theta = mlp.init_params(rng)
    x, y = np.array([0.3, -0.7]), np.array([0.4])
    P = mlp.n_params
    basis = np.linalg.qr(rng.standard_normal((P, 2)))[0]
    blocks = [np.arange(0, 5), np.arange(5, P)]
    out = [
        ("FullEKF", rb.FullEKF(mlp, gauss), theta),
        ("FDEKF", rb.FDEKF(mlp, gauss), theta),
        ("VDEKF", rb.VDEKF(mlp, gauss), theta),
        ("FDEKF-blocks", rb.FDEKF(mlp, gauss, blocks=blocks), theta),
        ("LoFi", rb.LoFi(mlp, gauss, rank=2), theta),
        ("LoFi-adaptive", rb.LoFi(mlp, gauss, rank=2, adaptive_obs_noise=True), theta),
        ("RVGA", rb.RVGA(mlp, gauss), theta),
        ("LogisticRVGA", LogisticRVGA(lin, rb.Bernoulli()), np.zeros(3)),
        ("LogisticQKF", LogisticQKF(lin, rb.Bernoulli()), np.zeros(3)),
        ("SubspaceEKF-full", SubspaceEKF(mlp, gauss, basis=basis, offset=theta), np.zeros(2)),
        ("SubspaceEKF-diag", SubspaceEKF(mlp, gauss, basis=basis, offset=theta, cov="diag"), np.zeros(2)),
        ("SGDRB", rb.SGDRB(mlp, gauss, buffer_size=3), theta),
        ("OGD", rb.OGD(mlp, gauss), theta),
    ]
    out += [(f"Bong-{fam}", rb.Bong(mlp, gauss, family=fam, rank=2), theta)
            for fam in ("full-moment", "full", "diag-moment", "diag", "dlr")]
    return [(name, filt, mean, x, (np.array([1.0]) if "Logistic" in name else y)) for name, filt, mean in out]


@pytest.mark.parametrize("case", _filters(), ids=lambda c: c[0])
def test_every_filter_belief_round_trips(tmp_path, case):
    _, filt, mean, x, y = case
    bel = filt.init(mean, prior_var=1.0 if isinstance(filt, rb.SGDRB) else 0.1)  # no covariance in SGDRB/OGD
    bel = filt.update(filt.predict(bel), x, y)
    assert isinstance(bel, filt.belief_type)
    back = round_trip(bel, tmp_path / "f.npz")
    assert type(back) is type(bel)
