"""``refbayes warmup``: compile (and cache) the numba kernels ahead of first use (docs/threads.md).

The kernels are compiled by running a few steps of every filter that has a ``backend="numba"``
path, on tiny problems that take the same compiled code paths as real ones: each filter on an MLP
(the fused one-call steps), on an ``rb.Linear`` with and without biases, and on an ``rb.Function``
(the generic kernels fed by a dense Jacobian), with ``predict_update``, ``predict`` then
``update``, and ``scan``. numba keys a compiled function on its argument types, not on sizes, so
what the warmup compiles is what a real filter loads.

The work is split into groups (``GROUPS``); ``--jobs N`` compiles them in N processes at once,
since one process compiles one function at a time. The compiled code goes to the kernel cache
(``refbayes.kernels.cpu.kernel_cache_dir``), which every later process reads.
"""

import os
import sys

import numpy as np

__all__ = ["add_arguments", "run", "GROUPS", "warm"]

#: group -> what it compiles; the BONG groups cover every (algorithm, family, estimator) with a
#: compiled step over "diag", "diag-moment" and "dlr" (docs/bong.md §6)
GROUPS = {
    "lofi": "LoFi (fused MLP and rb.Linear steps, float64 and float32, and the generic DLR kernels)",
    "fdekf": "FDEKF (fused, float64 and float32, and generic)",
    "vdekf": "VDEKF (fused, float64 and float32, and generic)",
    "bong": "Bong, algorithm BONG, over the diagonal and DLR families",
    "blr": "Bong, algorithm BLR, over the diagonal and DLR families",
    "bog": "Bong, algorithm BOG, over the diagonal and DLR families (and its full-moment certificate)",
    "bbb": "Bong, algorithm BBB, over the diagonal and DLR families",
    "full": "FullEKF and Bong (BONG, BOG) over the full families with backend='numba' (the compiled update pass)",
}


def add_arguments(parser, name):
    """Options of ``refbayes warmup``."""
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="compile in N processes at once (default: the number of cores, at most 4)")
    parser.add_argument("--only", default=None, metavar="GROUPS",
                        help="comma-separated groups to compile, in this order (default: all): " + ", ".join(GROUPS))


def _problems(rng):
    """(model, likelihood, X (3, in), Y (3, out)) on which the filters run: an MLP with a Gaussian and
    one with a categorical likelihood, rb.Linear with and without biases, and an rb.Function."""
    import autograd.numpy as anp

    import refbayes as rb

    mlp = rb.MLP([3, 4, 2])
    X = rng.normal(size=(3, 3))
    Yg = rng.normal(size=(3, 2))
    Yc = rng.integers(0, 2, size=(3, 1)).astype(float)
    out = [(mlp, rb.Gaussian(1.0), X, Yg), (mlp, rb.Categorical(2), X, Yc)]
    for bias in (True, False):
        lin = rb.Linear(3, 2, bias=bias)
        out.append((lin, rb.Gaussian(1.0), X, Yg))
    fn = rb.Function(lambda th, x: anp.tanh(anp.reshape(th, (2, 3)) @ x), n_params=6, out_dim=2, in_dim=3)
    out.append((fn, rb.Gaussian(1.0), X, Yg))
    return out


# the DLR predict of a generic model goes over chunks from P = 65,536 on (kernels/cpu/dlr.py): one
# linear rb.Function that large compiles that path too
LARGE_P = 70_000


def _large_problem(rng):
    """A linear rb.Function with P = LARGE_P, for LO-FI's chunked DLR predict."""
    import autograd.numpy as anp

    import refbayes as rb

    n = LARGE_P // 2
    fn = rb.Function(lambda th, x: anp.reshape(th, (2, n)) @ x, n_params=LARGE_P, out_dim=2, in_dim=n)
    return fn, rb.Gaussian(1.0), rng.normal(size=(3, n)) / np.sqrt(n), rng.normal(size=(3, 2))


