"""Jones, Chang & Murphy (2024), BONG, on offline data.

The reproducible subset of the paper's experiments (section 5 and App. B)
that needs no download and runs on a CPU:

B1 digits (stand-in for the MNIST CNN of figs 1, 3, 5 and 7): MLP 64-16-10,
   DLR rank 10; BONG, BLR, BOG and BBB x MC-EF, LIN-HESS and LIN-EF. Test NLL
   and error of the plugin predictive along the stream; plugin, Lin-MC and MC
   predictives and the expected calibration error (20 bins) at the end;
   seconds per step.
B2 the same streams, BONG over the variational families (figs 2 and 6):
   diagonal (natural and moment parameters), DLR-1, DLR-10 and full covariance.
B3 teacher-student regression (stand-in for SARCOS, App. B.3, figs 9-13):
   MLP 10-20-20-1, Gaussian likelihood with R = 0.1 Var(y), DLR-10, the paper's
   learning-rate grid, I = 1 and I = 10 inner iterations.
B4 seconds per step against the number of parameters P on the same
   regression, full covariance and DLR-10 (App. B.1, fig. 4).
B5 MC-HESS against MC-EF and LIN-HESS for BONG with full covariance on a
   small regression network, a few prior variances (the remark of section 5
   that MC-HESS "works very poorly").

Scaled down from the paper: M = 10 Monte Carlo draws (paper 100; the
regression also runs BONG with M = 100 in full mode), I = 3 inner iterations
for BLR and BBB on digits (paper 10), 1-2 trials (paper 3-5), streams of
150-800 examples (paper 2000).

Hyper-parameters come from small fixed grids chosen on data that the reported
numbers never see. Digits: the prior variance sigma0^2 (all methods) and the
learning rate alpha (BLR, BOG, BBB) are picked per algorithm with LIN-HESS on a
tuning stream and a fixed validation set disjoint from every test set; the
objective is the authors' code's (validation plugin NLL averaged over the states
after the first and second half of the tuning stream; the text says mid-way or
final); the other estimators and families reuse the algorithm's choice. Regression: sigma0^2 = 1 and alpha from
the paper's grid (5e-3, 1e-2, 5e-2, 1e-1, 5e-1) chosen on validation NLPD at
the middle of the stream, as the paper does for SARCOS. Full mode searches the
digits grid; quick mode uses the fixed values in ``QUICK_HP``, which the same
search picks for the quick configuration (``run(quick=True, tune=True)``
repeats it). Diverged runs (a numerical failure or a non-finite mean) are
recorded, not dropped: they count as worse than any finite result.
"""

import time

import numpy as np  # noqa: E402
from scipy.special import log_softmax, softmax  # noqa: E402

import refbayes as rb  # noqa: E402
from refbayes.filters.bong.names import format_name  # noqa: E402

from ._mpl import pyplot as _pyplot  # noqa: E402
from .common import check, class_metrics, digits, explanation, run_parts, savefig  # noqa: E402

ALGOS = ("bong", "blr", "bog", "bbb")
ESTS = ("mc-ef", "lin-hess", "lin-ef")
EST_LABEL = {"mc-ef": "MC-EF", "lin-hess": "LIN-HESS", "lin-ef": "LIN-EF", "mc-hess": "MC-HESS"}
# digits families (B2); full covariance is compared on the regression net (B3): its update checks
# positive definiteness with a P x P Cholesky every step, too slow for the digits stream here
FAMILIES = {"Diag": ("diag", 0), "Diag-mom": ("diag-moment", 0), "DLR-1": ("dlr", 1), "DLR-10": ("dlr", 10)}
COLORS = {"bong": "C0", "blr": "C1", "bog": "C2", "bbb": "C3"}
STYLES = {"lin-hess": "-", "lin-ef": "--", "mc-ef": ":", "mc-hess": "-."}
RANK = 10

CONFIG = {
    True: {
        "digits": {"sizes": [64, 16, 10], "n_stream": 150, "n_test": 400, "n_val": 300, "every": 25, "seeds": 1,
                   "n_iter": 3, "n_samples": 10, "tune_stream": 200, "pred_samples": 30},
        "reg": {"n_stream": 150, "n_val": 300, "n_test": 300, "every": 15, "seeds": 1, "n_samples": 10,
                "mc_algos": ("bong",), "lrs_i10": (5e-4, 5e-3), "fc": False, "mc_big": None},
        "timing": {"fc_hidden": [5, 20], "dlr_hidden": [10, 100, 1000], "steps": 4, "mc_hess_max_p": 0,
                   "i10_ests": ("lin-hess",)},
        "mc_hess": {"hidden": 5, "n_stream": 100, "n_samples": 10, "seeds": 1, "prior_vars": (1.0, 0.01)},
    },
    False: {
        "digits": {"sizes": [64, 16, 10], "n_stream": 800, "n_test": 500, "n_val": 300, "every": 50, "seeds": 2,
                   "n_iter": 3, "n_samples": 10, "tune_stream": 300, "pred_samples": 100},
        "reg": {"n_stream": 300, "n_val": 500, "n_test": 500, "every": 20, "seeds": 2, "n_samples": 10,
                "mc_algos": ALGOS, "lrs_i10": (5e-4, 5e-3, 5e-2, 5e-1), "fc": True, "mc_big": 100},
        "timing": {"fc_hidden": [5, 20, 40, 60], "dlr_hidden": [10, 100, 1000, 5000], "steps": 4,
                   "mc_hess_max_p": 250, "i10_ests": ("lin-hess", "mc-ef")},
        "mc_hess": {"hidden": 5, "n_stream": 150, "n_samples": 10, "seeds": 1, "prior_vars": (1.0, 0.1, 0.01)},
    },
}

GRIDS = {
    "digits": {"prior_var": (0.1, 0.3, 1.0), "lr": (0.03, 0.1, 0.3, 1.0)},
    # the paper's SARCOS grid plus two smaller values: our targets are standardised (SARCOS torques are
    # only centred), so plain-gradient steps are about 1 / R = 10 times larger here
    "reg": {"prior_var": 1.0, "lr": (5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 1e-1, 5e-1), "obs_frac": 0.1},
}

# What the digits grid search picks for the quick configuration (from run(quick=True, tune=True)).
QUICK_HP = {
    "bong": {"prior_var": 0.3},
    "blr": {"prior_var": 1.0, "lr": 0.3},
    "bog": {"prior_var": 0.1, "lr": 0.1},
    "bbb": {"prior_var": 1.0, "lr": 0.3},
}

# Where the paper's text (Jones, Chang & Murphy 2024) and its authors' code (petergchang/bong, which the paper
# names) differ or say nothing, and which one these runs follow. "unknown": what the code does is not known here.
DEFAULTS = [
    {"setting": "prior variance sigma0^2 and learning rate alpha (classification)",
     "text": "Bayesian optimisation on validation NLL, mid-way or final (section 5)",
     "code": "optuna, 30 trials, log-uniform in [1e-5, 1]; plugin validation NLL averaged over the states after the "
             "first and the second half of the stream",
     "follows": "code's objective on a fixed grid (sigma0^2 0.1-1, alpha 0.03-1), per algorithm with LIN-HESS; the "
                "other estimators and families reuse the choice"},
    {"setting": "sigma0^2 and alpha (regression)",
     "text": "sigma0^2 = 1; alpha by grid search 5e-3 ... 5e-1 on plugin NLPD (App. B.3)",
     "code": "unknown",
     "follows": "text, with 5e-4 and 1e-3 added to the grid (the targets here are standardised)"},
    {"setting": "observation variance (regression)",
     "text": "R = 0.1 Var(y) over the training sequence (App. B.3)",
     "code": "unknown",
     "follows": "text"},
    {"setting": "Monte Carlo draws M (MC-EF, MC-HESS)",
     "text": "M = 100 (section 5)",
     "code": "unknown",
     "follows": "neither: M = 10 (the library default); BONG MC-EF on the regression also with M = 100 in full mode"},
    {"setting": "inner iterations I (BLR, BBB)",
     "text": "not stated for MNIST; I = 1 and 10 on SARCOS and in the timing (App. B.1, B.3)",
     "code": "I = 10",
     "follows": "neither on digits (I = 3); text on the regression (I = 1 and 10)"},
    {"setting": "diagonal BONG LIN-HESS mean",
     "text": "eq. 214: the gain uses the posterior variances (VD-EKF, App. E.3.2)",
     "code": "the full Kalman gain with the diagonal prior",
     "follows": "text (vd_mean='paper')"},
    {"setting": "MC and Lin-MC predictives (classification)",
     "text": "average the predictive probabilities over S = 100 draws (section 5, footnote 2)",
     "code": "averages the logits over the draws, then the softmax",
     "follows": "text: probabilities averaged (S = 100 in full mode, 30 in quick mode)"},
    {"setting": "singular categorical covariance R",
     "text": "not stated",
     "code": "adds 1e-5 I",
     "follows": "neither: the last class is dropped (rb.Categorical's default), no jitter"},
    {"setting": "classification data and trials",
     "text": "MNIST, 5 trials (section 5)",
     "code": "the loader's default is Fashion-MNIST; 10 trials",
     "follows": "neither: scikit-learn's digits, 2 trials (1 in quick mode)"},
]

# numerical failures only: a ValueError (bad input) must surface, not be recorded as a divergence
_FAILURES = (rb.ConvergenceError, rb.NotPositiveDefiniteError, rb.DivergenceError, np.linalg.LinAlgError, FloatingPointError)


# ---------------------------------------------------------------------------------------------
# helpers


def _filter(model, lik, algo, est, family="dlr", rank=RANK, lr=None, n_iter=1, n_samples=10):
    """A Bong filter; BONG ignores lr, BONG and BOG ignore n_iter (one step)."""
    return rb.Bong(model, lik, algorithm=algo, family=family, estimator=est, rank=rank,
                   lr=None if algo == "bong" else lr, n_iter=n_iter if algo in ("blr", "bbb") else 1,
                   n_samples=n_samples)


