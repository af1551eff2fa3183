"""Chang, Duran-Martin, Shestopaloff, Jones & Murphy (2023), LO-FI, on offline data.

The reproducible subset of the paper's experiments (section 4 and App. D) that
needs no download:

L1 piecewise-stationary 1-d regression (App. D.2): MLP 1-50-1, P = 151; FCEKF,
   LO-FI (diagonal and spherical), FDEKF, VDEKF and SGD-RB; current-regime test
   RMSE after every observation.
L2 stationary digits classification (stand-in for Fashion-MNIST, section 4.1):
   LO-FI(10) against SGD-RB (sgd and adam, buffer 10), FDEKF, VDEKF and OGD;
   test error and NLL along the stream, generalised-probit NLPD at the end.
L3 rank ablation of LO-FI on the same stream (L = 0 is VDEKF).
L4 permuted-pixel digits (piecewise stationary, section 4.1): current-task test
   error; LO-FI with process noise q > 0 against the same methods.
L5 load_diabetes as a UCI-style regression (App. D.1): MLP 10-50-1 over random
   90/10 splits; FCEKF, LO-FI diagonal and spherical, FDEKF, VDEKF; test RMSE
   and linearised NLPD (eq. 63).

Hyper-parameters come from small fixed grids (no Bayesian optimisation),
chosen per method on data that the reported numbers never see: a separate
synthetic stream (L1), a validation split of the training pool (L2, L4) or a
held-out part of the first training split (L5). Full mode searches the grids;
quick mode uses smaller models and the fixed values in ``QUICK_HP``, which are
what the same search picks for the quick configurations (``run(quick=True,
tune=True)`` repeats it). In L4, LO-FI's q grid leaves out 0 (the claim is
about q > 0; LO-FI with q = 0 runs as a separate entry); the diagonal EKFs'
grids include 0.

Other choices: the VDEKF baseline uses the EKF mean (the paper's VDEKF,
identical to LO-FI with L = 0); the filters' process noise is 0 on stationary
data; the MLPs use tanh in L1 and ReLU elsewhere, with LeCun-normal initial
weights shared by all methods within a seed; the replay-SGD baselines minimise
squared error (a unit-variance Gaussian NLL) in regression and cross-entropy
in classification.
"""

import functools

import numpy as np  # noqa: E402

import refbayes as rb  # noqa: E402
from refbayes import predictive  # noqa: E402

from ._mpl import pyplot as _pyplot  # noqa: E402
from .common import check, class_metrics, digits, explanation, plugin_metrics, run_parts, savefig, split  # noqa: E402
from refbayes.parallel import TrialFailure, run_trials  # noqa: E402

FC, LOFI, SPH, FD, VD = "FCEKF", "LO-FI", "LO-FI sph", "FDEKF", "VDEKF"
SGD, ADAM, OGD = "SGD-RB sgd", "SGD-RB adam", "OGD"
RANK, BUFFER = 10, 10

# Per-mode sizes. Quick mode uses smaller networks and streams so that it runs in well under a minute;
# full mode keeps to about 15 minutes on a shared 2-core machine (hence 10 diabetes splits, not 20).
CONFIG = {
    True: {
        "drift": {"seeds": 2, "regimes": 3, "n_train": 100, "n_test": 100, "tune_regimes": 3},
        "digits": {"sizes": [64, 20, 10], "n_stream": 300, "every": 50, "seeds": 1, "tune_stream": 300},
        "ranks": [1, 2, 5, 10, 20],
        "permuted": {"tasks": 3, "n_train": 150, "n_test": 200, "every": 25, "seeds": 1, "tune_tasks": 3},
        "diabetes": {"sizes": [10, 20, 1], "splits": 3},
    },
    False: {
        "drift": {"seeds": 5, "regimes": 10, "n_train": 100, "n_test": 100, "tune_regimes": 5},
        "digits": {"sizes": [64, 50, 50, 10], "n_stream": 1300, "every": 100, "seeds": 2, "tune_stream": 800},
        "ranks": [1, 2, 5, 10, 20],
        "permuted": {"tasks": 5, "n_train": 300, "n_test": 300, "every": 30, "seeds": 1, "tune_tasks": 2},
        "diabetes": {"sizes": [10, 50, 1], "splits": 10},
    },
}

# The grids, fixed in advance: prior variance 1/eta_0 and process noise q for the filters (plus the
# observation variance in regression), learning rates for the gradient methods.
GRIDS = {
    "drift": {"filter": [{"prior_var": 1.0, "q": q, "obs_var": r} for q in (1e-4, 1e-3, 1e-2) for r in (0.01, 0.1)],
              "sgd": [{"lr": lr} for lr in (1e-3, 1e-2, 1e-1)]},
    "digits": {"filter": [{"prior_var": v} for v in (0.1, 0.3, 1.0)],
               SGD: [{"lr": lr} for lr in (0.03, 0.1, 0.3)],
               ADAM: [{"lr": lr} for lr in (1e-3, 3e-3, 1e-2)],
               OGD: [{"lr": lr} for lr in (0.03, 0.1, 0.3)]},
    "permuted": {"q": (1e-6, 1e-5, 1e-4, 1e-3)},
    "diabetes": {"filter": [{"prior_var": v, "obs_var": r} for v in (0.03, 0.1, 0.3) for r in (0.3, 1.0)]},
}

# What the grid search picks for the quick configurations (filled from run(quick=True, tune=True)).
QUICK_HP = {
    "drift": {FC: {"prior_var": 1.0, "q": 1e-4, "obs_var": 0.01}, LOFI: {"prior_var": 1.0, "q": 1e-3, "obs_var": 0.01},
              SPH: {"prior_var": 1.0, "q": 1e-4, "obs_var": 0.01}, FD: {"prior_var": 1.0, "q": 1e-3, "obs_var": 0.1},
              VD: {"prior_var": 1.0, "q": 1e-4, "obs_var": 0.1}, SGD: {"lr": 0.1}, ADAM: {"lr": 0.1}},
    "digits": {LOFI: {"prior_var": 0.1}, FD: {"prior_var": 0.1}, VD: {"prior_var": 0.1},
               SGD: {"lr": 0.3}, ADAM: {"lr": 1e-2}, OGD: {"lr": 0.1}},
    "permuted": {LOFI: 1e-3, FD: 1e-4, VD: 1e-4},
    "diabetes": {FC: {"prior_var": 0.1, "obs_var": 0.3}, LOFI: {"prior_var": 0.1, "obs_var": 0.3},
                 SPH: {"prior_var": 0.03, "obs_var": 0.3}, FD: {"prior_var": 0.1, "obs_var": 0.3},
                 VD: {"prior_var": 0.3, "obs_var": 0.3}},
}

