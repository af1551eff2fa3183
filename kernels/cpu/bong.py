"""BONG, BLR, BOG and BBB inner steps for the diagonal and DLR families on plain arrays
(Jones, Chang & Murphy 2024, App. E.3-E.5).

Same numbers (round-off) as the steps of ``refbayes.filters.bong.algorithms``; G is held as
diag(G) = d (P,) or as a factor G = -U U^T, U (P, K), and g (P,) estimates E[grad log p].
Unsubscripted mean/var/ups/W are the current iterate, ``_p`` the predicted (prior) belief.

- Diagonal (8 steps, ``diag_step``): one fused pass over P, no temporaries; with a factor
  the pass forms d_i = -sum_k U[i, k]^2 itself.
- DLR BONG / BLR (``dlr_bong``, ``dlr_blr``): when g = U c (true for every DLR estimator:
  LIN-HESS c = A e, LIN-EF c = 1, MC-EF c = 1 / sqrt(M)), the step is a LO-FI update with
  H = sqrt(alpha) U^T, R = I, e = sqrt(alpha) c (``lofi.lofi_update``): the untruncated
  precision diag(ups~) + W~ W~^T, the mean, and the thin-SVD projection to rank R that moves
  the discarded mass into the diagonal (eqs 284-286). Without c the mean is a Woodbury solve.
- DLR BLR inner step (0 < alpha < 1): the factor W~ = [sqrt(1 - alpha) W, sqrt(alpha) W_p,
  sqrt(alpha) U] has nearly parallel columns (W is the last projection of W_p's span), so it is
  first rotated by the eigenvectors of its small Gram matrix, F = W~ V (same W~ W~^T, orthogonal
  columns; directions at round-off level go to the diagonal). The mean is one BLAS Woodbury
  solve with F; the projection keeps F's first R columns where the eigenvectors' error moves
  W+ W+^T by at most ``TRUNC_TOL`` of the largest eigenvalue (``gram_truncation_ok``: F is then
  its own thin SVD to that accuracy), and otherwise runs LO-FI's truncation of F. ``_blr_fused``
  does this from one compiled pass, one Gram call and one compiled call for the n x n algebra
  (``blr_small``: ``_symeig.sym_eig`` and a Cholesky factor; ``_blr_fused_truncate`` for the small
  gap), ``_blr_fast`` is its fallback. Any failed guard
  (non-finite input, failed Cholesky factor) falls back to the general route, which raises the
  reference's error.
- DLR BOG / BBB (``dlr_bog``, ``dlr_bbb``): Woodbury solves and one fused pass for the new ups
  and W; BOG's R x R and K x K algebra in NumPy. BBB (``_bbb_fused``): with X = [W, W_p, U], the W rows of
  X^T D X and the W block of X^T diag(ups_p D^2) X (one compiled pass on the kernel threads,
  ``bbb_sums``; the step uses no other sums),
  and every Sigma product is a row of X times a small matrix (the small algebra compiled:
  ``bbb_small``); its fallback shares one Cholesky factor of
  I + W^T diag(1/ups) W between the Sigma products (Sigma = D - B B^T), then ``dlr.dlr_solve``.

Wrappers check shapes, return new arrays, and raise NotPositiveDefiniteError when a variance
or precision comes out <= 0 or non-finite (where the reference raises); a non-finite output
from a non-finite input raises ValueError naming that input (``_host.raise_nonfinite``).
Large inputs are not scanned up front.
"""

import numba
import numpy as np
import scipy.linalg as sla

from refbayes.errors import DivergenceError, NotPositiveDefiniteError

from .. import _host
from ._blocks import (CONTRACT, EPS, REDUCE, block_buffer, chol_lower, chol_solve, lower_inverse, matmul, nonfinite_vec,
                      tile_matmul)
from ._symeig import sym_eig
from .dlr import dlr_inner, dlr_solve
from .lofi import TAU_GRAM, cross_tiles, gram_blocks, gram_tiles, lofi_update

__all__ = ["diag_step", "diag_what", "dlr_bong", "dlr_blr", "dlr_bog", "dlr_bbb", "DIAG_STEPS", "ALGORITHMS", "DIAG_FAMILIES"]

ALGORITHMS = ("bong", "blr", "bog", "bbb")
DIAG_FAMILIES = ("diag-natural", "diag")
# (family, algorithm) -> mode of diag_pass; mode 1 is natural BONG with a given mean step
DIAG_STEPS = {
    ("diag-natural", "bong"): 0,
    ("diag-natural", "blr"): 2,
    ("diag-natural", "bog"): 3,
    ("diag-natural", "bbb"): 4,
    ("diag", "bong"): 5,
    ("diag", "blr"): 6,
    ("diag", "bog"): 7,
    ("diag", "bbb"): 8,
}
NAT_BONG_GIVEN_STEP = 1
DROP_TOL = 1e-13  # BLR (DLR): eigenvalues of Wt^T Wt at round-off level, moved to the diagonal
# BLR (DLR): the error the truncation may take from the eigenvectors of the Gram matrix, in W+ W+^T relative
# to the largest eigenvalue: the accuracy the LO-FI kernels ask of a Gram matrix (see gram_truncation_ok)
TRUNC_TOL = TAU_GRAM
# BBB (DLR): rows per block of the sums and the output pass; the output pass's products for one block
# (about 70 numbers a row at R = Rp = K = 10) stay in the L2 cache
BBB_BLOCK = 256


# -- diagonal families ----------------------------------------------------------------------


@numba.njit(cache=True, error_model="numpy")
def diag_pass(mode, mu, s, mu_p, s_p, g, d, U, use_U, step, a, out_mean, out_var):
    """One pass over P for step ``mode`` (see DIAG_STEPS). d_i = -|U_i|^2 when ``use_U``.

    Natural (App. E.3; lam = 1/s):
      0 BONG eqs 212-213: lam+ = 1/s_p - a d, mu+ = mu_p + a g / lam+
      1 BONG with mu+ = mu_p + a step (the full-gain mean)
      2 BLR eqs 218-219:  lam+ = (1-a)/s + a lam_p - a d, mu+ = mu + a v / lam+
      3 BOG eqs 224-225:  lam+ = 1/s_p - 4a s_p mu_p g - 2a s_p^2 d, mu+ = (mu_p/s_p + a s_p g) / lam+
      4 BBB eqs 230-231:  lam+ = 1/s - 4a s mu v - 2a s^2 (d - lam_p) - 2a s, mu+ = (mu/s + a s v) / lam+
    Moment (App. E.4):
      5 BONG eqs 248-249: mu+ = mu_p + a s_p g, s+ = s_p + a s_p^2 d
      6 BLR eqs 252-253:  mu+ = mu + a s v, s+ = s + a s^2 (d - lam_p + 1/s)
      7 BOG eqs 256-257:  mu+ = mu_p + a g, s+ = s_p + (a/2) d
      8 BBB eqs 260-261:  mu+ = mu + a v, s+ = s + (a/2) (d - lam_p + 1/s)
    with v = g + lam_p (mu_p - mu), lam_p = 1/s_p. Returns (count of entries with a
    non-finite output, count with a variance <= 0).
    """
    P = mu.shape[0]
    K = U.shape[1]
    nonfinite = 0
    nonpos = 0
    a4 = 4.0 * a
    a2 = 2.0 * a
    ah = 0.5 * a
    for i in range(P):
        if use_U:
            acc = 0.0
            for k in range(K):
                acc += U[i, k] * U[i, k]
            di = -acc
        else:
            di = d[i]
        gi = g[i]
        spi = s_p[i]
        # one division per reciprocal (1/s_p, 1/s, 1/lam+), then products: a division costs several
        # multiplications wherever the loop is not vectorised
        if mode == 0 or mode == 1:
            lam = 1.0 / spi - a * di
            v = 1.0 / lam
            if mode == 0:
                m = mu_p[i] + a * (gi * v)
            else:
                m = mu_p[i] + a * step[i]
        elif mode == 2:
            lam_p = 1.0 / spi
            vi = gi + lam_p * (mu_p[i] - mu[i])
            lam = (1.0 - a) / s[i] + a * lam_p - a * di
            v = 1.0 / lam
            m = mu[i] + a * (vi * v)
        elif mode == 3:
            lam_p = 1.0 / spi
            lam = lam_p - a4 * spi * mu_p[i] * gi - a2 * (spi * spi) * di
            v = 1.0 / lam
            m = (mu_p[i] * lam_p + a * spi * gi) * v
        elif mode == 4:
            si = s[i]
            mi = mu[i]
            lam_p = 1.0 / spi
            vi = gi + lam_p * (mu_p[i] - mi)
            lam_c = 1.0 / si
            lam = lam_c - a4 * si * mi * vi - a2 * (si * si) * (di - lam_p) - a2 * si
            v = 1.0 / lam
            m = (mi * lam_c + a * si * vi) * v
        elif mode == 5:
            m = mu_p[i] + a * spi * gi
            v = spi + a * (spi * spi) * di
        elif mode == 6:
            si = s[i]
            lam_p = 1.0 / spi
            vi = gi + lam_p * (mu_p[i] - mu[i])
            m = mu[i] + a * si * vi
            v = si + a * (si * si) * (di - lam_p + 1.0 / si)
        elif mode == 7:
            m = mu_p[i] + a * gi
            v = spi + ah * di
        else:
            si = s[i]
            lam_p = 1.0 / spi
            vi = gi + lam_p * (mu_p[i] - mu[i])
            m = mu[i] + a * vi
            v = si + ah * (di - lam_p + 1.0 / si)
        out_mean[i] = m
        out_var[i] = v
        if not (np.isfinite(m) and np.isfinite(v)):
            nonfinite += 1
        elif not v > 0.0:
            nonpos += 1
    return nonfinite, nonpos