def _stream(filt, bel, X, Y, rng, every, evaluate, mid_eval=None, n_metrics=2):
    """Predict + update over (X, Y), timing each step; ``evaluate(bel)`` (n_metrics values) every ``every`` steps.

    Returns a dict: curve (K, 1 + m) rows [t, metrics...] with NaN after a
    divergence, sec (mean seconds per step), belief (None if diverged),
    error (message or None), mid (``mid_eval(bel)`` at T // 2).
    """
    T = len(X)
    ticks = [t for t in range(1, T + 1) if t % every == 0 or t == T]
    curve, times, error, mid = [], [], None, np.nan
    for t in range(T):
        start = time.perf_counter()
        try:
            with np.errstate(all="ignore"):
                new = filt.update(filt.predict(bel), X[t], Y[t], rng=rng)
            if not np.all(np.isfinite(new.mean)):
                raise FloatingPointError("the mean is not finite")
        except _FAILURES as exc:
            error = f"step {t + 1}: {type(exc).__name__}: {str(exc)[:120]}"
            bel = None
            break
        times.append(time.perf_counter() - start)
        bel = new
        if t + 1 in ticks:
            with np.errstate(all="ignore"):
                curve.append([t + 1, *evaluate(bel)])
        if mid_eval is not None and t + 1 == T // 2:
            with np.errstate(all="ignore"):
                mid = mid_eval(bel)
    while len(curve) < len(ticks):
        curve.append([ticks[len(curve)]] + [np.nan] * n_metrics)
    return {"curve": np.array(curve, dtype=float), "sec": float(np.mean(times)) if times else np.nan, "times": times,
            "belief": bel, "error": error, "mid": mid}


def _worse(v):
    """Diverged (NaN) results rank below every finite one."""
    return np.inf if v is None or not np.isfinite(v) else float(v)


def _fmt(v, digits=3):
    return "diverged" if v is None or not np.isfinite(v) else f"{v:.{digits}f}"


def _ece(probs, y, n_bins=20):
    """Expected calibration error of the top-class confidence, equal-width bins on [0, 1]."""
    conf, pred = probs.max(1), probs.argmax(1)
    idx = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        sel = idx == b
        if sel.any():
            total += sel.mean() * abs(np.mean(pred[sel] == y[sel]) - conf[sel].mean())
    return float(total)


def _linmc_probs(model, bel, X, rng, n_samples):
    """Lin-MC predictive (Immer et al. 2021): average softmax(f(x, m) + J (theta_s - m)) over draws."""
    F = model.apply_batch(bel.mean, X)  # (N, K)
    J = np.stack([model.jacobian(bel.mean, x) for x in X])  # (N, K, P)
    D = bel.sample(rng, n_samples) - bel.mean  # (S, P)
    N, K, P = J.shape
    etas = F[:, :, None] + (J.reshape(N * K, P) @ D.T).reshape(N, K, n_samples)
    return softmax(etas, axis=1).mean(2)


def _mc_probs(model, bel, X, rng, n_samples):
    return np.mean([softmax(model.apply_batch(th, X), axis=1) for th in bel.sample(rng, n_samples)], axis=0)


def _final_class_metrics(model, bel, X, y, rng, n_samples):
    """Plugin, Lin-MC and MC predictive: NLL, error and ECE for a classification belief."""
    out = {}
    plug = softmax(model.apply_batch(bel.mean, X), axis=1)
    for name, probs in (("plugin", plug), ("linmc", _linmc_probs(model, bel, X, rng, n_samples)),
                        ("mc", _mc_probs(model, bel, X, rng, n_samples))):
        nll, err = class_metrics(np.log(np.maximum(probs, 1e-300)), y)
        out[name] = {"nll": nll, "err": err, "ece": _ece(probs, y)}
    return out


def _mean_over(runs, key_fn):
    """Mean over trials; NaN if any trial diverged."""
    vals = [key_fn(r) for r in runs]
    return float(np.mean(vals)) if all(np.isfinite(v) for v in vals) else np.nan


def _ms(runs):
    """Mean milliseconds per step over the trials that ran at least one step."""
    vals = [r["sec"] for r in runs if np.isfinite(r["sec"])]
    return 1e3 * float(np.mean(vals)) if vals else np.nan


# ---------------------------------------------------------------------------------------------
# B1 + B2: digits


def _digits_pools(cfg):
    """A fixed validation set (for tuning only) and the pool that the trials split into stream + test."""
    X, y = digits()
    perm = np.random.default_rng([2024, 0]).permutation(len(y))
    val, pool = perm[: cfg["n_val"]], perm[cfg["n_val"]:]
    return X[pool], y[pool], X[val], y[val]


def _digits_trial(Xp, yp, cfg, seed):
    rng = np.random.default_rng([2024, 1, seed])
    perm = rng.permutation(len(yp))
    s, te = perm[: cfg["n_stream"]], perm[cfg["n_stream"]: cfg["n_stream"] + cfg["n_test"]]
    return Xp[s], yp[s], Xp[te], yp[te], rng


def _tune_digits(cfg, Xp, yp, Xv, yv):
    """Grid search per algorithm with LIN-HESS: validation plugin NLL after half and all of the tuning stream."""
    model, lik = rb.MLP(cfg["sizes"], activation="relu"), rb.Categorical(10)
    rng = np.random.default_rng([2024, 2])
    idx = rng.permutation(len(yp))[: cfg["tune_stream"]]
    X, Y = Xp[idx], yp[idx]
    theta0 = model.init_params(rng)
    grids = GRIDS["digits"]

    def val_nll(bel):
        return class_metrics(log_softmax(model.apply_batch(bel.mean, Xv), axis=1), yv)[0]

    chosen, tables = {}, {}
    for algo in ALGOS:
        points = [{"prior_var": v} for v in grids["prior_var"]]
        if algo != "bong":
            points = [{"prior_var": v, "lr": a} for v in grids["prior_var"] for a in grids["lr"]]
        rows = []
        for hp in points:
            filt = _filter(model, lik, algo, "lin-hess", lr=hp.get("lr"), n_iter=cfg["n_iter"])
            res = _stream(filt, filt.init(theta0, hp["prior_var"]), X, Y, None, len(X), lambda b: (val_nll(b),),
                          mid_eval=val_nll, n_metrics=1)
            score = 0.5 * (res["mid"] + res["curve"][-1, 1])
            rows.append({"hp": hp, "score": _worse(score), **({"error": res["error"]} if res["error"] else {})})
        best = min(rows, key=lambda r: r["score"])
        chosen[algo], tables[algo] = dict(best["hp"]), rows
    return chosen, tables


def _digits_runs(cfg, hps, Xp, yp):
    """All B1 and B2 runs over the trials. Returns {label: [per-trial result dicts]}."""
    model, lik = rb.MLP(cfg["sizes"], activation="relu"), rb.Categorical(10)
    methods = [(a, e, "dlr", RANK) for a in ALGOS for e in ESTS]
    for fam, (family, rank) in FAMILIES.items():
        if fam == "DLR-10":
            continue
        for e in ESTS:
            methods.append(("bong", e, family, rank))
    out = {}
    for seed in range(cfg["seeds"]):
        Xs, ys, Xt, yt, rng = _digits_trial(Xp, yp, cfg, seed)
        theta0 = model.init_params(rng)

        def evaluate(bel):
            return class_metrics(log_softmax(model.apply_batch(bel.mean, Xt), axis=1), yt)

        for algo, est, family, rank in methods:
            hp = hps[algo]
            filt = _filter(model, lik, algo, est, family=family, rank=rank, lr=hp.get("lr"),
                           n_iter=cfg["n_iter"], n_samples=cfg["n_samples"])
            run_rng = np.random.default_rng([2024, 3, seed])
            res = _stream(filt, filt.init(theta0, hp["prior_var"]), Xs, ys, run_rng, cfg["every"], evaluate)
            final = None
            if res["belief"] is not None:
                with np.errstate(all="ignore"):
                    final = _final_class_metrics(model, res["belief"], Xt, yt, run_rng, cfg["pred_samples"])
            out.setdefault(filt.name, []).append(
                {"algo": algo, "est": est, "family": family, "rank": rank, "curve": res["curve"],
                 "sec": res["sec"], "error": res["error"], "final": final})
    return out, model.n_params


def _summ(runs):
    """Mean over trials of the curve, the final metrics and the seconds per step."""
    curve = np.mean([r["curve"] for r in runs], axis=0)
    fin = {}
    for pred in ("plugin", "linmc", "mc"):
        fin[pred] = {m: _mean_over(runs, lambda r, p=pred, m=m: r["final"][p][m] if r["final"] else np.nan)
                     for m in ("nll", "err", "ece")}
    return {"algo": runs[0]["algo"], "est": runs[0]["est"], "family": runs[0]["family"], "rank": runs[0]["rank"],
            "curve": curve.tolist(), "final": fin, "ms_per_step": _ms(runs),
            "diverged": [r["error"] for r in runs if r["error"]]}


def digits_experiments(quick, tune, outdir):
    cfg = CONFIG[quick]["digits"]
    Xp, yp, Xv, yv = _digits_pools(cfg)
    tables = None
    if tune:
        hps, tables = _tune_digits(cfg, Xp, yp, Xv, yv)
    else:
        hps = QUICK_HP
    runs, P = _digits_runs(cfg, hps, Xp, yp)
    S = {name: _summ(r) for name, r in runs.items()}

    def key(algo, est, family="dlr", rank=RANK):
        return format_name(algo, family, est, rank=rank if family == "dlr" else None,
                           n_samples=cfg["n_samples"] if est.startswith("mc") else None)

    def nll(algo, est, family="dlr", rank=RANK, pred="plugin"):
        return S[key(algo, est, family, rank)]["final"][pred]["nll"]

    def ms(algo, est, family="dlr", rank=RANK):
        return S[key(algo, est, family, rank)]["ms_per_step"]

    abl = _Ablation(cfg, hps, Xp, yp)
    checks = _digits_checks(S, nll, ms, key, cfg, abl)
    figs = [_plot_digits(S, cfg, P, outdir, "b1_algorithms.png", [key(a, e) for a in ALGOS for e in ESTS],
                         f"B1 digits MLP {cfg['sizes']} (P = {P}), DLR-10: algorithms x estimators"),
            _plot_digits(S, cfg, P, outdir, "b2_families.png",
                         [key("bong", e, f, r) for f, r in FAMILIES.values() for e in ESTS
                          if key("bong", e, f, r) in S],
                         f"B2 digits MLP {cfg['sizes']} (P = {P}), BONG: families x estimators")]
    result = {"P": P, "config": {k: v for k, v in cfg.items()}, "hyper_parameters": hps, "grid": GRIDS["digits"],
              "tuning_table": tables, "methods": S}
    return result, checks, figs