# Where the paper's text (Chang et al. 2023) and its authors' code (probml/rebayes, which the paper names) differ
# or say nothing, and which one these runs follow. "unknown": what the code does there is not known here.
DEFAULTS = [
    {"setting": "hyper-parameter search",
     "text": "Bayesian optimisation (section 3.4, App. C.1)",
     "code": "Bayesian optimisation: 20 random points, then 25 iterations, objective averaged over 5 seeds",
     "follows": "neither: a small fixed grid per experiment (GRIDS) in full mode, on data the reported numbers never "
                "see; quick mode uses what that search picks (QUICK_HP)"},
    {"setting": "tuning objective",
     "text": "validation NLL on stationary data, average one-step-ahead NLL on non-stationary data (App. C.1)",
     "code": "unknown",
     "follows": "text on stationary data (L2 final plugin validation NLL, L5 linearised NLPD on a held-out part of "
                "the first split); neither on non-stationary data (L1 one-step-ahead squared error on a separate "
                "synthetic stream, L4 mean current-task test error on tasks drawn from the training pool)"},
    {"setting": "prior variance 1/eta_0",
     "text": "a hyper-parameter, tuned (section 3.4)",
     "code": "searched over log(1/eta_0) in [-10, 0]",
     "follows": "text (tuned on held-out data), on a coarse grid: 0.1, 0.3, 1 (digits), 0.03-0.3 (load_diabetes), "
                "1 (1-d stream)"},
    {"setting": "dynamics gamma and process noise q",
     "text": "both hyper-parameters, tuned (section 3.4, App. C)",
     "code": "stationary data: gamma = 1 and q fixed near 0; non-stationary: log(1 - gamma) and log q searched "
             "in [-30, 0]",
     "follows": "code on stationary data (gamma = 1, q = 0: L2, L3, L5); neither on non-stationary data: gamma = 1, "
                "q from a grid (L1 1e-4-1e-2, L4 1e-6-1e-3)"},
    {"setting": "observation variance (regression)",
     "text": "a hyper-parameter, tuned (section 3.4), or estimated online (App. C.2, eqs 67-68)",
     "code": "unknown",
     "follows": "text (tuned): a grid (L1 0.01, 0.1; L5 0.3, 1), fixed along the stream, no online estimate"},
    {"setting": "singular categorical covariance R",
     "text": "drop one class or use a pseudo-inverse (section 3.2, footnote 2)",
     "code": "adds a jitter eps I (1e-3 or 1e-6)",
     "follows": "text: the last class is dropped (rb.Categorical's default), no jitter"},
    {"setting": "covariance inflation",
     "text": "optional (App. E); negligible effect (App. D.3, table 7)",
     "code": "the experiment scripts build hybrid inflation with a tuned alpha (held near 0 by the search bounds; "
             "some stored configurations 1e-3)",
     "follows": "text: no inflation"},
    {"setting": "VDEKF baseline mean",
     "text": "VD-EKF is LO-FI with rank 0 (App. A.4)",
     "code": "the FD-EKF (full-gain) mean with the diagonal variance update",
     "follows": "both: vd_mean='ekf', the filter LO-FI becomes at L = 0"},
    {"setting": "rank L, replay buffer B",
     "text": "L = 10, B = 10 (section 4.2, App. D.1); gains plateau near L = 10 (App. D.4)",
     "code": "L = 10, B = 10",
     "follows": "both: L = 10, B = 10; L3 sweeps L = 1-20"},
]

# numerical failures only: a ValueError (bad input) must surface, not be recorded as a divergence
_FAILURES = (rb.ConvergenceError, rb.NotPositiveDefiniteError, rb.DivergenceError, np.linalg.LinAlgError, FloatingPointError)


# ---------------------------------------------------------------------------------------------
# helpers


def _build(method, model, lik, hp, rank=RANK):
    """The learner for ``method`` with hyper-parameters ``hp``; returns (learner, prior_var)."""
    if "obs_var" in hp:
        lik = rb.Gaussian(hp["obs_var"])
    q = hp.get("q", 0.0)
    if method == FC:
        return rb.FullEKF(model, lik, q=q), hp["prior_var"]
    if method == LOFI:
        return rb.LoFi(model, lik, rank=rank, q=q), hp["prior_var"]
    if method == SPH:
        return rb.LoFi(model, lik, rank=rank, variant="spherical", q=q), hp["prior_var"]
    if method == FD:
        return rb.FDEKF(model, lik, q=q), hp["prior_var"]
    if method == VD:
        return rb.VDEKF(model, lik, q=q, vd_mean="ekf"), hp["prior_var"]
    if method in (SGD, ADAM):
        return rb.SGDRB(model, lik, buffer_size=BUFFER, lr=hp["lr"], optimizer="adam" if method == ADAM else "sgd"), None
    if method == OGD:
        return rb.OGD(model, lik, lr=hp["lr"]), None
    raise ValueError(f"unknown method {method!r}")


def _attempt(fn):
    """(fn(), None), or (None, message) when the learner diverges or breaks down numerically."""
    try:
        with np.errstate(all="ignore"):
            return fn(), None
    except _FAILURES as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _select(grid, score):
    """The grid point with the lowest finite score, and the table of all scores."""
    table = []
    for hp in grid:
        value, err = _attempt(lambda hp=hp: score(hp))
        value = np.inf if value is None or not np.isfinite(value) else float(value)
        table.append({"hp": hp, "score": value, **({"error": err} if err else {})})
    best = min(range(len(grid)), key=lambda i: table[i]["score"])
    return dict(grid[best]), table


def _mse(a, b):
    return float(np.mean((np.asarray(a) - np.asarray(b)) ** 2))


def _se(values):
    v = np.asarray(values, dtype=float)
    return float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")


def _fmt(d, digits=3):
    return ", ".join(f"{k} {v:.{digits}f}" for k, v in d.items())


# ---------------------------------------------------------------------------------------------
# L1: piecewise-stationary 1-d regression (App. D.2)


def drift_data(n_regimes, n_train, n_test, rng):
    """Regimes y = c2 x + 0.3 sin(2 + c1 pi x) + N(0, 0.02^2), x ~ U(-0.5, 0.5), c1 ~ U(-5, 5),
    c2 ~ U(-1, 1); x and y standardised per regime with the training statistics.
    Returns a list of (X_train (n, 1), Y_train (n, 1), X_test, Y_test)."""
    out = []
    for _ in range(n_regimes):
        c1, c2 = rng.uniform(-5, 5), rng.uniform(-1, 1)
        x = rng.uniform(-0.5, 0.5, n_train + n_test)
        y = c2 * x + 0.3 * np.sin(2 + c1 * np.pi * x) + 0.02 * rng.standard_normal(x.size)
        x = (x - x[:n_train].mean()) / x[:n_train].std()
        y = (y - y[:n_train].mean()) / y[:n_train].std()
        out.append((x[:n_train, None], y[:n_train, None], x[n_train:, None], y[n_train:, None]))
    return out


