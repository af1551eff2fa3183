"""Per-step cost of the full-covariance filters next to one copy of the P x P covariance.

``full_cov_timings(quick)`` times one ``predict_update`` (predict, Jacobian, update) of
FullEKF (covariance and Joseph forms) and of BONG / BOG over the full families
("full" = natural parameters, stored as a covariance; "full-moment" = moment
parameters; internal names "full-natural" and "full") with LIN-HESS and LIN-EF, on
tanh MLPs 8-32-32-2 (P = 1,410) and 8-48-48-2 (P = 2,882) with a Gaussian likelihood
(C = 2), under one BLAS thread. Each row also holds the time of one ``np.copy`` of
the P x P covariance in the same run, and the ratio step / copy (target <= 4, for the
one-thread rows: the copy runs on one thread). The compiled step is timed twice: on one
numba thread (the target's row) and on the thread policy's count (docs/threads.md; the full
families weigh a step by P^2, and the update pass runs on the kernel threads from
``kernels.cpu.cholupdate.COPY_FIRST_P`` on).

Each filter first runs ``SETTLE`` steps on a fixed stream, and the step is timed from the
belief they leave: a running filter's covariance, not the diagonal prior. The difference
matters for BOG over "full-moment": its definiteness certificate (bong.algorithms._certify_bog)
is Gershgorin's bound of the new covariance, taken in the pass that writes it, while the
covariance is diagonally dominant, as the prior is; once it is not, one O(P^3) factorisation
starts a bound carried from step to step, each step certified by one O(K P^2) triangular solve
with its factor and every 32 rows of downdates flushed into a new factor (docs/bong.md §7). On
this stream, after ``SETTLE`` steps, LIN-HESS still certifies by Gershgorin and LIN-EF by the
carried bound (4 and 5 rows of it at the two sizes: the timed step does not flush).

What a step costs (refbayes.filters.ekf.predict_update, bong.algorithms.full_one_step): the
predict step is folded into the update, Sigma_p U comes from one triangle of the stored
covariance (linalg.sym_matmul: the reference's K BLAS symv calls are K half-reads, the numba
backend's compiled product one; BOG over "full" needs a second Krylov product, Sigma_p^2 U,
for its Woodbury form), and the one new P x P array is written
by linalg.lowrank_update (a scaled pass and an in-place gemm). Only C x C (or (K+2) x (K+2))
matrices are factorised, except in BOG "full-moment" (above).
The copy is timed in turns with the steps (each round: the reference's step, the compiled step
on one thread, then on the policy's threads, the copy) and back to back, with the covariance warm in cache, and its best time is the yardstick; at
P = 1,410 both fit the 32 MB L3 of the reference machine, at P = 2,882 neither does, and
the copy then pays for the new array's first-touch page faults as the step does.
"""

import time

import numpy as np

import refbayes as rb
from refbayes.threads import plan

__all__ = ["full_cov_timings", "SIZES"]

SIZES = ((8, 32, 32, 2), (8, 48, 48, 2))  # P = 1,410 and 2,882
PRIOR_VAR, OBS_VAR = 1e-3, 1.0  # small enough that the moment-family steps stay positive definite
SETTLE = 8  # steps run before the timed one


def _best(fn, reps):
    best = np.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _filters(model, lik, backend):
    yield "FullEKF covariance", rb.FullEKF(model, lik, gamma=0.999, q=1e-6, form="covariance", backend=backend)
    yield "FullEKF joseph", rb.FullEKF(model, lik, gamma=0.999, q=1e-6, form="joseph", backend=backend)
    for algorithm in ("bong", "bog"):
        for family in ("full", "full-moment"):
            for estimator in ("lin-hess", "lin-ef"):
                kw = {"lr": 3e-6} if algorithm == "bog" else {}
                f = rb.Bong(model, lik, algorithm=algorithm, family=family, estimator=estimator,
                            gamma=0.999, q=1e-6, backend=backend, **kw)
                yield f"{algorithm.upper()} {family} {estimator.upper()}", f


def full_cov_timings(quick=True):
    """Rows (filter, backend, P, step ms, copy ms, ratio) for the full-covariance steps, each filter
    with backend "numpy" (the reference) and "numba" (its compiled update pass) on one numba thread,
    and backend "numba" on the thread policy's count (docs/threads.md), labelled
    "numba, N threads": its update pass runs on the kernel threads from P = ``COPY_FIRST_P`` on.

    quick: fewer repetitions (best of 5 instead of 9). One BLAS thread (threadpoolctl).
    Times are the best of the repetitions, each a fresh step from the same belief, the one that
    ``SETTLE`` steps of the reference on a fixed stream leave; the two backends' steps and the
    copy are timed in turns (numpy step, numba step, copy; then again), so that a change in the
    machine's speed meets all three, and the copy also ``reps`` times back to back (source and
    destination then stay in cache at P = 1,410): its time is the best of both, the strictest
    yardstick the run has.
    """
    from threadpoolctl import threadpool_limits

    reps = 5 if quick else 9
    rows = []
    before = rb.get_threads()
    with threadpool_limits(limits=1, user_api="blas"):
        for sizes in SIZES:
            model = rb.MLP(list(sizes), activation="tanh")
            lik = rb.Gaussian(OBS_VAR)
            rng = np.random.default_rng(0)
            xs, ys = rng.standard_normal((SETTLE + 1, sizes[0])), rng.standard_normal((SETTLE + 1, sizes[-1]))
            x, y = xs[-1], ys[-1]
            theta0 = model.init_params(rng)
            for (name, ref), (_, fast) in zip(_filters(model, lik, "numpy"), _filters(model, lik, "numba")):
                bel = ref.init(theta0, PRIOR_VAR)
                P = bel.n_params
                for t in range(SETTLE):  # raises if a moment-family step loses definiteness
                    bel = ref.predict_update(bel, xs[t], ys[t])
                fast.predict_update(bel, x, y)  # compiled once before the timing
                cov = bel.cov
                # (numba threads for the timing: 1, or None for the policy's count)
                timed = {"numpy": (1, lambda: ref.predict_update(bel, x, y)),
                         "numba": (1, lambda: fast.predict_update(bel, x, y)),
                         "threads": (None, lambda: fast.predict_update(bel, x, y)), "copy": (1, lambda: np.copy(cov))}
                best = dict.fromkeys(timed, np.inf)
                try:
                    for _ in range(reps):
                        for key, (nt, fn) in timed.items():
                            rb.set_threads(numba=nt, blas=1)
                            best[key] = min(best[key], _best(fn, 1))
                    rb.set_threads(numba=None, blas=1)
                    n_threads = plan(fast._thread_size(), "numba")[0]  # the count of the "threads" timings
                finally:
                    rb.set_threads(numba=before["numba"], blas=before["blas"])
                copy = min(best["copy"], _best(timed["copy"][1], reps))  # and back to back: the faster of both
                for backend, key in (("numpy", "numpy"), ("numba", "numba"), (f"numba, {n_threads} thread{'s' if n_threads > 1 else ''}", "threads")):
                    rows.append((name, backend, P, 1e3 * best[key], 1e3 * copy, best[key] / copy))
    return rows


if __name__ == "__main__":
    import sys

    for row in full_cov_timings(quick="--full" not in sys.argv):
        print(f"{row[0]:26s} {row[1]:5s} P={row[2]:5d}  step {row[3]:8.2f} ms  copy {row[4]:6.2f} ms  ratio {row[5]:5.1f}")
