"""Every chunked or threaded path of the CPU kernels against the NumPy reference.

The kernels walk the parameters in chunks (``dlr.NBP``, ``lofi.NB``, ``diagonal.NBD`` rows;
``step.ROWS_PER_CHUNK`` rows of whole units) and hand the chunks to a few threads once a pass
has ``2 * _host.MIN_CHUNKS_PER_THREAD`` of them (``_host.run_chunks``; the fused MLP step too).
Comparing a path only with itself across thread counts cannot catch a wrong chunk offset or Gram weight: here each path runs at a size above its threshold,
on one thread and on two, and is compared with the reference formula row by row.
"""

import numba
import numpy as np
import pytest

import refbayes as rb
from refbayes import linalg, threads
from refbayes.beliefs import DLR, Diag
from refbayes.filters import diagonal as ref_diag
from refbayes.filters import lofi as ref_lofi
from refbayes.kernels import _host
from refbayes.kernels import cpu as K
from refbayes.kernels.cpu import diagonal as kdiag
from refbayes.kernels.cpu import dlr as kdlr
from refbayes.kernels.cpu import lofi as klofi
from refbayes.kernels.cpu import step as kstep
from problems import close


def above_threshold(P, rows_per_chunk):
    """P rows make enough chunks for two threads, and the last chunk is a partial one."""
    nch = -(-P // rows_per_chunk)
    return nch >= 2 * _host.MIN_CHUNKS_PER_THREAD and P % rows_per_chunk != 0


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def n_threads(request, monkeypatch):
    """Run the kernels on 1 or 2 threads; with 2, check that the pool really got work."""
    n = request.param
    if n > threads.available_cores() or n > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"needs {n} cores")
    submitted = []
    real_pool = _host._pool

    class Counting:
        def __init__(self, pool):
            self.pool = pool

        def submit(self, *args):
            submitted.append(args[0])
            return self.pool.submit(*args)

    monkeypatch.setattr(_host, "_pool", lambda k: Counting(real_pool(k)))
    threads.set_threads(numba=n)
    try:
        yield n, submitted
    finally:
        threads.set_threads()


def check_pool_used(n_threads):
    n, submitted = n_threads
    if n > 1:
        assert submitted, "the threaded path was not taken"
    else:
        assert not submitted


def row_sketch(W, Z):
    """W (W^T Z): rows of W W^T against a few random directions, without the P x P matrix."""
    return W @ (W.T @ Z)


# -- DLR predict (eqs 13-25): chunked above 2 * MIN_CHUNKS_PER_THREAD chunks of NBP rows ------------


@pytest.mark.parametrize("q_kind", ["scalar", "vector", "zero"])
@pytest.mark.parametrize("layout", ["C", "F"])
def test_dlr_predict_chunked_path_equals_the_reference(q_kind, layout, n_threads):
    P, L = 32 * kdlr.NBP + 777, 3
    assert above_threshold(P, kdlr.NBP)
    rng = np.random.default_rng(1)
    mean = rng.standard_normal(P)
    ups = rng.uniform(0.3, 2.0, P)
    W = rng.standard_normal((P, L))
    if layout == "F":
        W = np.asfortranarray(W)
    # a vector q that differs from chunk to chunk and inside each chunk: a read at a wrong offset shows
    q = {"scalar": 0.3, "vector": rng.uniform(0.0, 2.0, P), "zero": 0.0}[q_kind]
    m, u, Wn = K.dlr_predict(mean, ups, W, 0.9, q)
    ref = ref_lofi.predict(DLR(mean, ups, W), 0.9, q)
    check_pool_used(n_threads)
    close(m, ref.mean)
    np.testing.assert_allclose(u, ref.ups, rtol=1e-10)
    # the kernel and the reference take the same square root (M^{-T}, M = chol(I + W^T diag(q D) W))
    close(Wn, ref.W)


# -- LO-FI update (eqs 26-43): chunks of NB rows, three routes -----------------------------------------


