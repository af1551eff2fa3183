"""Inner steps on compiled kernels (``Bong(..., backend="numba")``) for the diagonal and DLR families.

Same signature and numbers (round-off) as the steps in :mod:`.algorithms`, plus ``coef``
(K,) with g = U coef for a factor curvature U (the Estimate's ``coef``); the DLR BONG and
BLR steps are then one LO-FI update (Jones et al. 2024, eqs 281-308). The kernels are in
``refbayes.kernels.cpu.bong``; they are imported on first use, so the NumPy reference never
loads Numba. The full-covariance families have no compiled steps.

For an MLP (or ``rb.Linear``) with a Gaussian or categorical likelihood and a linearised
estimator (LIN-HESS, LIN-EF), :func:`fused_step` runs a whole step (predict, estimate, every
inner iteration) on kernels that never form the C x P Jacobian (``kernels.cpu.bong_mlp``);
:func:`fused_combinations` lists the triples it serves (docs/bong.md §6). With MC-EF over the
diagonal and DLR families (:func:`mc_combinations`) it draws on the host exactly as the reference does
and runs the M draws' forward and reverse passes in one compiled call per inner iteration; with
MC-HESS over the diagonal families and Hutchinson's diagonal (:func:`mc_hess_combinations`) it draws
the parameters and the probes as the reference does and forms each draw's Hessian-vector products
by compiled forward and reverse passes of directional derivatives (``kernels.cpu.hutchinson``).

Family identifiers here are those of :mod:`.families` and :mod:`.algorithms` ("diag" = the
moment form Diag_MOM, "diag-natural" = Diag), not the public ``Bong(family=...)`` names;
:func:`.names.internal_family` maps one to the other.
"""

import numpy as np

from ...beliefs import DLR, Diag
from ...errors import DivergenceError, inner_iteration

__all__ = [
    "KERNEL_FAMILIES",
    "KERNEL_STEPS",
    "get_kernel_step",
    "dlr_bong",
    "dlr_blr",
    "dlr_bog",
    "dlr_bbb",
    "predict_dlr",
    "dlr_sampler",
    "mlp_lofi_spec",
    "fused_dlr_bong_lin_hess",
    "fused_diag_natural_bong_lin_hess",
    "FUSED_ESTIMATORS",
    "fused_combinations",
    "MC_ESTIMATORS",
    "MC_FAMILIES",
    "mc_combinations",
    "MC_HESS_FAMILIES",
    "mc_hess_combinations",
    "mc_calls",
    "fused_spec",
    "fused_step",
]

KERNEL_FAMILIES = ("diag", "diag-natural", "dlr")


def _kb():
    from ...kernels.cpu import bong

    return bong


def _cpu():
    from ...kernels import cpu

    return cpu


def _finite_estimate(family, algorithm, g, curv):
    """Reject a non-finite estimate with the reference's exception: DivergenceError for
    the diagonal families (their output check sees it), ValueError for DLR (the Woodbury
    solves refuse it), except a non-finite g in DLR BOG/BBB, which only moves the mean
    (DivergenceError). One O(P K) scan."""
    g_ok = bool(np.all(np.isfinite(g)))
    curv_ok = bool(np.all(np.isfinite(curv.data)))
    if g_ok and curv_ok:
        return
    if family != "dlr" or (curv_ok and algorithm in ("bog", "bbb")):
        raise DivergenceError(f"{algorithm.upper()} ({family}) update produced NaN or inf: "
                              "the gradient or curvature estimate is not finite", quantity="estimate")
    raise ValueError(f"the {'curvature factor U' if not curv_ok else 'gradient g'} contains NaN or inf")


def _curvature_args(curv):
    """Keyword arguments d= or U= of kernels.cpu.bong.diag_step for a Curvature."""
    if curv.is_factor:
        return {"U": curv.data}
    return {"d": curv.diag()}