def _alpha(alpha, upper=None):
    a = _host.as_scalar(alpha, "alpha", positive=True)
    if upper is not None and a > upper:
        raise ValueError(f"alpha must be in (0, {upper}]; got {a}")
    return a


def _factor_or_diag(P, d, U):
    if (d is None) == (U is None):
        raise TypeError("pass exactly one of d (the diagonal of G) and U (the factor G = -U U^T)")
    if U is not None:
        return np.zeros(0), _host.as_f64(U, "U", (P, None)), True
    return _host.as_f64(d, "d", (P,)), np.zeros((0, 0)), False


def diag_what(family, algorithm):
    """The quantity a diagonal step updates, in the reference's words (``bong.algorithms``: the public
    family names, "diag" for the natural form): "BONG (diag) precision", "BBB (diag moment) variance".
    family: "diag-natural" | "diag" (moment), as in ``DIAG_STEPS``."""
    name = "BONG BLR BOG BBB".split()[ALGORITHMS.index(algorithm)]
    return f"{name} (diag) precision" if family == "diag-natural" else f"{name} (diag moment) variance"


def diag_step(family, algorithm, mean, var, mean_p, var_p, g, d=None, U=None, alpha=1.0, step=None):
    """One inner step of BONG/BLR/BOG/BBB for a diagonal family (Jones et al. 2024, App. E.3-E.4).

    family: "diag-natural" (eqs 212-231) or "diag" (eqs 248-261); algorithm: "bong" | "blr" |
    "bog" | "bbb". mean, var: the current iterate (P,); mean_p, var_p: the prior (P,);
    g (P,); the curvature as d = diag(G) (P,) or its factor U (P, K) with G = -U U^T
    (exactly one); alpha > 0. step (P,): natural BONG only, replaces the mean step
    g / lambda+ (e.g. the full-gain step (diag(1/var_p) + alpha U U^T)^{-1} g).
    Returns (mean (P,), var (P,)), new arrays. Raises NotPositiveDefiniteError when a
    variance comes out <= 0 or an output non-finite from finite inputs (ValueError naming a
    non-finite input).
    """
    key = (family, algorithm)
    if key not in DIAG_STEPS:
        raise ValueError(f"(family, algorithm) must be one of {tuple(DIAG_STEPS)}; got {key!r}")
    mode = DIAG_STEPS[key]
    mean_p = _host.as_f64(mean_p, "mean_p", (None,))
    P = mean_p.shape[0]
    var_p = _host.check_positive(_host.as_f64(var_p, "var_p", (P,)), "var_p")
    mean = _host.as_f64(mean, "mean", (P,))
    var = _host.check_positive(_host.as_f64(var, "var", (P,)), "var")
    g = _host.as_f64(g, "g", (P,))
    d, U, use_U = _factor_or_diag(P, d, U)
    a = _alpha(alpha)
    if step is not None:
        if mode != 0:
            raise ValueError("step applies only to family='diag-natural', algorithm='bong'")
        step = _host.as_f64(step, "step", (P,))
        mode = NAT_BONG_GIVEN_STEP
    else:
        step = np.zeros(0)
    out_mean = np.empty(P)
    out_var = np.empty(P)
    nonfinite, nonpos = diag_pass(mode, mean, var, mean_p, var_p, g, d, U, use_U, step, a, out_mean, out_var)
    what = diag_what(family, algorithm)
    if nonfinite:
        _host.raise_nonfinite(f"{what} update", mean=mean, var=var, mean_p=mean_p, var_p=var_p, g=g, d=d, U=U,
                              step=step)
    if nonpos:
        i = int(np.argmin(out_var))
        raise NotPositiveDefiniteError(f"{what} update made entry {i} non-positive ({float(out_var[i])!r})")
    return out_mean, out_var


# -- DLR family ----------------------------------------------------------------------------


def _check_dlr(mean, ups, W, names, P=None, transpose=False):
    """(mean, ups, W) checked and C-contiguous float64; with ``transpose`` W^T (L, P) instead of W
    (no copy for a column-major W)."""
    mean = _host.as_f64(mean, names[0], (P,))
    P = mean.shape[0]
    ups = _host.check_positive(_host.as_f64(ups, names[1], (P,)), names[1])
    W = _host.as_f64(W, names[2], (P, None), transpose=transpose)
    return mean, ups, W


def _check_estimate(P, U, g, coef, transpose=False):
    """(U, g, coef) checked and C-contiguous float64; with ``transpose`` U^T (K, P) instead of U."""
    U = _host.as_f64(U, "U", (P, None), transpose=transpose)
    g = _host.as_f64(g, "g", (P,))
    if coef is not None:
        coef = _host.check_finite(_host.as_f64(coef, "coef", (U.shape[0 if transpose else 1],)), "coef")
    return U, g, coef