def _drift_run(method, model, hp, data, theta0):
    """Run one learner through all regimes: current-regime test RMSE after each step (T,)
    (empty without test data), one-step-ahead predictions (T,), final belief."""
    filt, prior_var = _build(method, model, rb.Gaussian(1.0), hp)
    bel = filt.init(theta0, prior_var) if prior_var is not None else filt.init(theta0)
    rmse, yhat = [], []
    for Xtr, Ytr, Xte, Yte in data:
        def cb(t, bp, b, x, y, Xte=Xte, Yte=Yte):
            return np.sqrt(_mse(model.apply_batch(b.mean, Xte), Yte))

        bel, hist = filt.scan(bel, Xtr, Ytr, callback=cb if len(Xte) else None)
        rmse += hist.get("callback", [])
        yhat += list(hist["yhat"][:, 0])
    return np.array(rmse), np.array(yhat), bel


def _drift_trial(key, hps, cfg):
    """One (seed, method) trial of the drift experiment: (test RMSE curve, error, fit on a grid
    for seed 0). The seed's data and initial weights come from the seed alone."""
    s, m = key
    model = rb.MLP([1, 50, 1], activation="tanh")
    rng = np.random.default_rng([2023, 1, s])
    data = drift_data(cfg["regimes"], cfg["n_train"], cfg["n_test"], rng)
    theta0 = model.init_params(rng)
    out, err = _attempt(lambda: _drift_run(m, model, hps[m], data, theta0))
    if err:
        return None, err, None
    fit = None
    if s == 0:
        grid = np.linspace(data[-1][2].min(), data[-1][2].max(), 200)[:, None]
        fit = model.apply_batch(out[2].mean, grid)[:, 0]
    return out[0], None, fit


def drift(quick, hps, tune, outdir):
    plt = _pyplot()
    cfg = CONFIG[quick]["drift"]
    model = rb.MLP([1, 50, 1], activation="tanh")
    methods = [FC, LOFI, SPH, FD, VD, SGD, ADAM]
    selection = {}
    if tune:
        rng = np.random.default_rng([2023, 1, 99])
        data = drift_data(cfg["tune_regimes"], cfg["n_train"], 0, rng)
        theta0 = model.init_params(rng)
        Y = np.concatenate([d[1][:, 0] for d in data])
        hps = {}
        for m in methods:
            grid = GRIDS["drift"]["filter" if m in (FC, LOFI, SPH, FD, VD) else "sgd"]
            hps[m], selection[m] = _select(grid, lambda hp, m=m: _mse(_drift_run(m, model, hp, data, theta0)[1], Y))
    curves, errors, fits = {m: [] for m in methods}, {}, {}
    keys = [(s, m) for s in range(cfg["seeds"]) for m in methods]
    results = run_trials(functools.partial(_drift_trial, hps=hps, cfg=cfg), keys, label="lofi drift")
    for (s, m), res in results.items():
        curve, err, fit = (None, res.error, None) if isinstance(res, TrialFailure) else res
        if err:
            errors[f"{m} seed {s}"] = err
            curves[m].append(np.full(cfg["regimes"] * cfg["n_train"], np.nan))
            continue
        curves[m].append(curve)
        if fit is not None:
            fits[m] = fit
    curves = {m: np.array(v) for m, v in curves.items()}  # (seeds, T)
    n, k = cfg["n_train"], 20
    early = np.tile(np.arange(n) < k, cfg["regimes"])
    late = np.tile(np.arange(n) >= n - 10, cfg["regimes"])
    per_seed = {m: c.mean(axis=1) for m, c in curves.items()}
    summary = {m: {"rmse_mean": float(per_seed[m].mean()), "rmse_se": _se(per_seed[m]),
                   f"rmse_first_{k}_per_regime": float(c[:, early].mean()),
                   "rmse_last_10_per_regime": float(c[:, late].mean())}
               for m, c in curves.items()}
    mean = {m: summary[m]["rmse_mean"] for m in methods}
    best_grad = min(SGD, ADAM, key=lambda m: mean[m])
    best_diag = min(FD, VD, key=lambda m: mean[m])
    checks = [
        check("drift 1-d: FCEKF adapts at least as well as LO-FI", "FCEKF > LO-FI (App. D.2, fig. 11)",
              f"mean current-regime RMSE FCEKF {mean[FC]:.3f}, LO-FI {mean[LOFI]:.3f}", mean[FC] <= mean[LOFI]),
        check("drift 1-d: LO-FI beats SGD-RB", "LO-FI > SGD (App. D.2)",
              f"LO-FI {mean[LOFI]:.3f}, {best_grad} (better of sgd/adam) {mean[best_grad]:.3f}",
              mean[LOFI] < mean[best_grad]),
        check("drift 1-d: LO-FI beats the diagonal EKFs", "LO-FI > diagonal methods (App. D.2)",
              f"LO-FI {mean[LOFI]:.3f}, {best_diag} (better of FD/VD) {mean[best_diag]:.3f}",
              mean[LOFI] < mean[best_diag]),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [2.2, 1]})
    steps = np.arange(1, curves[FC].shape[1] + 1)
    for m in methods:
        axes[0].plot(steps, np.nanmean(curves[m], axis=0), lw=1, label=m)
    for j in range(1, cfg["regimes"]):
        axes[0].axvline(j * n, color="k", lw=0.5, ls=":")
    axes[0].set(xlabel="observations", ylabel="current-regime test RMSE", yscale="log",
                title=f"1-d piecewise-stationary regression, MLP 1-50-1 (P = {model.n_params}), {cfg['seeds']} seed(s)")
    axes[0].legend(fontsize=7, ncol=2)
    rng = np.random.default_rng([2023, 1, 0])
    last = drift_data(cfg["regimes"], cfg["n_train"], cfg["n_test"], rng)[-1]
    axes[1].scatter(last[2][:, 0], last[3][:, 0], s=5, c="k", label="test data")
    grid = np.linspace(last[2].min(), last[2].max(), 200)
    for m in (FC, LOFI, VD, best_grad):
        if m in fits:
            axes[1].plot(grid, fits[m], lw=1, label=m)
    axes[1].set(xlabel="x", ylabel="y", title="end of the last regime (seed 0)")
    axes[1].legend(fontsize=7)
    res = {"hparams": hps, "selection": selection, "summary": summary, "failures": errors,
           "model": "MLP 1-50-1 tanh", "P": model.n_params, **cfg}
    return res, checks, [savefig(fig, outdir, "lofi_drift_1d.png")]