def _diag_step(family, algorithm):
    natural_bong = (family, algorithm) == ("diag-natural", "bong")

    def step(cur, prior, g, curv, alpha=1.0, coef=None, vdekf_mean=False):
        _finite_estimate(family, algorithm, g, curv)
        extra = {}
        if vdekf_mean:
            if not natural_bong:
                raise ValueError("vdekf_mean applies only to BONG with family='diag-natural'")
            extra["step"] = _cpu().dlr_solve(1.0 / prior.var, np.sqrt(alpha) * curv.factor(), g)
        mean, var = _kb().diag_step(family, algorithm, cur.mean, cur.var, prior.mean, prior.var, g,
                                    alpha=alpha, **_curvature_args(curv), **extra)
        return Diag._trusted(mean=mean, var=var)

    step.__name__ = f"{family.replace('-', '_')}_{algorithm}_kernel"
    step.__doc__ = (f"Compiled {algorithm.upper()} step, family {family!r}: the numbers of "
                    f"algorithms.{family.replace('-', '_')}_{algorithm} (kernels.cpu.bong.diag_step).")
    return step


def dlr_bong(cur, prior, g, curv, alpha=1.0, coef=None):
    """Compiled BONG step, DLR (Jones et al. 2024, eqs 281-292): kernels.cpu.bong.dlr_bong."""
    _finite_estimate("dlr", "bong", g, curv)
    mean, ups, W = _kb().dlr_bong(prior.mean, prior.ups, prior.W, curv.factor(), g, coef=coef, alpha=alpha)
    return DLR._trusted(mean=mean, ups=ups, W=W)