@pytest.mark.parametrize("method", ["gram", "cholqr2", "tsqr"])
def test_lofi_update_chunked_routes_equal_the_reference(method, n_threads):
    P, L, C, rank = 32 * klofi.NB + 333, 3, 2, 3
    assert above_threshold(P, klofi.NB)
    rng = np.random.default_rng(2)
    mean = rng.standard_normal(P)
    ups = rng.uniform(0.3, 2.0, P)
    # columns of distinct sizes and a varying row scale: the singular values are well apart, so
    # the rank-3 truncation is unique, and rows in different chunks carry different weights
    W = rng.standard_normal((P, L)) * np.array([3.0, 1.5, 0.7]) * rng.uniform(0.5, 1.5, (P, 1))
    H = rng.standard_normal((C, P)) * np.array([[1.0], [0.4]])
    R = np.array([[0.5, 0.1], [0.1, 0.3]])
    e = rng.standard_normal(C)
    m, u, Wn, route = K.lofi_update(mean, ups, W, H, R, e, rank, method=method, return_route=True)
    assert route == method
    ref = ref_lofi.update(DLR(mean, ups, W), H, R, e, rank=rank)
    check_pool_used(n_threads)
    G, _ = rb.likelihoods.whiten(H, R, e)
    s = np.linalg.svd(np.hstack([W, G]), compute_uv=False)
    assert s[rank - 1] - s[rank] > 1e-3 * s[0]  # the test's premise: a unique truncation
    close(m, ref.mean)
    np.testing.assert_allclose(u, ref.ups, rtol=1e-10)
    Z = rng.standard_normal((P, 2))
    close(row_sketch(Wn, Z), row_sketch(ref.W, Z))


def test_lofi_update_chunked_path_with_rank_zero_and_a_singular_r(n_threads):
    # the categorical full-class form: R = diag(p) - p p^T is singular, H and e lie in its range
    P, L, C = 32 * klofi.NB + 5, 2, 3
    rng = np.random.default_rng(3)
    mean, ups, W = rng.standard_normal(P), rng.uniform(0.3, 2.0, P), rng.standard_normal((P, L))
    p = np.array([0.5, 0.3, 0.2])
    R = np.diag(p) - np.outer(p, p)
    H = R @ rng.standard_normal((C, P))
    e = np.eye(C)[1] - p
    m, u, Wn = K.lofi_update(mean, ups, W, H, R, e, 0, singular=True)
    ref = ref_lofi.update(DLR(mean, ups, W), H, R, e, rank=0, singular=True)
    check_pool_used(n_threads)
    assert Wn.shape == (P, 0)
    close(m, ref.mean)
    np.testing.assert_allclose(u, ref.ups, rtol=1e-10)


# -- FD-EKF / VD-EKF updates (eqs 10-14, 25): chunks of NBD parameters ------------------------------


@pytest.mark.parametrize("rule", ["fd", "vd-paper", "vd-ekf"])
def test_diagonal_updates_chunked_path_equal_the_reference(rule, n_threads):
    P, C = 32 * kdiag.NBD + 99, 3
    assert above_threshold(P, kdiag.NBD)
    rng = np.random.default_rng(4)
    mean = rng.standard_normal(P)
    var = rng.uniform(0.3, 2.0, P)
    H = rng.standard_normal((C, P)) * rng.uniform(0.2, 1.0, P) / 30.0
    A = rng.standard_normal((C, C))
    R = A @ A.T / C + 0.5 * np.eye(C)
    e = rng.standard_normal(C)
    if rule == "fd":
        m, v = K.fd_update(mean, var, H, R, e)
        ref = ref_diag.fd_update(Diag(mean, var), H, R, e)
    else:
        m, v = K.vd_update(mean, var, H, R, e, rule[3:])
        ref = ref_diag.vd_update(Diag(mean, var), H, R, e, rule[3:])
    check_pool_used(n_threads)
    close(m, ref.mean)
    np.testing.assert_allclose(v, ref.var, rtol=1e-10)


# -- the fused LO-FI step of an MLP: chunks of whole units, spread over the kernel threads -----------


@pytest.mark.parametrize("model", [rb.MLP([300, 40, 4]), rb.Linear(700, 36, bias=False), rb.Linear(700, 5)],
                         ids=["mlp", "linear-no-bias", "linear-few-chunks"])