def _digits_checks(S, nll, ms, key, cfg, abl):
    checks = []
    fin = {k: _worse(v["final"]["plugin"]["nll"]) for k, v in S.items()}
    dlr10 = [key(a, e) for a in ALGOS for e in ESTS]
    lbl = {"mc-ef": "MC-EF", "lin-hess": "LIN-HESS", "lin-ef": "LIN-EF"}
    # (i) linearisation helps
    for a in ALGOS:
        mc, lh, le = (_worse(nll(a, e)) for e in ESTS)
        checks.append(check(f"B1 {a.upper()}: LIN-HESS and LIN-EF beat MC-EF (final plugin NLL)",
                            "LIN-HESS, LIN-EF < MC-EF (paper sec. 5, fig. 1)",
                            f"LIN-HESS {_fmt(lh)}, LIN-EF {_fmt(le)}, MC-EF {_fmt(mc)}", lh < mc and le < mc,
                            explain=(lambda: abl.bbb_lr({e: S[key("bbb", e)]["diverged"] for e in ("lin-hess", "lin-ef")}))
                            if a == "bbb" else None))
    # (ii) NGD helps, implicit regularisation helps
    for other, claim in (("bog", "NGD helps: BONG < BOG"), ("blr", "implicit regularisation: BONG < BLR")):
        for e in ESTS:
            b, o = _worse(nll("bong", e)), _worse(nll(other, e))
            checks.append(check(f"B1 {lbl[e]}: BONG beats {other.upper()} (final plugin NLL)",
                                f"{claim} (paper sec. 5, fig. 1)", f"BONG {_fmt(b)}, {other.upper()} {_fmt(o)}", b < o,
                                explain=(lambda e=e: abl.other_trial("blr", "bong", e))
                                if other == "blr" and e in ("lin-hess", "lin-ef") else None))
    b_lh, b_le = _worse(nll("bong", "lin-hess")), _worse(nll("bong", "lin-ef"))
    checks.append(check("B1 BONG: LIN-HESS beats LIN-EF (final plugin NLL)", "LIN-HESS < LIN-EF for BONG (sec. 5)",
                        f"LIN-HESS {_fmt(b_lh)}, LIN-EF {_fmt(b_le)}", b_lh < b_le,
                        explain=lambda: abl.other_trial(("bong", "lin-ef"), ("bong", "lin-hess"), reported=(b_le, b_lh))))
    # (iii) BONG-LIN-HESS best, BBB worst
    best = min(dlr10, key=lambda k: fin[k])
    checks.append(check("B1: BONG-LIN-HESS has the lowest final plugin NLL of the 12 DLR-10 methods",
                        "bong-dlr10-hess_lin best (fig. 1)", f"best: {best} ({_fmt(fin[best])}); "
                        f"BONG-LIN-HESS {_fmt(fin[key('bong', 'lin-hess')])}", best == key("bong", "lin-hess"),
                        explain=lambda: abl.other_trial((S[best]["algo"], S[best]["est"]), ("bong", "lin-hess"))))
    for e in ESTS:
        worst = max(ALGOS, key=lambda a: fin[key(a, e)])
        checks.append(check(f"B1 {lbl[e]}: BBB is the worst algorithm (final plugin NLL)", "BBB generally does poorly",
                            ", ".join(f"{a.upper()} {_fmt(fin[key(a, e)])}" for a in ALGOS), worst == "bbb",
                            explain=(lambda e=e: abl.bog_below_bbb(e)) if worst == "bog" else None))
    # (v) predictives: plugin ~ Lin-MC, both much better than MC
    close, mc_worse = 0, 0
    for k in dlr10:
        f = S[k]["final"]
        p, lm, mc = _worse(f["plugin"]["nll"]), _worse(f["linmc"]["nll"]), _worse(f["mc"]["nll"])
        close += bool(np.isfinite(p) and abs(lm - p) <= 0.15 * p)
        mc_worse += bool(np.isfinite(p) and mc > max(p, lm))
    checks.append(check("B1: plugin NLL ~ Lin-MC NLL (within 15%) for most DLR-10 methods",
                        "plugin ~ Lin-MC (sec. 5, fig. 5)", f"{close}/12 methods", close >= 9,
                        explain=abl.linmc_gap))
    diverged = [(S[k]["algo"], S[k]["est"]) for k in dlr10 if not np.isfinite(_worse(S[k]["final"]["plugin"]["nll"]))]
    checks.append(check("B1: MC predictive NLL worse than plugin and Lin-MC for most DLR-10 methods",
                        "plugin and Lin-MC much better than MC (fig. 5)", f"{mc_worse}/12 methods", mc_worse >= 9,
                        explain=lambda: _first_supported(lambda: abl.mc_worse_with_bbb_lr(mc_worse, diverged),
                                                         abl.mc_worse_by_estimator)))
    ece = {a: _worse(S[key(a, "lin-hess")]["final"]["linmc"]["ece"]) for a in ALGOS}
    checks.append(check("B1 LIN-HESS: BONG has the lowest Lin-MC ECE",
                        "BONG-LIN-HESS-DLR-10 best calibrated (figs 7, 8)",
                        ", ".join(f"{a.upper()} {_fmt(v)}" for a, v in ece.items()), min(ece, key=ece.get) == "bong",
                        explain=abl.ece_other_trial))
    # runtime (fig. 3)
    for e in ESTS:
        one = np.max([ms("bong", e), ms("bog", e)])
        it = np.min([ms("blr", e), ms("bbb", e)])
        checks.append(check(f"B1 {lbl[e]}: one-step methods (BONG, BOG) faster than iterative "
                            f"(BLR, BBB, I = {cfg['n_iter']})", "BONG, BOG faster than BLR, BBB (fig. 3)",
                            ", ".join(f"{a.upper()} {ms(a, e):.1f}" for a in ALGOS) + " ms/step", one < it))
    lin_faster = [a for a in ALGOS if max(ms(a, "lin-hess"), ms(a, "lin-ef")) < ms(a, "mc-ef")]
    checks.append(check(f"B1: LIN-HESS and LIN-EF faster than MC-EF (M = {cfg['n_samples']})",
                        "linearised faster than MC (fig. 3)", f"holds for {len(lin_faster)}/4 algorithms "
                        f"({', '.join(a.upper() for a in lin_faster) or 'none'})", len(lin_faster) == 4))
    checks.append(check("B1 BONG: LIN-EF not slower than LIN-HESS", "EF a bit faster than LIN-HESS (fig. 3)",
                        f"LIN-EF {ms('bong', 'lin-ef'):.2f}, LIN-HESS {ms('bong', 'lin-hess'):.2f} ms/step",
                        ms("bong", "lin-ef") <= ms("bong", "lin-hess"), explain=abl.fastest_step))
    # B2 families
    fam = {f: {e: _worse(nll("bong", e, *FAMILIES[f])) if key("bong", e, *FAMILIES[f]) in S else np.nan
               for e in ESTS} for f in FAMILIES}
    for e in ESTS:
        checks.append(check(f"B2 BONG {lbl[e]}: DLR-10 beats DLR-1", "DLR-10 > DLR-1 (sec. 5, fig. 2)",
                            f"DLR-10 {_fmt(fam['DLR-10'][e])}, DLR-1 {_fmt(fam['DLR-1'][e])}",
                            fam["DLR-10"][e] < fam["DLR-1"][e]))
    for e in ("mc-ef", "lin-hess"):
        d1, dg = fam["DLR-1"][e], fam["Diag"][e]
        checks.append(check(f"B2 BONG {lbl[e]}: DLR-1 similar to Diag (within 10%)", "DLR-1 ~ Diag (fig. 2)",
                            f"DLR-1 {_fmt(d1)}, Diag {_fmt(dg)}", np.isfinite(d1) and abs(d1 - dg) <= 0.1 * dg,
                            explain=lambda e=e: abl.other_trial(("bong", e, "dlr", 1), ("bong", e, "diag", 0),
                                                                margin=0.1)))
    checks.append(check("B2 BONG LIN-EF: DLR-1 worse than Diag", "DLR-1 worse than Diag with LIN-EF (fig. 2)",
                        f"DLR-1 {_fmt(fam['DLR-1']['lin-ef'])}, Diag {_fmt(fam['Diag']['lin-ef'])}",
                        fam["DLR-1"]["lin-ef"] > fam["Diag"]["lin-ef"],
                        explain=abl.dlr1_vs_diag))
    for e in ("mc-ef", "lin-hess"):
        n, m = fam["Diag"][e], fam["Diag-mom"][e]
        checks.append(check(f"B2 BONG {lbl[e]}: Diag natural ~ Diag moment (within 10%)",
                            "comparable (fig. 2)", f"natural {_fmt(n)}, moment {_fmt(m)}",
                            np.isfinite(m) and abs(n - m) <= 0.1 * n,
                            explain=lambda e=e: abl.moment_prior_var(e, abl.hps["bong"]["prior_var"])))
    n, m = fam["Diag"]["lin-ef"], fam["Diag-mom"]["lin-ef"]
    checks.append(check("B2 BONG LIN-EF: Diag moment unstable (diverges or worse than natural)",
                        "moment parameters can be numerically unstable with LIN-EF (sec. 5)",
                        f"natural {_fmt(n)}, moment {_fmt(m)}", m > n))
    t = {f: ms("bong", "lin-hess", *FAMILIES[f]) for f in ("Diag", "DLR-1", "DLR-10")}
    checks.append(check("B2 BONG LIN-HESS: Diag faster than DLR-10", "Diag 1.7-3.2 s vs DLR-10 3.8-13 s (fig. 3)",
                        ", ".join(f"{f} {v:.2f}" for f, v in t.items()) + " ms/step", t["Diag"] < t["DLR-10"]))
    return checks


def _method_name(m, cfg):
    algo, est, family, rank = (tuple(m) + ("dlr", RANK))[:4]
    return format_name(algo, family, est, rank=rank if family == "dlr" else None,
                       n_samples=cfg["n_samples"] if est.startswith("mc") else None)


def _first_supported(*explains):
    """The first supported explanation that the functions give (each called only if none before it gave a
    supported one), else the first one given (unsupported), else None."""
    first = None
    for fn in explains:
        e = fn()
        if e is not None and e["supported"]:
            return e
        first = first or e
    return first


