"""Chang, Jones & Murphy (2022), diagonal EKFs, on offline data.

V1 digits MLP: FC / FD / VD-EKF and one-pass SGD, test NLL and error under
   plugin and Monte Carlo predictives (stand-in for the paper's MNIST MLP, fig. 4).
V2 two spirals, MLP 2-20-20-1, Bernoulli (the paper's fig. 3 toy).
V3 linear regression y = 1 + 0.5 x + noise: FC-EKF must equal the conjugate posterior.
V4 seconds per step against P for FC / FD / VD.
"""

import time

import numpy as np  # noqa: E402

import refbayes as rb  # noqa: E402
from refbayes import exact  # noqa: E402

from ._mpl import pyplot as _pyplot  # noqa: E402
from .common import check, digits, explanation, run_parts, mc_metrics, plugin_metrics, savefig, sgd_pass, split  # noqa: E402


def _filters(model, lik):
    return {
        "FC-EKF": rb.FullEKF(model, lik),
        "FD-EKF": rb.FDEKF(model, lik),
        "VD-EKF": rb.VDEKF(model, lik, vd_mean="paper"),
    }


# The prior variances of the authors' code (Chang, Jones & Murphy 2022: CNN FD 0.03, VD 0.065; MLP FC 0.01),
# grid-searched there on a validation split of MNIST for a 784-input network.
PAPER_PRIOR_VAR = {"FC-EKF": 0.01, "FD-EKF": 0.03, "VD-EKF": 0.065}
PRIOR_VAR_GRID = (0.01, 0.03, 0.1, 0.3)
# What the same protocol (a grid search on a validation split of the training examples, tune_prior_var)
# picks for the quick network 64-10-10; run(quick=True, tune=True) repeats the search.
QUICK_PRIOR_VAR = {"FC-EKF": 0.3, "FD-EKF": 0.1, "VD-EKF": 0.1}
TARGET_ERROR = 0.15


def tune_prior_var(sizes, Xtr, ytr, rng, grid=PRIOR_VAR_GRID):
    """The paper's protocol for sigma0^2: one pass over 80% of the training examples, the plugin NLL on the
    other 20%, the grid point with the lowest NLL per filter. Returns ({filter: prior_var}, table)."""
    n = int(0.8 * len(ytr))
    model, lik = rb.MLP(sizes, activation="relu"), rb.Categorical(10)
    theta0 = model.init_params(rng)
    chosen, table = {}, {}
    for name, filt in _filters(model, lik).items():
        scores = {}
        for v in grid:
            try:
                with np.errstate(all="ignore"):
                    bel, _ = filt.scan(filt.init(theta0, v), Xtr[:n], ytr[:n])
                scores[v] = plugin_metrics(model, bel.mean, Xtr[n:], ytr[n:])[0]
            except (rb.DivergenceError, rb.NotPositiveDefiniteError, np.linalg.LinAlgError, FloatingPointError):
                scores[v] = float("inf")
            if not np.isfinite(scores[v]):
                scores[v] = float("inf")
        chosen[name], table[name] = min(scores, key=scores.get), scores
    return chosen, table