def test_fused_step_chunks_on_numba_threads_equal_the_reference(model, n_threads):
    from refbayes.filters.base import linearize
    from refbayes.kernels.cpu.mlp import _offsets

    bias = not (isinstance(model, rb.Linear) and not model.bias)
    sizes = np.array([model.in_dim, model.out_dim]) if isinstance(model, rb.Linear) else np.array(model.layer_sizes)
    w0, b0, _, _, _ = _offsets(sizes, bias)
    assert kstep._chunks(sizes, w0, b0).shape[0] >= 4  # several chunks of whole units (one thread takes >= 1)
    rng = np.random.default_rng(5)
    lik = rb.Categorical(4) if model.out_dim == 4 else rb.Gaussian(0.3)
    P = model.n_params
    theta = model.init_params(rng) + 0.1 * rng.standard_normal(P)
    # a belief whose rows all differ: distinct diagonal, dense low-rank part
    rank = model.out_dim  # Linear: the C nearly equal columns of H are kept whole, the truncation is unique
    bel = DLR(theta, rng.uniform(0.5, 2.0, P), 0.3 * rng.standard_normal((P, rank)))
    x = rng.standard_normal(model.in_dim)
    y = int(rng.integers(4)) if model.out_dim == 4 else rng.standard_normal(model.out_dim)
    q = rng.uniform(0.0, 0.02, P)  # a vector q: each chunk must read its own rows
    filt = rb.LoFi(model, lik, rank=rank, gamma=0.97, q=q, backend="numba")
    with threads.step_threads(P, "numba"):  # the filter's own thread setting, as inside a step
        assert _host.n_threads() == n_threads[0]
        out = filt._fused_step(bel, x, y, predict=True)
    assert out is not None, "the compiled step did not serve this model"
    check_pool_used(n_threads)
    new, _ = out
    pred = ref_lofi.predict(bel, 0.97, q)
    lin = linearize(model, lik, pred.mean, x, y)
    ref = ref_lofi.update(pred, lin.H, lin.R, lin.e, rank=rank, singular=lin.singular)
    G, _ = rb.likelihoods.whiten(lin.H, lin.R, lin.e, singular=lin.singular)
    s = np.linalg.svd(np.hstack([pred.W, G]), compute_uv=False)
    assert s[rank - 1] - s[rank] > 1e-3 * s[0]  # the test's premise: a unique truncation
    close(new.mean, ref.mean)
    np.testing.assert_allclose(new.ups, ref.ups, rtol=1e-10)
    Z = rng.standard_normal((P, 2))
    close(row_sketch(new.W, Z), row_sketch(ref.W, Z))


# -- BLR's and BBB's per-unit iterations (kernels.cpu.blr_mlp, bbb_mlp): groups of chunks of whole units
# over the threads (BLR: both passes; BBB: its output pass)


def _per_unit_setup(algorithm, net, monkeypatch):
    """(numpy filter, numba filter, belief, x, y, calls) for BLR or BBB + DLR + LIN-HESS on a network whose
    chunks make at least two groups (blr_mlp.CHUNK_GROUP chunks each); "wide-input": units cut into
    pieces."""
    from refbayes.kernels.cpu import bbb_mlp, blr_mlp

    module, name = {"blr": (blr_mlp, "mlp_blr_lin_hess_iteration"), "bbb": (bbb_mlp, "mlp_bbb_lin_hess_iteration")}[
        algorithm]

    if net == "wide-input":  # pieces of 1,000 rows (kind 2 chunks), three per unit
        monkeypatch.setattr(kstep, "PIECE_ROWS", 1000)
        monkeypatch.setattr(kstep, "_LAYOUTS", {})
    model = {"mlp": rb.MLP([20, 300, 3]), "wide-input": rb.MLP([2100, 2, 3])}[net]
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(21)
    P = model.n_params
    lr = {"blr": 0.6, "bbb": 0.05}[algorithm]
    fnp, fnb = (rb.Bong(model, rb.Gaussian(0.5), algorithm=algorithm, family="dlr", estimator="lin-hess", rank=3,
                        lr=lr, n_iter=2, gamma=0.95, q=1e-3, backend=b) for b in ("numpy", "numba"))
    bel = DLR(model.init_params(rng), rng.uniform(1.0, 4.0, P), 0.4 * rng.standard_normal((P, 3)))
    x = rng.standard_normal(model.in_dim) / np.sqrt(model.in_dim / 4)
    return fnp, fnb, bel, x, rng.standard_normal(3), calls