def dlr_blr(cur, prior, g, curv, alpha, coef=None):
    """Compiled BLR step, DLR (Jones et al. 2024, eqs 293-308): kernels.cpu.bong.dlr_blr."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1] for BLR with the DLR family; got {alpha}")
    _finite_estimate("dlr", "blr", g, curv)
    mean, ups, W = _kb().dlr_blr(cur.mean, cur.ups, cur.W, prior.mean, prior.ups, prior.W, curv.factor(), g,
                                 coef=coef, alpha=alpha)
    return DLR._trusted(mean=mean, ups=ups, W=W)


def dlr_bog(cur, prior, g, curv, alpha, coef=None):
    """Compiled BOG step, DLR (Jones et al. 2024, eqs 309-318): kernels.cpu.bong.dlr_bog."""
    _finite_estimate("dlr", "bog", g, curv)
    mean, ups, W = _kb().dlr_bog(prior.mean, prior.ups, prior.W, curv.factor(), g, alpha)
    return DLR._trusted(mean=mean, ups=ups, W=W)


def dlr_bbb(cur, prior, g, curv, alpha, coef=None):
    """Compiled BBB step, DLR (Jones et al. 2024, eqs 319-321): kernels.cpu.bong.dlr_bbb."""
    _finite_estimate("dlr", "bbb", g, curv)
    mean, ups, W = _kb().dlr_bbb(cur.mean, cur.ups, cur.W, prior.mean, prior.ups, prior.W, curv.factor(), g, alpha)
    return DLR._trusted(mean=mean, ups=ups, W=W)


KERNEL_STEPS = {(f, a): _diag_step(f, a) for f in ("diag-natural", "diag") for a in ("bong", "blr", "bog", "bbb")}
KERNEL_STEPS.update({
    ("dlr", "bong"): dlr_bong,
    ("dlr", "blr"): dlr_blr,
    ("dlr", "bog"): dlr_bog,
    ("dlr", "bbb"): dlr_bbb,
})


def get_kernel_step(algorithm, family):
    """The compiled inner step for (algorithm, family); ValueError for the full families."""
    try:
        return KERNEL_STEPS[(family, algorithm)]
    except KeyError:
        raise ValueError(
            f"backend='numba' supports family in {KERNEL_FAMILIES}; got family={family!r} "
            f"(algorithm={algorithm!r}); use backend='numpy'"
        ) from None


def predict_dlr(bel, gamma, q, b=None):
    """DLR predict on the compiled kernel (kernels.cpu.dlr_predict; Jones et al. 2024, Alg. 2),
    plus the mean offset b of the OU dynamics. Same numbers as families.predict_dlr."""
    mean, ups, W = _cpu().dlr_predict(bel.mean, bel.ups, bel.W, gamma, q)
    if b is not None:
        mean = mean + b
    return DLR._trusted(mean=mean, ups=ups, W=W)


def dlr_sampler(bel, rng, n):
    """n draws (n, P) from a DLR belief on the compiled sampler; consumes rng as bel.sample does."""
    return _cpu().dlr_sample(bel.mean, bel.ups, bel.W, rng, n)


def mlp_lofi_spec(model, likelihood):
    """Arguments of the fused compiled MLP LO-FI step (kernels.cpu.step.lofi_mlp_step) for an MLP
    with a Gaussian or categorical likelihood; None otherwise (base.mlp_kernel_spec). BONG with
    LIN-HESS on the DLR family is that update (Jones et al. 2024, eqs 287-292)."""
    from ..base import mlp_kernel_spec

    return mlp_kernel_spec(model, likelihood)


def fused_dlr_bong_lin_hess(spec, bel, x, target, gamma=1.0, q=0.0):
    """(posterior DLR, yhat (C,)) of BONG with LIN-HESS for one observation in one compiled call
    (forward pass, Jacobian structure, likelihood moments, update; with gamma, q the standard
    predict step first, yhat then at the predicted mean), or None when the kernel hands the
    step back (one Gram matrix would not be accurate enough)."""
    from ...kernels.cpu.step import lofi_mlp_step

    res = lofi_mlp_step(*spec, bel.mean, bel.ups, bel.W, x, target, bel.rank, gamma=gamma, q=q)
    if res is None:
        return None
    mean, ups, W, yhat = res
    return DLR._trusted(mean=mean, ups=ups, W=W), yhat


def fused_diag_natural_bong_lin_hess(spec, bel, x, target, gamma=1.0, q=0.0, vdekf_mean=False):
    """(posterior Diag, yhat (C,)) of BONG with LIN-HESS over the natural diagonal family in one
    compiled call: the VD-EKF update (Jones et al. 2024, eqs 212-213; the paper's mean, or with
    ``vdekf_mean`` the full-gain mean), after the standard predict step when gamma, q are given."""
    from ...kernels.cpu.mlp_diag import mlp_diag_step

    mean, var, yhat = mlp_diag_step(*spec, bel.mean, bel.var, x, target, "vd-ekf" if vdekf_mean else "vd-paper",
                                    gamma=gamma, q=q)
    return Diag._trusted(mean=mean, var=var), yhat


# -- fused MLP steps for every algorithm with the linearised estimators ----------------------

FUSED_ESTIMATORS = ("lin-hess", "lin-ef")


def fused_combinations():
    """The public (algorithm, family, estimator) triples that ``Bong(..., backend="numba")`` runs as
    compiled MLP steps (docs/bong.md §6): every algorithm over "diag", "diag-moment" and "dlr" with
    LIN-HESS or LIN-EF, for an MLP or an ``rb.Linear`` with a Gaussian or categorical likelihood."""
    from .names import COMBINATIONS, internal_family

    return [c for c in COMBINATIONS if internal_family(c[1]) in KERNEL_FAMILIES and c[2] in FUSED_ESTIMATORS]


#: Monte Carlo estimators with a compiled MLP step, and the (internal) families they serve
MC_ESTIMATORS = ("mc-ef",)
MC_FAMILIES = ("diag-natural", "diag", "dlr")


def mc_combinations():
    """The public (algorithm, family, estimator) triples with a compiled Monte Carlo MLP step
    (docs/bong.md §6): every algorithm over "diag", "diag-moment" and "dlr" with MC-EF, for an MLP
    or an ``rb.Linear`` with a Gaussian or categorical likelihood."""
    from .names import COMBINATIONS, internal_family

    return [c for c in COMBINATIONS if internal_family(c[1]) in MC_FAMILIES and c[2] in MC_ESTIMATORS]


#: the (internal) families with a compiled MC-HESS step: the diagonal ones, whose curvature is
#: Hutchinson's estimate of the Hessian's diagonal (``Bong(hess_diag="hutchinson")``, the default; with
#: hess_diag="exact" the reference builds each draw's P x P Hessian and the general route runs)
MC_HESS_FAMILIES = ("diag-natural", "diag")


def mc_hess_combinations():
    """The public (algorithm, family, estimator) triples with a compiled MC-HESS MLP step (docs/bong.md
    §6): every algorithm over "diag" and "diag-moment" with MC-HESS (``hess_diag="hutchinson"``), for
    an MLP or an ``rb.Linear`` with a Gaussian or categorical likelihood. ("dlr" has no MC-HESS.)"""
    from .names import COMBINATIONS, internal_family

    return [c for c in COMBINATIONS if internal_family(c[1]) in MC_HESS_FAMILIES and c[2] == "mc-hess"]


#: how many compiled Monte Carlo estimates (MC-EF, MC-HESS) have run (one per inner iteration; tests read it)
mc_calls = [0]


def fused_spec(filt):
    """The MLP kernel arguments (base.mlp_kernel_spec) when ``filt`` (a Bong) has a compiled MLP step
    (backend "numba"; a family of KERNEL_FAMILIES with an estimator of FUSED_ESTIMATORS, or a family
    of MC_FAMILIES with one of MC_ESTIMATORS; an MLP or an rb.Linear with a Gaussian or categorical
    likelihood); None otherwise."""
    if filt.backend != "numba" or filt._family not in KERNEL_FAMILIES:
        return None
    mc_ef = filt._family in MC_FAMILIES and filt.estimator in MC_ESTIMATORS
    mc_hess = (filt._family in MC_HESS_FAMILIES and filt.estimator == "mc-hess"
               and filt.hess_diag == "hutchinson")
    if filt.estimator not in FUSED_ESTIMATORS and not (mc_ef or mc_hess):
        return None
    return mlp_lofi_spec(filt.model, filt.likelihood)


def _gaussian_precision(likelihood, C):
    """R^{-1} (C, C) as ``Gaussian.grad`` applies it (its own solve, no jitter); zeros (1, 1) for a
    categorical likelihood, whose gradient onehot(y) - softmax(eta) needs none."""
    from ...likelihoods import Gaussian

    if isinstance(likelihood, Gaussian):
        return np.ascontiguousarray(likelihood._solve(np.eye(C)), dtype=np.float64)
    return np.zeros((1, 1))


def _mc_ef_step(filt, spec, bel, x, target, pending, rng):
    """(posterior Diag, yhat) of predict (when ``pending``) and ``n_iter`` inner iterations with MC-EF
    over a diagonal family (Jones et al. 2024, Alg. 5). Each inner iteration draws from the current
    iterate exactly as ``estimators.draw_params`` does (``Diag.sample``: one
    ``rng.standard_normal((M, P))``, or (M/2, P) with antithetic pairs; theta = mean + z sqrt(var)),
    then one compiled call (kernels.cpu.bong_mlp.mlp_mc_ef) puts the M draws through one forward and
    one reverse pass each and returns g = mean_j g_j and d = -mean_j g_j^2, and the compiled
    diagonal inner step (kernels.cpu.bong.diag_step) moves the iterate. With ``vd_mean="ekf"`` the
    per-draw gradients form the factor U = [g_j] / sqrt(M) that step needs. Over "dlr":
    :func:`_mc_ef_dlr_step`."""
    from .estimators import Curvature

    if filt._family == "dlr":
        return _mc_ef_dlr_step(filt, spec, bel, x, target, pending, rng)
    prior = filt._predict(bel) if pending else bel
    sizes, act, lik, Rc, jitter = spec
    Rinv = _gaussian_precision(filt.likelihood, int(sizes[-1]))
    M = filt.n_samples
    n_draw = M // 2 if filt.antithetic else M
    P = prior.mean.shape[0]
    mc_ef = _cpu().bong_mlp.mlp_mc_ef
    cur = prior
    yhat = None
    for k in range(filt.n_iter):
        z = rng.standard_normal((n_draw, P))  # Diag._sample's one call
        with inner_iteration(k, filt.n_iter):
            g, d, G, yh = mc_ef(sizes, act, lik, Rinv, Rc, jitter, cur.mean, cur.var, x, target, z,
                                antithetic=filt.antithetic, store=filt.vdekf_mean, want_yhat=yhat is None)
            mc_calls[0] += 1
            if yhat is None:
                yhat = yh
            curv = Curvature.from_factor(G.T / np.sqrt(M)) if filt.vdekf_mean else Curvature.from_diag(d)
            cur = filt._step_fn(cur, prior, g, curv, filt.lr, **filt._step_kw)
    return cur, yhat


def _host_threads():
    from ...kernels import _host

    return _host.n_threads()


def _host_pool():
    from ...kernels import _host

    return _host._pool(1)


def _mc_hess_step(filt, spec, bel, x, target, pending, rng):
    """(posterior Diag, yhat) of predict (when ``pending``) and ``n_iter`` inner iterations with MC-HESS
    over a diagonal family and Hutchinson's diagonal (Jones et al. 2024, Alg. 4 and Sec. E.3). Each
    inner iteration draws as ``estimators.mc_hess`` does: the M parameters first
    (``estimators.draw_params``), then, draw after draw, the N = ``n_probes`` Rademacher probes
    (``estimators.rademacher_bits``); each draw's gradient and sum_n z_n * (H z_n) come from one
    compiled call (``kernels.cpu.hutchinson``: forward and reverse passes of the directional
    derivatives along the N probes, no Jacobian, no autograd), g = mean_j g_j and
    d = mean_j mean_n z_n * (H_j z_n); the compiled diagonal inner step moves the iterate. yhat is
    the likelihood mean at the predicted mean, as the general route gives it."""
    from ...kernels.cpu._status import OK, raise_status
    from ...kernels.cpu.hutchinson import mlp_mc_hess_draw
    from ...kernels.cpu.mlp import layer_bias
    from ...likelihoods import Gaussian
    from .estimators import Curvature, draw_params, rademacher_bits

    prior = filt._predict(bel) if pending else bel
    sizes, act, lik, Rc, jitter = spec
    C = int(sizes[-1])
    Rinv = _gaussian_precision(filt.likelihood, C)
    # the Gaussian Hessian in eta (-R^{-1}, symmetrised, as Gaussian.hessian gives it); a categorical one
    # depends on eta and is formed in the kernel
    Lam = np.zeros((1, 1))
    if isinstance(filt.likelihood, Gaussian):
        Lam = np.ascontiguousarray(filt.likelihood.hessian(np.zeros(C), np.zeros(C)), dtype=np.float64)
    P = prior.mean.shape[0]
    bias = layer_bias(sizes, P)
    M, N = filt.n_samples, filt.n_probes
    yhat = filt.likelihood.mean(filt.model.apply(prior.mean, x))
    # with two or more threads (the thread policy's count for this P), draw j's kernel runs on a worker
    # (nogil) while this thread draws draw j + 1's probes: the draws and the sums are in the same
    # order either way, so the numbers do not depend on the threads
    pool = _host_pool() if _host_threads() > 1 else None
    cur = prior
    for k in range(filt.n_iter):
        with inner_iteration(k, filt.n_iter):
            thetas = draw_params(cur, rng, M, filt.antithetic)
            g = np.zeros(P)
            s = np.zeros(P)
            running = None
            status = OK
            for theta in thetas:
                bits = rademacher_bits(rng, P, N)  # the probes 2 bits - 1, as the reference draws them
                if status != OK:  # the reference draws every draw's probes before it checks the estimate
                    continue
                args = (sizes, act, lik, Rinv, Lam, theta, bits, x, target, g, s, bias)
                if pool is None:
                    status = mlp_mc_hess_draw(*args)
                    continue
                if running is not None:
                    status, running = running.result(), None
                    if status != OK:
                        continue
                running = pool.submit(mlp_mc_hess_draw, *args)
            if running is not None:
                status = running.result()
            raise_status(status, "MC-HESS estimate")
            mc_calls[0] += 1
            g /= thetas.shape[0]
            d = s / (thetas.shape[0] * N)
            cur = filt._step_fn(cur, prior, g, Curvature.from_diag(d), filt.lr, **filt._step_kw)
    return cur, yhat


def _dlr_prior(filt, bel, pending):
    """The predicted DLR belief of an inner-iteration loop (``bel`` itself unless ``pending``), its W
    column-major for BLR and BBB, whose inner steps read W_p^T (a row-major W is transposed once)."""
    prior = filt._predict(bel) if pending else bel
    if filt.algorithm in ("blr", "bbb") and not prior.W.flags.f_contiguous:
        prior = DLR._trusted(mean=prior.mean, ups=prior.ups, W=np.asfortranarray(prior.W))
    return prior


def _mc_ef_dlr_step(filt, spec, bel, x, target, pending, rng):
    """(posterior DLR, yhat) of predict (when ``pending``) and ``n_iter`` inner iterations with MC-EF
    over "dlr" (Jones et al. 2024, Alg. 5). Each inner iteration draws from the current iterate as
    the general route does (``estimators.draw_params`` with the compiled DLR sampler, antithetic
    pairs included), puts the M draws through one forward and one reverse pass each in one compiled
    call (kernels.cpu.bong_mlp.mlp_mc_ef with given draws: no C x P Jacobian), and moves the iterate
    with the compiled DLR inner step, from the factor U = [g_1 .. g_M] / sqrt(M) and coef = 1 / sqrt(M)
    (g = U coef), as ``estimators.mc_ef`` forms them; U column-major (a view of the per-draw rows), as
    the LIN estimate's, which the BLR and BBB inner steps read as rows. yhat is the likelihood mean at
    the predicted mean, from the first call."""
    from .estimators import draw_params

    prior = _dlr_prior(filt, bel, pending)
    sizes, act, lik, Rc, jitter = spec
    Rinv = _gaussian_precision(filt.likelihood, int(sizes[-1]))
    M = filt.n_samples
    coef = np.full(M, 1.0 / np.sqrt(M))
    mc_ef = _cpu().bong_mlp.mlp_mc_ef
    step = _DLR_ARRAY_STEPS[filt.algorithm]
    cur = prior
    yhat = None
    for k in range(filt.n_iter):
        with inner_iteration(k, filt.n_iter):
            thetas = draw_params(cur, rng, M, filt.antithetic, sampler=dlr_sampler)
            g, _, G, yh = mc_ef(sizes, act, lik, Rinv, Rc, jitter, prior.mean, None, x, target, thetas,
                                store=True, want_yhat=yhat is None, given=True)
            mc_calls[0] += 1
            if yhat is None:
                yhat = yh
            mean, ups, W = step(cur, prior, g, G.T / np.sqrt(M), coef, filt.lr)
            cur = DLR._trusted(mean=mean, ups=ups, W=W)
    return cur, yhat


def _dlr_bong_arrays(cur, prior, g, U, coef, alpha):
    return _kb().dlr_bong(prior.mean, prior.ups, prior.W, U, g, coef=coef, alpha=alpha)


def _dlr_blr_arrays(cur, prior, g, U, coef, alpha):
    return _kb().dlr_blr(cur.mean, cur.ups, cur.W, prior.mean, prior.ups, prior.W, U, g, coef=coef, alpha=alpha)


def _dlr_bog_arrays(cur, prior, g, U, coef, alpha):
    return _kb().dlr_bog(prior.mean, prior.ups, prior.W, U, g, alpha)


def _dlr_bbb_arrays(cur, prior, g, U, coef, alpha):
    return _kb().dlr_bbb(cur.mean, cur.ups, cur.W, prior.mean, prior.ups, prior.W, U, g, alpha)


_DLR_ARRAY_STEPS = {"bong": _dlr_bong_arrays, "blr": _dlr_blr_arrays, "bog": _dlr_bog_arrays, "bbb": _dlr_bbb_arrays}


def fused_step(filt, bel, x, y, predict=False, rng=None):
    """(posterior, yhat (C,) at the predicted mean) of one observation on the compiled MLP path of
    ``filt`` (a Bong whose ``_fused_spec`` is set by :func:`fused_spec`), after the predict step when
    ``predict``; None for an observation with missing components (the general route handles them).

    Diagonal families: one compiled call for the predict and all ``n_iter`` inner iterations
    (kernels.cpu.bong_mlp.mlp_diag_bong_step; BONG with LIN-HESS over "diag-natural" is the VD-EKF
    step, kernels.cpu.mlp_diag). DLR: BONG with LIN-HESS is one LO-FI call (kernels.cpu.step) where
    its one-Gram route is accurate; otherwise each inner iteration is the estimate from the per-unit
    structure (kernels.cpu.bong_mlp.mlp_lin_factor: no Jacobian) and a compiled DLR inner step
    (kernels.cpu.bong), after the compiled DLR predict; BLR and BBB with LIN-HESS fold U's columns
    into per-unit sums instead of forming them (kernels.cpu.blr_mlp, kernels.cpu.bbb_mlp) wherever
    that route applies. MC-EF over the diagonal and DLR families: :func:`_mc_ef_step`; MC-HESS over the
    diagonal families: :func:`_mc_hess_step` (``rng``: the Generator the reference would draw from,
    consumed as it does; checked here, before any work). Same numbers as the reference to
    round-off (Monte Carlo estimators: for the same draws).
    """
    from ..base import has_missing

    spec = filt._fused_spec
    if spec is None or has_missing(y):
        return None
    x = filt.model.validate_x(x)
    target = filt.likelihood.encode(y, filt.model.out_dim)
    fam, alg, est = filt._family, filt.algorithm, filt.estimator
    gamma, q = (filt.gamma, filt._q_eff) if predict else (1.0, 0.0)
    pending = predict  # whether the predict step is still to be done
    if predict and filt._b is not None:  # OU dynamics: the predict with its mean offset first
        bel = filt._predict(bel)
        gamma, q, pending = 1.0, 0.0, False
    if est in MC_ESTIMATORS or est == "mc-hess":
        if not isinstance(rng, np.random.Generator):  # before any work, in the reference's words
            raise TypeError("rng must be a numpy.random.Generator for Monte Carlo estimators; "
                            f"got {type(rng).__name__}")
        step = _mc_ef_step if est in MC_ESTIMATORS else _mc_hess_step
        return step(filt, spec, bel, x, target, pending, rng)
    if fam in ("diag-natural", "diag"):
        if (fam, alg, est) == ("diag-natural", "bong", "lin-hess"):
            return fused_diag_natural_bong_lin_hess(spec, bel, x, target, gamma, q, filt.vdekf_mean)
        mean, var, yhat = _cpu().bong_mlp.mlp_diag_bong_step(
            *spec, bel.mean, bel.var, x, target, fam, alg, est, alpha=filt.lr, n_iter=filt.n_iter, gamma=gamma,
            q=q, full_gain_mean=filt.vdekf_mean)
        return Diag._trusted(mean=mean, var=var), yhat
    if (alg, est) == ("bong", "lin-hess"):
        out = fused_dlr_bong_lin_hess(spec, bel, x, target, gamma, q)
        if out is not None:
            return out
    prior = _dlr_prior(filt, bel, pending)
    estimate = _cpu().bong_mlp.mlp_lin_factor
    step = _DLR_ARRAY_STEPS[alg]
    # BLR and BBB with LIN-HESS: each iteration from the per-unit structure of U (kernels.cpu.blr_mlp,
    # kernels.cpu.bbb_mlp); where that route does not apply (it returns None) the iteration below runs instead
    by_units = None
    if est == "lin-hess" and alg in ("blr", "bbb"):
        by_units = (_cpu().blr_mlp.mlp_blr_lin_hess_iteration if alg == "blr"
                    else _cpu().bbb_mlp.mlp_bbb_lin_hess_iteration)
    cur = prior
    yhat = None
    for k in range(filt.n_iter):
        with inner_iteration(k, filt.n_iter):
            out = None if by_units is None else by_units(*spec, cur.mean, cur.ups, cur.W, prior.mean, prior.ups,
                                                         prior.W, x, target, filt.lr)
            if out is not None:
                mean, ups, W, yh = out
                yhat = yh if yhat is None else yhat
                cur = DLR._trusted(mean=mean, ups=ups, W=W)
                continue
            g, U, coef, yh = estimate(*spec, cur.mean, x, target, est)
            if yhat is None:
                yhat = yh
            mean, ups, W = step(cur, prior, g, U, coef, filt.lr)
            cur = DLR._trusted(mean=mean, ups=ups, W=W)
    return cur, yhat