class _Ablation:
    """Runs for the explanations of failing digits checks, on a trial (seed) that the reported numbers do
    not use; each run is done once and cached. A method is (algo, est[, family, rank])."""

    def __init__(self, cfg, hps, Xp, yp):
        self.cfg, self.hps, self.Xp, self.yp, self.cache = cfg, hps, Xp, yp, {}
        self.model, self.lik = rb.MLP(cfg["sizes"], activation="relu"), rb.Categorical(10)
        self.seed = cfg["seeds"]  # the first trial the reported runs did not use

    def final_run(self, method, prior_var=None, seed=None, n_stream=None):
        """One stream of ``method`` on trial ``seed`` (default: the first unused one) over ``n_stream``
        examples (default: the configured length), cached. Returns (final plugin NLL, error message
        or None, belief or None, X_test, y_test)."""
        algo, est, family, rank = (tuple(method) + ("dlr", RANK))[:4]
        seed = self.seed if seed is None else seed
        n_stream = self.cfg["n_stream"] if n_stream is None else n_stream
        k = (algo, est, family, rank, prior_var, seed, n_stream)
        if k not in self.cache:
            Xs, ys, Xt, yt, rng = _digits_trial(self.Xp, self.yp, dict(self.cfg, n_stream=n_stream), seed)
            theta0 = self.model.init_params(rng)
            hp = self.hps[algo]
            filt = _filter(self.model, self.lik, algo, est, family=family, rank=rank, lr=hp.get("lr"),
                           n_iter=self.cfg["n_iter"], n_samples=self.cfg["n_samples"])
            res = _stream(filt, filt.init(theta0, prior_var or hp["prior_var"]), Xs, ys,
                          np.random.default_rng([2024, 3, seed]), len(Xs),
                          lambda b: class_metrics(log_softmax(self.model.apply_batch(b.mean, Xt), axis=1), yt))
            self.cache[k] = (_worse(res["curve"][-1, 1]), res["error"], res["belief"], Xt, yt)
        return self.cache[k]

    def final_nll(self, method, prior_var=None, seed=None, n_stream=None):
        """(final plugin NLL, error message or None) of ``final_run``."""
        return self.final_run(method, prior_var, seed, n_stream)[:2]

    def final_metrics(self, method, seed=None, n_stream=None):
        """Plugin, Lin-MC and MC metrics (``_final_class_metrics``) at the end of ``final_run``; None if it diverged."""
        _, _, bel, Xt, yt = self.final_run(method, seed=seed, n_stream=n_stream)
        if bel is None:
            return None
        seed = self.seed if seed is None else seed
        with np.errstate(all="ignore"):
            return _final_class_metrics(self.model, bel, Xt, yt, np.random.default_rng([2024, 4, seed]),
                                        self.cfg["pred_samples"])

    def other_trial(self, winner, loser, est=None, margin=0.0, reported=None):
        """Does not carry over: ``winner`` (which the paper has losing, or tied) beats ``loser`` by more
        than ``margin`` (relative) on the new trial as well. If the new trial goes the paper's way and quick mode
        ran one trial, ``reported`` (winner's and loser's reported NLL) gives the mean over the two trials."""
        if est is not None:
            winner, loser = (winner, est), (loser, est)
        w, lo = self.final_nll(winner)[0], self.final_nll(loser)[0]
        a, b = _method_name(winner, self.cfg), _method_name(loser, self.cfg)
        if reported is not None and self.cfg["seeds"] == 1 and np.isfinite(w) and w >= lo:
            # the new trial goes the paper's way: is the reported one a single-trial fluctuation?
            mw, ml = (reported[0] + w) / 2, (reported[1] + lo) / 2
            return explanation(
                "setup", "quick mode runs one trial; the paper reports means over 3-5 trials, and the claim holds on "
                "the mean over this trial and a new one", f"trial {self.seed}: {a} {_fmt(w)}, {b} {_fmt(lo)}; mean "
                f"of the two trials: {a} {_fmt(mw)}, {b} {_fmt(ml)} (final plugin NLL)", bool(ml < mw))
        return explanation(
            "does-not-carry-over", f"on the digits MLP (small P, short stream) {a} beats {b}, against the paper's "
            f"MNIST CNN result; it does so again on a new trial (another stream, test set and initialisation)",
            f"trial {self.seed}: {a} {_fmt(w)}, {b} {_fmt(lo)} (final plugin NLL)",
            bool(np.isfinite(w) and w < (1 - margin) * lo))

    def fastest_step(self):
        """Set-up difference (timing on a shared machine): the mean per-step time includes other load; the
        fastest step of each method (the least disturbed) is compared on the same stream."""
        Xs, ys, _, _, rng = _digits_trial(self.Xp, self.yp, self.cfg, 0)
        theta0 = self.model.init_params(rng)
        best = {}
        for est in ("lin-ef", "lin-hess"):
            filt = _filter(self.model, self.lik, "bong", est, n_samples=self.cfg["n_samples"])
            res = _stream(filt, filt.init(theta0, self.hps["bong"]["prior_var"]), Xs[:40], ys[:40],
                          np.random.default_rng(0), 10 ** 9, lambda b: (0.0,), n_metrics=1)
            best[est] = 1e3 * float(np.min(res["times"][1:]))
        return explanation(
            "setup", "per-step times on a loaded shared machine: the mean over the stream includes other "
            "processes' load; the fastest step (least disturbed) measures the algorithm",
            f"fastest of 40 steps: LIN-EF {best['lin-ef']:.3f}, LIN-HESS {best['lin-hess']:.3f} ms",
            best["lin-ef"] <= best["lin-hess"])

    def moment_prior_var(self, est, reported_pv):
        """Set-up difference (the prior variance): the moment-parameter diagonal shares the prior variance
        tuned for BONG (natural DLR-10, LIN-HESS); the paper tunes sigma0 per method. The moment update adds
        sigma^4 diag(G) to the variance (the paper's footnote 3): a first-order step that goes negative once
        sigma^2 |G_ii| > 1 and drifts from the natural update 1 / (1 / sigma^2 - G_ii) well before that.
        Supported when, on a new trial, the moment run fails or ends more than 10% from the natural one at the
        reported prior variance and ends within 10% of it at each smaller prior variance tried (0.1 of the grid
        and 0.03)."""
        pvs = [v for v in (0.1, 0.03) if v < reported_pv]
        mom = {v: self.final_nll(("bong", est, "diag-moment", 0), prior_var=v) for v in [reported_pv] + pvs}
        nat = {v: self.final_nll(("bong", est, "diag", 0), prior_var=v)[0] for v in [reported_pv] + pvs}
        close = {v: bool(np.isfinite(mom[v][0]) and abs(mom[v][0] - nat[v]) <= 0.1 * nat[v]) for v in mom}
        err = mom[reported_pv][1]
        at = (f"failed at {err.split(':')[0]}" if err else
              f"natural {_fmt(nat[reported_pv])}, moment {_fmt(mom[reported_pv][0])}")
        return explanation(
            "setup", f"the run reuses BONG's prior variance (sigma0^2 = {reported_pv}, tuned with LIN-HESS) for "
            f"the moment-parameter diagonal; the paper tunes sigma0 per method. The moment update adds sigma^4 "
            f"diag(G) to each variance (paper footnote 3), a first-order step that turns a variance negative when "
            f"sigma^2 |G_ii| > 1 and departs from the natural update before that; with {EST_LABEL[est]} at sigma0^2 = "
            f"{reported_pv} the moment run fails or falls behind, and at smaller prior variances the two "
            "parameterisations agree",
            f"trial {self.seed}: sigma0^2 {reported_pv}: {at}; "
            + "; ".join(f"sigma0^2 {v}: natural {_fmt(nat[v])}, moment {_fmt(mom[v][0])}" for v in pvs)
            + " (final plugin NLL)",
            bool(not close[reported_pv] and pvs and all(close[v] for v in pvs)))

    def _sibling(self, algo, lr):
        """An _Ablation on the same trials with ``algo``'s learning rate set to ``lr`` (cached)."""
        k = ("sibling", algo, lr)
        if k not in self.cache:
            self.cache[k] = _Ablation(self.cfg, dict(self.hps, **{algo: dict(self.hps[algo], lr=lr)}), self.Xp, self.yp)
        return self.cache[k]

    def _smaller_lr(self, algo):
        """The next smaller learning rate of the digits grid than ``algo``'s tuned one (None if none)."""
        lr = self.hps[algo]["lr"]
        smaller = [a for a in GRIDS["digits"]["lr"] if a < lr]
        return max(smaller) if smaller else None

    def bbb_lr(self, diverged):
        """Set-up difference (learning-rate tuning): BBB's alpha is tuned with LIN-HESS on the tuning stream
        (``tune_stream`` examples), shorter than the reported streams; the paper tunes on the streams it reports,
        where a diverging alpha is never picked. diverged: {est: [error messages of the reported runs]}.
        Supported when a reported BBB run with a linearised estimator diverged and, at the grid's next smaller
        alpha on a new trial, BBB with LIN-HESS and with LIN-EF both finish below MC-EF (the claim holds there)."""
        lr, lo = self.hps["bbb"]["lr"], self._smaller_lr("bbb")
        if lo is None:
            return None
        sib = self._sibling("bbb", lo)
        new = {e: sib.final_nll(("bbb", e)) for e in ESTS}
        steps = "; ".join(f"{EST_LABEL[e]} " + ", ".join(m.split(":")[0] for m in v) for e, v in diverged.items() if v)
        return explanation(
            "setup", f"learning rate: BBB's alpha = {lr} was tuned on a {self.cfg['tune_stream']}-example stream and "
            f"diverges on the {self.cfg['n_stream']}-example streams with the linearised estimators; the paper tunes "
            f"on the streams it reports, where a diverging alpha is not picked; at the grid's next alpha = {lo} the "
            "linearised BBB runs finish and beat MC-EF",
            f"reported runs at alpha {lr} diverged at {steps or 'no step'}; trial {self.seed}, alpha {lo}: "
            + ", ".join(f"{EST_LABEL[e]} {_fmt(v[0])}" for e, v in new.items()) + " (final plugin NLL)",
            bool(steps and new["lin-hess"][0] < new["mc-ef"][0] and new["lin-ef"][0] < new["mc-ef"][0]))

    def mc_worse_with_bbb_lr(self, count, diverged, need=9):
        """Set-up difference (BBB's learning rate, as ``bbb_lr``): the count of DLR-10 methods whose MC
        predictive NLL is worse than both plugin and Lin-MC misses ``need`` of 12 because runs diverged
        (a diverged run counts as not worse). diverged: the diverged methods (algo, est). Supported when all
        of them are BBB runs and, at the grid's next smaller alpha on a new trial, enough of them finish with
        MC worse than plugin and Lin-MC to bring the count to ``need``."""
        lo = self._smaller_lr("bbb")
        if lo is None or not diverged or any(a != "bbb" for a, _ in diverged):
            return None
        sib, rows, extra = self._sibling("bbb", lo), [], 0
        for a, e in diverged:
            f = sib.final_metrics((a, e))
            if f is None:
                rows.append(f"BBB {EST_LABEL[e]} diverged again")
                continue
            p, lm, mc = f["plugin"]["nll"], f["linmc"]["nll"], f["mc"]["nll"]
            extra += bool(mc > max(p, lm))
            rows.append(f"BBB {EST_LABEL[e]} plugin {_fmt(p)}, Lin-MC {_fmt(lm)}, MC {_fmt(mc)}")
        return explanation(
            "setup", f"learning rate: {len(diverged)} of the 12 runs (BBB with the linearised estimators at the "
            f"alpha tuned on a shorter stream) diverged and count against the claim; at the grid's next alpha = {lo} "
            "they finish, and the MC predictive is the worst of the three for them too",
            f"{count}/12 with the diverged runs; trial {self.seed}, BBB alpha {lo}: " + "; ".join(rows)
            + f" -> {count + extra}/12", count + extra >= need)

    def mc_worse_by_estimator(self, need=9):
        """Does not carry over: on this network the MC predictive is the worst of the three for the DLR-10
        beliefs of the linearised estimators, not for those of MC-EF, whose MC predictive ties or beats the
        plugin, so the count stays below ``need`` of 12. Supported when, on a new trial, the count is below
        ``need`` again, every linearised run that finishes has MC worse than plugin and Lin-MC, and no MC-EF
        run has."""
        worse, rows = {}, []
        for a in ALGOS:
            for e in ESTS:
                f = self.final_metrics((a, e))
                if f is None:
                    rows.append(f"{a.upper()} {EST_LABEL[e]} diverged")
                    continue
                p, lm, mc = f["plugin"]["nll"], f["linmc"]["nll"], f["mc"]["nll"]
                worse[a, e] = bool(mc > max(p, lm))
                rows.append(f"{a.upper()} {EST_LABEL[e]} MC - max(plugin, Lin-MC) {mc - max(p, lm):+.3f}")
        lin = [w for (a, e), w in worse.items() if e != "mc-ef"]
        mcef = [w for (a, e), w in worse.items() if e == "mc-ef"]
        count = sum(worse.values())
        return explanation(
            "does-not-carry-over", "on the digits MLP the MC predictive is the worst of the three for the beliefs "
            "that the linearised estimators (LIN-HESS, LIN-EF) leave, as in the paper's fig. 5, but not for the "
            f"MC-EF beliefs, where it ties or beats the plugin; with 4 of the 12 methods on MC-EF the count stays "
            f"below {need}",
            f"trial {self.seed}: {count}/12 with MC worse than both; linearised {sum(lin)}/{len(lin)} finished runs, "
            f"MC-EF {sum(mcef)}/{len(mcef)}; " + "; ".join(rows),
            count < need and bool(lin) and all(lin) and not any(mcef))

    def dlr1_vs_diag(self, est="lin-ef", n_long=800):
        """Does not carry over: BONG-DLR-1 beats BONG-Diag with ``est`` on most new trials of the configured
        stream and on every new trial of a longer stream (n_long examples; the paper's claim is on T = 2000)."""
        short = [(self.final_nll(("bong", est, "dlr", 1), seed=s)[0], self.final_nll(("bong", est, "diag", 0), seed=s)[0])
                 for s in range(self.seed, self.seed + 4)]
        long = [(self.final_nll(("bong", est, "dlr", 1), seed=s, n_stream=n_long)[0],
                 self.final_nll(("bong", est, "diag", 0), seed=s, n_stream=n_long)[0])
                for s in range(self.seed, self.seed + 2)]
        wins_s, wins_l = sum(d < g for d, g in short), sum(d < g for d, g in long)

        def fmt(rows):
            return ", ".join(f"{_fmt(d)} vs {_fmt(g)}" for d, g in rows)

        return explanation(
            "does-not-carry-over", f"on the digits MLP BONG-{EST_LABEL[est]} with DLR-1 beats the diagonal, against "
            "the paper's MNIST CNN exception; the low-rank column helps more as the stream grows",
            f"DLR-1 vs Diag (final plugin NLL), trials {self.seed}-{self.seed + 3}, T = {self.cfg['n_stream']}: "
            f"{fmt(short)} (DLR-1 better on {wins_s}/4); trials {self.seed}-{self.seed + 1}, T = {n_long}: {fmt(long)} "
            f"(DLR-1 better on {wins_l}/2)", wins_s >= 3 and wins_l == 2)

    def bog_below_bbb(self, est, n_trials=3):
        """Does not carry over: the check fails when another algorithm ends worse than BBB; here that is BOG
        (one plain-gradient step per example). Supported when BOG ends worse than BBB on most new trials."""
        rows = [(self.final_nll(("bbb", est), seed=s), self.final_nll(("bog", est), seed=s))
                for s in range(self.seed, self.seed + n_trials)]
        n = sum(bog[0] > bbb[0] for bbb, bog in rows)
        txt = "; ".join(f"trial {s}: BBB {'diverged (' + bbb[1].split(':')[0] + ')' if bbb[1] else _fmt(bbb[0])}, "
                        f"BOG {_fmt(bog[0])}" for s, (bbb, bog) in zip(range(self.seed, self.seed + n_trials), rows))
        return explanation(
            "does-not-carry-over", f"with {EST_LABEL[est]} on the digits MLP, BBB with I = {self.cfg['n_iter']} inner "
            "iterations ends better than BOG (one plain-gradient step per example), so BBB is not the worst; BBB "
            "still fails on some trials (the paper: 'often NaN')",
            f"{txt} (final plugin NLL); BOG worse than BBB on {n}/{n_trials} new trials", 2 * n > n_trials)

    def linmc_gap(self, n_long=800):
        """Does not carry over: for BONG with LIN-HESS and LIN-EF the Lin-MC NLL stays more than 15% above
        the plugin NLL on a new trial, both on the configured stream and on a longer one (n_long examples):
        the gap is not a short-stream effect."""
        rows, gaps = [], []
        for est in ("lin-hess", "lin-ef"):
            for T in (self.cfg["n_stream"], n_long):
                f = self.final_metrics(("bong", est), n_stream=T)
                if f is None:
                    rows.append(f"{EST_LABEL[est]} T={T}: diverged")
                    gaps.append(np.nan)
                    continue
                p, lm = f["plugin"]["nll"], f["linmc"]["nll"]
                gaps.append((lm - p) / p)
                rows.append(f"{EST_LABEL[est]} T={T}: plugin {_fmt(p)}, Lin-MC {_fmt(lm)} ({100 * gaps[-1]:+.0f}%)")
        return explanation(
            "does-not-carry-over", "on the digits MLP the posterior after the stream is still broad in function "
            "space: Lin-MC averages softmax over wide logit draws and ends well above the plugin NLL, on a 5x "
            "longer stream as much as on quick mode's",
            f"trial {self.seed}, BONG: " + "; ".join(rows),
            all(np.isfinite(g) and g > 0.15 for g in gaps))

    def ece_other_trial(self, est="lin-hess"):
        """Does not carry over: BONG does not have the lowest Lin-MC ECE on a new trial either."""
        ece = {}
        for a in ALGOS:
            f = self.final_metrics((a, est))
            ece[a] = np.inf if f is None else f["linmc"]["ece"]
        best = min(ece, key=ece.get)
        conf = acc = np.nan
        _, _, bel, Xt, yt = self.final_run(("bong", est))
        if bel is not None:
            p = _linmc_probs(self.model, bel, Xt, np.random.default_rng([2024, 5, self.seed]), self.cfg["pred_samples"])
            conf, acc = float(p.max(1).mean()), float(np.mean(p.argmax(1) == yt))
        return explanation(
            "does-not-carry-over", f"on the digits MLP after {self.cfg['n_stream']} examples BONG's Lin-MC "
            "predictive is under-confident (mean top-class probability well below its accuracy), which the ECE "
            "counts, and it is not the best calibrated on a new trial either",
            f"trial {self.seed}, Lin-MC ECE: " + ", ".join(f"{a.upper()} {_fmt(v)}" for a, v in ece.items())
            + f"; lowest: {best.upper()}; BONG Lin-MC mean confidence {_fmt(conf)}, accuracy {_fmt(acc)}",
            best != "bong")