# ---------------------------------------------------------------------------------------------
# L2-L4: digits classification (stand-ins for the Fashion-MNIST experiments of section 4.1)


def _digits_data():
    """One fixed split of the 1797 digits: a pool of 1300 for streams and tuning, 497 for testing."""
    X, y = digits()
    Xp, yp, Xte, yte = split(X, y, 1300, np.random.default_rng([2023, 0]))
    return Xp, yp, Xte, yte


def _class_run(learner, prior_var, theta0, X, Y, Xte, yte, every):
    """Stream (X, Y) through ``learner``; plugin test NLL and error every ``every`` steps.
    Returns (curve (k, 3) rows [n, nll, err], final belief)."""
    model, rec = learner.model, []

    def cb(t, bp, b, x, y):
        if (t + 1) % every == 0 or t + 1 == len(X):
            rec.append((t + 1, *plugin_metrics(model, b.mean, Xte, yte)))

    bel = learner.init(theta0, prior_var) if prior_var is not None else learner.init(theta0)
    bel, _ = learner.scan(bel, X, Y, callback=cb)
    return np.array(rec), bel


def _probit_metrics(learner, bel, Xte, yte):
    """(NLPD, error) of the generalised-probit predictive (eqs 64-66) on the test set."""
    probs = np.array([learner.predict_obs(bel, x, method="probit")[0] for x in Xte])
    return class_metrics(np.log(np.maximum(probs, 1e-300)), yte)


