"""Step times of BONG's compiled grid (docs/bong.md §6) for ``refbayes bench``.

For each network (tanh MLP, Categorical likelihood with 10 classes) and each (algorithm, family,
estimator) of ``refbayes.filters.bong.compiled.fused_combinations()`` and ``.mc_combinations()``
(MC-EF over the diagonal and DLR families, ``n_samples`` draws), the time of one ``predict_update`` with
backend "numba" next to the NumPy reference and next to the compiled BONG LIN-HESS step of the
same family (the VD-EKF step for "diag", the LO-FI step for "dlr"); MC-EF rows also give the
ratio to the same algorithm's compiled LIN-EF step. On the smaller network only, the rows of
``.mc_hess_combinations()`` (MC-HESS over the diagonal families, Hutchinson's diagonal with
``MC_HESS_PROBES`` probes per draw): the reference's Hessian-vector products run through autograd,
about a second per step there. BLR and BBB run ``n_iter`` inner iterations; their rows also give the
time per iteration.

Call :func:`bong_grid_rows` with one numba and one BLAS thread for the figures in docs
(``rb.set_threads(numba=1, blas=1)``); it returns plain rows (dicts) and prints nothing.
"""


import numpy as np

__all__ = ["NETWORKS", "bong_grid_rows"]

#: (label, layer sizes): P = 6,310 and 123,610
NETWORKS = (("64-50-50-10", (64, 50, 50, 10)), ("100-300-300-10", (100, 300, 300, 10)))
LR = {"bong": None, "blr": 0.5, "bog": 1e-3, "bbb": 1e-4}
MC_HESS_PROBES = 10  # Rademacher probes per draw of the MC-HESS rows (the filters' default is 100)


def _best_of(fns, min_total, min_reps=3, max_reps=200, rounds=3):
    """{key: (min, median)} wall time of each fn, taken in turns over ``rounds`` windows (bench's timer)."""
    from .bench import _time_rounds

    return _time_rounds(fns, rounds=rounds, min_total=min_total, min_reps=min_reps, max_reps=max_reps)