def _plot_digits(S, cfg, P, outdir, name, keys, title):
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for k in keys:
        s = S[k]
        c = np.array(s["curve"])
        color = COLORS[s["algo"]] if name.startswith("b1") else f"C{list(FAMILIES).index(_fam_label(s))}"
        lab = f"{k} [{s['ms_per_step']:.1f} ms/step]"
        axes[0].plot(c[:, 0], c[:, 1], STYLES[s["est"]], color=color, label=lab)
        axes[1].plot(c[:, 0], c[:, 2], STYLES[s["est"]], color=color, label=lab)
    axes[0].set(xlabel="training examples", ylabel="test NLL (plugin)", yscale="log")
    axes[1].set(xlabel="training examples", ylabel="test error (plugin)")
    axes[1].legend(fontsize=6, loc="upper right")
    fig.suptitle(f"{title}; mean of {cfg['seeds']} trial(s); diverged runs leave gaps")
    return savefig(fig, outdir, name)


def _fam_label(s):
    for f, (family, rank) in FAMILIES.items():
        if s["family"] == family and (family != "dlr" or s["rank"] == rank):
            return f
    return "DLR-10"


# ---------------------------------------------------------------------------------------------
# B3, B4, B5: teacher-student regression


def teacher_data(n, rng, hidden=(20, 20), noise_frac=0.05):
    """x ~ N(0, A A^T / 10) in R^10, y = teacher MLP 10-20-20-1 (elu, LeCun init) + Gaussian noise
    with variance noise_frac * Var(teacher output) (the paper's App. B.1 set-up). Returns X (n, 10), y (n,)."""
    A = rng.standard_normal((10, 10))
    X = rng.standard_normal((n, 10)) @ A.T / np.sqrt(10)
    teacher = rb.MLP([10, *hidden, 1], activation="elu")
    f = teacher.apply_batch(teacher.init_params(rng), X)[:, 0]
    return X, f + np.sqrt(noise_frac * f.var()) * rng.standard_normal(n)