@pytest.mark.parametrize("net", ["mlp", "wide-input"])
@pytest.mark.parametrize("algorithm", ["blr", "bbb"])
def test_per_unit_iteration_on_numba_threads_equals_the_reference(algorithm, net, n_threads, monkeypatch):
    from refbayes.kernels.cpu import blr_mlp

    fnp, fnb, bel, x, y, calls = _per_unit_setup(algorithm, net, monkeypatch)
    chunks = kstep._layout(np.array(fnb.model.layer_sizes), True)[1]
    assert blr_mlp._groups(chunks)[0] >= 2
    new = fnb.predict_update(bel, x, y)
    assert len(calls) == 2  # both inner iterations took the per-unit route
    check_pool_used(n_threads)
    ref = fnp.predict_update(bel, x, y)
    close(new.mean, ref.mean)
    np.testing.assert_allclose(new.ups, ref.ups, rtol=1e-10)
    Z = np.random.default_rng(0).standard_normal((bel.n_params, 2))
    close(row_sketch(new.W, Z), row_sketch(ref.W, Z))


@pytest.mark.parametrize("net", ["mlp", "wide-input"])
@pytest.mark.parametrize("algorithm", ["blr", "bbb"])
def test_per_unit_iteration_gives_the_same_bits_on_one_and_two_threads(algorithm, net, monkeypatch):
    # BLR's Gram sums go to one slot per group of chunks and the pieces' sums to one per chunk, added in a
    # fixed order; BBB's threaded output pass writes each row from that row alone: the thread count
    # cannot change a bit
    if threads.available_cores() < 2 or numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 cores")
    _, fnb, bel, x, y, calls = _per_unit_setup(algorithm, net, monkeypatch)
    out = []
    try:
        for n in (1, 2):
            threads.set_threads(numba=n)
            out.append(fnb.predict_update(bel, x, y))
    finally:
        threads.set_threads()
    assert len(calls) == 4
    for name in ("mean", "ups", "W"):
        assert np.array_equal(getattr(out[0], name), getattr(out[1], name)), name