def bong_grid_rows(quick=False, networks=None, n_iter=10, rank=10, reference=True, seed=0, n_samples=10):
    """Rows {"network", "P", "algorithm", "family", "estimator", "n_iter", "numba_s", "numba_median_s",
    "numpy_s", "ratio_to_numpy", "bong_lin_hess_s", "ratio_to_bong_lin_hess", "per_iteration_s",
    "ratio_to_lin_ef", "bong_same_s"} with times in seconds per ``predict_update`` (minimum over repeats; median too
    for numba; "bong_lin_hess_s": BONG's LIN-HESS step of the same family, timed in the same rounds as
    the row); "ratio_to_lin_ef" (MC-EF rows only, None elsewhere): the time over that of the same
    (algorithm, family) with LIN-EF; "bong_same_s" (BLR and BBB rows; None elsewhere): BONG's step with
    the same family and estimator, timed in the same rounds as the row, for the time per inner iteration.

    networks: labels of NETWORKS to run (default: both; ``quick``: the small one). n_iter: BLR and BBB
    inner iterations. reference: time the NumPy reference too (None in its columns otherwise).
    n_samples: M of the MC-EF rows (each step draws from a Generator seeded with ``seed``).
    """
    import refbayes as rb
    from refbayes.filters.bong import compiled

    nets = [n for n in NETWORKS if networks is None and (not quick or n[0] == NETWORKS[0][0])
            or networks is not None and n[0] in networks]
    rows = []
    for label, sizes in nets:
        rng = np.random.default_rng(seed)
        model = rb.MLP(list(sizes), activation="tanh")
        C = sizes[-1]
        lik = rb.Categorical(C)
        X, Y = rng.standard_normal((4, sizes[0])), rng.integers(0, C, 4)
        theta0 = model.init_params(np.random.default_rng(seed + 1))
        min_total = 0.2 if quick else 0.6

        def make(alg, fam, est, backend):
            kw = dict(algorithm=alg, family=fam, estimator=est, rank=rank, gamma=0.999, q=1e-6, lr=LR[alg],
                      n_iter=n_iter if alg in ("blr", "bbb") else 1, n_samples=n_samples, backend=backend)
            if est == "mc-hess":
                kw["n_probes"] = MC_HESS_PROBES
            filt = rb.Bong(model, lik, **kw)
            opt = {"rng": np.random.default_rng(seed)} if est.startswith("mc") else {}
            bel = filt.init(theta0, prior_var=1e-2)
            for t in range(2):
                bel = filt.predict_update(bel, X[t], Y[t], **opt)
            return lambda f=filt, b=bel: f.predict_update(b, X[3], Y[3], **opt)

        # the BONG LIN-HESS step of each family is timed again beside every row, in the same rounds as
        # the row's own steps, so that both see the same machine and the same cache (the NumPy
        # reference's calls in between evict the belief's arrays)
        base_fns = {fam: make("bong", fam, "lin-hess", "numba") for fam in ("diag", "diag-moment", "dlr")}
        bong_fns = {}  # BONG with each (family, estimator): timed beside the BLR and BBB rows too
        combos = compiled.fused_combinations() + compiled.mc_combinations()
        if label == NETWORKS[0][0]:
            combos = combos + compiled.mc_hess_combinations()
        for alg, fam, est in combos:
            fns = {"numba": make(alg, fam, est, "numba"), "base": base_fns[fam]}
            if alg == "bong":
                bong_fns[(fam, est)] = fns["numba"]
            elif alg in ("blr", "bbb") and (fam, est) in bong_fns:
                fns["bong"] = bong_fns[(fam, est)]
            big_ref = model.n_params > 10**5 and alg in ("blr", "bbb")
            if reference and not (quick and big_ref):
                fns["numpy"] = make(alg, fam, est, "numpy")
            # the reference's MC-HESS step takes about a second (autograd's Hessian-vector products)
            res = _best_of(fns, min_total, min_reps=1 if est == "mc-hess" else 2 if big_ref else 3)
            k = n_iter if alg in ("blr", "bbb") else 1
            t = res["numba"][0]
            ref = res.get("numpy", (None,))[0]
            base = res["base"][0]
            rows.append({
                "network": label, "P": model.n_params, "algorithm": alg, "family": fam, "estimator": est,
                "n_iter": k, "numba_s": t, "numba_median_s": res["numba"][1], "numpy_s": ref,
                "ratio_to_numpy": None if ref is None else ref / t,
                "bong_lin_hess_s": base, "ratio_to_bong_lin_hess": t / base,
                "per_iteration_s": t / k, "ratio_to_lin_ef": None,
                "bong_same_s": res["bong"][0] if "bong" in res else None,
            })
        lin_ef = {(r["algorithm"], r["family"]): r["numba_s"] for r in rows
                  if r["network"] == label and r["estimator"] == "lin-ef"}
        for r in rows:
            if r["network"] == label and r["estimator"] == "mc-ef":
                r["ratio_to_lin_ef"] = r["numba_s"] / lin_ef[(r["algorithm"], r["family"])]
    return rows


def format_rows(rows):
    """The rows as text lines (ms), for a report or a terminal."""
    out = [f"{'network':>15} {'algorithm':>5} {'family':>11} {'estimator':>8} {'numba ms':>9} {'numpy ms':>9} "
           f"{'x numpy':>8} {'/ BONG lin-hess':>15} {'ms / iter':>9} {'/ lin-ef':>8}"]
    for r in rows:
        ref = "" if r["numpy_s"] is None else f"{1e3 * r['numpy_s']:.3f}"
        ratio = "" if r["ratio_to_numpy"] is None else f"{r['ratio_to_numpy']:.1f}"
        out.append(f"{r['network']:>15} {r['algorithm']:>5} {r['family']:>11} {r['estimator']:>8} "
                   f"{1e3 * r['numba_s']:9.3f} {ref:>9} {ratio:>8} {r['ratio_to_bong_lin_hess']:15.2f} "
                   f"{1e3 * r['per_iteration_s']:9.3f} "
                   + ("" if r.get("ratio_to_lin_ef") is None else f"{r['ratio_to_lin_ef']:8.2f}"))
    return out