def _reg_split(cfg, rng):
    """Stream, validation and test sets from one fixed teacher draw of 2000 points (1000 / 500 / 500
    pools, the first n of each used); standardised with the stream's statistics."""
    X, y = teacher_data(2000, rng)
    n_tr = cfg["n_stream"]
    mx, sx = X[:n_tr].mean(0), X[:n_tr].std(0)
    my, sy = y[:n_tr].mean(), y[:n_tr].std()
    X, y = (X - mx) / sx, (y - my) / sy
    va = slice(1000, 1000 + cfg["n_val"])
    te = slice(1500, 1500 + cfg["n_test"])
    return X[:n_tr], y[:n_tr], X[va], y[va], X[te], y[te]


def _nlpd(model, theta, X, y, R):
    m = model.apply_batch(theta, X)[:, 0]
    return float(np.mean(0.5 * np.log(2 * np.pi * R) + (y - m) ** 2 / (2 * R)))


def _reg_runs(cfg, configs, n_stream=None, seeds=None):
    """The B3 streams: {(algo, est, lr, n_iter, family, n_samples): [one _stream result per trial]} on the
    teacher-student split (``n_stream`` examples, default ``cfg["n_stream"]``), sigma0^2 and R of GRIDS["reg"];
    trials ``seeds`` (default: the configured ones, 0 .. cfg["seeds"] - 1)."""
    grid = GRIDS["reg"]
    cfg = dict(cfg, n_stream=cfg["n_stream"] if n_stream is None else n_stream)
    Xs, ys, Xv, yv, Xt, yt = _reg_split(cfg, np.random.default_rng([2024, 10]))
    R = grid["obs_frac"] * ys.var()
    model, lik = rb.MLP([10, 20, 20, 1], activation="elu"), rb.Gaussian(R)
    runs = {}
    for seed in (range(cfg["seeds"]) if seeds is None else seeds):
        rng = np.random.default_rng([2024, 11, seed])
        order = rng.permutation(len(ys))
        X, Y = Xs[order], ys[order][:, None]
        theta0 = model.init_params(rng)
        for algo, est, lr, n_iter, family, n_samples in configs:
            filt = _filter(model, lik, algo, est, family=family, lr=lr, n_iter=n_iter, n_samples=n_samples)
            res = _stream(filt, filt.init(theta0, grid["prior_var"]), X, Y, np.random.default_rng([2024, 12, seed]),
                          cfg["every"], lambda b: (_nlpd(model, b.mean, Xt, yt, R),),
                          mid_eval=lambda b: _nlpd(model, b.mean, Xv, yv, R), n_metrics=1)
            runs.setdefault((algo, est, lr, n_iter, family, n_samples), []).append(res)
    return runs


def _blr_alpha_longer(cfg, n_long=600):
    """Does not carry over: BLR (LIN-HESS, I = 1) validation picks alpha over the whole grid on a stream
    n_long long (4x quick mode's); supported when it does not pick 0.5 there either."""
    lrs = GRIDS["reg"]["lr"]
    M = cfg["n_samples"]
    runs = _reg_runs(cfg, [("blr", "lin-hess", lr, 1, "dlr", M) for lr in lrs], n_stream=n_long)
    val = {lr: _mean_over(runs[("blr", "lin-hess", lr, 1, "dlr", M)], lambda r: r["mid"]) for lr in lrs}
    pick = min(lrs, key=lambda lr: _worse(val[lr]))
    top = sorted(lrs, key=lambda lr: _worse(val[lr]))[:4]
    return explanation(
        "does-not-carry-over", "on the teacher-student regression BLR's mid-stream validation NLPD is flat over "
        "alpha = 0.05-0.5 and its minimum is not at 0.5, on quick mode's stream and on a 4x longer one",
        f"T = {n_long}: validation picks alpha {pick}; validation NLPD at mid-stream "
        + ", ".join(f"alpha {lr}: {_fmt(val[lr])}" for lr in sorted(top)), pick != 0.5)


def _bbb_i10_grid(cfg, table, bong, bbb1):
    """Does not carry over: BBB with I = 10 over the whole learning-rate grid (quick mode runs two of its
    values) on the same streams; supported when no alpha, not even the one with the best final test NLPD,
    closes half of BBB's I = 1 gap to BONG."""
    M = cfg["n_samples"]
    lrs = GRIDS["reg"]["lr"]
    missing = [("bbb", "lin-hess", lr, 10, "dlr", M) for lr in lrs
               if ("bbb", "lin-hess", lr, 10, "dlr", M) not in table]
    runs = _reg_runs(cfg, missing) if missing else {}
    final = {}
    for lr in lrs:
        k = ("bbb", "lin-hess", lr, 10, "dlr", M)
        final[lr] = _worse(table[k]["final"]) if k in table else _worse(_mean_over(runs[k], lambda r: r["curve"][-1, 1]))
    best = min(lrs, key=lambda lr: final[lr])
    return explanation(
        "does-not-carry-over", "on the teacher-student regression BBB with I = 10 does not improve on I = 1 at any "
        "learning rate of the grid: the larger rates diverge within a few steps and the smaller ones end no "
        "better than I = 1",
        "BBB I = 10 final test NLPD: " + ", ".join(f"alpha {lr}: {_fmt(final[lr])}" for lr in lrs)
        + f"; best {_fmt(final[best])} (alpha {best}) vs BBB I = 1 {_fmt(bbb1)}, BONG {_fmt(bong)}",
        not final[best] - bong < 0.5 * (bbb1 - bong))


def _mc_ef_other_trial(cfg, sel):
    """Does not carry over: with MC-EF the order of the four algorithms is not the paper's on a new trial
    either. sel: the selected runs ("bong mc-ef I=1", ...), whose learning rates are reused. The empirical
    Fisher adds J^T r^2 J / R^2 to the precision where the Hessian adds J^T J / R; at parameter draws from a
    belief that is still broad in most directions the residuals r^2 are far above R (R = 0.1 Var(y)), so it
    over-counts curvature and the natural-gradient methods (BONG, BLR) take small steps, while a plain-gradient
    step (BOG) is not slowed this way. Supported when on the new trial BONG is not the best or BOG is not last."""
    M, seed = cfg["n_samples"], cfg["seeds"]
    configs = [(a, "mc-ef", sel[f"{a} mc-ef I=1"]["lr"], 1, "dlr", M) for a in ALGOS]
    runs = _reg_runs(cfg, configs, seeds=[seed])
    fin = {k[0]: _worse(v[0]["curve"][-1, 1]) for k, v in runs.items()}
    ok = min(fin, key=fin.get) != "bong" or fin["bog"] < max(fin["blr"], fin["bbb"])
    return explanation(
        "does-not-carry-over", "with MC-EF the natural-gradient methods (BONG, BLR) precondition with the empirical "
        "Fisher of gradients at draws from a belief still broad in most directions, whose residuals are far above R "
        "(R = 0.1 Var(y)); it over-counts curvature and they take small steps along this short stream, while the "
        "plain-gradient BOG is not slowed this way, so the paper's order (BONG best, BOG last) does not appear, on a "
        "new trial either",
        f"trial {seed}, MC-EF (M = {M}), I = 1, final test NLPD: "
        + ", ".join(f"{a.upper()} {_fmt(fin[a])}" + (f" (alpha {sel[f'{a} mc-ef I=1']['lr']})" if a != "bong" else "")
                    for a in ALGOS), bool(ok))


def _mc_ef_longer(cfg, n_long=600):
    """Does not carry over: BONG with MC-EF and M = cfg["mc_big"] stays more than 0.5 nats behind LIN-HESS
    on a new trial, at the configured stream length and on a longer stream (n_long examples); BONG with
    LIN-EF (the empirical Fisher at the mean, no sampling) is shown next to it, to separate the estimator
    from the sampling. Supported when the MC-EF gap exceeds 0.5 nats at both lengths."""
    M, big, seed = cfg["n_samples"], cfg["mc_big"], cfg["seeds"]
    configs = [("bong", "lin-hess", None, 1, "dlr", M), ("bong", "mc-ef", None, 1, "dlr", big),
               ("bong", "lin-ef", None, 1, "dlr", M)]
    runs = _reg_runs(dict(cfg, every=cfg["n_stream"]), configs, n_stream=n_long, seeds=[seed])
    at = {}  # (est, T) -> test NLPD after T examples
    for (algo, est, *_), (res,) in runs.items():
        for row in res["curve"]:
            if int(row[0]) in (cfg["n_stream"], n_long):
                at[(est, int(row[0]))] = _worse(row[1])
    Ts = (cfg["n_stream"], n_long)
    gaps = [at.get(("mc-ef", T), np.inf) - at.get(("lin-hess", T), np.inf) for T in Ts]
    return explanation(
        "does-not-carry-over", f"on the teacher-student regression BONG with MC-EF (M = {big}) stays several nats "
        "behind LIN-HESS on a new trial and on a longer stream: its empirical Fisher is taken at draws from a belief "
        "still broad in most directions, whose residuals are far above R, so it over-counts curvature and the mean "
        "barely moves; more draws estimate that inflated expectation better, they do not remove it (LIN-EF, the "
        "same estimator at the mean, is shown for comparison)",
        f"trial {seed}, test NLPD after " + "; ".join(
            f"T = {T}: LIN-HESS {_fmt(at.get(('lin-hess', T), np.nan))}, MC-EF (M = {big}) "
            f"{_fmt(at.get(('mc-ef', T), np.nan))}, LIN-EF {_fmt(at.get(('lin-ef', T), np.nan))}" for T in Ts),
        all(g > 0.5 for g in gaps))