def _guard(what, inputs, fn, *args, **kwargs):
    """fn(*args, **kwargs); a ValueError of an inner kernel caused by a non-finite input is
    re-raised naming this wrapper's argument (the inputs are scanned only after a failure), and an
    inner kernel's DivergenceError with the step ``what`` named in front (e.g. "BLR (DLR) update: LO-FI
    update produced ...": the LO-FI update is the projection inside BLR's step)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        for name, arr in inputs.items():
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} contains NaN or inf") from exc
        raise
    except DivergenceError as exc:
        raise DivergenceError(f"{what}: {exc}", quantity=exc.quantity, step=exc.step) from exc


def _project(mean, ups, Wt, U, coef, a, rank):
    """lofi_update with H = sqrt(a) U^T, R = I, e = sqrt(a) coef (zeros without coef): the
    mean mean + a (diag(ups) + W~ W~^T)^{-1} U coef, W~ = [Wt, sqrt(a) U], and the rank-``rank``
    projection of W~ (Jones et al. 2024, eqs 283-286)."""
    ra = np.sqrt(a)
    K = U.shape[1]
    H = np.multiply(U.T, ra, order="C")
    e = ra * coef if coef is not None else np.zeros(K)
    return lofi_update(mean, ups, Wt, H, np.eye(K), e, rank=rank)


def _finite_or_raise(what, inputs, *arrays):
    for arr in arrays:
        if not np.all(np.isfinite(arr)):
            _host.raise_nonfinite(f"{what} update", **inputs)


def dlr_bong(mean_p, ups_p, W_p, U, g, coef=None, alpha=1.0):
    """BONG step for the DLR family (Jones et al. 2024, eqs 281-286; LIN-HESS: eqs 287-292).

    W~ = [W_p, sqrt(alpha) U], mu+ = mu_p + alpha (diag(ups_p) + W~ W~^T)^{-1} g, then the
    thin-SVD projection of W~ to rank R (ups+ = ups_p + the discarded rows' squared norms).
    mean_p, ups_p: (P,); W_p: (P, R); U: (P, K) with G = -U U^T; g: (P,); coef (K,) with
    g = U coef, when known, makes the step one LO-FI update (g itself is then not read;
    without coef a Woodbury solve gives the mean). Returns (mean (P,), ups (P,), W (P, R));
    W is defined up to a right orthogonal factor.
    """
    mean_p, ups_p, W_p = _check_dlr(mean_p, ups_p, W_p, ("mean_p", "ups_p", "W_p"))
    P, R = W_p.shape
    U, g, coef = _check_estimate(P, U, g, coef)
    a = _alpha(alpha)
    inputs = dict(mean_p=mean_p, ups_p=ups_p, W_p=W_p, U=U, g=g)
    mean, ups, W = _guard("BONG (DLR) update", inputs, _project, mean_p, ups_p, W_p, U, coef, a, R)
    if coef is None:
        Wt = np.concatenate([W_p, np.sqrt(a) * U], axis=1)
        mean = mean_p + a * _guard("BONG (DLR) update", inputs, dlr_solve, ups_p, Wt, g)
    _finite_or_raise("BONG (DLR)", inputs, mean)
    return mean, ups, W


@numba.njit(cache=True, error_model="numpy")
def gram_truncation_ok(lam, rank, drop_tol, tol):
    """Whether the projection of W~ to rank ``rank`` (eqs 284-286) may keep W~ V[:, :rank], V the eigenvectors
    of its Gram matrix G = W~^T W~ (eigenvalues ``lam``, descending, 0 < rank < len(lam)), to an error in
    W+ W+^T of at most ``tol`` lam[0] (docs/bong.md §6).

    G carries an error of about EPS lam[0], which turns each eigenvector v_j by about d = EPS lam[0] / gap
    towards the others, gap = lam[rank - 1] - lam[rank] at the cut. Kept and dropped directions mix only
    across the cut, so W+ W+^T = W~ V_R V_R^T W~^T moves by about d sqrt(lam[rank - 1] lam[rank]) (first
    order: the pair at the cut bounds every pair across it) plus d^2 lam[rank - 1] (second order). Where
    the cut's eigenvalues are far below lam[0] this allows gaps far smaller than lam[0] EPS / tol, which
    bounds the eigenvectors' own error instead. True when lam[rank] is at round-off level
    (<= drop_tol lam[0]): that direction goes to the diagonal whichever basis holds it."""
    top = max(lam[0], 0.0)
    lo = max(lam[rank], 0.0)
    if lo <= drop_tol * top:
        return True
    hi = lam[rank - 1]
    gap = hi - lo
    if not gap > 0.0:
        return False
    d = EPS * top / gap
    return d * (np.sqrt(hi * lo) + d * hi) <= tol * top


def _rotated_factor(Wt):
    """F = Wt V (P, n) with V (n, n) orthogonal from the eigenvectors of Wt^T Wt, so F F^T =
    Wt Wt^T (to round-off, any orthogonal V) and F's columns are orthogonal; None when the
    Gram matrix is not finite. BLR's Wt = [sqrt(1 - alpha) W, sqrt(alpha) W_p] has nearly
    parallel columns (W is the projection of the previous iterate, W = W_p on the first
    iteration), which sends the LO-FI update to its Householder route; F spans the same
    precision with orthogonal columns. Directions with eigenvalue <= DROP_TOL * the largest
    (round-off of a rank-deficient Wt) leave F; their rows' squared norms d (P,) go to the
    diagonal, as the projection does with every discarded direction (eq. 286). Returns (F, the
    kept eigenvalues (descending; F^T F = diag of them to round-off), d or None)."""
    if Wt.shape[1] == 0:
        return None
    G = Wt.T @ Wt
    if not np.all(np.isfinite(G)):
        return None
    lam, V = np.linalg.eigh(G)
    keep = lam > DROP_TOL * max(lam[-1], 0.0)
    F = np.ascontiguousarray(Wt @ V[:, keep][:, ::-1])
    lam = lam[keep][::-1]
    if keep.all():
        return F, lam, None
    return F, lam, np.sum(np.square(Wt @ V[:, ~keep]), axis=1)


def _woodbury(ups, F, rhs):
    """(diag(ups) + F F^T)^{-1} rhs, F (P, n), rhs (P,), from the Cholesky factor of
    I + F^T diag(1/ups) F (docs/bong.md; the Woodbury identity); None when that factor fails
    or the result is not finite (the caller then takes the general route, which names the
    failure)."""
    DF = F / ups[:, None]
    core = F.T @ DF
    core[np.diag_indices_from(core)] += 1.0
    try:
        Lc = np.linalg.cholesky(core)
    except np.linalg.LinAlgError:
        return None
    y = np.linalg.solve(Lc, DF.T @ rhs)
    c = np.linalg.solve(Lc.T, y)
    out = rhs / ups - DF @ c
    return out if np.all(np.isfinite(out)) else None


def _blr_fast(mean, ups_t, Wt, U, g, coef, a, rank, prior_term):
    """DLR BLR step (0 < a < 1) from F = :func:`_rotated_factor` of the whole
    W~ = [sqrt(1 - a) W, sqrt(a) W_p, sqrt(a) U] (eqs 293-301): F F^T = W~ W~^T, so the same
    precision, mean (one Woodbury solve with v = g + Lambda_p (mu_p - mu), g = U coef when coef
    is given) and rank-``rank`` projection (LO-FI's truncation of F; its columns are orthogonal,
    so the truncation takes its one-pass Gram route instead of the Householder route that the
    nearly parallel columns of W and W_p force). Returns (mean, ups, W) or None when a guard
    fails (non-finite input, a failed Cholesky factor): the general route then raises the
    reference's error."""
    rot = _rotated_factor(np.concatenate([Wt, np.sqrt(a) * U], axis=1))
    if rot is None or not np.all(np.isfinite(prior_term)):
        return None
    F, lam, dropped = rot
    if dropped is not None:
        ups_t = ups_t + dropped
    rhs = (g if coef is None else U @ coef) + prior_term
    step = _woodbury(ups_t, F, rhs)
    if step is None:
        return None
    n = F.shape[1]
    if n <= rank or rank == 0 or gram_truncation_ok(lam, rank, DROP_TOL, TRUNC_TOL):
        # F = (F diag(lam)^{-1/2}) diag(lam)^{1/2} I is its own thin SVD: keep the first
        # ``rank`` columns, move the rest to the diagonal (eqs 284-286)
        out_W = np.zeros((F.shape[0], rank))
        out_W[:, :min(n, rank)] = F[:, :rank]
        out_ups = ups_t + np.sum(np.square(F[:, rank:]), axis=1) if n > rank else ups_t.copy()
        if not (np.all(np.isfinite(out_W)) and np.all(np.isfinite(out_ups)) and np.all(out_ups > 0.0)):
            return None
        return mean + a * step, out_ups, out_W
    # a small gap at the cut: LO-FI's truncation of F (its W~ = [W, H^T], R = I; H not empty)
    try:
        _, out_ups, out_W = lofi_update(mean, ups_t, F[:, :-1], np.ascontiguousarray(F[:, -1:].T), np.eye(1),
                                        np.zeros(1), rank=rank)
    except (ValueError, NotPositiveDefiniteError):
        return None
    return mean + a * step, out_ups, out_W


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def blr_rows(g, ups, ups_p, mean, mean_p, a, ut, dinv, delta, r0):
    """The per-row numbers of the fused DLR BLR step (eqs 293-301) for a block of rows, every argument
    an (n,) slice from its block's first row: ups~ = (1 - a) ups + a ups_p into ut, 1 / ups~ into dinv,
    delta = mu_p - mu and r0 = (g + ups_p delta) / ups~ (``blr_load``, ``blr_mlp._row_numbers``)."""
    for t in range(g.shape[0]):
        u = (1.0 - a) * ups[t] + a * ups_p[t]
        ut[t] = u
        d = 1.0 / u
        dinv[t] = d
        dl = mean_p[t] - mean[t]
        delta[t] = dl
        r0[t] = (g[t] + ups_p[t] * dl) * d


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def blr_mean_ups(ut, ou, mean, r0, zm, dinv, a, out_mean):
    """The end of the fused DLR BLR step's outputs for a block of rows (every argument an (n,) slice from
    its first row): ups+ = ups~ + ou in place of ou (ou = s2 - |W+_i|^2), mu+ = mu + a (r0 + zm / ups~)
    into out_mean (``blr_out``, ``blr_mlp._block_out``). Returns the number of rows with a non-finite
    output or ups+ <= 0."""
    nbad = 0
    for t in range(ou.shape[0]):
        u = ut[t] + ou[t]
        mu = mean[t] + a * (r0[t] + zm[t] * dinv[t])
        ou[t] = u
        out_mean[t] = mu
        if not (np.isfinite(u) and u > 0.0 and np.isfinite(mu)):
            nbad += 1
    return nbad


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def blr_load(Wt, Wpt, Ut, coef, g, use_coef, mean, ups, mean_p, ups_p, a, Yt, ut, dinv, r0, s2, delta):
    """Pass 1 of the fused DLR BLR step over blocks of rows, from the factors' transposes Wt = W^T (L, P),
    Wpt = W_p^T (R, P) and Ut = U^T (K, P), so that every read and write runs along contiguous rows:
    Yt (n, P) = W~^T with W~ = [sqrt(1 - a) W, sqrt(a) W_p, sqrt(a) U] (n = L + R + K),
    ups~ = (1 - a) ups + a ups_p into ut, 1 / ups~ into dinv, delta = mu_p - mu,
    r0 = (g + ups_p delta) / ups~ (g = U coef when ``use_coef``) and s2 = |W~_i|^2, each row's squared norm."""
    L, P = Wt.shape
    Rp = Wpt.shape[0]
    K = Ut.shape[0]
    ra1 = np.sqrt(1.0 - a)
    ra = np.sqrt(a)
    BS = 256
    gb = np.empty(BS)
    for i0 in range(0, P, BS):
        nb = min(BS, P - i0)
        if use_coef:  # g = U coef, summed over k in order for each row
            for kk in range(nb):
                gb[kk] = 0.0
            for k in range(K):
                ur = Ut[k, i0:i0 + nb]
                ck = coef[k]
                for kk in range(nb):
                    gb[kk] += ur[kk] * ck
        else:
            for kk in range(nb):
                gb[kk] = g[i0 + kk]
        j = slice(i0, i0 + nb)
        blr_rows(gb[:nb], ups[j], ups_p[j], mean[j], mean_p[j], a, ut[j], dinv[j], delta[j], r0[j])
        sb = s2[j]
        for kk in range(nb):
            sb[kk] = 0.0
        # the three blocks of one loop body each: contiguous reads and writes along the block
        for c in range(L):
            yr = Yt[c, i0:i0 + nb]
            wr = Wt[c, i0:i0 + nb]
            for kk in range(nb):
                y = ra1 * wr[kk]
                yr[kk] = y
                sb[kk] += y * y
        for c in range(Rp):
            yr = Yt[L + c, i0:i0 + nb]
            wr = Wpt[c, i0:i0 + nb]
            for kk in range(nb):
                y = ra * wr[kk]
                yr[kk] = y
                sb[kk] += y * y
        for k in range(K):
            yr = Yt[L + Rp + k, i0:i0 + nb]
            wr = Ut[k, i0:i0 + nb]
            for kk in range(nb):
                y = ra * wr[kk]
                yr[kk] = y
                sb[kk] += y * y


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def blr_out(Z, s2, ut, dinv, r0, mean, a, out_mean, out_ups):
    """Pass 2 of the fused DLR BLR step from Z = E^T W~^T ((R + 1), P), E = [V_R | e]: W+ = Z[:R]^T (the
    caller's view, not copied), ups+ = ups~ + s2 - |W+_i|^2 (the discarded directions' squares, eq. 286;
    V is orthogonal), mu+ = mu + a (r0 + Z[R] / ups~) (eqs 293-301). Returns the number of rows with a
    non-finite output or ups+ <= 0."""
    m, P = Z.shape
    R = m - 1
    for i in range(P):
        out_ups[i] = s2[i]
    bad_w = False
    for c in range(R):  # row by row of Z: contiguous, and the squares subtracted in the order of c
        zr = Z[c]
        for i in range(P):
            w = zr[i]
            out_ups[i] -= w * w
        bad_w = bad_w or nonfinite_vec(zr)
    nbad = blr_mean_ups(ut, out_ups, mean, r0, Z[R], dinv, a, out_mean)
    return nbad + (1 if bad_w else 0)


def _blr_fused_truncate(Yt, V, lam, top, c, wp, L, Rp, ut, dinv, r0, mean, a, rank):
    """The end of :func:`_blr_fused` where :func:`gram_truncation_ok` is False: F = W~ V for the whole
    eigenbasis V (n, n; eigenvalues ``lam`` descending) from products with the X^T of pass 1 (the kept
    directions but the last as a row-major (P, nk - 1) block, the last one and the mean's column as
    two rows), directions at round-off level (eigenvalue <= DROP_TOL * top) moved to the diagonal,
    then LO-FI's truncation of F to rank ``rank`` (eqs 284-286), as :func:`_blr_fast` does. Returns
    (mean, ups, W) or None when a guard fails."""
    n = V.shape[0]
    nk = int(np.count_nonzero(lam > DROP_TOL * top))
    if nk <= rank:
        return None
    E = np.empty((n, 2))  # the last kept direction (LO-FI's H) and the mean's column
    E[:, 0] = V[:, nk - 1]
    E[:, 1] = -c
    E[L:L + Rp, 1] += wp
    Z = np.dot(np.ascontiguousarray(E.T), Yt)
    F = np.dot(Yt.T, V[:, :nk - 1])  # (P, nk - 1), row-major as lofi_update reads it: no copy there
    ups_t = ut
    if nk < n:
        Zd = np.ascontiguousarray(V[:, nk:].T) @ Yt
        ups_t = ut + np.einsum("ij,ij->j", Zd, Zd)
    out_mean = mean + a * (r0 + Z[1] * dinv)
    try:
        _, out_ups, out_W = lofi_update(mean, ups_t, F, Z[:1], np.eye(1), np.zeros(1), rank=rank)
    except (ValueError, NotPositiveDefiniteError):
        return None
    if not np.all(np.isfinite(out_mean)):
        return None
    return out_mean, out_ups, out_W


@numba.njit(cache=True, error_model="numpy")
def blr_small(M, b0, wpd, L, Rp, ra, rank, drop_tol, trunc_tol):
    """The n x n algebra of the fused DLR BLR step (:func:`_blr_fused`), in one compiled call.

    M (n, 2n) holds the lower triangles of G = W~^T W~ (M[:, :n]) and N = W~^T diag(1/ups~) W~
    (M[:, n:]) as ``lofi.gram_blocks`` leaves them; b0 = W~^T diag(1/ups~) (g + ups_p delta) (n,),
    wpd = W_p^T delta (Rp,), ra = sqrt(alpha), L and Rp the widths of W and W_p in W~.
    With lam, V the eigenpairs of G in descending order (``sym_eig``), wp = wpd / ra and
    b = b0 + N[:, L:L + Rp] wp (W~^T diag(1/ups~) (g + Lambda_p delta)), c = (I + N)^{-1} b is the
    Woodbury solve's core (Cholesky factor of I + N).

    Returns (status, lam (n,), V (n, n), c (n,), wp (Rp,), E (n, rank + 1)): status 0 when
    :func:`gram_truncation_ok` allows truncating with V (E = [V[:, :rank] | -c + [0, wp, 0]], the
    second product's matrix), 1 when it does not (:func:`_blr_fused_truncate` ends the step;
    E undefined), -1 when a guard fails (a non-finite sum, QL did not converge, I + N not
    positive definite).
    """
    n = M.shape[0]
    lam = np.zeros(n)
    V = np.zeros((n, n))
    c = np.zeros(n)
    wp = np.zeros(Rp)
    E = np.zeros((n, rank + 1))
    for i in range(n):
        if not np.isfinite(b0[i]):
            return -1, lam, V, c, wp, E
        for j in range(i + 1):
            if not (np.isfinite(M[i, j]) and np.isfinite(M[i, n + j])):
                return -1, lam, V, c, wp, E
    for j in range(Rp):
        if not np.isfinite(wpd[j]):
            return -1, lam, V, c, wp, E
        wp[j] = wpd[j] / ra
    w, Va, ok = sym_eig(M[:, :n])
    if not ok:
        return -1, lam, V, c, wp, E
    for j in range(n):  # descending
        lam[j] = w[n - 1 - j]
        for i in range(n):
            V[i, j] = Va[i, n - 1 - j]
    cut = gram_truncation_ok(lam, rank, drop_tol, trunc_tol)
    b = np.empty(n)
    for i in range(n):
        s = b0[i]
        for j in range(Rp):  # N[i, L + j] from the lower triangle
            k = L + j
            s += (M[i, n + k] if i >= k else M[k, n + i]) * wp[j]
        b[i] = s
    Lc = np.zeros((n, n))
    if not chol_lower(M[:, n:], Lc, 1.0):  # I + N
        return -1, lam, V, c, wp, E
    chol_solve(Lc, b, c)
    if not cut:
        return 1, lam, V, c, wp, E
    for i in range(n):
        for j in range(rank):
            E[i, j] = V[i, j]
        E[i, rank] = -c[i]
    for j in range(Rp):
        E[L + j, rank] += wp[j]
    return 0, lam, V, c, wp, E


def _blr_fused(mean, ups, Wt, mean_p, ups_p, Wpt, Ut, g, coef, a, rank):
    """DLR BLR step (0 < a < 1; eqs 293-301) in two compiled passes over the rows and n x n algebra,
    n = L + R + K: pass 1 (``blr_load`` and one ``lofi.gram_blocks`` call) gives G = W~^T W~,
    N = W~^T diag(1/ups~) W~ and W~^T diag(1/ups~) rhs without any P x n BLAS product; the mean is one
    Woodbury solve with the whole W~ (I + N >= I, so W~'s rank deficiency on the first iteration,
    W = W_p, does no harm); the n x n algebra (eigenpairs of G, the Cholesky factor of I + N) is one
    compiled call, :func:`blr_small`; the projection keeps W~ V_R, V_R the top ``rank`` eigenvectors of G (the
    right singular vectors of W~), and adds the rest of each row's squared norm to the diagonal
    (eqs 284-286); where :func:`gram_truncation_ok` finds the eigenvectors not accurate enough for that,
    :func:`_blr_fused_truncate` ends the step instead. Returns (mean, ups, W (P, rank)) or None when
    this route does not apply (rank 0, n <= rank, a non-finite sum, a failed Cholesky factor, a bad
    output, a failed truncation): the caller then takes :func:`_blr_fast`. The factors come transposed,
    Wt = W^T (L, P), Wpt = W_p^T and Ut = U^T (rows of P), and W (P, rank) is returned column-major (a
    view of the product that makes it), so that the next inner iteration reads it without a copy."""
    L, P = Wt.shape
    Rp = Wpt.shape[0]
    K = Ut.shape[0]
    n = L + Rp + K
    if rank == 0 or n <= rank or Rp == 0:
        return None
    Yt = np.empty((n, P))
    ut, dinv, r0, s2, delta = np.empty((5, P))
    use_coef = coef is not None
    blr_load(Wt, Wpt, Ut, coef if use_coef else np.zeros(K), g, use_coef, mean, ups, mean_p, ups_p, a, Yt, ut, dinv,
             r0, s2, delta)
    wpd = Wpt @ delta
    M = np.empty((n, 2 * n))
    b0 = np.empty(n)
    # lower triangles of G = W~^T W~ and N = W~^T diag(1/ups~) W~, and b0 = W~^T diag(1/ups~) (g + ups_p delta)
    gram_blocks(Yt, dinv, r0, M, b0)
    status, lam, V, c, wp, E = blr_small(M, b0, wpd, L, Rp, np.sqrt(a), rank, DROP_TOL, TRUNC_TOL)
    if status < 0:
        return None
    if status == 1:
        return _blr_fused_truncate(Yt, V, lam, max(lam[0], 0.0), c, wp, L, Rp, ut, dinv, r0, mean, a, rank)
    Z = np.dot(np.ascontiguousarray(E.T), Yt)
    out_mean = np.empty(P)
    out_ups = np.empty(P)
    if blr_out(Z, s2, ut, dinv, r0, mean, a, out_mean, out_ups):
        return None
    return out_mean, out_ups, Z[:rank].T


def dlr_blr(mean, ups, W, mean_p, ups_p, W_p, U, g, coef=None, alpha=1.0):
    """BLR step for the DLR family (Jones et al. 2024, eqs 293-301; LIN-HESS: eqs 302-308).

    ups~ = (1 - alpha) ups + alpha ups_p, W~ = [sqrt(1 - alpha) W, sqrt(alpha) W_p, sqrt(alpha) U]
    (the first block only when alpha < 1), mu+ = mu + alpha (diag(ups~) + W~ W~^T)^{-1} v with
    v = g + (diag(ups_p) + W_p W_p^T)(mu_p - mu), then the projection to rank R of W_p. With
    coef (g = U coef) the g part of the mean comes from the LO-FI update and the prior part
    from one Woodbury solve. 0 < alpha <= 1. Shapes as :func:`dlr_bong`; mean, ups (P,), W (P, L).
    Returns (mean, ups, W); W column-major where the fused route made it (a column-major W, W_p or U
    is read without a copy).
    """
    mean_p, ups_p, Wpt = _check_dlr(mean_p, ups_p, W_p, ("mean_p", "ups_p", "W_p"), transpose=True)
    R, P = Wpt.shape
    mean, ups, Wt_ = _check_dlr(mean, ups, W, ("mean", "ups", "W"), P, transpose=True)
    Ut, g, coef = _check_estimate(P, U, g, coef, transpose=True)
    W_p, W, U = Wpt.T, Wt_.T, Ut.T  # (P, .) column-major views for the general routes
    a = _alpha(alpha, upper=1.0)
    inputs = dict(mean=mean, ups=ups, W=W, mean_p=mean_p, ups_p=ups_p, W_p=W_p, U=U, g=g)
    fast = None
    # where the Gram matrix's eigenvectors are not accurate enough at the rank cut (gram_truncation_ok: a
    # gap at the cut small next to the largest eigenvalue, with eigenvalues there not far below it) the
    # fused route ends with LO-FI's truncation of W~ V itself, reusing its pass and Gram matrix
    if a < 1.0:
        with _host.blas_threads(1), np.errstate(all="ignore"):  # small BLAS products; see _host.blas_threads
            fast = _blr_fused(mean, ups, Wt_, mean_p, ups_p, Wpt, Ut, g, coef, a, R)
    if fast is not None:
        return fast[0], fast[1], fast[2]
    ups_t = (1.0 - a) * ups + a * ups_p
    parts = [np.sqrt(a) * W_p]
    if a < 1.0:
        parts.insert(0, np.sqrt(1.0 - a) * W)
    Wt = np.concatenate(parts, axis=1)
    delta = mean_p - mean
    prior_term = ups_p * delta + W_p @ (W_p.T @ delta)
    if a < 1.0:
        with _host.blas_threads(1):  # small BLAS products; see _host.blas_threads
            fast = _blr_fast(mean, ups_t, Wt, U, g, coef, a, R, prior_term)
    if fast is not None:
        out_mean, out_ups, out_W = fast
        _finite_or_raise("BLR (DLR)", inputs, out_mean)
        return out_mean, out_ups, out_W
    out_mean, out_ups, out_W = _guard("BLR (DLR) update", inputs, _project, mean, ups_t, Wt, U, coef, a, R)
    if coef is None:
        rhs = g + prior_term
    elif np.any(delta):
        rhs = prior_term
    else:
        rhs = None
    if rhs is not None:
        Wfull = np.concatenate([Wt, np.sqrt(a) * U], axis=1)
        out_mean = (mean if coef is None else out_mean) + a * _guard("BLR (DLR) update", inputs, dlr_solve,
                                                                       ups_t, Wfull, rhs)
    _finite_or_raise("BLR (DLR)", inputs, out_mean)
    return out_mean, out_ups, out_W


@numba.njit(cache=True, error_model="numpy")
def bog_pass(ups_p, W_p, B, M, a, out_ups, out_W):
    """out_ups = ups_p + (a/2) rowsumsq(B), out_W = W_p + a B M (M (K, R)), row by row.
    Returns the number of rows with a non-finite output or out_ups <= 0."""
    P, R = W_p.shape
    K = B.shape[1]
    ah = 0.5 * a
    nbad = 0
    for i in range(P):
        acc = 0.0
        for k in range(K):
            acc += B[i, k] * B[i, k]
        u = ups_p[i] + ah * acc
        out_ups[i] = u
        ok = np.isfinite(u) and u > 0.0
        for r in range(R):
            t = 0.0
            for k in range(K):
                t += B[i, k] * M[k, r]
            w = W_p[i, r] + a * t
            out_W[i, r] = w
            ok = ok and np.isfinite(w)
        if not ok:
            nbad += 1
    return nbad


def dlr_bog(mean_p, ups_p, W_p, U, g, alpha):
    """BOG step for the DLR family (Jones et al. 2024, eqs 309-318): a gradient step on (mu, ups, W).

    B = (diag(ups_p) + W_p W_p^T)^{-1} U, mu+ = mu_p + alpha g,
    ups+ = ups_p + (alpha/2) rowsumsq(B), W+ = W_p + alpha B (B^T W_p).
    mean_p, ups_p: (P,); W_p: (P, R); U: (P, K) with G = -U U^T; g: (P,); alpha > 0.
    Returns (mean (P,), ups (P,), W (P, R)).
    """
    mean_p, ups_p, W_p = _check_dlr(mean_p, ups_p, W_p, ("mean_p", "ups_p", "W_p"))
    P, R = W_p.shape
    U, g, _ = _check_estimate(P, U, g, None)
    a = _alpha(alpha)
    inputs = dict(mean_p=mean_p, ups_p=ups_p, W_p=W_p, U=U, g=g)
    B = _guard("BOG (DLR) update", inputs, dlr_solve, ups_p, W_p, U)
    M = np.ascontiguousarray(B.T @ W_p)
    out_ups = np.empty(P)
    out_W = np.empty((P, R))
    nbad = bog_pass(ups_p, W_p, B, M, a, out_ups, out_W)
    mean = mean_p + a * g
    if nbad or not np.all(np.isfinite(mean)):
        if not (np.all(np.isfinite(out_ups)) and np.all(np.isfinite(out_W)) and np.all(np.isfinite(mean))):
            _host.raise_nonfinite("BOG (DLR) update", **inputs)
        i = int(np.argmin(out_ups))
        raise NotPositiveDefiniteError(f"BOG (DLR) precision update made diagonal entry {i} non-positive "
                                       f"({float(out_ups[i])!r})")
    return mean, out_ups, out_W


@numba.njit(cache=True, error_model="numpy")
def bbb_diag_pass(ups, ups_p, B, Cm, SWp, SU, a, out_ups):
    """out_ups = ups + (a/2) diag(Sigma M Sigma) with, per row i (D = 1/ups, b = B[i]):
    diag(Sigma diag(ups_p) Sigma)_i = ups_p D^2 - 2 ups_p D |b|^2 + b Cm b^T,
    diag(Sigma)_i = D - |b|^2, plus |SWp[i]|^2 + |SU[i]|^2 (Cm = B^T diag(ups_p) B).
    Returns the number of entries that are non-finite or <= 0."""
    P, R = B.shape
    nbad = 0
    for i in range(P):
        D = 1.0 / ups[i]
        dp = ups_p[i]
        bb = 0.0
        quad = 0.0
        for r in range(R):
            bb += B[i, r] * B[i, r]
            t = 0.0
            for c in range(R):
                t += Cm[r, c] * B[i, c]
            quad += B[i, r] * t
        sw = 0.0
        for r in range(SWp.shape[1]):
            sw += SWp[i, r] * SWp[i, r]
        su = 0.0
        for k in range(SU.shape[1]):
            su += SU[i, k] * SU[i, k]
        sand = dp * D * D - 2.0 * dp * D * bb + quad
        u = ups[i] + 0.5 * a * (sand + sw - (D - bb) + su)
        out_ups[i] = u
        if not (np.isfinite(u) and u > 0.0):
            nbad += 1
    return nbad


def _bbb_sigma_factor(ups, W, X):
    """B (P, R) with Sigma = (diag(ups) + W W^T)^{-1} = D - B B^T (D = diag(1/ups),
    B = D W chol(I + W^T D W)^{-T}, the Woodbury identity) and Sigma X, from one Cholesky
    factor that every Sigma product of a BBB step then reuses (eqs 319-321). None when the
    factor fails or a result is not finite: the caller then takes the general route, which
    names the failure."""
    with np.errstate(all="ignore"):  # a non-finite input is named by the general route
        DW = W / ups[:, None]
        core = W.T @ DW
        core[np.diag_indices_from(core)] += 1.0
        if not np.all(np.isfinite(core)):
            return None
        try:
            Lk = np.linalg.cholesky(core)
        except np.linalg.LinAlgError:
            return None
        B = np.ascontiguousarray(sla.solve_triangular(Lk, DW.T, lower=True, check_finite=False).T)
        S = X / ups[:, None] - B @ (B.T @ X)
    if not (np.all(np.isfinite(B)) and np.all(np.isfinite(S))):
        return None
    return B, S


#: blocks of BBB_BLOCK rows per slot of the sums (:func:`bbb_sums`): the kernel threads take runs of
#: whole groups, and each group's sums go to their own slot
SUMS_GROUP = 16


def bbb_sums(Wt, Wpt, Ut, dinv, ups_p, NW, N2w):
    """The sums of the fused DLR BBB step (:func:`_bbb_fused`) in one pass over blocks of rows:
    NW (R, n) = W^T D X, X = [W, W_p, U] (n = R + Rp + K columns; of the symmetric block
    NW[:, :R] only the lower triangle) and the lower triangle of N2w (R, R) = W^T diag(ups_p D^2) W,
    D = diag(dinv). The rows go in groups of SUMS_GROUP blocks to the kernel threads
    (``_host.run_chunks``, :func:`bbb_sums_range`); each group's sums have their own slot, added here
    in group order, so the numbers do not depend on the thread count. Entries not written are zero;
    columns of NW past n (a wider NW) are left as they are (``bbb_mlp`` puts U's sums there)."""
    R, P = Wt.shape
    n = R + Wpt.shape[0] + Ut.shape[0]
    rows = np.full(-(-P // (SUMS_GROUP * BBB_BLOCK)), SUMS_GROUP * BBB_BLOCK)
    if rows.size:
        rows[-1] = P - SUMS_GROUP * BBB_BLOCK * (rows.size - 1)
    NWs = np.zeros((rows.size, R, n))
    N2s = np.zeros((rows.size, R, R))
    _host.run_chunks(bbb_sums_range, rows.size, Wt, Wpt, Ut, dinv, ups_p, NWs, N2s, rows=rows)
    NW[:, :n] = np.add.reduce(NWs, axis=0)
    N2w[:] = np.add.reduce(N2s, axis=0)


@numba.njit(nogil=True, cache=True, fastmath=REDUCE, error_model="numpy")
def bbb_sums_range(Wt, Wpt, Ut, dinv, ups_p, NWs, N2s, g0, g1):
    """The sums of :func:`bbb_sums` over the groups g0 <= g < g1 of SUMS_GROUP blocks of BBB_BLOCK rows,
    group g's into NWs[g] (R, n) and N2s[g] (R, R) (zeros on entry). Per block: the two symmetric blocks
    W^T D W and W^T diag(ups_p D^2) W from the register-tiled ``lofi.gram_tiles`` (2 x 4 tiles of W's
    rows, both weights in one sweep), then the cross sums W^T D W_p and W^T D U from ``lofi.cross_tiles``
    (4 x 4 tiles of W's rows against W_p's or U's, weighted by 1 / ups)."""
    R, P = Wt.shape
    Rp = Wpt.shape[0]
    BS = BBB_BLOCK
    q = np.empty(BS)
    tile = np.empty((R, 2 * R))
    for g in range(g0, g1):
        NW = NWs[g]
        N2w = N2s[g]
        for i0 in range(g * SUMS_GROUP * BS, min((g + 1) * SUMS_GROUP * BS, P), BS):
            nb = min(BS, P - i0)
            dv = dinv[i0:i0 + nb]
            pv = ups_p[i0:i0 + nb]
            for k in range(nb):
                q[k] = pv[k] * dv[k] * dv[k]
            gram_tiles(Wt, dv, q, i0, nb, tile)
            for r in range(R):
                for c in range(r + 1):
                    NW[r, c] += tile[r, c]
                    N2w[r, c] += tile[r, R + c]
            cross_tiles(Wt, Wpt, dv, i0, nb, NW, R)
            cross_tiles(Wt, Ut, dv, i0, nb, NW, R + Rp)


@numba.njit(cache=True, error_model="numpy")
def _block_rows(Xt, i0, nb, out):
    """out[:, :nb] = columns i0 <= i < i0 + nb of Xt (rows of P): the block's rows, contiguous, for the loops
    of :func:`bbb_block`."""
    for c in range(Xt.shape[0]):
        src = Xt[c, i0:i0 + nb]
        dst = out[c, :nb]
        for k in range(nb):
            dst[k] = src[k]


@numba.njit(cache=True, fastmath=CONTRACT, error_model="numpy")
def bbb_block(Wc, Zw, Zp, Zu, Uc, Wpt, i0, nb, ups, ups_p, dinv, a, out_ups, out_Wt, zw, yw, ss):
    """The outputs of rows i0 <= i < i0 + nb of the fused DLR BBB step (see :func:`bbb_out`) from the
    block's rows Wc (R, >= nb) of W^T and Uc (K, >= nb) of U^T, and its products Zw = Ew^T W^T
    (3R + Rp + K, >= nb), Zp = (W_p Q1)^T (R, >= nb) and Zu = (U Mk)^T (R, >= nb), each read over its first
    nb columns (block buffers); zw, yw, ss: (>= nb,) buffers. Writes
    out_Wt[:, i0:i0 + nb] and out_ups[i0:i0 + nb]. Returns (rows with ups+ non-finite or <= 0, whether
    W+ holds NaN or inf)."""
    R = Wc.shape[0]
    Rp = Wpt.shape[0]
    K = Uc.shape[0]
    dv = dinv[i0:i0 + nb]
    pv = ups_p[i0:i0 + nb]
    for k in range(nb):
        zw[k] = 0.0
        yw[k] = 0.0
        ss[k] = 0.0
    bad_w = False
    for c in range(R):
        w = Wc[c]
        z = Zw[c]
        z2 = Zw[R + c]
        y = Zw[2 * R + c]
        zp = Zp[c]
        zu = Zu[c]
        o = out_Wt[c, i0:i0 + nb]
        for k in range(nb):
            d = dv[k]
            zw[k] += z[k] * w[k]
            yw[k] += y[k] * w[k]
            o[k] = w[k] + a * d * (pv[k] * d * z[k] + z2[k] + zp[k] + zu[k])
        bad_w = bad_w or nonfinite_vec(o)
    for c in range(Rp):
        wp = Wpt[c, i0:i0 + nb]
        zr = Zw[3 * R + c]
        for k in range(nb):
            sv = wp[k] + zr[k]
            ss[k] += sv * sv
    for c in range(K):
        ur = Uc[c]
        zr = Zw[3 * R + Rp + c]
        for k in range(nb):
            sv = ur[k] + zr[k]
            ss[k] += sv * sv
    nbad = 0
    uv = ups[i0:i0 + nb]  # views from 0: indexed by i0 + k, the loop gathered and scattered (a negative
    ou = out_ups[i0:i0 + nb]  # index would wrap around); by k, it is vectorised with plain loads and stores
    for k in range(nb):
        d = dv[k]
        p = pv[k]
        dd = d * d
        bb = dd * zw[k]
        u = uv[k] + 0.5 * a * (p * dd - 2.0 * p * d * bb + dd * yw[k] + dd * ss[k] - d + bb)
        ou[k] = u
        if not (np.isfinite(u) and u > 0.0):
            nbad += 1
    return nbad, bad_w


@numba.njit(cache=True, error_model="numpy")
def bbb_out(EwT, Cp, MkT, Wt, Wpt, Ut, ups, ups_p, dinv, a, out_ups, out_Wt):
    """Pass 2 of the fused DLR BBB step (see :func:`_bbb_fused`) over blocks of BBB_BLOCK rows, along the
    rows of the transposes Wt, Wpt, Ut. Each block's products (``_blocks.tile_matmul``, into block buffers)
    are used while they are in cache (3R + Rp + K + 2R numbers per row: never written to memory whole):
    Zw = Ew^T W^T, whose row groups are z = (W A^{-1})^T, the W-part of the W step,
    y = (W A^{-1} N2 A^{-1})^T, -(W C_p)^T and -(W C_u)^T, and Zp = (W_p Q1)^T = Cp W_p^T and
    Zu = (U Mk)^T = MkT U^T (R rows), the W_p- and U-parts of the W step; :func:`bbb_block` makes the
    outputs from them. With s_p = W_p,i - W_i C_p and s_u = U_i - W_i C_u (Sigma W_p and Sigma U's rows
    times ups_i): W+ = W + a d (p d z + Z2) into out_Wt = W+^T, ups+ = ups + (a/2) diag(Sigma M Sigma)
    (eqs 319-321), d = 1/ups_i, p = ups_p,i; each row's sums taken over c in order. Returns the number
    of rows with ups+ non-finite or <= 0, plus one when W+ holds NaN or inf."""
    R, P = Wt.shape
    BS = BBB_BLOCK
    zw = np.empty(BS)
    yw = np.empty(BS)
    ss = np.empty(BS)
    Wc = block_buffer(R, BS)
    Uc = block_buffer(Ut.shape[0], BS)
    Zw = block_buffer(EwT.shape[0], BS)
    Zp = block_buffer(R, BS)
    Zu = block_buffer(R, BS)
    bad_w = False
    nbad = 0
    for i0 in range(0, P, BS):
        nb = min(BS, P - i0)
        _block_rows(Wt, i0, nb, Wc)
        tile_matmul(EwT, Wc, 0, nb, Zw)
        tile_matmul(Cp, Wpt, i0, nb, Zp)
        _block_rows(Ut, i0, nb, Uc)
        tile_matmul(MkT, Uc, 0, nb, Zu)
        n, bw = bbb_block(Wc, Zw, Zp, Zu, Uc, Wpt, i0, nb, ups, ups_p, dinv, a, out_ups, out_Wt, zw, yw, ss)
        nbad += n
        bad_w = bad_w or bw
    return nbad + (1 if bad_w else 0)


@numba.njit(cache=True, error_model="numpy")
def bbb_small(NW, N2w, Rp):
    """The small algebra of the fused DLR BBB step (:func:`_bbb_fused`), in one compiled call.

    NW (R, n) = W^T D X, the W rows of N = X^T D X, and N2w (R, R) = W^T diag(ups_p D^2) W, the one
    block of N2 = X^T diag(ups_p D^2) X that the step uses (X = [W, W_p, U] with R, Rp and
    K = n - R - Rp columns; of the symmetric blocks N_ww and N2w only the lower triangles are read).
    With A = I + N_ww (Cholesky), C_p = A^{-1} N_wp, C_u = A^{-1} N_wu, Q2 = A^{-1} (N2_ww + N_wp N_pw) A^{-1}
    and M_k = N_uw - C_u^T N_ww ((Sigma U)^T W):

    Returns (ok, EwT, Cp, MkT), the matrices of the three products with W^T, W_p^T and U^T:
    EwT (3R + Rp + K, R) = Ew^T, Ew = [A^{-1}, -Q2 - A^{-1} - C_u M_k, A^{-1} N2_ww A^{-1}, -C_p, -C_u];
    Cp (R, Rp) (W_p's part of the W step is W_p Q1 with Q1 = N_pw A^{-1} = C_p^T); MkT = M_k^T (R, K).
    A^{-1} is formed as L^{-T} L^{-1} from the Cholesky factor L, so it is exactly symmetric.
    ok is False (the rest undefined) when a sum is not finite or A is not positive definite.
    """
    R, n = NW.shape
    K = n - R - Rp
    EwT = np.zeros((3 * R + Rp + K, R))
    Cp = np.zeros((R, Rp))
    MkT = np.zeros((R, K))
    Nww = np.empty((R, R))
    N2ww = np.empty((R, R))
    for i in range(R):
        for j in range(n):
            if not np.isfinite(NW[i, j]):
                return False, EwT, Cp, MkT
        for j in range(i + 1):
            if not np.isfinite(N2w[i, j]):
                return False, EwT, Cp, MkT
            Nww[i, j] = Nww[j, i] = NW[i, j]
            N2ww[i, j] = N2ww[j, i] = N2w[i, j]
    Lk = np.empty((R, R))
    if not chol_lower(Nww, Lk, 1.0):  # A = I + N_ww
        return False, EwT, Cp, MkT
    Li = np.empty((R, R))
    lower_inverse(Lk, Li)
    Ainv = np.empty((R, R))
    matmul(Li, Li, Ainv, True, False)  # A^{-1} = Lk^{-T} Lk^{-1}
    Nwp = NW[:, R:R + Rp]
    Nwu = NW[:, R + Rp:]
    matmul(Ainv, Nwp, Cp)
    Cu = np.empty((R, K))
    matmul(Ainv, Nwu, Cu)
    for i in range(R):  # M_k^T = N_wu - N_ww C_u
        for k in range(K):
            s = Nwu[i, k]
            for j in range(R):
                s -= Nww[i, j] * Cu[j, k]
            MkT[i, k] = s
    T = np.empty((R, R))
    matmul(Nwp, Nwp, T, False, True)  # N_wp N_pw
    for i in range(R):
        for j in range(R):
            T[i, j] += N2ww[i, j]
    T2 = np.empty((R, R))
    matmul(Ainv, T, T2)
    Q2 = np.empty((R, R))
    matmul(T2, Ainv, Q2)
    matmul(Ainv, N2ww, T2)
    AN2A = np.empty((R, R))
    matmul(T2, Ainv, AN2A)
    CuMk = np.empty((R, R))
    matmul(Cu, MkT, CuMk, False, True)
    for i in range(R):
        for j in range(R):
            EwT[j, i] = Ainv[i, j]
            EwT[R + j, i] = -Q2[i, j] - Ainv[i, j] - CuMk[i, j]
            EwT[2 * R + j, i] = AN2A[i, j]
        for j in range(Rp):
            EwT[3 * R + j, i] = -Cp[i, j]
        for k in range(K):
            EwT[3 * R + Rp + k, i] = -Cu[i, k]
    return True, EwT, Cp, MkT


def _bbb_fused(ups, Wt, ups_p, Wpt, Ut, a):
    """(ups+, W+) of the DLR BBB step (eqs 319-321) from two compiled passes over the rows.
    With X = [W, W_p, U] (n = R + Rp + K columns) and D = diag(1/ups), the step reads only the
    W rows of N = X^T D X, W^T D X, and one block of N2 = X^T diag(ups_p D^2) X, W^T diag(ups_p D^2) W:
    a third of the sums of the two whole Gram matrices (at n = 30, R = 10: 310 of 930 pairs; fewer
    still with the symmetric blocks' lower triangles), one compiled pass (:func:`bbb_sums`). The small
    algebra is one compiled call (:func:`bbb_small`), then ``bbb_out`` forms the three products with W,
    W_p and U (their zero blocks left out) block by block, on rows in cache (``_blocks.tile_matmul``),
    and the outputs from them; no P-sized temporary. With A = I + W^T D W (Cholesky) the
    Woodbury identity gives Sigma = D - D W A^{-1} W^T D, so Sigma W = D W A^{-1},
    Sigma W_p = D (W_p - W C_p), Sigma U = D (U - W C_u) (C_p = A^{-1} W^T D W_p, C_u = A^{-1} W^T D U),
    and every term of diag(Sigma M Sigma) and of Sigma M Sigma W is a row of X times an n x m matrix.
    The factors come transposed (Wt = W^T (R, P), Wpt = W_p^T, Ut = U^T), so that every pass runs
    along contiguous rows, and W+ is returned column-major.
    Returns (ups+, W+), or None when a guard fails (R = 0, a non-finite sum, a failed Cholesky factor,
    a bad output): the caller then takes the general route, which names the failure."""
    R, P = Wt.shape
    Rp = Wpt.shape[0]
    K = Ut.shape[0]
    n = R + Rp + K
    if R == 0:
        return None
    dinv = 1.0 / ups
    NW = np.empty((R, n))  # W^T D X (the other rows of X^T D X are not used)
    N2w = np.empty((R, R))  # W^T diag(ups_p D^2) W
    bbb_sums(Wt, Wpt, Ut, dinv, ups_p, NW, N2w)
    ok, EwT, Cp, MkT = bbb_small(NW, N2w, Rp)
    if not ok:
        return None
    out_ups = np.empty(P)
    out_Wt = np.empty((R, P))
    if bbb_out(EwT, Cp, MkT, Wt, Wpt, Ut, ups, ups_p, dinv, a, out_ups, out_Wt):
        return None
    return out_ups, out_Wt.T


def dlr_bbb(mean, ups, W, mean_p, ups_p, W_p, U, g, alpha):
    """BBB step for the DLR family (Jones et al. 2024, eqs 319-321): a gradient step on
    (mu, ups, W) of E[log p] - KL(q || prior).

    With Sigma = (diag(ups) + W W^T)^{-1}, Lambda_p = diag(ups_p) + W_p W_p^T and
    Sigma M Sigma = Sigma Lambda_p Sigma - Sigma + (Sigma U)(Sigma U)^T:
    mu+ = mu + alpha v, v = g + Lambda_p (mu_p - mu); ups+ = ups + (alpha/2) diag(Sigma M Sigma);
    W+ = W + alpha Sigma M Sigma W. Shapes as :func:`dlr_blr`; returns (mean, ups, W), W column-major
    where the fused route made it (column-major W, W_p and U are read without a copy).
    """
    mean_p, ups_p, Wpt = _check_dlr(mean_p, ups_p, W_p, ("mean_p", "ups_p", "W_p"), transpose=True)
    Rp, P = Wpt.shape
    mean, ups, Wt_ = _check_dlr(mean, ups, W, ("mean", "ups", "W"), P, transpose=True)
    R = Wt_.shape[0]
    Ut, g, _ = _check_estimate(P, U, g, None, transpose=True)
    W_p, W, U = Wpt.T, Wt_.T, Ut.T  # (P, .) column-major views for the general route
    a = _alpha(alpha)
    K = U.shape[1]
    delta = mean_p - mean
    v = g + (ups_p * delta + W_p @ (W_p.T @ delta))
    inputs = dict(mean=mean, ups=ups, W=W, mean_p=mean_p, ups_p=ups_p, W_p=W_p, U=U, g=g)
    out_mean = mean + a * v
    if R > 0 and np.all(np.isfinite(out_mean)):
        with _host.blas_threads(1), np.errstate(all="ignore"):  # small BLAS products; see _host.blas_threads
            fused = _bbb_fused(ups, Wt_, ups_p, Wpt, Ut, a)
        if fused is not None:
            return out_mean, fused[0], fused[1]
    fast = None
    if R > 0:
        with _host.blas_threads(1):  # small BLAS products; see _host.blas_threads
            fast = _bbb_sigma_factor(ups, W, np.concatenate([U, W_p, W], axis=1))
    if fast is not None:
        B, S_all = fast
    else:
        S_all = _guard("BBB (DLR) update", inputs, dlr_solve, ups, W,
                       np.concatenate([U, W_p, W], axis=1))  # Sigma [U, W_p, W]
    SU, SWp, SW = S_all[:, :K], S_all[:, K:K + Rp], S_all[:, K + Rp:]
    if fast is None and R > 0:
        try:
            Lk = np.linalg.cholesky(_guard("BBB (DLR) update", inputs, dlr_inner, ups, W))
        except np.linalg.LinAlgError as exc:
            raise NotPositiveDefiniteError("I + W^T diag(1/ups) W is not positive definite") from exc
        B = np.linalg.solve(Lk, (W / ups[:, None]).T).T  # Sigma = D - B B^T
    elif fast is None:
        B = np.zeros((P, 0))
    B = np.ascontiguousarray(B)
    Cm = np.ascontiguousarray(B.T @ (ups_p[:, None] * B))
    out_ups = np.empty(P)
    nbad = bbb_diag_pass(ups, ups_p, B, Cm, np.ascontiguousarray(SWp), np.ascontiguousarray(SU), a, out_ups)
    if R > 0:
        LpSW = ups_p[:, None] * SW + W_p @ (W_p.T @ SW)
        if fast is not None:
            with _host.blas_threads(1):
                S_LpSW = LpSW / ups[:, None] - B @ (B.T @ LpSW)
        else:
            S_LpSW = _guard("BBB (DLR) update", inputs, dlr_solve, ups, W, LpSW)
        out_W = W + a * (S_LpSW - SW + SU @ (SU.T @ W))
    else:
        out_W = W.copy()
    out_mean = mean + a * v
    if nbad or not (np.all(np.isfinite(out_mean)) and np.all(np.isfinite(out_W))):
        if not (np.all(np.isfinite(out_ups)) and np.all(np.isfinite(out_W)) and np.all(np.isfinite(out_mean))):
            _host.raise_nonfinite("BBB (DLR) update", **inputs)
        i = int(np.argmin(out_ups))
        raise NotPositiveDefiniteError(f"BBB (DLR) precision update made diagonal entry {i} non-positive "
                                       f"({float(out_ups[i])!r})")
    return out_mean, out_ups, out_W
