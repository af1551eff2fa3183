"""Chang, Jones & Murphy (2022), diagonal EKFs, on offline data.

V1 digits MLP: FC / FD / VD-EKF and one-pass SGD, test NLL and error under
   plugin and Monte Carlo predictives (stand-in for the paper's MNIST MLP, fig. 4).
V2 two spirals, MLP 2-20-20-1, Bernoulli (the paper's fig. 3 toy).
V3 linear regression y = 1 + 0.5 x + noise: FC-EKF must equal the conjugate posterior.
V4 seconds per step against P for FC / FD / VD.
"""

import json
import os
import time

import numpy as np  # noqa: E402

import refbayes as rb  # noqa: E402
from refbayes import exact  # noqa: E402

from ._mpl import pyplot as _pyplot  # noqa: E402
from .common import check, digits, mc_metrics, plugin_metrics, savefig, sgd_pass, split  # noqa: E402


def _filters(model, lik):
    return {
        "FC-EKF": rb.FullEKF(model, lik),
        "FD-EKF": rb.FDEKF(model, lik),
        "VD-EKF": rb.VDEKF(model, lik, vd_mean="paper"),
    }


def digits_mlp(quick, rng, outdir):
    plt = _pyplot()
    X, y = digits()
    sizes = [64, 10, 10] if quick else [64, 25, 25, 25, 10]
    n_train, every, seeds = (500, 100, 1) if quick else (1300, 100, 5)
    n_mc = 20 if quick else 100
    prior_var = {"FC-EKF": 0.01, "FD-EKF": 0.03, "VD-EKF": 0.065}
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
    checks = [
        check("digits: final NLL, VD <= FD (plugin)", "VD better than FD (paper figs 1, 2, 4)",
              f"VD {final['VD-EKF']['nll_plugin']:.3f}, FD {final['FD-EKF']['nll_plugin']:.3f}",
              final["VD-EKF"]["nll_plugin"] <= final["FD-EKF"]["nll_plugin"]),
        check("digits: final NLL, VD <= one-pass SGD (plugin)", "VD better than SGD",
              f"VD {final['VD-EKF']['nll_plugin']:.3f}, SGD {final['SGD']['nll_plugin']:.3f}",
              final["VD-EKF"]["nll_plugin"] <= final["SGD"]["nll_plugin"]),
    ]
    for k in ("FC-EKF", "FD-EKF", "VD-EKF", "SGD"):
        checks.append(check(f"digits: {k} test error < 15%", "< 15% (spec target)",
                            f"{100 * final[k]['err_plugin']:.1f}%", final[k]["err_plugin"] < 0.15))
    return {"final": final, "sizes": sizes, "n_train": n_train, "seeds": seeds}, checks, [fig_name]


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
    errs, checks = {}, []
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (name, filt) in zip(axes, _filters(model, lik).items()):
        bel, _ = filt.scan(filt.init(theta0, 1.0), Xtr, ytr)
        p = 1 / (1 + np.exp(-model.apply_batch(bel.mean, Xtr)[:, 0]))
        errs[name] = float(np.mean((p > 0.5) != ytr))
        pg = 1 / (1 + np.exp(-model.apply_batch(bel.mean, grid)[:, 0]))
        ax.contourf(grid[:, 0].reshape(60, 60), grid[:, 1].reshape(60, 60), pg.reshape(60, 60), levels=20, cmap="RdBu_r")
        ax.scatter(*Xtr.T, c=ytr, s=4, cmap="RdBu_r", edgecolors="k", linewidths=0.2)
        ax.set_title(f"{name} plugin, train error {100 * errs[name]:.1f}%")
        checks.append(check(f"spirals: {name} one-pass train error < 10%", "< 10% (spec target)",
                            f"{100 * errs[name]:.1f}%", errs[name] < 0.10))
    return {"train_error": errs}, checks, [savefig(fig, outdir, "spirals.png")]


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


def run(quick=False, outdir="."):
    rng = np.random.default_rng(2022)
    summary, checks, figures = {}, [], []
    for name, part in (("V1_digits_mlp", digits_mlp), ("V2_spirals", spiral_toy),
                       ("V3_linear_regression", linear_regression), ("V4_timing", timing)):
        res, chk, figs = part(quick, rng, outdir)
        summary[name] = res
        checks += chk
        figures += figs
    with open(os.path.join(outdir, "diagonal_ekf.json"), "w") as fh:
        json.dump(summary, fh, indent=2, default=float)
    return {"results": summary, "checks": checks, "figures": figures}