def regression(quick, outdir):
    cfg = CONFIG[quick]["reg"]
    grid = GRIDS["reg"]
    Xs, ys, Xv, yv, Xt, yt = _reg_split(cfg, np.random.default_rng([2024, 10]))
    R = grid["obs_frac"] * ys.var()
    model = rb.MLP([10, 20, 20, 1], activation="elu")
    M = cfg["n_samples"]
    configs = [("bong", "lin-hess", None, 1, "dlr", M)]
    configs += [(a, "lin-hess", lr, 1, "dlr", M) for a in ("blr", "bog", "bbb") for lr in grid["lr"]]
    configs += [(a, "lin-hess", lr, 10, "dlr", M) for a in ("blr", "bbb") for lr in cfg["lrs_i10"]]
    configs += [("bong", "mc-ef", None, 1, "dlr", M)]
    configs += [(a, "mc-ef", lr, 1, "dlr", M) for a in cfg["mc_algos"] if a != "bong" for lr in grid["lr"]]
    if cfg["mc_big"]:
        configs += [("bong", "mc-ef", None, 1, "dlr", cfg["mc_big"])]
    if cfg["fc"]:
        configs += [("bong", "lin-hess", None, 1, "full", M)]
    runs = _reg_runs(cfg, configs)
    table = {}
    for key, rs in runs.items():
        algo, est, lr, n_iter, family, n_samples = key
        table[key] = {
            "algo": algo, "est": est, "lr": lr, "n_iter": n_iter, "family": family,
            "n_samples": n_samples if est.startswith("mc") else None,
            "curve": np.mean([r["curve"] for r in rs], axis=0).tolist(),
            "final": _mean_over(rs, lambda r: r["curve"][-1, 1]),
            "val_mid": _mean_over(rs, lambda r: r["mid"]),
            "ms_per_step": _ms(rs),
            "diverged": [r["error"] for r in rs if r["error"]]}

    def best(algo, est, n_iter):
        """The grid point with the lowest mean validation NLPD at mid-stream."""
        cands = [k for k in table if k[:2] == (algo, est) and k[3:] == (n_iter, "dlr", M)]
        cands = [table[k] for k in cands]
        return min(cands, key=lambda v: _worse(v["val_mid"])) if cands else None

    sel = {f"{a} {e} I={i}": best(a, e, i) for a in ALGOS for e in ("lin-hess", "mc-ef") for i in (1, 10)
           if best(a, e, i) is not None}
    checks = _regression_checks(table, sel, grid, cfg)
    fc = table.get(("bong", "lin-hess", None, 1, "full", M))
    if fc is not None:
        d10, full = _worse(sel["bong lin-hess I=1"]["final"]), _worse(fc["final"])
        checks.append(check("B3 BONG LIN-HESS: DLR-10 within 0.1 nats of full covariance",
                            "DLR-10 similar to FC (App. B.3; rank 5-10 often as good as FC, sec. 5)",
                            f"DLR-10 {_fmt(d10)}, FC {_fmt(full)} ({fc['ms_per_step']:.1f} vs "
                            f"{sel['bong lin-hess I=1']['ms_per_step']:.1f} ms/step)", d10 - full <= 0.1))
    big = table.get(("bong", "mc-ef", None, 1, "dlr", cfg["mc_big"]))
    if big is not None:
        lin, small = _worse(sel["bong lin-hess I=1"]["final"]), _worse(sel["bong mc-ef I=1"]["final"])
        checks.append(check(f"B3 BONG, I = 1: MC-EF with M = {cfg['mc_big']} within 0.5 nats of LIN-HESS",
                            "MC-EF (M = 100) slightly worse than LIN-HESS (fig. 10)",
                            f"M = {cfg['mc_big']}: {_fmt(_worse(big['final']))}, M = {M}: {_fmt(small)}, "
                            f"LIN-HESS {_fmt(lin)}", _worse(big["final"]) - lin <= 0.5, explain=lambda: _mc_ef_longer(cfg)))
    fig = _plot_regression(table, sel, grid, cfg, model.n_params, outdir)
    result = {"P": model.n_params, "obs_var": R, "prior_var": grid["prior_var"], "config": cfg,
              "runs": [v for v in table.values()],
              "selected": {k: {"lr": v["lr"], "test_nlpd": v["final"], "ms_per_step": v["ms_per_step"]}
                           for k, v in sel.items()}}
    return result, checks, [fig]


def _regression_checks(table, sel, grid, cfg):
    checks = []
    f = {k: _worse(v["final"]) for k, v in sel.items()}
    bong, blr, bog, bbb = (f[f"{a} lin-hess I=1"] for a in ALGOS)
    checks.append(check("B3 LIN-HESS, I = 1: BONG ~ BLR (tuned alpha), within 0.1 nats", "indistinguishable (fig. 9a)",
                        f"BONG {_fmt(bong)}, BLR {_fmt(blr)} (alpha {sel['blr lin-hess I=1']['lr']})",
                        abs(bong - blr) <= 0.1))
    checks.append(check("B3 LIN-HESS, I = 1: BOG and BBB worse than BONG and BLR by > 0.2 nats",
                        "BONG ~ BLR >> BOG ~ BBB (fig. 9a)", f"BOG {_fmt(bog)}, BBB {_fmt(bbb)}",
                        min(bog, bbb) - max(bong, blr) > 0.2))
    checks.append(check("B3 LIN-HESS, I = 1: validation picks alpha = 0.5 for BLR",
                        "best alpha 0.5 (fig. 11a)", f"alpha {sel['blr lin-hess I=1']['lr']}",
                        sel["blr lin-hess I=1"]["lr"] == 0.5, explain=lambda: _blr_alpha_longer(cfg)))
    bbb10, blr10 = f["bbb lin-hess I=10"], f["blr lin-hess I=10"]
    checks.append(check("B3 LIN-HESS: with I = 10 BBB closes at least half of its gap to BONG",
                        "BBB approaches BONG/BLR at I = 10 (fig. 9b)",
                        f"BBB I=1 {_fmt(bbb)}, I=10 {_fmt(bbb10)}; BONG {_fmt(bong)}",
                        bbb10 - bong < 0.5 * (bbb - bong), explain=lambda: _bbb_i10_grid(cfg, table, bong, bbb)))
    checks.append(check("B3 LIN-HESS, I = 10: BLR still ~ BONG (within 0.1 nats)",
                        "several alpha give performance as good as BONG (fig. 11b)",
                        f"BLR {_fmt(blr10)}, BONG {_fmt(bong)}", blr10 - bong <= 0.1))
    t_b = sel["bong lin-hess I=1"]["ms_per_step"]
    ratios = {a: sel[f"{a} lin-hess I=10"]["ms_per_step"] / t_b for a in ("blr", "bbb")}
    checks.append(check("B3 LIN-HESS: BLR and BBB at I = 10 at least 5x slower per step than BONG",
                        "about 10x slower (App. B.3.1)", ", ".join(f"{a.upper()} {r:.1f}x" for a, r in ratios.items()),
                        all(np.isfinite(r) and r >= 5 for r in ratios.values())))
    mc = f["bong mc-ef I=1"]
    checks.append(check("B3 BONG, I = 1: MC-EF worse than LIN-HESS", "MC-EF slightly worse than LIN-HESS (fig. 10)",
                        f"MC-EF {_fmt(mc)}, LIN-HESS {_fmt(bong)}", mc > bong))
    sens = {}
    for a in ("blr", "bog", "bbb"):
        vals = [_worse(v["final"]) for v in table.values()
                if (v["algo"], v["est"], v["n_iter"], v["family"]) == (a, "lin-hess", 1, "dlr")]
        sens[a] = max(vals) - min(vals)
    checks.append(check("B3 LIN-HESS, I = 1: BLR, BOG and BBB alpha-sensitive (worst - best over the grid > 0.5 nats)",
                        "all non-BONG methods sensitive to alpha (App. B.3.2)",
                        ", ".join(f"{a.upper()} {_fmt(v)}" for a, v in sens.items()),
                        all(v > 0.5 for v in sens.values())))
    n_div = sum(bool(v["diverged"]) for v in table.values()
                if (v["algo"], v["est"], v["n_iter"], v["family"]) == ("bbb", "lin-hess", 1, "dlr"))
    checks.append(check("B3 LIN-HESS: BBB with I = 1 diverges for some alpha", "often NaN (fig. 12a)",
                        f"diverged at {n_div}/{len(grid['lr'])} alpha values", n_div >= 1))
    if "bog mc-ef I=1" in sel:
        mcs = {a: f[f"{a} mc-ef I=1"] for a in ALGOS}
        checks.append(check("B3 MC-EF, I = 1: BONG best, BOG last", "same trends as LIN-HESS (fig. 10a)",
                            ", ".join(f"{a.upper()} {_fmt(v)}" for a, v in mcs.items()),
                            min(mcs, key=mcs.get) == "bong" and mcs["bog"] >= max(mcs["blr"], mcs["bbb"]),
                            explain=lambda: _mc_ef_other_trial(cfg, sel)))
    return checks


def _plot_regression(table, sel, grid, cfg, P, outdir):
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, n_iter in zip(axes[:2], (1, 10)):
        for a in ALGOS:
            for e in ("lin-hess", "mc-ef"):
                v = sel.get(f"{a} {e} I={1 if a in ('bong', 'bog') else n_iter}")
                if v is None:
                    continue
                c = np.array(v["curve"])
                ax.plot(c[:, 0], c[:, 1], STYLES[e], color=COLORS[a],
                        label=f"{a}-{EST_LABEL[e]} a={v['lr']} [{v['ms_per_step']:.1f} ms/step]")
        ax.set(xlabel="training examples", ylabel="test NLPD (plugin)", title=f"BLR/BBB with I = {n_iter}")
        ax.legend(fontsize=6)
    ax = axes[2]
    bong = sel["bong lin-hess I=1"]["final"]
    ax.axhline(bong, color=COLORS["bong"], label="BONG (no alpha)")
    for a in ("blr", "bog", "bbb"):
        for n_iter in (1, 10):
            pts = [(v["lr"], v["final"]) for v in table.values()
                   if (v["algo"], v["est"], v["n_iter"], v["family"]) == (a, "lin-hess", n_iter, "dlr")]
            if pts:
                lrs, vals = zip(*pts)
                ax.plot(lrs, vals, "o-" if n_iter == 1 else "s--", color=COLORS[a], label=f"{a.upper()} I={n_iter}")
    ax.set(xscale="log", xlabel="learning rate alpha", ylabel="final test NLPD (missing = diverged)",
           title="learning-rate sensitivity, LIN-HESS (BBB I=1 = BOG)")
    ax.set_ylim(top=min(ax.get_ylim()[1], _worse(bong) + 3.0))
    ax.legend(fontsize=7)
    fig.suptitle(f"B3 teacher-student regression, MLP 10-20-20-1 (P = {P}), DLR-10, sigma0^2 = 1, "
                 f"mean of {cfg['seeds']} trial(s)")
    return savefig(fig, outdir, "b3_regression.png")