def test_bbb_sums_over_groups_on_numba_threads_equal_the_dense_sums(n_threads):
    # the fused DLR BBB step's sums (kernels.cpu.bong.bbb_sums) go in groups of SUMS_GROUP blocks to the
    # kernel threads, each group's into its own slot: three groups, the last a partial one
    from refbayes.kernels.cpu import bong as kbong

    rng = np.random.default_rng(8)
    R, Rp, K = 3, 2, 4
    P = 2 * kbong.SUMS_GROUP * kbong.BBB_BLOCK + 37
    Wt, Wpt, Ut = (rng.standard_normal((m, P)) for m in (R, Rp, K))
    dinv, ups_p = rng.uniform(0.5, 2.0, (2, P))
    n = R + Rp + K
    NW = np.full((R, n + 2), 7.0)  # columns past n are not touched
    N2w = np.full((R, R), np.nan)
    with threads.step_threads(P, "numba"):
        kbong.bbb_sums(Wt, Wpt, Ut, dinv, ups_p, NW, N2w)
    check_pool_used(n_threads)
    dense = (Wt * dinv) @ np.vstack([Wt, Wpt, Ut]).T
    low = np.tril(np.ones((R, R), dtype=bool))
    np.testing.assert_allclose(NW[:, :R][low], dense[:, :R][low], rtol=1e-12, atol=1e-10)
    assert np.all(NW[:, :R][~low] == 0.0)
    np.testing.assert_allclose(NW[:, R:n], dense[:, R:], rtol=1e-12, atol=1e-10)
    assert np.all(NW[:, n:] == 7.0)
    np.testing.assert_allclose(N2w[low], ((Wt * (ups_p * dinv**2)) @ Wt.T)[low], rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("seed", range(6))
def test_even_cuts_split_unequal_chunks_into_balanced_contiguous_runs(seed):
    rng = np.random.default_rng(seed)
    rows = rng.integers(1, 2000, size=rng.integers(1, 40))
    rows[rng.integers(rows.size)] = 20000  # one wide unit
    for nt in (1, 2, 3, 8):
        cuts = _host._even_cuts(rows, nt)
        assert cuts[0] == 0 and cuts[-1] == rows.size and np.all(np.diff(cuts) > 0) and len(cuts) - 1 <= nt
        if nt == 2 and rows.size >= 2:
            assert len(cuts) == 3  # two threads get work
            parts = [rows[a:b].sum() for a, b in zip(cuts[:-1], cuts[1:])]
            # no other single cut does better (the cut is the best one of the two around the half)
            best = min(abs(rows[:c].sum() - rows[c:].sum()) for c in range(1, rows.size))
            assert abs(parts[0] - parts[1]) == best


# -- row blocks of the dense low-rank update (FullEKF, BONG full families) --------------------------


@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_lowrank_update_row_blocks_equal_the_dense_formula(sign):
    rng = np.random.default_rng(6)
    P, Kr = 3 * 64 + 17, 5  # three whole blocks of 64 rows and a partial one
    A = rng.standard_normal((P, P))
    S = A @ A.T / P + np.eye(P)
    B = rng.standard_normal((Kr, P)) * rng.uniform(0.1, 1.0, P)
    out = linalg.lowrank_update(S, B, sign)
    np.testing.assert_allclose(out, S + sign * (B.T @ B), rtol=1e-12, atol=1e-13)
    small = linalg.lowrank_update(S, B, sign, block=7)  # blocks that do not divide P
    np.testing.assert_allclose(small, S + sign * (B.T @ B), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n", [1, 5, 20, 23])
def test_gram_blocks_equal_the_dense_sums_over_several_blocks(n):
    # the Gram matrices of the DLR BLR steps (kernels.cpu.bong._blr_fused, blr_mlp) over blocks of
    # GRAM_BLOCK columns: three whole blocks and a partial one, against the dense formulas
    rng = np.random.default_rng(n)
    P = 3 * klofi.GRAM_BLOCK + 37
    Yt = rng.standard_normal((n, P))
    dinv, r = rng.uniform(0.5, 2.0, P), rng.standard_normal(P)
    M, b = np.full((n, 2 * n), np.nan), np.full(n, np.nan)  # overwritten, whatever they held
    klofi.gram_blocks(Yt, dinv, r, M, b)
    low = np.tril(np.ones((n, n), dtype=bool))
    np.testing.assert_allclose(M[:, :n][low], (Yt @ Yt.T)[low], rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(M[:, n:][low], ((Yt * dinv) @ Yt.T)[low], rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(b, Yt @ r, rtol=1e-12, atol=1e-10)
    first = np.zeros((n, 2 * n))  # and the blocks' sums are those of one gram_tiles call per block
    for j0 in range(0, P, klofi.GRAM_BLOCK):
        m = min(klofi.GRAM_BLOCK, P - j0)
        part = np.zeros((n, 2 * n))
        klofi.gram_tiles(Yt, None, dinv[j0:j0 + m], j0, m, part)
        first += part
    np.testing.assert_allclose(M[:, :n][low], first[:, :n][low], rtol=1e-13, atol=1e-11)


@pytest.mark.parametrize("K", [1, 3, 10, 13])
def test_gram_tiles_with_three_weights_equal_the_dense_sums(K):
    # the fused LO-FI step's pass 1 takes its three weighted Gram matrices of W in one sweep
    # (lofi.gram_tiles with w3); rows in tiles of 2 x 4 with rows left over, from a column offset
    rng = np.random.default_rng(K)
    Yt = rng.standard_normal((K, 700))
    w1, w2, w3 = rng.uniform(0.5, 2.0, (3, 600))
    j0, n = 45, 590
    M = np.full((K, 3 * K), np.nan)
    klofi.gram_tiles(Yt, w1, w2, j0, n, M, w3)
    Y = Yt[:, j0:j0 + n]
    low = np.tril(np.ones((K, K), dtype=bool))
    for i, w in enumerate((w1, w2, w3)):
        np.testing.assert_allclose(M[:, i * K:(i + 1) * K][low], ((Y * w[:n]) @ Y.T)[low], rtol=1e-12, atol=1e-11)
    two = np.full((K, 2 * K), np.nan)  # and without w3 the first two blocks (the compiler may interleave the
    klofi.gram_tiles(Yt, w1, w2, j0, n, two)  # sums differently in the two specialisations: round-off)
    np.testing.assert_allclose(two[:, :2 * K][np.tile(low, 2)], M[:, :2 * K][np.tile(low, 2)], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("R,Rx", [(1, 1), (3, 5), (4, 4), (10, 10), (10, 9), (13, 2), (2, 0)])
def test_cross_tiles_add_the_weighted_cross_sums(R, Rx):
    # the BBB sums pass takes W^T D W_p and W^T D U from lofi.cross_tiles: rows of both factors in 4 x 4
    # tiles with rows left over on either side, from a column offset, added into columns c0.. of out;
    # no other entry of out changes
    rng = np.random.default_rng(10 * R + Rx)
    At, Xt = rng.standard_normal((R, 700)), rng.standard_normal((Rx, 700))
    w = rng.uniform(0.5, 2.0, 600)
    j0, n, c0 = 45, 590, 3
    before = rng.standard_normal((R + 1, c0 + Rx + 2))
    out = before.copy()
    klofi.cross_tiles(At, Xt, w, j0, n, out, c0)
    dense = (At[:, j0:j0 + n] * w[:n]) @ Xt[:, j0:j0 + n].T
    np.testing.assert_allclose(out[:R, c0:c0 + Rx], before[:R, c0:c0 + Rx] + dense, rtol=1e-12, atol=1e-11)
    mask = np.ones(out.shape, dtype=bool)
    mask[:R, c0:c0 + Rx] = False
    assert np.array_equal(out[mask], before[mask])


@pytest.mark.parametrize("K", [0, 2, 4, 6])
def test_full_covariance_update_pass_on_numba_threads_gives_the_one_thread_numbers(K, n_threads):
    # cholupdate.update_pass / update_pass_bound run the copy-first route (P >= COPY_FIRST_P) over
    # blocks of rows on the kernel threads: the array must be lowrank_pass's (and lowrank_gershgorin's)
    # bit for bit, one thread's, and the bound the smallest row bound, NaN when a row's is
    from refbayes.kernels.cpu import cholupdate as cu

    P = cu.COPY_FIRST_P + 5
    assert cu.copy_blocks(P) >= 2 * _host.MIN_CHUNKS_PER_THREAD  # enough blocks for two threads
    rng = np.random.default_rng(600 + K)
    A = rng.standard_normal((P, P))
    S = A + A.T
    d = rng.uniform(0, 1, P)
    B = rng.standard_normal((K, P))
    Blt = np.ascontiguousarray((np.where(rng.random(K) < 0.5, -1.0, 1.0)[:, None] * B).T)
    one = cu.lowrank_pass(S, 0.7, d, Blt, B, np.full((P, P), np.nan))
    out = cu.update_pass(S, 0.7, d, Blt, B, np.full((P, P), np.nan))
    assert np.array_equal(out, one)
    check_pool_used(n_threads)
    out = np.full((P, P), np.nan)
    low = cu.update_pass_bound(S, 0.7, d, Blt, B, out)
    assert np.array_equal(out, one)
    assert low == cu.lowrank_gershgorin(S, 0.7, d, Blt, B, np.empty((P, P)))
    assert low == pytest.approx(float(np.min(2 * np.diag(one) - np.abs(one).sum(axis=1))), rel=1e-12)
    S[P - 3, 1] = np.nan  # a row of the last block (the second thread's, on two)
    assert np.isnan(cu.update_pass_bound(S, 0.7, d, Blt, B, np.empty((P, P))))


def test_full_covariance_filters_take_the_threaded_pass_and_keep_their_numbers(n_threads, monkeypatch):
    # backend="numba" full-covariance filters weigh a step by P^2 in the thread policy, so that at
    # P >= COPY_FIRST_P their update pass runs on the kernel threads: the same beliefs as on one thread
    from refbayes.kernels.cpu import cholupdate as cu

    model, lik = rb.MLP([8, 32, 32, 2], activation="tanh"), rb.Gaussian(1.0)
    P = model.n_params
    assert P >= cu.COPY_FIRST_P
    rng = np.random.default_rng(7)
    X, Y = rng.standard_normal((3, 8)), rng.standard_normal((3, 2))
    theta = model.init_params(rng)
    filters = [rb.FullEKF(model, lik, gamma=0.99, q=1e-4, backend="numba"),
               rb.Bong(model, lik, algorithm="bong", family="full", gamma=0.99, q=1e-4, backend="numba")]
    for filt in filters:
        assert filt._thread_size() == P * P
        assert threads.plan(filt._thread_size(), "numba")[0] == min(threads.available_cores(), n_threads[0])
        bel = filt.init(theta, 1e-3)
        new, _ = filt.scan(bel, X, Y)
        threads.set_threads(numba=1)
        one, _ = filt.scan(bel, X, Y)
        threads.set_threads(numba=n_threads[0])
        assert np.array_equal(new.cov, one.cov) and np.array_equal(new.mean, one.mean)
    check_pool_used(n_threads)
    sizes = []  # the size each step hands the policy (threads.step_threads -> threads.plan)
    plan = threads.plan
    monkeypatch.setattr(threads, "plan", lambda n, backend="numpy": sizes.append(n) or plan(n, backend))
    for filt in filters:
        filt.predict_update(filt.init(theta, 1e-3), X[0], Y[0])
    assert sizes == [P * P, P * P]
    # the reference and the other families keep P
    assert rb.FullEKF(model, lik)._thread_size() == P
    assert rb.Bong(model, lik, algorithm="bong", family="full")._thread_size() == P
    assert rb.Bong(model, lik, algorithm="bong", family="dlr", backend="numba")._thread_size() == P


def test_bog_moment_bound_solve_beside_the_threaded_pass_keeps_the_numbers(n_threads, monkeypatch):
    # BOG over "full-moment" with a carried bound, P >= COPY_FIRST_P: on two kernel threads the bound's
    # solve runs on a side worker while the update pass runs on the other; the belief and the bound are
    # those of one thread, bit for bit, and the side worker got the solve exactly when threads were there
    from refbayes.filters.bong import families as fam
    from refbayes.kernels.cpu import cholupdate as cu

    side = []
    real_side = _host.side_pool

    class Counting:
        def submit(self, fn, *args):
            side.append(fn.__name__)
            return real_side().submit(fn, *args)

    monkeypatch.setattr(_host, "side_pool", lambda: Counting())
    model, lik = rb.MLP([8, 32, 32, 2], activation="tanh"), rb.Gaussian(1.0)
    P = model.n_params
    assert P >= cu.COPY_FIRST_P
    rng = np.random.default_rng(8)
    X, Y = rng.standard_normal((3, 8)), rng.standard_normal((3, 2))
    filt = rb.Bong(model, lik, algorithm="bog", family="full-moment", estimator="lin-ef", gamma=0.999, q=1e-6,
                   lr=3e-6, backend="numba")
    bel = filt.init(model.init_params(rng), 1e-3)
    fam.carry_factor(bel, fam.FactorBound(np.ascontiguousarray(np.linalg.cholesky(bel.cov).T)))
    new, _ = filt.scan(bel, X, Y)
    threads.set_threads(numba=1)
    one, _ = filt.scan(bel, X, Y)
    threads.set_threads(numba=n_threads[0])
    assert np.array_equal(new.cov, one.cov) and np.array_equal(new.mean, one.mean)
    b_new, b_one = fam.carried_factor(new), fam.carried_factor(one)
    assert b_new.R is b_one.R and b_new.a == b_one.a and b_new.X.shape == (3, P)
    assert all(np.array_equal(getattr(b_new, k), getattr(b_one, k)) for k in ("X", "Z", "G"))
    # on two threads: the solve on the side worker, the pass on the one thread left (inline)
    assert side == (["downdated"] * 3 if n_threads[0] > 1 else []) and not n_threads[1]


@pytest.mark.parametrize("C", [1, 2, 3, 4, 5, 8, 9, 10, 13])
def test_add_square_rows_in_pairs_gives_the_numbers_of_one_row_at_a_time(C):
    # _blocks.add_square_rows takes A's rows two at a time (the FD/VD-EKF pass's |A h_i|^2); each row's
    # sums and their order into q must be those of one row at a time (_square_one), for a lower
    # triangular A and for a full one with fewer, as many and more rows than columns (odd counts too)
    from refbayes.kernels.cpu import _blocks

    rng = np.random.default_rng(500 + C)
    i0, n = 3, 101
    X = rng.standard_normal((C, i0 + n + 2))
    for lower, k in ((True, C), (False, C), (False, max(1, C - 2)), (False, C + 3)):
        A = rng.standard_normal((k, C))
        if lower:
            A = np.tril(A)
        q0 = rng.uniform(0, 1, n)
        q = q0.copy()
        _blocks.add_square_rows(X, A, lower, i0, n, np.full(2 * n, np.nan), q)
        one = q0.copy()
        for r in range(k):
            _blocks._square_one(X, A, lower, i0, n, np.full(n, np.nan), one, r)
        assert np.array_equal(q, one), (lower, k)
        dense = q0 + np.sum((A @ X[:, i0:i0 + n]) ** 2, axis=0)
        np.testing.assert_allclose(q, dense, rtol=1e-13, atol=0)


@pytest.mark.parametrize("m,k", [(0, 3), (1, 1), (3, 0), (4, 0), (4, 2), (8, 3), (6, 1), (4, 4), (5, 7), (11, 20),
                                 (21, 10), (50, 10)])
def test_tile_matmul_equals_the_dense_product(m, k):
    # the blocks' products of the fused passes (_blocks.tile_matmul): four rows of the output from four rows
    # of B at a time, then the rows and columns left over (k % 4 = 0..3, m % 4 = 0..3, and k < 4, where the
    # rows left over write the output); B read in place from column j0 (a factor's rows), the output
    # overwritten (whatever it held) or added to
    from refbayes.kernels.cpu._blocks import tile_matmul

    rng = np.random.default_rng(10 * m + k)
    A, B = rng.standard_normal((m, k)), rng.standard_normal((k, 300))
    j0, n = 37, 203
    out = np.full((m, n + 5), np.nan)
    tile_matmul(A, B, j0, n, out)
    np.testing.assert_allclose(out[:, :n], A @ B[:, j0:j0 + n], rtol=1e-13, atol=1e-13)
    assert np.isnan(out[:, n:]).all()  # nothing past n written
    before = rng.standard_normal((m, n))
    acc = before.copy()
    tile_matmul(A, B, j0, n, acc, True)
    np.testing.assert_allclose(acc, before + A @ B[:, j0:j0 + n], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("m,n", [(0, 512), (1, 1), (3, 0), (21, 512), (49, 256), (10, 500)])
def test_block_buffers_start_on_a_cache_line(m, n):
    # _blocks.block_buffer: the block buffers of the products, C-contiguous (m, n) float64 arrays whose first
    # entry is on a 64-byte boundary (numba's np.empty gives 32), whatever the allocator hands back
    import numba

    from refbayes.kernels.cpu._blocks import block_buffer

    @numba.njit
    def several(m, n):  # a few in a row, so that the allocator's offsets vary
        out = []
        for _ in range(8):
            out.append(block_buffer(m, n))
        return out

    for buf in several(m, n):
        assert buf.shape == (m, n) and buf.dtype == np.float64 and buf.flags.c_contiguous
        assert buf.ctypes.data % 64 == 0
        buf[...] = 1.0  # all of it is the array's own memory
        assert buf.sum() == m * n


@pytest.mark.parametrize("k", [1, 3, 4, 10])
@pytest.mark.parametrize("L", [0, 1, 10])
def test_dlr_woodbury_blocks_equal_the_dense_solve(L, k):
    # dlr_solve and dlr_inner go over blocks of WOODBURY_BLOCK (and _blocks.SB) rows with one BLAS product
    # per block (k >= 4 columns for the cross sums); a partial last block; against dense linear algebra
    rng = np.random.default_rng(10 * L + k)
    P = 3 * kdlr.WOODBURY_BLOCK + 37
    ups, W, B = rng.uniform(0.5, 2.0, P), rng.standard_normal((P, L)), rng.standard_normal((P, k))
    dense = np.diag(ups) + W @ W.T
    np.testing.assert_allclose(K.dlr_solve(ups, W, B), np.linalg.solve(dense, B), rtol=1e-10, atol=1e-12)
    inner = K.dlr_inner(ups, W)
    np.testing.assert_allclose(inner, np.eye(L) + (W / ups[:, None]).T @ W, rtol=1e-12, atol=1e-12)
    assert np.array_equal(inner, inner.T)