def _longer_stream_errors(sizes, prior_var, names, X, y, n_short, rng):
    """Test (NLL, error) of each filter (and SGD) in ``names`` after one pass over n_short, over half of the
    longest stream and over all but 497 of the digits (the longest stream the data allow), on a new split
    with new initial weights. Returns ({name: {n: (NLL, error)}}, n_long); with n_short = n_long (full mode)
    the half stream is what shows whether the error still falls with the stream."""
    n_long = len(y) - 497
    Xtr, ytr, Xte, yte = split(X, y, n_long, rng)
    model, lik = rb.MLP(sizes, activation="relu"), rb.Categorical(10)
    theta0 = model.init_params(rng)
    filts = _filters(model, lik)
    out = {}
    for name in names:
        row = {}
        for n in sorted({n_short, n_long // 2, n_long}):
            if name == "SGD":
                theta = sgd_pass(model, lik, theta0, Xtr[:n], ytr[:n], lr=0.01, momentum=0.2)
            else:
                f = filts[name]
                theta = f.scan(f.init(theta0, prior_var[name]), Xtr[:n], ytr[:n])[0].mean
            row[n] = plugin_metrics(model, theta, Xte, yte)  # (NLL, error)
        out[name] = row
    return out, n_long


def digits_mlp(quick, rng, outdir, tune=False):
    plt = _pyplot()
    X, y = digits()
    sizes = [64, 10, 10] if quick else [64, 25, 25, 25, 10]
    n_train, every, seeds = (500, 100, 1) if quick else (1300, 100, 5)
    n_mc = 20 if quick else 100
    prior_var = dict(QUICK_PRIOR_VAR if quick else PAPER_PRIOR_VAR)
    selection = None
    if tune:
        Xtr, ytr, _, _ = split(X, y, n_train, np.random.default_rng([2022, 99]))
        prior_var, selection = tune_prior_var(sizes, Xtr, ytr, np.random.default_rng([2022, 98]))
    curves = {}
    for s in range(seeds):
        Xtr, ytr, Xte, yte = split(X, y, n_train, rng)
        model = rb.MLP(sizes, activation="relu")
        lik = rb.Categorical(10)
        theta0 = model.init_params(rng)
        for name, filt in _filters(model, lik).items():
            rec = []

            def cb(t, bp, b, x, yy, rec=rec):
                if (t + 1) % every == 0:
                    rec.append((t + 1, *plugin_metrics(model, b.mean, Xte, yte),
                                *mc_metrics(model, b, Xte, yte, rng, n_mc)))

            filt.scan(filt.init(theta0, prior_var[name]), Xtr, ytr, callback=cb)
            curves.setdefault(name, []).append(rec)
        rec = []
        sgd_pass(model, lik, theta0, Xtr, ytr, lr=0.01, momentum=0.2,
                 callback=lambda t, th: rec.append((t + 1, *plugin_metrics(model, th, Xte, yte), np.nan, np.nan))
                 if (t + 1) % every == 0 else None)
        curves.setdefault("SGD", []).append(rec)
    mean = {k: np.mean(np.array(v, dtype=float), axis=0) for k, v in curves.items()}  # SGD has no MC columns (NaN)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for k, m in mean.items():
        axes[0].plot(m[:, 0], m[:, 1], label=f"{k} plugin")
        axes[1].plot(m[:, 0], m[:, 2], label=f"{k} plugin")
        if k != "SGD":
            axes[0].plot(m[:, 0], m[:, 3], "--", label=f"{k} MC")
            axes[1].plot(m[:, 0], m[:, 4], "--", label=f"{k} MC")
    axes[0].set(xlabel="training examples", ylabel="test NLL")
    axes[1].set(xlabel="training examples", ylabel="test error")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"digits MLP {sizes}, one pass, mean of {seeds} seed(s)")
    fig_name = savefig(fig, outdir, "digits_mlp.png")
    final = {k: {"nll_plugin": m[-1, 1], "err_plugin": m[-1, 2], "nll_mc": m[-1, 3], "err_mc": m[-1, 4]} for k, m in mean.items()}
    failing = [k for k in ("FC-EKF", "FD-EKF", "VD-EKF", "SGD") if final[k]["err_plugin"] >= TARGET_ERROR]
    longer = {}

    def ablation():
        # one ablation for every explanation: the methods on another split, over n_train and over the
        # longest stream the digits allow
        if not longer:
            names = sorted(set(failing) | {"FD-EKF", "VD-EKF"})
            longer.update(zip(("metrics", "n_long"), _longer_stream_errors(
                sizes, prior_var, names, X, y, n_train, np.random.default_rng([2022, 7]))))
        return longer["metrics"], longer["n_long"]

    def stream_length(k):
        m, n_long = ablation()
        e = {n: v[1] for n, v in m[k].items()}
        # the shorter stream compared: this run's, or half of the longest where this run already uses it all
        n_cmp = n_train if n_train < n_long else n_long // 2
        return explanation(
            "setup", f"stream length: one pass over {n_train} digits here, 60,000 MNIST images in the paper (whose "
            f"MLP reaches about 5.5% error there, Chang, Jones & Murphy 2022); the error keeps falling with "
            f"the stream", f"{k} test error {100 * e[n_cmp]:.1f}% after {n_cmp} and {100 * e[n_long]:.1f}% "
            f"after {n_long} examples (ablation on another split)",
            e[n_long] < e[n_cmp] - 0.02)

    def more_seeds():
        if seeds > 1:
            return None
        m, _ = ablation()
        vd = (final["VD-EKF"]["nll_plugin"] + m["VD-EKF"][n_train][0]) / 2
        fd = (final["FD-EKF"]["nll_plugin"] + m["FD-EKF"][n_train][0]) / 2
        return explanation(
            "setup", "quick mode runs one split; the claim is about the mean over splits (the paper averages "
            "over seeds)",
            f"mean over this split and the ablation's: VD {vd:.3f}, FD {fd:.3f} "
            f"(ablation split alone: VD {m['VD-EKF'][n_train][0]:.3f}, FD {m['FD-EKF'][n_train][0]:.3f})", vd <= fd)

    checks = [
        check("digits: final NLL, VD <= FD (plugin)", "VD better than FD (paper figs 1, 2, 4)",
              f"VD {final['VD-EKF']['nll_plugin']:.3f}, FD {final['FD-EKF']['nll_plugin']:.3f}",
              final["VD-EKF"]["nll_plugin"] <= final["FD-EKF"]["nll_plugin"], explain=lambda: more_seeds()),
        check("digits: final NLL, VD <= one-pass SGD (plugin)", "VD better than SGD",
              f"VD {final['VD-EKF']['nll_plugin']:.3f}, SGD {final['SGD']['nll_plugin']:.3f}",
              final["VD-EKF"]["nll_plugin"] <= final["SGD"]["nll_plugin"]),
    ]
    for k in ("FC-EKF", "FD-EKF", "VD-EKF", "SGD"):
        checks.append(check(f"digits: {k} test error < 15%", "< 15% (target)",
                            f"{100 * final[k]['err_plugin']:.1f}%", final[k]["err_plugin"] < TARGET_ERROR,
                            explain=lambda k=k: stream_length(k)))
    res = {"final": final, "sizes": sizes, "n_train": n_train, "seeds": seeds, "prior_var": prior_var,
           "prior_var_selection": selection, "longer_stream": longer or None}
    return res, checks, [fig_name]


def spirals(n, rng):
    """Two interleaved spirals (r = 2 theta + pi), standardised; labels 0/1."""
    th = 2 * np.pi * np.sqrt(rng.uniform(size=n // 2))
    r = 2 * th + np.pi
    a = np.c_[r * np.cos(th), r * np.sin(th)] + rng.standard_normal((n // 2, 2))
    b = -np.c_[r * np.cos(th), r * np.sin(th)] + rng.standard_normal((n // 2, 2))
    X = np.r_[a, b]
    y = np.r_[np.zeros(n // 2, int), np.ones(n // 2, int)]
    idx = rng.permutation(n)
    X = (X - X.mean(0)) / X.std(0)
    return X[idx], y[idx]


def spiral_toy(quick, rng, outdir):
    plt = _pyplot()
    X, y = spirals(1000, rng)
    Xtr, ytr = X[:500], y[:500]
    model = rb.MLP([2, 20, 20, 1], activation="tanh")
    lik = rb.Bernoulli()
    theta0 = model.init_params(rng)
    grid = np.stack(np.meshgrid(np.linspace(-2.5, 2.5, 60), np.linspace(-2.5, 2.5, 60)), -1).reshape(-1, 2)
    errs, checks, ablation = {}, [], {}
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (name, filt) in zip(axes, _filters(model, lik).items()):
        bel, _ = filt.scan(filt.init(theta0, 1.0), Xtr, ytr)
        p = 1 / (1 + np.exp(-model.apply_batch(bel.mean, Xtr)[:, 0]))
        errs[name] = float(np.mean((p > 0.5) != ytr))
        pg = 1 / (1 + np.exp(-model.apply_batch(bel.mean, grid)[:, 0]))
        ax.contourf(grid[:, 0].reshape(60, 60), grid[:, 1].reshape(60, 60), pg.reshape(60, 60), levels=20, cmap="RdBu_r")
        ax.scatter(*Xtr.T, c=ytr, s=4, cmap="RdBu_r", edgecolors="k", linewidths=0.2)
        ax.set_title(f"{name} plugin, train error {100 * errs[name]:.1f}%")
        checks.append(check(f"spirals: {name} one-pass train error < 10%", "< 10% (target)",
                            f"{100 * errs[name]:.1f}%", errs[name] < 0.10,
                            explain=lambda name=name: _spiral_explanation(name, model, lik, ablation)))
    return {"train_error": errs, "ablation": ablation or None}, checks, [savefig(fig, outdir, "spirals.png")]


def _spiral_errors(name, model, lik, seed, n, q=0.0):
    """Train error on the first 500 points after one pass over the first n of a fresh spiral draw."""
    rng = np.random.default_rng([2022, 3, seed])
    X, y = spirals(max(n, 1000), rng)
    filt = {"FC-EKF": rb.FullEKF(model, lik, q=q), "FD-EKF": rb.FDEKF(model, lik, q=q),
            "VD-EKF": rb.VDEKF(model, lik, q=q, vd_mean="paper")}[name]
    with np.errstate(all="ignore"):
        bel, _ = filt.scan(filt.init(model.init_params(rng), 1.0), X[:n], y[:n])
    p = 1 / (1 + np.exp(-model.apply_batch(bel.mean, X[:500])[:, 0]))
    return float(np.mean((p > 0.5) != y[:500]))


def _spiral_explanation(name, model, lik, ablation):
    """A filter that misses the 10% target after 500 points: is it the seed, the authors' q, or the stream length?"""
    e = ablation[name] = {"500, seeds 0/1": [_spiral_errors(name, model, lik, s, 500) for s in (0, 1)],
                          "500, q=1e-4 (authors code)": _spiral_errors(name, model, lik, 0, 500, q=1e-4),
                          "2000": _spiral_errors(name, model, lik, 0, 2000)}
    at500 = e["500, seeds 0/1"] + [e["500, q=1e-4 (authors code)"]]
    return explanation(
        "does-not-carry-over",
        "the paper shows fig. 3 as pictures only; the 10% target after one pass over 500 points is not reached by "
        "this diagonal EKF on other draws or with the authors' q = 1e-4, but is with a longer stream, so the "
        "filter learns the spirals, only more slowly than FC-EKF",
        f"train error {', '.join(f'{100 * v:.1f}%' for v in e['500, seeds 0/1'])} on two more draws, "
        f"{100 * e['500, q=1e-4 (authors code)']:.1f}% with q = 1e-4, {100 * e['2000']:.1f}% after 2000 points",
        min(at500) >= 0.10 and e["2000"] < 0.10)


def linear_regression(quick, rng, outdir):
    out, checks = {}, []
    for n in (100, 200):
        x = rng.uniform(0, 1, n)
        yv = 1 + 0.5 * x + 0.1 * rng.standard_normal(n)
        X = np.c_[np.ones(n), x]
        model, lik = rb.Linear(2, 1, bias=False), rb.Gaussian(0.1)
        mean, cov = exact.blr_posterior(np.zeros(2), np.eye(2), X, yv, 0.1)
        res = {}
        for name, filt in _filters(model, lik).items():
            bel, _ = filt.scan(filt.init(np.zeros(2), 1.0), X, yv[:, None])
            res[name] = {"mean_err": float(np.abs(bel.mean - mean).max()),
                         "var_rel_err": float(np.abs(bel.marginal_variance() / np.diag(cov) - 1).max())}
        out[n] = res
        checks.append(check(f"linear regression n={n}: FC-EKF = conjugate posterior", "exact (max |diff| < 1e-9)",
                            f"{res['FC-EKF']['mean_err']:.1e}", res["FC-EKF"]["mean_err"] < 1e-9))
    return out, checks, []


def timing(quick, rng, outdir):
    plt = _pyplot()
    sizes = [(64, 4), (64, 8), (64, 32)] if quick else [(64, 8), (64, 32), (64, 128), (64, 512)]
    rows = []
    for d, h in sizes:
        model = rb.MLP([d, h, 10], activation="relu")
        lik = rb.Categorical(10)
        X, Y = rng.uniform(size=(10, d)), rng.integers(0, 10, 10)
        row = {"P": model.n_params}
        for name, filt in _filters(model, lik).items():
            if name == "FC-EKF" and model.n_params > 5000:  # O(P^2) memory and time
                continue
            bel = filt.init(model.init_params(rng), 0.05)
            start = time.perf_counter()
            filt.scan(bel, X, Y)
            row[name] = (time.perf_counter() - start) / len(X)
        rows.append(row)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name in ("FC-EKF", "FD-EKF", "VD-EKF"):
        pts = [(r["P"], r[name]) for r in rows if name in r]
        ax.loglog(*zip(*pts), "o-", label=name)
    ax.set(xlabel="P", ylabel="seconds per step (numpy reference)")
    ax.legend()
    return {"rows": rows}, [], [savefig(fig, outdir, "timing.png")]


def run(quick=False, outdir=".", tune=False):
    """Run V1-V4; write ``diagonal_ekf.json`` and the PNGs into ``outdir``.

    tune: pick the digits prior variances by the paper's validation-split protocol (``tune_prior_var``)
    instead of the fixed values (quick: ``QUICK_PRIOR_VAR``; full: the authors' code, ``PAPER_PRIOR_VAR``).
    """
    rng = np.random.default_rng(2022)
    parts = (("V1_digits_mlp", lambda: digits_mlp(quick, rng, outdir, tune)),
             ("V2_spirals", lambda: spiral_toy(quick, rng, outdir)),
             ("V3_linear_regression", lambda: linear_regression(quick, rng, outdir)),
             ("V4_timing", lambda: timing(quick, rng, outdir)))
    out = run_parts(parts, outdir, "diagonal_ekf.json", extra={"mode": "quick" if quick else "full"},
                    json_default=float)
    out["defaults"] = DEFAULTS
    return out


# Where the paper's text and the authors' code differ (Chang, Jones & Murphy 2022 and the authors' code).
DEFAULTS = [
    {"setting": "VD-EKF mean", "text": "mu_q = mu_p, the EKF mean (section A.2)",
     "code": "eq. 24-25: the gain uses the diagonal posterior", "follows": "code (vd_mean='paper'; 'ekf' is one argument away)"},
    {"setting": "what the EKF linearises (categorical)", "text": "h, the natural-parameter map (section 2.3)",
     "code": "the mean softmax(f), R evaluated at mu_{t|t-1}", "follows": "code"},
    {"setting": "digits prior variance sigma0^2", "text": "not given",
     "code": "grid search on a validation split (MLP FC 0.01, CNN FD 0.03, VD 0.065)",
     "follows": "code's protocol: full mode its values, quick mode the same search on the quick network"},
    {"setting": "spiral toy process noise q", "text": "not given", "code": "q = 1e-4",
     "follows": "library default q = 0; q = 1e-4 runs in the ablation of a failing spiral check"},
]