def timing(quick, outdir):
    plt = _pyplot()
    cfg = CONFIG[quick]["timing"]
    rng = np.random.default_rng([2024, 20])
    X, y = teacher_data(cfg["steps"] + 1, rng)
    X = (X - X.mean(0)) / X.std(0)
    Y = ((y - y.mean()) / y.std())[:, None]
    rows, steps = [], {}
    for family, hidden in (("full", cfg["fc_hidden"]), ("dlr", cfg["dlr_hidden"])):
        for h in hidden:
            model = rb.MLP([10, h, 1], activation="elu")
            lik = rb.Gaussian(0.1)
            theta0 = model.init_params(rng)
            ests = ["lin-hess", "mc-ef"]
            if family == "full" and model.n_params <= cfg["mc_hess_max_p"]:
                ests.append("mc-hess")
            for est in ests:
                for algo, n_iter in (("bong", 1), ("bog", 1), ("blr", 1), ("bbb", 1), ("blr", 10), ("bbb", 10)):
                    if (est == "mc-hess" and algo != "bong") or (n_iter == 10 and est not in cfg["i10_ests"]):
                        continue
                    # a tiny learning rate and prior variance keep every method finite at large P (and MC-HESS
                    # positive definite); the cost per step does not depend on them
                    filt = _filter(model, lik, algo, est, family=family, lr=1e-5, n_iter=n_iter, n_samples=10)
                    res = _stream(filt, filt.init(theta0, 1e-3), X, Y, np.random.default_rng(0), 10 ** 9,
                                  lambda b: (0.0,), n_metrics=1)
                    # fastest step after the first: the least disturbed by other load on the machine
                    rows.append({"family": family, "P": model.n_params, "algo": algo, "est": est, "n_iter": n_iter,
                                 "ms_per_step": 1e3 * float(np.min(res["times"][1:])) if len(res["times"]) > 1
                                 else np.nan, "error": res["error"]})
                    if family == "dlr" and h == max(cfg["dlr_hidden"]) and n_iter == 1 and res["belief"] is not None:
                        steps[(algo, est)] = (filt, res["belief"], X[-1], Y[-1])
    clean = _clean_step_ms(steps)
    checks = _timing_checks(rows, cfg["i10_ests"], clean)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, family in zip(axes, ("full", "dlr")):
        keys = sorted({(r["algo"], r["est"], r["n_iter"]) for r in rows if r["family"] == family})
        for algo, est, n_iter in keys:
            pts = [(r["P"], r["ms_per_step"]) for r in rows
                   if r["family"] == family and (r["algo"], r["est"], r["n_iter"]) == (algo, est, n_iter)]
            ax.loglog(*zip(*pts), ("o" if n_iter == 1 else "s") + STYLES[est], color=COLORS[algo],
                      label=f"{algo.upper()} {EST_LABEL[est]} I={n_iter}")
        ax.set(xlabel="P", ylabel="ms per step (numpy reference)",
               title="full covariance (natural)" if family == "full" else "DLR-10")
        ax.legend(fontsize=6)
    fig.suptitle("B4 seconds per step vs P, student MLP 10-H-1, M = 10")
    return {"rows": rows}, checks, [savefig(fig, outdir, "b4_timing.png")]


def _clean_step_ms(steps):
    """{(algo, est): ms} for one predict + update from a fixed belief, each method timed in turns with the
    others over 3 windows (bench's ``_time_rounds``), minimum over the calls: a burst of load on a shared
    machine then slows some windows of every method alike instead of all the steps of one method."""
    from .bench import _time_rounds

    def step(filt, bel, x, y):
        return lambda: filt.update(filt.predict(bel), x, y, rng=np.random.default_rng(0))

    fns = {k: step(*v) for k, v in steps.items()}
    with np.errstate(all="ignore"):
        out = _time_rounds(fns, rounds=3, min_total=0.3, min_reps=3, max_reps=20) if fns else {}
    return {k: 1e3 * v[0] for k, v in out.items()}


def _timing_checks(rows, i10_ests, clean=None):
    def t(family, P, algo, est, n_iter=1):
        for r in rows:
            if (r["family"], r["P"], r["algo"], r["est"], r["n_iter"]) == (family, P, algo, est, n_iter):
                return r["ms_per_step"]
        return np.nan

    checks = []
    Ps = sorted({r["P"] for r in rows if r["family"] == "dlr"})
    P = Ps[-1]
    clean = clean or {}
    for est in ("lin-hess", "mc-ef"):
        # the single-step comparisons at the largest P use the interleaved timing where there is one
        bog, bong, blr1 = (clean.get((a, est), t("dlr", P, a, est)) for a in ("bog", "bong", "blr"))
        blr10, bbb10 = t("dlr", P, "blr", est, 10), t("dlr", P, "bbb", est, 10)
        lab = EST_LABEL[est]
        how = " (interleaved, min of 3 windows)" if all((a, est) in clean for a in ("bog", "bong", "blr")) else ""
        checks.append(check(f"B4 DLR-10 {lab}, P = {P}: BOG faster than BONG", "BOG < BONG (fig. 4b)",
                            f"BOG {bog:.2f}, BONG {bong:.2f} ms/step{how}", bog < bong))
        checks.append(check(f"B4 DLR-10 {lab}, P = {P}: BLR (I = 1) slower than BONG", "BLR slower than BONG even at "
                            "I = 1 (SVD on 2R + K columns, App. B.1)", f"BLR {blr1:.2f}, BONG {bong:.2f} ms/step{how}",
                            blr1 > bong))
        if est in i10_ests:
            checks.append(check(f"B4 DLR-10 {lab}, P = {P}: BLR and BBB (I = 10) at least 5x slower than BONG",
                                "BONG << BLR ~ BBB (fig. 4b)", f"BLR {blr10 / bong:.1f}x, BBB {bbb10 / bong:.1f}x",
                                all(np.isfinite(v) and v >= 5 * bong for v in (blr10, bbb10))))
    a, b = Ps[-2], Ps[-1]
    slope = np.log(t("dlr", b, "bong", "lin-hess") / t("dlr", a, "bong", "lin-hess")) / np.log(b / a)
    checks.append(check(f"B4 BONG-DLR-10 LIN-HESS cost grows at most linearly in P (log-log slope, P {a} -> {b})",
                        "O((R + C)^2 P) (Table 3)", f"slope {slope:.2f}", slope <= 1.2))
    Pf = sorted({r["P"] for r in rows if r["family"] == "full"})
    a, b = Pf[-2], Pf[-1]
    sf = np.log(t("full", b, "blr", "lin-hess") / t("full", a, "blr", "lin-hess")) / np.log(b / a)
    checks.append(check(f"B4 BLR-FC LIN-HESS cost grows faster in P than BONG-DLR (P {a} -> {b})",
                        "O(I P^3) vs O((R + C)^2 P) (Table 3)", f"slope {sf:.2f} vs {slope:.2f}", sf > slope))
    hess = [(r["P"], r["ms_per_step"]) for r in rows if r["est"] == "mc-hess"]
    if hess:
        ok = all(ms > t("full", P_, "bong", "mc-ef") for P_, ms in hess)
        checks.append(check("B4 BONG-FC: MC-HESS slower than MC-EF", "MC-HESS dearer than MC-EF (fig. 4a)",
                            ", ".join(f"P {P_}: {ms:.1f} vs {t('full', P_, 'bong', 'mc-ef'):.1f} ms"
                                      for P_, ms in hess), ok))
    return checks


def mc_hess(quick, outdir):
    """BONG-FC with MC-HESS, MC-EF and LIN-HESS on a small student (appendix: MC-HESS works very poorly)."""
    cfg = CONFIG[quick]["mc_hess"]
    rcfg = {"n_stream": cfg["n_stream"], "n_val": 10, "n_test": 500}
    Xs, ys, _, _, Xt, yt = _reg_split(rcfg, np.random.default_rng([2024, 30]))
    R = GRIDS["reg"]["obs_frac"] * ys.var()
    model, lik = rb.MLP([10, cfg["hidden"], 1], activation="elu"), rb.Gaussian(R)
    out = {}
    for seed in range(cfg["seeds"]):
        rng = np.random.default_rng([2024, 31, seed])
        theta0 = model.init_params(rng)
        for prior_var in cfg["prior_vars"]:
            for est in ("lin-hess", "mc-ef", "mc-hess"):
                filt = _filter(model, lik, "bong", est, family="full", n_samples=cfg["n_samples"])
                res = _stream(filt, filt.init(theta0, prior_var), Xs, ys[:, None],
                              np.random.default_rng([2024, 32, seed]), len(Xs),
                              lambda b: (_nlpd(model, b.mean, Xt, yt, R),), n_metrics=1)
                out.setdefault((prior_var, est), []).append({"nlpd": res["curve"][-1, 1], "error": res["error"],
                                                             "sec": res["sec"]})
    summ = {f"sigma0^2={pv} {e}": {"nlpd": _mean_over(v, lambda r: r["nlpd"]),
                                   "diverged": [r["error"] for r in v if r["error"]], "ms_per_step": _ms(v)}
            for (pv, e), v in out.items()}
    rows, ok = [], True
    for pv in cfg["prior_vars"]:
        h, ef, lh = (_worse(summ[f"sigma0^2={pv} {e}"]["nlpd"]) for e in ("mc-hess", "mc-ef", "lin-hess"))
        rows.append(f"sigma0^2 {pv}: MC-HESS {_fmt(h)}, MC-EF {_fmt(ef)}, LIN-HESS {_fmt(lh)}")
        ok = ok and h > max(ef, lh)
    checks = [check(f"B5 BONG-FC (P = {model.n_params}, M = {cfg['n_samples']}, T = {cfg['n_stream']}): "
                    "MC-HESS worse than MC-EF and LIN-HESS at every prior variance",
                    "MC-HESS works very poorly, even with M = 1000 (sec. 5)", "; ".join(rows), ok)]
    return {"P": model.n_params, "config": cfg, "results": summ}, checks, []


def run(quick=False, outdir=".", tune=None):
    """Run B1-B5; ``tune`` (default: not quick) searches the digits grid instead of using QUICK_HP."""
    tune = (not quick) if tune is None else bool(tune)
    parts = (("B1_B2_digits", lambda: digits_experiments(quick, tune, outdir)),
             ("B3_regression", lambda: regression(quick, outdir)),
             ("B4_timing", lambda: timing(quick, outdir)),
             ("B5_mc_hess", lambda: mc_hess(quick, outdir)))
    out = run_parts(parts, outdir, "bong.json")
    out["defaults"] = DEFAULTS
    return out