def digits_stationary(quick, hps, tune, outdir):
    plt = _pyplot()
    cfg = CONFIG[quick]["digits"]
    model, lik = rb.MLP(cfg["sizes"], activation="relu"), rb.Categorical(10)
    Xp, yp, Xte, yte = _digits_data()
    methods = [LOFI, SGD, ADAM, FD, VD, OGD]
    selection = {}
    if tune:
        rng = np.random.default_rng([2023, 2, 99])
        Xs, ys, Xv, yv = split(Xp, yp, cfg["tune_stream"], rng)
        Xv, yv = Xv[:500], yv[:500]
        theta0 = model.init_params(rng)
        hps = {}
        for m in methods:
            grid = GRIDS["digits"]["filter" if m in (LOFI, FD, VD) else m]

            def score(hp, m=m):
                learner, pv = _build(m, model, lik, hp)
                return _class_run(learner, pv, theta0, Xs, ys, Xv, yv, len(Xs))[0][-1, 1]

            hps[m], selection[m] = _select(grid, score)
    curves, probit, errors, ablation_input = {m: [] for m in methods}, {m: [] for m in (LOFI, FD, VD)}, {}, None
    finals = {}  # seed 0: (learner, final belief) of each Gaussian filter, for the probit explanation
    for s in range(cfg["seeds"]):
        rng = np.random.default_rng([2023, 2, s])
        order = rng.permutation(len(yp))[: cfg["n_stream"]]
        X, Y = Xp[order], yp[order]
        theta0 = model.init_params(rng)
        if s == 0:
            ablation_input = (X, Y, theta0)
        for m in methods:
            learner, pv = _build(m, model, lik, hps[m])
            out, err = _attempt(lambda: _class_run(learner, pv, theta0, X, Y, Xte, yte, cfg["every"]))
            if err:
                errors[f"{m} seed {s}"] = err
                continue
            curves[m].append(out[0])
            if m in probit:
                probit[m].append(_probit_metrics(learner, out[1], Xte, yte))
            if s == 0 and m in probit:
                finals[m] = (learner, out[1])
            if s == 0 and m == LOFI:
                ablation_input += (out[0],)
    mean_curves = {m: np.mean(v, axis=0) for m, v in curves.items() if v}
    nan = float("nan")
    summary = {m: {"error_auc": float(c[:, 2].mean()) if m in mean_curves else nan,
                   "final_error": float(c[-1, 2]) if m in mean_curves else nan,
                   "final_nll": float(c[-1, 1]) if m in mean_curves else nan}
               for m in methods for c in [mean_curves.get(m)]}
    for m, v in probit.items():
        if v:
            summary[m]["probit_nlpd"], summary[m]["probit_error"] = (float(a) for a in np.mean(v, axis=0))
    auc = {m: summary[m]["error_auc"] for m in methods}
    nll = {m: summary[m]["final_nll"] for m in methods}
    worst3 = min(FD, VD, OGD, key=lambda m: auc[m])
    checks = [
        check("digits stationary: LO-FI(10) more sample-efficient than SGD-RB(sgd)",
              "LO-FI > SGD-RB sgd (section 4.1, fig. 1)", f"mean test error along the stream: {_fmt({LOFI: auc[LOFI], SGD: auc[SGD]})}",
              auc[LOFI] < auc[SGD], explain=lambda: _stream_gap(mean_curves, 2, "test error", cfg)),
        check("digits stationary: SGD-RB(sgd) better than SGD-RB(adam)", "SGD-RB sgd > SGD-RB adam (fig. 1)",
              _fmt({SGD: auc[SGD], ADAM: auc[ADAM]}), auc[SGD] < auc[ADAM]),
        check("digits stationary: SGD-RB(adam) better than FDEKF, VDEKF and OGD",
              "SGD-RB adam > {FDEKF, VDEKF, OGD} (fig. 1)", _fmt({ADAM: auc[ADAM], FD: auc[FD], VD: auc[VD], OGD: auc[OGD]}),
              auc[ADAM] < auc[worst3]),
        check("digits stationary: LO-FI has the lowest final test NLL", "LO-FI best, larger gaps in NLL (fig. 1)",
              _fmt(nll), nll[LOFI] <= min(nll.values()),
              explain=lambda: _stream_gap(mean_curves, 1, "test NLL", cfg, rival=min(nll, key=nll.get))),
    ]
    if all(probit[m] for m in probit):
        pn = {m: summary[m]["probit_nlpd"] for m in probit}
        best = min(FD, VD, key=lambda m: pn[m])
        gap_nlpd, gap_nll = pn[best] - pn[LOFI], nll[best] - nll[LOFI]
        checks += [
            check("digits stationary: LO-FI has the lowest probit NLPD of the Gaussian filters",
                  "LO-FI best in NLPD (fig. 2)", _fmt(pn), pn[LOFI] < pn[best]),
            check("digits stationary: probit NLPD narrows the gap between LO-FI and the diagonal EKFs",
                  "NLPD narrows the gaps (fig. 2)",
                  f"{best} minus LO-FI: plugin NLL {gap_nll:.3f}, probit NLPD {gap_nlpd:.3f}", gap_nlpd < gap_nll,
                  explain=lambda: _probit_explanation(curves, probit, finals, best, model, Xte, yte)),
        ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for m, c in mean_curves.items():
        axes[0].plot(c[:, 0], c[:, 2], "o-", ms=3, label=m)
        axes[1].plot(c[:, 0], c[:, 1], "o-", ms=3, label=m)
    axes[0].set(xlabel="training examples", ylabel="test error (plugin)")
    axes[1].set(xlabel="training examples", ylabel="test NLL (plugin)", yscale="log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"stationary digits, MLP {cfg['sizes']} (P = {model.n_params}), mean of {cfg['seeds']} seed(s)")
    res = {"hparams": hps, "selection": selection, "summary": summary, "failures": errors,
           "P": model.n_params, **cfg}
    return res, checks, [savefig(fig, outdir, "lofi_digits_stationary.png")], ablation_input


def _stream_gap(mean_curves, col, label, cfg, rival=SGD):
    """Set-up difference (stream length): LO-FI's gap to ``rival`` in column ``col`` of the stream curves,
    at the first evaluation, half-way and at the end; supported when the gap at the end is less than half
    the gap half-way (the claim moves towards holding as the stream grows)."""
    a, b = mean_curves[LOFI], mean_curves[rival]
    gap = a[:, col] - b[:, col]
    k = len(gap) // 2
    return explanation(
        "setup", f"stream length: {cfg['n_stream']} digits in quick mode (full mode 1300; the paper streams "
        f"Fashion-MNIST's 60,000 images); LO-FI starts slower and catches up along the stream",
        f"LO-FI minus {rival} {label}: {gap[0]:+.3f} after {int(a[0, 0])}, {gap[k]:+.3f} after {int(a[k, 0])}, "
        f"{gap[-1]:+.3f} after {int(a[-1, 0])} examples", gap[-1] < 0.5 * gap[k] and gap[k] > 0)


def _probit_explanation(curves, probit, finals, rival, model, Xte, yte, n_points=100, n_samples=300):
    """Does not carry over: after this short stream every Gaussian filter's posterior predictive is worse
    than its plugin (the posteriors are broad), so the predictive widens, not narrows, the gaps.

    curves: {method: [per-seed stream curves (k, 3)]}; probit: {method: [per-seed (NLPD, error)]};
    finals: {method: (learner, final belief)} of seed 0; rival: the diagonal EKF of the check.
    Cross-check that the generalised probit (LO-FI paper eqs 64-66, an approximation of the linearised
    predictive; tested against its dense formula, docs/lofi.md §9 T13)
    is not the cause: the linearised predictive integral itself, by Monte Carlo over the belief
    (``n_samples`` draws, first ``n_points`` test digits), is also worse than the plugin for LO-FI and
    ``rival``. Supported when the probit NLPD exceeds the plugin NLL for every filter in every seed and
    the linearised Monte Carlo NLPD exceeds the plugin NLL for both filters of the check.
    """
    worse = {m: [p[0] - c[-1, 1] for p, c in zip(probit[m], curves[m])] for m in probit}
    X, y = Xte[:n_points], yte[:n_points]
    rng = np.random.default_rng([2023, 6])
    mc, var = {}, {}
    for m in (m for m in (LOFI, rival) if m in finals):
        learner, bel = finals[m]
        plug = plugin_metrics(model, bel.mean, X, y)[0]
        probs = learner.predict_obs(bel, X, method="linearized-mc", rng=rng, n_samples=n_samples)[0]
        prob = _probit_metrics(learner, bel, X, y)[0]
        mc[m] = (plug, prob, class_metrics(np.log(np.maximum(probs, 1e-300)), y)[0])
        J = np.concatenate([model.value_and_jacobian(bel.mean, x)[1] for x in X[:10]])
        var[m] = float(np.mean(np.diag(bel.project(J))))
    per_seed = "; ".join(f"{m} " + ", ".join(f"{w:+.3f}" for w in v) for m, v in worse.items())
    return explanation(
        "does-not-carry-over", "the predictive integral helps only when the posterior is narrow; after this short "
        "stream every filter's probit NLPD is worse than its plugin NLL, the diagonal EKFs' most, so the gaps widen; "
        "the probit approximation is not the cause: the linearised predictive it approximates, integrated by "
        "Monte Carlo, is also worse than the plugin",
        f"probit NLPD minus plugin NLL per seed: {per_seed}; on {n_points} test digits (seed 0), plugin / probit / "
        f"linearised MC ({n_samples} draws): " + "; ".join(f"{m} {a:.3f} / {b:.3f} / {c:.3f}" for m, (a, b, c) in mc.items())
        + "; mean logit variance [J Sigma J^T]_kk: " + ", ".join(f"{m} {v:.2g}" for m, v in var.items()),
        all(w > 0 for v in worse.values() for w in v) and len(mc) == 2 and all(c > a for a, _, c in mc.values()))


def rank_ablation(quick, hps, model_sizes, ablation_input, outdir):
    plt = _pyplot()
    ranks = CONFIG[quick]["ranks"]
    model, lik = rb.MLP(model_sizes, activation="relu"), rb.Categorical(10)
    _, _, Xte, yte = _digits_data()
    X, Y, theta0 = ablation_input[:3]
    every = CONFIG[quick]["digits"]["every"]
    curves, errors = {}, {}
    for L in sorted(set([0] + ranks)):
        if L == RANK and len(ablation_input) > 3:
            curves[L] = ablation_input[3]
            continue
        learner, pv = _build(LOFI, model, lik, hps[LOFI], rank=L)
        out, err = _attempt(lambda: _class_run(learner, pv, theta0, X, Y, Xte, yte, every))
        if err:
            errors[L] = err
            continue
        curves[L] = out[0]
    final = {L: {"final_nll": float(c[-1, 1]), "final_error": float(c[-1, 2]), "error_auc": float(c[:, 2].mean())}
             for L, c in curves.items()}
    nll = {L: final[L]["final_nll"] if L in final else float("nan") for L in sorted(set([0] + ranks))}
    top = max(ranks)
    gain_low, gain_high = nll[1] - nll[RANK], nll[RANK] - nll[top]
    checks = [
        check("digits rank ablation: L = 10 better than L = 1", "larger rank is better (fig. 3)",
              f"final test NLL L=1 {nll[1]:.3f}, L=10 {nll[RANK]:.3f}", nll[RANK] < nll[1]),
        check(f"digits rank ablation: plateau after L = 10 (|NLL change 10 -> {top}| < half the gain 1 -> 10)",
              "plateau near L = 10 (fig. 3)", f"gain 1->10 {gain_low:.3f}, gain 10->{top} {gain_high:.3f}",
              gain_low > 0 and abs(gain_high) < 0.5 * gain_low),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    Ls = sorted(final)
    axes[0].plot(Ls, [final[L]["final_nll"] for L in Ls], "o-")
    axes[1].plot(Ls, [final[L]["final_error"] for L in Ls], "o-")
    axes[0].set(xlabel="rank L (0 = VDEKF)", ylabel="final test NLL")
    axes[1].set(xlabel="rank L (0 = VDEKF)", ylabel="final test error")
    fig.suptitle(f"LO-FI rank ablation, digits MLP {model_sizes}, {len(X)} examples, seed 0")
    return {"final": final, "failures": errors, "prior_var": hps[LOFI]["prior_var"]}, checks, \
        [savefig(fig, outdir, "lofi_rank_ablation.png")]


def _permuted_tasks(Xtr_pool, ytr_pool, Xte_pool, yte_pool, n_tasks, n_train, n_test, rng):
    """Tasks (X, y, X_test, y_test), each with its own fixed random pixel permutation."""
    tasks = []
    for _ in range(n_tasks):
        perm = rng.permutation(Xtr_pool.shape[1])
        i = rng.choice(len(ytr_pool), n_train, replace=False)
        j = rng.choice(len(yte_pool), n_test, replace=False)
        tasks.append((Xtr_pool[i][:, perm], ytr_pool[i], Xte_pool[j][:, perm], yte_pool[j]))
    return tasks


def _permuted_run(learner, prior_var, theta0, tasks, every):
    """Current-task test error every ``every`` steps over a sequence of tasks: (n_tasks, k)."""
    model = learner.model
    bel = learner.init(theta0, prior_var) if prior_var is not None else learner.init(theta0)
    errs = []
    for X, Y, Xte, yte in tasks:
        def cb(t, bp, b, x, y, Xte=Xte, yte=yte):
            return plugin_metrics(model, b.mean, Xte, yte)[1] if (t + 1) % every == 0 else None

        bel, hist = learner.scan(bel, X, Y, callback=cb)
        errs.append([e for e in hist["callback"] if e is not None])
    return np.array(errs)


def permuted(quick, hps, qs, tune, outdir):
    plt = _pyplot()
    cfg, sizes = CONFIG[quick]["permuted"], CONFIG[quick]["digits"]["sizes"]
    model, lik = rb.MLP(sizes, activation="relu"), rb.Categorical(10)
    Xp, yp, Xte, yte = _digits_data()
    selection = {}
    if tune:
        rng = np.random.default_rng([2023, 4, 99])
        Xa, ya, Xb, yb = split(Xp, yp, 800, rng)  # both halves from the pool; the test set is not used
        tasks = _permuted_tasks(Xa, ya, Xb, yb, cfg["tune_tasks"], cfg["n_train"], cfg["n_test"], rng)
        theta0 = model.init_params(rng)
        qs = {}
        for m in (LOFI, FD, VD):
            grid = [{**hps[m], "q": q} for q in ((() if m == LOFI else (0.0,)) + GRIDS["permuted"]["q"])]

            def score(hp, m=m):
                learner, pv = _build(m, model, lik, hp)
                return _permuted_run(learner, pv, theta0, tasks, cfg["every"]).mean()

            best, selection[m] = _select(grid, score)
            qs[m] = best["q"]
    runs = {f"{LOFI} q={qs[LOFI]:g}": (LOFI, {**hps[LOFI], "q": qs[LOFI]}),
            f"{LOFI} q=0": (LOFI, {**hps[LOFI], "q": 0.0}),
            SGD: (SGD, hps[SGD]), ADAM: (ADAM, hps[ADAM]),
            f"{FD} q={qs[FD]:g}": (FD, {**hps[FD], "q": qs[FD]}),
            f"{VD} q={qs[VD]:g}": (VD, {**hps[VD], "q": qs[VD]}),
            OGD: (OGD, hps[OGD])}
    curves, errors = {k: [] for k in runs}, {}
    for s in range(cfg["seeds"]):
        rng = np.random.default_rng([2023, 4, s])
        tasks = _permuted_tasks(Xp, yp, Xte, yte, cfg["tasks"], cfg["n_train"], cfg["n_test"], rng)
        theta0 = model.init_params(rng)
        for name, (m, hp) in runs.items():
            learner, pv = _build(m, model, lik, hp)
            out, err = _attempt(lambda: _permuted_run(learner, pv, theta0, tasks, cfg["every"]))
            if err:
                errors[f"{name} seed {s}"] = err
                continue
            curves[name].append(out)
    mean = {k: np.mean(v, axis=0) for k, v in curves.items() if v}  # (tasks, k)
    nan = float("nan")
    summary = {k: {"error_auc": float(mean[k].mean()) if k in mean else nan,
                   "error_after_first_eval": float(mean[k][:, 0].mean()) if k in mean else nan,
                   "final_error_per_task": mean[k][:, -1].tolist() if k in mean else []} for k in runs}
    auc = {k: summary[k]["error_auc"] for k in runs}
    lofi_q, lofi_0 = f"{LOFI} q={qs[LOFI]:g}", f"{LOFI} q=0"
    others = {k: v for k, v in auc.items() if not k.startswith(LOFI)}
    best_other = min(others, key=others.get)
    checks = [
        check("permuted digits: LO-FI (q > 0) has the lowest current-task error", "LO-FI adapts fastest (section 4.1, fig. 4)",
              f"mean current-task error {lofi_q} {auc[lofi_q]:.3f}; best other: {best_other} {auc[best_other]:.3f}",
              auc[lofi_q] < auc[best_other], explain=lambda: _task_end(summary, lofi_q, best_other, cfg)),
        check("permuted digits: q > 0 helps LO-FI", "process noise lets LO-FI forget (section 3.4)",
              f"{lofi_q} {auc[lofi_q]:.3f}, {lofi_0} {auc[lofi_0]:.3f}", auc[lofi_q] < auc[lofi_0],
              explain=lambda: _task_end(summary, lofi_q, lofi_0, cfg)),
    ]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    n_eval = next(iter(mean.values())).shape[1] if mean else 0
    x = np.arange(1, cfg["tasks"] * n_eval + 1) * cfg["every"]
    for k, v in mean.items():
        ax.plot(x, v.ravel(), lw=1, label=k)
    for j in range(1, cfg["tasks"]):
        ax.axvline(j * cfg["n_train"], color="k", lw=0.5, ls=":")
    ax.set(xlabel="training examples", ylabel="current-task test error",
           title=f"permuted digits, {cfg['tasks']} tasks x {cfg['n_train']}, MLP {sizes}, {cfg['seeds']} seed(s)")
    ax.legend(fontsize=7, ncol=2)
    res = {"q": qs, "selection": selection, "summary": summary, "failures": errors, **cfg}
    return res, checks, [savefig(fig, outdir, "lofi_permuted.png")]


def _task_end(summary, a, b, cfg):
    """Set-up difference (task length): ``a`` loses on the mean error along each task but is ahead by the
    end of most tasks, so the claim moves towards holding with the paper's longer tasks."""
    ea, eb = summary[a]["final_error_per_task"], summary[b]["final_error_per_task"]
    ahead = sum(x < y for x, y in zip(ea, eb))
    return explanation(
        "setup", f"task length: {cfg['tasks']} tasks of {cfg['n_train']} digits here (the paper's permuted "
        f"Fashion-MNIST tasks are far longer); {a} is slower in the first evaluations of a task and ahead "
        f"by its end", f"error at the end of each task: {a} {', '.join(f'{x:.3f}' for x in ea)}; "
        f"{b} {', '.join(f'{x:.3f}' for x in eb)} ({a} ahead in {ahead} of {len(ea)}); after the first "
        f"evaluation of a task: {summary[a]['error_after_first_eval']:.3f} vs {summary[b]['error_after_first_eval']:.3f}",
        2 * ahead > len(ea))


# ---------------------------------------------------------------------------------------------
# L5: load_diabetes as a UCI-style regression (App. D.1)


def _diabetes_split(X, y, n_train, rng):
    idx = rng.permutation(len(y))
    tr, te = idx[:n_train], idx[n_train:]
    xm, xs, ym, ys = X[tr].mean(0), X[tr].std(0), y[tr].mean(), y[tr].std()
    return (X[tr] - xm) / xs, ((y[tr] - ym) / ys)[:, None], (X[te] - xm) / xs, ((y[te] - ym) / ys)[:, None]


def _regression_fit(m, model, hp, theta0, Xtr, Ytr, Xte, Yte):
    """One pass of method m over the training data: (test RMSE, linearised NLPD)."""
    learner, pv = _build(m, model, rb.Gaussian(1.0), hp)
    bel, _ = learner.scan(learner.init(theta0, pv), Xtr, Ytr)
    rmse = np.sqrt(_mse(model.apply_batch(bel.mean, Xte), Yte))
    nlpd = -np.mean([predictive.log_predictive(learner.likelihood, yy, *learner.predict_obs(bel, xx, "linearized"))
                     for xx, yy in zip(Xte, Yte)])
    return float(rmse), float(nlpd)


def _diabetes_tune(model, X, y, n_train, grids):
    """Each method's hyper-parameters by the held-out protocol: on the training part of split 0, fit on the
    first 80% and score the linearised NLPD on the last 20% (``_select``).

    grids: {method: list of hyper-parameter dicts}. Returns ({method: chosen dict}, {method: score table}).
    """
    rng = np.random.default_rng([2023, 5, 0])
    Xtr, Ytr, _, _ = _diabetes_split(X, y, n_train, rng)
    theta0 = model.init_params(rng)
    k = int(round(0.8 * len(Ytr)))
    chosen, tables = {}, {}
    for m, grid in grids.items():
        chosen[m], tables[m] = _select(
            grid, lambda hp, m=m: _regression_fit(m, model, hp, theta0, Xtr[:k], Ytr[:k], Xtr[k:], Ytr[k:])[1])
    return chosen, tables


def _diabetes_scores(model, X, y, n_train, hps, n_splits):
    """One pass of each method over each of ``n_splits`` random 90/10 splits (seeds [2023, 5, s]).

    hps: {method: hyper-parameters}. Returns ({method: (n_splits, 2) array of (test RMSE, linearised NLPD),
    NaN where the method failed}, {"<method> split <s>": error message}).
    """
    scores, errors = {m: [] for m in hps}, {}
    for s in range(n_splits):
        rng = np.random.default_rng([2023, 5, s])
        Xtr, Ytr, Xte, Yte = _diabetes_split(X, y, n_train, rng)
        theta0 = model.init_params(rng)
        for m, hp in hps.items():
            out, err = _attempt(lambda m=m, hp=hp: _regression_fit(m, model, hp, theta0, Xtr, Ytr, Xte, Yte))
            if err:
                errors[f"{m} split {s}"] = err
            scores[m].append((np.nan, np.nan) if err else out)
    return {m: np.array(v, dtype=float) for m, v in scores.items()}, errors


def diabetes(quick, hps, tune, outdir):
    plt = _pyplot()
    from sklearn.datasets import load_diabetes

    cfg = CONFIG[quick]["diabetes"]
    data = load_diabetes()
    X, y = data.data, data.target.astype(float)
    n_train = int(round(0.9 * len(y)))
    model = rb.MLP(cfg["sizes"], activation="relu")
    methods = [FC, LOFI, SPH, FD, VD]
    selection = {}
    if tune:
        hps, selection = _diabetes_tune(model, X, y, n_train, {m: GRIDS["diabetes"]["filter"] for m in methods})
    sc, errors = _diabetes_scores(model, X, y, n_train, {m: hps[m] for m in methods}, cfg["splits"])
    summary = {m: {"rmse": float(np.nanmean(v[:, 0])), "rmse_se": _se(v[:, 0]),
                   "nlpd": float(np.nanmean(v[:, 1])), "nlpd_se": _se(v[:, 1])} for m, v in sc.items()}
    rmse = {m: summary[m]["rmse"] for m in methods}
    nlpd = {m: summary[m]["nlpd"] for m in methods}
    ranked = np.argsort(np.stack([sc[m][:, 0] for m in (FC, LOFI, FD, VD)], axis=1), axis=1)
    lofi_first, lofi_second = float(np.mean(ranked[:, 0] == 1)), float(np.mean(ranked[:, 1] == 1))
    rel = abs(rmse[SPH] / rmse[LOFI] - 1)
    checks = [
        check("diabetes: FCEKF has the lowest test RMSE", "FCEKF best (App. D.1, table 2)", _fmt(rmse), rmse[FC] <= min(rmse.values())),
        check("diabetes: FCEKF has the lowest linearised NLPD", "FCEKF best (table 3)", _fmt(nlpd), nlpd[FC] <= min(nlpd.values()),
              explain=lambda: _diabetes_nlpd_tie(model, X, y, n_train, hps, sc, cfg)),
        check("diabetes: LO-FI beats FDEKF and VDEKF in RMSE", "LO-FI usually second (tables 2-3)",
              _fmt({LOFI: rmse[LOFI], FD: rmse[FD], VD: rmse[VD]}), rmse[LOFI] < min(rmse[FD], rmse[VD])),
        check("diabetes: LO-FI second in RMSE (after FCEKF) in at least half the splits", "LO-FI usually second",
              f"second in {100 * lofi_second:.0f}%, first in {100 * lofi_first:.0f}% of {cfg['splits']} splits "
              f"(ranks among FCEKF, LO-FI, FDEKF, VDEKF)", lofi_second >= 0.5,
              explain=lambda: _diabetes_tie(sc, summary, lofi_first, lofi_second, cfg)),
        check("diabetes: spherical LO-FI within 5% of diagonal LO-FI in RMSE", "spherical ~ diagonal (App. D.1)",
              f"{SPH} {rmse[SPH]:.3f}, {LOFI} {rmse[LOFI]:.3f} ({100 * rel:.1f}%)", rel < 0.05),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, j, label in ((axes[0], 0, "test RMSE"), (axes[1], 1, "test NLPD (linearised)")):
        ax.boxplot([sc[m][:, j][np.isfinite(sc[m][:, j])] for m in methods])
        ax.set_xticks(range(1, len(methods) + 1), methods, fontsize=8)
        ax.set(ylabel=label)
    fig.suptitle(f"load_diabetes, MLP {cfg['sizes']} (P = {model.n_params}), one pass, {cfg['splits']} random 90/10 splits")
    res = {"hparams": hps, "selection": selection, "summary": summary, "failures": errors,
           "lofi_first_fraction": lofi_first, "lofi_second_fraction": lofi_second, "P": model.n_params, **cfg}
    return res, checks, [savefig(fig, outdir, "lofi_diabetes.png")]


# the observation-variance values of the finer search in the diabetes NLPD explanation (the grid has 0.3 and 1.0)
FINE_OBS_VAR = (0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


def _diabetes_nlpd_tie(model, X, y, n_train, hps, sc, cfg):
    """Does not carry over: on load_diabetes the methods that end below FCEKF in mean NLPD are statistically
    tied with it, at the grid's observation variance and again when each of them (and FCEKF) re-chooses its
    obs_var from ``FINE_OBS_VAR`` (prior variance kept) on the same held-out part of the first training split;
    the paper itself cautions that the UCI error bars overlap a lot (App. D.1).

    sc: {method: (splits, 2) array of (RMSE, NLPD)} of the reported run. Supported when, for every method below
    FCEKF, the paired NLPD difference to FCEKF is within two standard errors in both settings."""
    nlpd = {m: float(np.nanmean(v[:, 1])) for m, v in sc.items()}
    rivals = [m for m in nlpd if m != FC and nlpd[m] < nlpd[FC]]
    methods = [FC] + rivals
    fine, _ = _diabetes_tune(model, X, y, n_train,
                             {m: [{**hps[m], "obs_var": r} for r in FINE_OBS_VAR] for m in methods})
    again, _ = _diabetes_scores(model, X, y, n_train, fine, cfg["splits"])

    def paired(a, b):
        d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
        d = d[np.isfinite(d)]
        return (float(d.mean()), _se(d)) if len(d) > 1 else (np.nan, np.nan)

    rows, tied = [], True
    for m in rivals:
        for label, a, b in (("grid", sc[m][:, 1], sc[FC][:, 1]), ("finer obs_var", again[m][:, 1], again[FC][:, 1])):
            mean, se = paired(a, b)
            tied = tied and bool(np.isfinite(mean) and abs(mean) <= 2 * se)
            rows.append(f"{m} - FCEKF ({label}): {mean:+.4f} (standard error {se:.4f})")
    return explanation(
        "does-not-carry-over", "on load_diabetes the filters' linearised NLPDs are within noise of one another: the "
        "methods below FCEKF are tied with it split by split, with the grid's obs_var and with obs_var re-chosen "
        "from a finer grid (where the order between them changes), as the paper's overlapping UCI error bars also show",
        "obs_var re-chosen from " + ", ".join(f"{r:g}" for r in FINE_OBS_VAR) + ": "
        + ", ".join(f"{m} {fine[m]['obs_var']:g}" for m in methods) + f"; mean NLPD over the {cfg['splits']} splits "
        "(grid -> finer obs_var): " + ", ".join(f"{m} {nlpd[m]:.3f} -> {np.nanmean(again[m]):.3f}" for m in methods)
        + "; paired differences: " + "; ".join(rows),
        bool(rivals) and tied)


def _diabetes_tie(sc, summary, first, second, cfg):
    """Does not carry over: here LO-FI ties FCEKF (first about as often as second), so 'usually second'
    fails by LO-FI doing better, not worse; supported when LO-FI is in the top two in at least half the
    splits and its mean RMSE is within two standard errors of FCEKF's paired difference."""
    d = sc[LOFI][:, 0] - sc[FC][:, 0]
    d = d[np.isfinite(d)]
    se = _se(d) if len(d) > 1 else float("inf")
    return explanation(
        "does-not-carry-over", "on load_diabetes with this network LO-FI and FCEKF are statistically tied: LO-FI "
        "is first about as often as second, so it is not 'usually second'", f"LO-FI first in {100 * first:.0f}%, "
        f"second in {100 * second:.0f}% of {cfg['splits']} splits; paired RMSE difference LO-FI - FCEKF "
        f"{d.mean():+.4f} (standard error {se:.4f})",
        first + second >= 0.5 and abs(d.mean()) <= 2 * se)


# ---------------------------------------------------------------------------------------------


def run(quick=False, outdir=".", tune=None):
    """Run L1-L5; write ``lofi.json`` and the PNGs into ``outdir``.

    quick: smaller models and streams, fixed hyper-parameters (``QUICK_HP``).
    tune: search the grids (default: in full mode only).
    """
    tune = (not quick) if tune is None else bool(tune)
    stationary = {}  # what L3 and L4 take from L2: its hyper-parameters, and the stream of the rank ablation

    def digits_part():
        res, checks, figures, stationary["ablation_input"] = digits_stationary(quick, QUICK_HP["digits"], tune, outdir)
        stationary["hps"] = res["hparams"]
        return res, checks, figures

    sizes = CONFIG[quick]["digits"]["sizes"]
    parts = (("L1_drift_1d", lambda: drift(quick, QUICK_HP["drift"], tune, outdir)),
             ("L2_digits_stationary", digits_part),
             ("L3_rank_ablation",
              lambda: rank_ablation(quick, stationary["hps"], sizes, stationary["ablation_input"], outdir)),
             ("L4_permuted_digits", lambda: permuted(quick, stationary["hps"], QUICK_HP["permuted"], tune, outdir)),
             ("L5_diabetes", lambda: diabetes(quick, QUICK_HP["diabetes"], tune, outdir)))
    out = run_parts(parts, outdir, "lofi.json", extra={"mode": "quick" if quick else "full", "tuned": tune},
                    json_default=_jsonable)
    out["defaults"] = DEFAULTS
    return out


def _jsonable(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.integer,)):
        return int(x)
    return float(x)