def _run_filter(filt, model, X, Y, rng):
    """predict_update, predict then update, and scan: every entry point that may call a kernel."""
    estimator = str(getattr(filt, "estimator", ""))
    kw = {"rng": rng} if estimator.startswith("mc-") else {}
    bel = filt.init(0.1 * rng.normal(size=model.n_params), prior_var=0.01)
    bel = filt.predict_update(bel, X[0], Y[0], **kw)
    if estimator == "mc-hess":  # one step: the other entry points call the same kernels
        return
    bel = filt.update(filt.predict(bel), X[1], Y[1], **kw)
    filt.scan(bel, X, Y, **kw)


def _kernel_calls(group, rng):
    """The kernel entry points whose routes a few filter steps may not reach: every route of the LO-FI
    update ("gram", "cholqr2", "tsqr", with a definite and a semi-definite R), the DLR solve, inner
    matrix and sampler, the FD/VD-EKF updates with both R kinds and every VD mean rule, and the two
    kernels of BOG's full-moment certificate."""
    from refbayes.kernels import cpu

    # (writable arrays: the wrappers pass every array input on read-only, as a belief's, _host.as_f64)
    P, L, C = 40, 3, 2
    mean, var, W = rng.normal(size=P), np.full(P, 2.0), rng.normal(size=(P, L))
    H, R, e = rng.normal(size=(C, P)), np.eye(C), rng.normal(size=C)
    if group == "lofi":
        for singular in (False, True):
            for method in ("gram", "cholqr2", "tsqr"):
                cpu.lofi_update(mean, var, W, H, R, e, L, singular=singular, method=method)
        cpu.dlr_inner(var, W)
        cpu.dlr_solve(var, W, H.T)
        cpu.dlr_solve(var, W, e.repeat(P // C))
        cpu.dlr_sample(mean, var, W, rng, 2)
        cpu.rowsumsq(W)
    elif group == "fdekf":
        for singular in (False, True):
            cpu.fd_update(mean, var, H, R, e, singular=singular)
    elif group == "vdekf":
        for singular in (False, True):
            for rule in cpu.VD_MEAN_RULES:
                cpu.vd_update(mean, var, H, R, e, mean_rule=rule, singular=singular)
    elif group in ("bog", "full"):
        # BOG over "full-moment" (NumPy steps, compiled certificate): the update pass that returns the
        # Gershgorin bound (a belief's read-only covariance), and the carried bound's solve and flush
        from refbayes.beliefs import FullCov
        from refbayes.filters.bong.families import full_cov_downdate_bound
        from refbayes.kernels.cpu.cholupdate import COPY_FIRST_P, chol_downdate, upper_solve_rows

        # the update passes at P and at COPY_FIRST_P: from there on they run block by block on the
        # kernel threads, whose entry points (called from Python) compile on their own
        Pc = COPY_FIRST_P
        Hc = np.tile(H, (1, Pc // P + 1))[:, :Pc]
        for n, Hn in ((P, H), (Pc, Hc)):
            full_cov_downdate_bound(FullCov(np.zeros(n), np.eye(n)), 0.1 * Hn)
        chol_downdate(np.eye(P), 1.0, 0.1 * H, np.empty((P, P)), 1e-8)
        upper_solve_rows(np.eye(P), 0.1 * H, np.empty_like(H))
        if group == "full":
            # the product and the update pass of backend="numba" over the full families (their
            # wrappers pass read-only arrays, so one call each compiles what every filter calls)
            from refbayes.linalg import lowrank_update, sym_matmul

            sym_matmul(np.eye(P), H.T, compiled=True)
            for n, Hn in ((P, H), (Pc, Hc)):
                lowrank_update(np.eye(n), 0.1 * Hn, scale=0.9, diag=np.full(n, 2.0), plus=0.1 * Hn, compiled=True)


def _filters(group, model, lik, first=True):
    """The filters of ``group`` for one problem. MC-HESS only on the ``first`` problem: its compiled
    estimate (``kernels.cpu.hutchinson``, Hutchinson's diagonal over the diagonal families) compiles
    once for every MLP and likelihood, and its inner steps are the other estimators' kernels with a
    diagonal curvature."""
    import refbayes as rb
    from refbayes.filters.bong.compiled import KERNEL_FAMILIES
    from refbayes.filters.bong.names import COMBINATIONS, internal_family

    # float32 beliefs have compiled code of their own in the one-call steps of MLPs and rb.Linear
    # (their other routes run the float64 kernels)
    dtypes = (np.float64, np.float32) if isinstance(model, (rb.MLP, rb.Linear)) else (np.float64,)
    if group == "lofi":
        return [rb.LoFi(model, lik, rank=2, gamma=0.99, q=1e-4, backend="numba", dtype=dt) for dt in dtypes]
    if group in ("fdekf", "vdekf"):
        cls = rb.FDEKF if group == "fdekf" else rb.VDEKF
        return [cls(model, lik, gamma=0.99, q=1e-4, backend="numba", dtype=dt) for dt in dtypes]
    if group == "full":  # the NumPy steps with the compiled update pass (and an MLP's compiled Jacobian)
        return ([rb.FullEKF(model, lik, gamma=0.99, q=1e-4, form=form, backend="numba") for form in ("covariance", "joseph")]
                + [rb.Bong(model, lik, algorithm="bong", family="full", estimator=est, gamma=0.99, q=1e-4,
                           backend="numba") for est in ("lin-hess", "lin-ef")])
    out = []
    for algorithm, family, estimator in COMBINATIONS:
        if algorithm != group or internal_family(family) not in KERNEL_FAMILIES:
            continue
        if estimator == "mc-hess" and not first:
            continue
        kw = dict(algorithm=algorithm, family=family, estimator=estimator, gamma=0.99, q=1e-4, backend="numba")
        if family == "dlr":
            kw["rank"] = 2
        if estimator.startswith("mc-"):
            kw["n_samples"] = 1 if estimator == "mc-hess" else 3
        if algorithm != "bong":  # steps small enough for any of these to keep its variances positive
            kw["lr"] = 1e-5 if family.endswith("-moment") else 1e-2
        if algorithm in ("blr", "bbb"):
            kw["n_iter"] = 2
        out.append(rb.Bong(model, lik, **kw))
    return out


def warm(groups, quiet=True):
    """Compile the kernels of ``groups`` (names of GROUPS) in this process, in order; prints one line per
    group unless quiet."""
    import time

    for group in groups:
        if group not in GROUPS:
            raise ValueError(f"unknown warmup group {group!r}; choose from {', '.join(GROUPS)}")
    rng = np.random.default_rng(0)
    problems = _problems(rng)
    for group in groups:
        t0 = time.perf_counter()
        _kernel_calls(group, rng)
        for i, (model, lik, X, Y) in enumerate(problems + ([_large_problem(rng)] if group == "lofi" else [])):
            for filt in _filters(group, model, lik, first=i == 0):
                _run_filter(filt, model, X, Y, rng)
        if not quiet:  # one write per line (text and newline together), so that lines of parallel jobs
            # sharing one pipe never interleave, buffered or not (PYTHONUNBUFFERED writes each part at once)
            sys.stdout.write(f"refbayes warmup: {group} kernels ready ({time.perf_counter() - t0:.1f} s)\n")
            sys.stdout.flush()


def _split(groups, jobs):
    """groups dealt round-robin to ``jobs`` lists (the largest groups, BONG's, spread across them)."""
    lists = [[] for _ in range(min(jobs, len(groups)))]
    for i, g in enumerate(groups):
        lists[i % len(lists)].append(g)
    return lists


def run(args):
    """Compile the kernels of the chosen groups, in ``--jobs`` processes."""
    import subprocess

    from refbayes.errors import UsageError

    groups = list(GROUPS) if args.only is None else [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        raise UsageError(f"--only takes groups among {', '.join(GROUPS)}; got {args.only!r}")
    jobs = args.jobs if args.jobs is not None else max(1, min(4, os.cpu_count() or 1))
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1; got {jobs}")
    lists = _split(groups, jobs)
    if len(lists) == 1:
        warm(lists[0], quiet=args.quiet)
        return 0
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; from refbayes.cli import main; sys.exit(main(sys.argv[1:]))",
                               "warmup", "--jobs", "1", "--only", ",".join(part)] + (["--quiet"] if args.quiet else []))
             for part in lists]
    codes = [p.wait() for p in procs]
    # the first failure (a process killed by a signal has a negative code, which max() would hide)
    return next((c for c in codes if c != 0), 0)
