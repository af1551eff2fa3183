"""Duran-Martin, Kara & Murphy (2022), neural bandits with the subspace EKF, on offline data.

V1 digits bandit (stand-in for the paper's MNIST, Fig. 4 and Fig. 7): 10 arms, MLP 65-50-10,
   every agent, cumulative reward and seconds per step over seeds.
V2 tabular stand-ins (Fig. 2): an imbalanced 7-class synthetic set (Shuttle-like, 79% majority)
   and wine (an easy set, as Adult is in the paper).
V3 a MovieLens-like ratings simulator (Fig. 3 and Fig. 6).
V4 reward against the subspace dimension d, SVD against random basis (Fig. 5).
V5 seconds per step against d and against P (Table 1).

Quick mode runs V1 only, on 500 steps with a short warm-up and fewer agents, and a small V5.
Every number is measured here; the checks put the paper's orderings next to them.
"""

import json
import os
import time

import numpy as np  # noqa: E402

import refbayes as rb  # noqa: E402

# agents of refbayes/bandits/__init__.py, sorted as there: an import list, not logic to share
from refbayes.bandits import (  # noqa: E402
    LiM2Agent,
    LinearTSAgent,
    LoFiAgent,
    NeuralGreedyAgent,
    NeuralLinearAgent,
    NeuralTSAgent,
    OrigEKFAgent,
    RandomAgent,
    SubspaceAgent,
    compare_agents,
    ratings_bandit,
    sklearn_bandit,
)

from ._mpl import pyplot as _pyplot  # noqa: E402
from .common import check, explanation, savefig  # noqa: E402


def _ticker():
    import matplotlib.ticker

    return matplotlib.ticker


def _one_thread():
    """Limit BLAS to one thread (the runs are many small products; threads only add contention)."""
    try:
        from threadpoolctl import threadpool_limits

        return threadpool_limits(1)
    except ImportError:  # pragma: no cover
        import contextlib

        return contextlib.nullcontext()


def _lofi_available():
    try:
        import refbayes.filters.lofi  # noqa: F401

        return True
    except ImportError:
        return False


def _log(msg):
    print(f"  [bandits] {msg}", flush=True)


# Where the paper's text (Duran-Martin, Kara & Murphy 2022) and its authors' code (probml/bandits, which the paper
# names) differ or say nothing, and which one these runs follow. "unknown": what the code does is not known here.
DEFAULTS = [
    {"setting": "warm-up feedback",
     "text": "round-robin warm-up, each context gives the pulled arm's reward (section 3.2, Alg. 2)",
     "code": "every head is fitted on the warm-up contexts with all arms' rewards",
     "follows": "text (feedback='bandit'); the code's warm-up runs as 'EKF-Sub-SVD (full warm-up)' and in the "
                "warm-up explanations"},
    {"setting": "EKF over the warm-up data",
     "text": "Alg. 2 also filters D_1:tau from (mu_0, Sigma_0) (section 3.4)",
     "code": "does not",
     "follows": "code (ekf_on_warmup=False: the offset is already fitted to those data)"},
    {"setting": "subspace dimension d",
     "text": "d = 200 on the tabular sets (section 4.1); d = 470 on MNIST, chosen on a validation set (section 4.3)",
     "code": "d = 470",
     "follows": "text for the library default (d = 200); neither in these runs: d = 100 (30 in quick mode) on "
                "streams of 1500-1797 steps, and V4 sweeps d = 5-200"},
    {"setting": "observation variance sigma^2",
     "text": "fixed (or inferred); no value given (section 3.2)",
     "code": "sigma^2 = 0, with 1e-3 added to the innovation variance (full covariance only)",
     "follows": "code's full-covariance value: obs_var = 1e-3, for both covariances"},
    {"setting": "process noise q (tau^2)",
     "text": "a small non-zero value, for numerical stability (section 3.4)",
     "code": "q = 0",
     "follows": "code (q = 0)"},
    {"setting": "prior variance of z",
     "text": "not stated",
     "code": "1e-4",
     "follows": "code (prior_var = 1e-4)"},
    {"setting": "warm-up gradient descent",
     "text": "SGD on the warm-up data (Alg. 2); settings not stated",
     "code": "1000 full-batch steps, momentum 0.9, learning rate 0.05 (tabular) or 0.8 (MNIST)",
     "follows": "code's tabular values on every data set (1000 steps, lr 0.05, momentum 0.9; 150 steps in quick "
                "mode)"},
    {"setting": "learned basis",
     "text": "SVD of the warm-up iterates (section 3.4)",
     "code": "PCA (mean-centred) of every second iterate",
     "follows": "code (pca_basis: centred, thin = 2)"},
    {"setting": "random-basis offset",
     "text": "a random subspace may skip the warm-up (section 3.4)",
     "code": "the warm-up's last iterate, as for the SVD basis",
     "follows": "code (offset='warm')"},
    {"setting": "EKF-Orig initial mean",
     "text": "not stated",
     "code": "zero weights passed to the network, so the warm-up is discarded and only the output biases learn",
     "follows": "neither: the warm-up iterate (init='warm'); the code's zero init runs as "
                "'EKF-Orig-Diag (zero init)' (V1, V2)"},
    {"setting": "rewards counted",
     "text": "from step tau + 1 (Alg. 1)",
     "code": "the warm-up rewards too",
     "follows": "code (count_warmup=True)"},
    {"setting": "Neural-Linear (limited) memory M",
     "text": "the last M = 100 observations (section 4.5)",
     "code": "20 rows (tabular), 50 (MNIST)",
     "follows": "code's MNIST value (50 rows) on every data set; the wine explanation also runs M = 100"},
    {"setting": "LiM2 schedule",
     "text": "the original authors' settings (section 4.1)",
     "code": "the LiM2 authors' code: one epoch over a FIFO of 100 N_a rows per step",
     "follows": "neither: one SGD step per bandit step on a FIFO of 20 N_a rows (run time)"},
    {"setting": "trials",
     "text": "10 random trials (section 4.1)",
     "code": "unknown",
     "follows": "neither: 3 seeds (2 in quick mode and in V4)"},
]


def _agents(net, quick, d, n_arms, E, with_zero=True, extras=True):
    """The agent line-up; where the paper's text and its authors' code differ, ``DEFAULTS`` says which one
    each setting follows (see also the notes in the summary)."""
    sub = dict(d=d, n_warmup_steps=E, lr=0.05, momentum=0.9, obs_var=1e-3, prior_var=1e-4)
    agents = {
        "EKF-Sub-SVD": SubspaceAgent(net, **sub),
        "EKF-Sub-Diag-SVD": SubspaceAgent(net, cov="diag", **sub),
        "EKF-Sub-RND": SubspaceAgent(net, basis="random", **sub),
    }
    if not quick:
        agents["EKF-Sub-Diag-RND"] = SubspaceAgent(net, cov="diag", basis="random", **sub)
        agents["EKF-Sub-SVD (full warm-up)"] = SubspaceAgent(net, feedback="full", **sub)
    agents["EKF-Orig-Diag"] = OrigEKFAgent(net, cov="diag", n_warmup_steps=100)
    if with_zero and not quick:
        agents["EKF-Orig-Diag (zero init)"] = OrigEKFAgent(net, cov="diag", init="zero")
    if extras and not quick and _lofi_available():
        agents["LOFI-10"] = LoFiAgent(net, rank=10, n_warmup_steps=100)
    agents["Linear"] = LinearTSAgent()
    agents["NL-Unlim"] = NeuralLinearAgent(net, update_every=100, n_epochs=100 if not quick else 50)
    agents["NL-Lim"] = NeuralLinearAgent(net, update_every=100, n_epochs=100 if not quick else 50, memory=50)
    if extras and not quick:
        agents["LiM2"] = LiM2Agent(net, memory=20 * n_arms, n_sgd=1)
        agents["Neural-Greedy"] = NeuralGreedyAgent(net, update_every=100, n_epochs=100)
        agents["Neural-TS"] = NeuralTSAgent(net, precision="diag", update_every=100, n_epochs=100, lr=0.05)
    agents["Random"] = RandomAgent()
    return agents


# the four subspace variants of the line-up (name -> SubspaceAgent options)
SUBSPACE_VARIANTS = {"EKF-Sub-SVD": {}, "EKF-Sub-Diag-SVD": {"cov": "diag"}, "EKF-Sub-RND": {"basis": "random"},
                     "EKF-Sub-Diag-RND": {"cov": "diag", "basis": "random"}}


def _full_warmup_rewards(make_env, net, names, d, E, seeds, n_w, have=None):
    """Mean reward over ``seeds`` of the subspace variants ``names`` (keys of ``SUBSPACE_VARIANTS``) with
    the authors' full-information warm-up (``feedback="full"``), the other options as in ``_agents``.
    have: {variant: reward} already measured with that warm-up."""
    have = {k: v for k, v in (have or {}).items() if k in names and v is not None}
    sub = dict(d=d, n_warmup_steps=E, lr=0.05, momentum=0.9, obs_var=1e-3, prior_var=1e-4, feedback="full")
    agents = {k: SubspaceAgent(net, **SUBSPACE_VARIANTS[k], **sub) for k in names if k not in have}
    if agents:
        out = compare_agents(make_env, agents, seeds, n_warmup_per_arm=n_w)
        have.update({k: out[k]["reward_mean"] for k in agents})
    return {k: have[k] for k in names}


def _warmup_explanation(full, bandit, rivals, what):
    """Set-up difference (the authors' code against the paper's text): the paper's numbers come from the
    authors' code, whose subspace warm-up fits every head on the warm-up contexts with all arms' rewards.
    full / bandit: {variant: reward} with the full-information / bandit-feedback warm-up; rivals: {name:
    reward} the claim puts below every subspace variant. Supported when every variant with the authors'
    warm-up beats every rival."""
    best = max(rivals, key=rivals.get)
    return explanation(
        "setup", f"warm-up: the paper's {what} come from the authors' code, whose subspace warm-up fits every head "
        "on the warm-up contexts with all arms' rewards (information no bandit sees and no other agent gets); "
        "with the bandit-feedback warm-up the text describes, the subspace variants fall back",
        "subspace reward, bandit -> full-information warm-up: "
        + ", ".join(f"{k} {bandit[k]:.0f} -> {full[k]:.0f}" for k in full)
        + "; " + ", ".join(f"{k} {v:.0f}" for k, v in rivals.items()),
        all(full[k] > rivals[best] for k in full))


def _summaries(out):
    return {name: {k: v for k, v in rec.items()} for name, rec in out.items() if name != "_results"}


def _bar_figure(summ, title, outdir, fname, chance=None, maximum=None):
    plt = _pyplot()
    names = list(summ)
    means = [summ[n]["reward_mean"] for n in names]
    stds = [summ[n]["reward_std"] for n in names]
    times = [1e3 * summ[n]["step_time_mean"] for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    axes[0].barh(names, means, xerr=stds, color="tab:blue")
    if chance is not None:
        axes[0].axvline(chance, color="k", ls=":", label="chance")
    if maximum is not None:
        axes[0].axvline(maximum, color="k", ls="--", label="maximum")
    axes[0].set(xlabel="cumulative reward (mean ± s.d. over seeds)")
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=7)
    axes[1].barh(names, times, color="tab:orange")
    axes[1].set(xlabel="ms per step (choose + update)", xscale="log")
    axes[1].invert_yaxis()
    axes[1].set_yticklabels([])
    fig.suptitle(title)
    return savefig(fig, outdir, fname)


def _fmt(summ, name):
    r = summ[name]
    return f"{name} {r['reward_mean']:.0f}±{r['reward_std']:.0f}"


def _cum_figure(out, title, outdir, fname):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    by_name = {}
    for res in out["_results"]:
        by_name.setdefault(res.agent, []).append(res.cumulative_reward())
    for name, curves in by_name.items():
        ax.plot(np.mean(curves, axis=0), label=name, lw=1)
    ax.set(xlabel="step", ylabel="cumulative reward", title=title)
    ax.legend(fontsize=6)
    return savefig(fig, outdir, fname)


# ---------------------------------------------------------------------------------------------


def digits_bandit(quick, outdir, sweep=None):
    """V1. sweep: the V4 d-sweep result (full mode), the evidence for the SVD ~ RND check."""
    T, n_w, d, E, seeds = (500, 10, 30, 150, [0, 1]) if quick else (1797, 20, 100, 1000, [0, 1, 2])
    make_env = lambda rng: sklearn_bandit("digits", rng, n_steps=T)
    probe = make_env(np.random.default_rng(0))
    net = rb.MLP([probe.n_features, 50, probe.n_arms], activation="relu")
    agents = _agents(net, quick, d, probe.n_arms, E)
    _log(f"V1 digits: T={T}, N_w={n_w}, d={d}, P={net.n_params}, {len(agents)} agents x {len(seeds)} seeds")
    out = compare_agents(make_env, agents, seeds, n_warmup_per_arm=n_w)
    summ = _summaries(out)
    chance = T / probe.n_arms
    figs = [_bar_figure(summ, f"digits bandit (T={T}, d={d}, {len(seeds)} seeds)", outdir, "digits_reward_time.png",
                        chance=chance, maximum=T),
            _cum_figure(out, "digits bandit", outdir, "digits_cumulative.png")]
    r = {k: v["reward_mean"] for k, v in summ.items()}
    t = {k: v["step_time_mean"] for k, v in summ.items()}
    subs = [k for k in r if k.startswith("EKF-Sub")]
    variants = [k for k in SUBSPACE_VARIANTS if k in r]

    def warmup():
        full = _full_warmup_rewards(make_env, net, variants, d, E, seeds, n_w,
                                    have={"EKF-Sub-SVD": r.get("EKF-Sub-SVD (full warm-up)")})
        return _warmup_explanation(full, {k: r[k] for k in variants}, {"NL-Unlim": r["NL-Unlim"]}, "MNIST rewards")

    checks = [
        check("V1 digits: every EKF-Sub variant well above chance", f"all >> T/N_a = {chance:.0f}",
              ", ".join(_fmt(summ, k) for k in subs), all(r[k] > 2 * chance for k in subs)),
        check("V1 digits: EKF-Sub-SVD >= NL-Lim", "Sub-SVD-full >= NL-Lim (MNIST, Fig. 4)",
              f"{_fmt(summ, 'EKF-Sub-SVD')}, {_fmt(summ, 'NL-Lim')}", r["EKF-Sub-SVD"] >= r["NL-Lim"]),
        check("V1 digits: full covariance >= diagonal (SVD basis)", "full beats diagonal (Fig. 4)",
              f"{_fmt(summ, 'EKF-Sub-SVD')}, {_fmt(summ, 'EKF-Sub-Diag-SVD')}",
              r["EKF-Sub-SVD"] >= r["EKF-Sub-Diag-SVD"]),
        check("V1 digits: every subspace method beats Neural-Linear (unlimited)",
              "all EKF-Sub > NL-Unlim (Fig. 4, MNIST)",
              ", ".join(_fmt(summ, k) for k in subs + ["NL-Unlim"]), all(r[k] > r["NL-Unlim"] for k in subs),
              explain=warmup),
        check("V1 digits: EKF-Sub-SVD beats Linear", "Sub-SVD 4040 vs Lin 1450 (Fig. 4, MNIST MLP1)",
              f"{_fmt(summ, 'EKF-Sub-SVD')}, {_fmt(summ, 'Linear')}", r["EKF-Sub-SVD"] > r["Linear"]),
        check("V1 digits: time per step, Neural-Linear slower than subspace EKF",
              "NL slowest, then subspace (Figs. 6-7)",
              f"NL-Unlim {1e3 * t['NL-Unlim']:.2f} ms, Sub-SVD {1e3 * t['EKF-Sub-SVD']:.2f} ms",
              t["NL-Unlim"] > t["EKF-Sub-SVD"]),
    ]
    if not quick:  # at the quick sizes (d = 30) the two update costs are within timing noise
        checks += [
            check("V1 digits: time per step, Sub-Diag < Sub-Full", "diag faster than full (Figs. 6-7)",
                  f"Sub-SVD {1e3 * t['EKF-Sub-SVD']:.2f} ms, Sub-Diag-SVD {1e3 * t['EKF-Sub-Diag-SVD']:.2f} ms",
                  t["EKF-Sub-Diag-SVD"] < t["EKF-Sub-SVD"]),
            check("V1 digits: SVD ~ RND at large d (within 5%)", "SVD ~ RND at d = 470 (Fig. 4)",
                  f"{_fmt(summ, 'EKF-Sub-SVD')}, {_fmt(summ, 'EKF-Sub-RND')} (d={d})",
                  abs(r["EKF-Sub-SVD"] - r["EKF-Sub-RND"]) <= 0.05 * max(r["EKF-Sub-SVD"], r["EKF-Sub-RND"]),
                  explain=lambda: _d_explanation(sweep, d, r["EKF-Sub-SVD"], r["EKF-Sub-RND"])),
            check("V1 digits: EKF-Orig-Diag with the code's zero init is near chance",
                  "Orig-Diag ~ 540/5000 on MNIST (Fig. 4); at theta = 0 only the output biases learn",
                  f"{_fmt(summ, 'EKF-Orig-Diag (zero init)')}, chance {chance:.0f}, "
                  f"warm init {_fmt(summ, 'EKF-Orig-Diag')}",
                  r["EKF-Orig-Diag (zero init)"] < 2 * chance),
            check("V1 digits: EKF-Sub-SVD beats EKF-Orig-Diag (warm init)", "Orig-Diag far below subspace (Fig. 4)",
                  f"{_fmt(summ, 'EKF-Sub-SVD')}, {_fmt(summ, 'EKF-Orig-Diag')}",
                  r["EKF-Sub-SVD"] > r["EKF-Orig-Diag"]),
            check("V1 digits: full-information warm-up (authors' code) >= bandit warm-up",
                  "the authors' code fits every head on the warm-up contexts",
                  f"{_fmt(summ, 'EKF-Sub-SVD (full warm-up)')}, {_fmt(summ, 'EKF-Sub-SVD')}",
                  r["EKF-Sub-SVD (full warm-up)"] >= r["EKF-Sub-SVD"]),
            check("V1 digits: EKF-Sub-SVD ~ LiM2 or better", "subspace ~ LiM2 and much faster (Fig. 2, Shuttle)",
                  f"{_fmt(summ, 'EKF-Sub-SVD')} ({1e3 * t['EKF-Sub-SVD']:.1f} ms), "
                  f"{_fmt(summ, 'LiM2')} ({1e3 * t['LiM2']:.1f} ms)",
                  r["EKF-Sub-SVD"] >= 0.95 * r["LiM2"] and t["EKF-Sub-SVD"] < t["LiM2"]),
        ]
    return {"config": {"T": T, "N_w": n_w, "d": d, "warmup_gd_steps": E, "seeds": seeds, "P": net.n_params},
            "agents": summ}, checks, figs


def _d_explanation(sweep, d, svd, rnd, paper_d=470, tol=0.05):
    """Set-up difference (subspace dimension): the paper compares SVD and random subspaces at d = 470; V1
    runs d = ``d``. Evidence: the relative SVD-RND reward gap along the V4 sweep. Supported when the sweep
    reaches beyond ``d``, the gap at its largest d is within ``tol`` and smaller than at ``d``."""
    if not sweep:
        return None
    dims = list(sweep["dims"])
    gap = [abs(a[0] - b[0]) / max(a[0], b[0]) for a, b in zip(sweep["svd"], sweep["random"])]
    at_d = gap[dims.index(d)] if d in dims else abs(svd - rnd) / max(svd, rnd)
    return explanation(
        "setup", f"subspace dimension: the paper finds SVD ~ random at d = {paper_d}; at d = {d} the random basis "
        "still trails, and the gap closes as d grows",
        f"relative SVD-RND reward gap along the d sweep ({len(sweep.get('seeds', [0, 1]))} seeds): "
        + ", ".join(f"d={k} {100 * g:.1f}%" for k, g in zip(dims, gap)) + f"; V1 at d={d}: {100 * abs(svd - rnd) / max(svd, rnd):.1f}%",
        dims[-1] > d and gap[-1] <= tol and gap[-1] < at_d)


def tabular(outdir):
    T, seeds = 1500, [0, 1, 2]
    results, checks, figs = {}, [], []
    for name in ("synthetic_imbalanced", "wine"):
        make_env = lambda rng, name=name: sklearn_bandit(name, rng, n_steps=T, replace=True)
        probe = make_env(np.random.default_rng(0))
        net = rb.MLP([probe.n_features, 50, probe.n_arms], activation="relu")
        agents = _agents(net, False, 100, probe.n_arms, 1000, extras=False)
        _log(f"V2 {name}: T={T}, P={net.n_params}, {len(agents)} agents x {len(seeds)} seeds")
        out = compare_agents(make_env, agents, seeds, n_warmup_per_arm=20)
        summ = _summaries(out)
        results[name] = summ
        majority = float(np.mean([sklearn_bandit(name, np.random.default_rng([s, 0]), n_steps=T, replace=True)
                                  .rewards.mean(0).max() for s in seeds])) * T
        figs.append(_bar_figure(summ, f"{name} bandit (T={T})", outdir, f"tabular_{name}.png",
                                chance=T / probe.n_arms, maximum=T))
        r = {k: v["reward_mean"] for k, v in summ.items()}
        subs = [k for k in r if k.startswith("EKF-Sub")]
        if name == "synthetic_imbalanced":
            def warmup(make_env=make_env, net=net, r=r):
                variants = [k for k in SUBSPACE_VARIANTS if k in r]
                full = _full_warmup_rewards(make_env, net, variants, 100, 1000, seeds, 20,
                                            have={"EKF-Sub-SVD": r["EKF-Sub-SVD (full warm-up)"]})
                return _warmup_explanation(full, {k: r[k] for k in variants},
                                           {"EKF-Orig-Diag (zero init, the authors' code)": r["EKF-Orig-Diag (zero init)"],
                                            "EKF-Orig-Diag (warm init)": r["EKF-Orig-Diag"]}, "Shuttle rewards")

            checks += [
                check("V2 Shuttle-like: subspace variants beat EKF-Orig (warm init)",
                      "Orig worse than subspace (Fig. 2, Shuttle)",
                      ", ".join(_fmt(summ, k) for k in subs + ["EKF-Orig-Diag"]),
                      min(r[k] for k in subs) > r["EKF-Orig-Diag"], explain=warmup),
                check("V2 Shuttle-like: zero-init EKF-Orig-Diag ~ majority-class rate",
                      "Orig ~ 3913/5000 ~ the majority rate (Fig. 2, Shuttle)",
                      f"{_fmt(summ, 'EKF-Orig-Diag (zero init)')}, majority x T = {majority:.0f}",
                      abs(r["EKF-Orig-Diag (zero init)"] - majority) <= 0.1 * T),
                check("V2 Shuttle-like: NL-Lim < NL-Unlim", "limited memory hurts (Fig. 2, Shuttle)",
                      f"{_fmt(summ, 'NL-Lim')}, {_fmt(summ, 'NL-Unlim')}", r["NL-Lim"] < r["NL-Unlim"]),
            ]
        else:
            learned = [k for k in r if k not in ("Random", "EKF-Orig-Diag (zero init)")]
            spread = (max(r[k] for k in learned) - min(r[k] for k in learned)) / T
            rest = [k for k in learned if k != "NL-Lim"]
            spread_rest = (max(r[k] for k in rest) - min(r[k] for k in rest)) / T
            checks.append(check("V2 easy set (wine): all methods similar", "Adult: all methods similar (Fig. 2)",
                                f"reward spread {spread:.1%} of T across {len(learned)} learning agents; "
                                f"{spread_rest:.1%} without NL-Lim ({r['NL-Lim']:.0f})", spread <= 0.1,
                                explain=lambda make_env=make_env, net=net, summ=summ, learned=learned:
                                _nl_lim_memory(make_env, net, summ, learned, seeds, T)))
    return results, checks, figs


def _nl_lim_memory(make_env, net, summ, learned, seeds, T, memory=100, tol=0.1):
    """Does not carry over: on wine one agent, NL-Lim, is far below the others, on every seed and also with
    the paper's memory (M = 100 observations, section 4.5; the line-up's NL-Lim keeps 50), while the other
    learning agents are within ``tol`` of T of one another. NL-Lim is run again with ``memory`` rows on the
    same seeds. Supported when, on every seed, the others' spread is within ``tol`` of T and NL-Lim (with
    either memory) is below the others' minimum by more than ``tol`` of T."""
    agent = NeuralLinearAgent(net, update_every=100, n_epochs=100, memory=memory)
    lim = compare_agents(make_env, {"NL-Lim": agent}, seeds, n_warmup_per_arm=20)["NL-Lim"]["rewards"]
    rest = [k for k in learned if k != "NL-Lim"]
    per_seed = []
    ok = True
    for i, seed in enumerate(seeds):
        vals = [summ[k]["rewards"][i] for k in rest]
        lo, hi = min(vals), max(vals)
        l50, l100 = summ["NL-Lim"]["rewards"][i], lim[i]
        ok = ok and (hi - lo) <= tol * T and max(l50, l100) < lo - tol * T
        per_seed.append(f"seed {seed}: others {lo:.0f}-{hi:.0f}, NL-Lim {l50:.0f} (M = 50), {l100:.0f} (M = {memory})")
    return explanation(
        "does-not-carry-over", "on wine every learning agent but the limited-memory Neural-Linear ends within a few "
        "percent of the others; NL-Lim, which refits its network and recomputes its heads from the last M rows only, "
        f"stays far below on every seed, with the paper's M = {memory} as with 50, so the spread is its alone",
        "; ".join(per_seed) + f" (T = {T})", ok)


def ratings(outdir):
    seeds = [0, 1, 2]
    make_env = lambda rng: ratings_bandit(rng)
    probe = make_env(np.random.default_rng(0))
    net = rb.MLP([probe.n_features, 50, probe.n_arms], activation="relu")
    agents = _agents(net, False, 100, probe.n_arms, 1000, extras=False)
    agents.pop("EKF-Orig-Diag (zero init)")
    _log(f"V3 ratings: T~{probe.n_steps}, {len(agents)} agents x {len(seeds)} seeds")
    out = compare_agents(make_env, agents, seeds, n_warmup_per_arm=2)
    summ = _summaries(out)
    best = float(np.mean([make_env(np.random.default_rng([s, 0])).mean_rewards.max(1).sum() for s in seeds]))
    fig = _bar_figure(summ, "ratings bandit (MovieLens-like)", outdir, "ratings.png", maximum=best)
    r = {k: v["reward_mean"] for k, v in summ.items()}
    subs = [k for k in r if k.startswith("EKF-Sub")]
    bandit_only = {k: v for k, v in r.items() if "full warm-up" not in k}
    checks = [
        check("V3 ratings: EKF-Sub-SVD with the authors' full-information warm-up is best",
              "subspace best by a large margin (Fig. 3)", ", ".join(_fmt(summ, k) for k in r),
              max(r, key=r.get) == "EKF-Sub-SVD (full warm-up)"),
        check("V3 ratings: EKF-Sub with a bandit-feedback warm-up (as the text describes) is best",
              "subspace best by a large margin (Fig. 3)", ", ".join(_fmt(summ, k) for k in bandit_only),
              max(bandit_only, key=bandit_only.get).startswith("EKF-Sub"),
              explain=lambda: _warmup_explanation(
                  {"EKF-Sub-SVD": r["EKF-Sub-SVD (full warm-up)"]}, {"EKF-Sub-SVD": r["EKF-Sub-SVD"]},
                  {k: v for k, v in bandit_only.items() if not k.startswith("EKF-Sub")}, "MovieLens rewards")),
        check("V3 ratings: Linear > Neural-Linear > EKF-Orig-Diag", "then Linear, then NL, then Orig-Diag (Fig. 3)",
              f"{_fmt(summ, 'Linear')}, {_fmt(summ, 'NL-Unlim')}, {_fmt(summ, 'EKF-Orig-Diag')}",
              r["Linear"] > r["NL-Unlim"] > r["EKF-Orig-Diag"]),
    ]
    return {"agents": summ, "best_possible": best, "subspace": subs}, checks, [fig]


def d_sweep(outdir):
    plt = _pyplot()
    dims, seeds, T = [5, 10, 20, 50, 100, 200], [0, 1], 1797
    make_env = lambda rng: sklearn_bandit("digits", rng, n_steps=T)
    probe = make_env(np.random.default_rng(0))
    net = rb.MLP([probe.n_features, 50, probe.n_arms], activation="relu")
    rows = {"svd": [], "random": []}
    _log(f"V4 d sweep: d in {dims}, {len(seeds)} seeds")
    for d in dims:
        agents = {kind: SubspaceAgent(net, d=d, basis=kind, n_warmup_steps=1000) for kind in rows}
        out = compare_agents(make_env, agents, seeds)
        for kind in rows:
            rows[kind].append((out[kind]["reward_mean"], out[kind]["reward_std"]))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for kind, vals in rows.items():
        m, s = np.array(vals).T
        ax.errorbar(dims, m, yerr=s, marker="o", label=kind.upper() if kind == "svd" else "RND", capsize=3)
    ax.set(xscale="log", xlabel="subspace dimension d", ylabel="cumulative reward", title="digits: reward vs d")
    ax.set_xticks(dims, [str(v) for v in dims], minor=False)
    ax.xaxis.set_minor_formatter(_ticker().NullFormatter())
    ax.legend()
    fname = savefig(fig, outdir, "d_sweep.png")
    svd = np.array(rows["svd"])[:, 0]
    rnd = np.array(rows["random"])[:, 0]
    small = [i for i, d in enumerate(dims) if d <= 20]
    checks = [check("V4 d sweep: SVD >= RND at small d (d <= 20)", "SVD better, especially at small d (Fig. 5)",
                    ", ".join(f"d={dims[i]}: {svd[i]:.0f} vs {rnd[i]:.0f}" for i in small),
                    all(svd[i] >= rnd[i] for i in small),
                    explain=lambda: _more_trials(make_env, net, [dims[i] for i in small if svd[i] < rnd[i]], rows, dims,
                                                 seeds))]
    return {"dims": dims, "svd": rows["svd"], "random": rows["random"], "seeds": seeds}, checks, [fname]


def _more_trials(make_env, net, failing, rows, dims, seeds, n_trials=10):
    """Set-up difference (number of trials): the paper averages 10 random trials; the sweep runs
    ``len(seeds)``. SVD and RND are run again at the failing d on the remaining seeds up to ``n_trials``;
    supported when, over all ``n_trials``, SVD >= RND at every failing d."""
    extra = list(range(len(seeds), n_trials))
    parts, ok = [], True
    for d in failing:
        agents = {kind: SubspaceAgent(net, d=d, basis=kind, n_warmup_steps=1000) for kind in ("svd", "random")}
        out = compare_agents(make_env, agents, extra)
        i = dims.index(d)
        mean = {kind: (rows[kind][i][0] * len(seeds) + out[kind]["reward_mean"] * len(extra)) / n_trials
                for kind in agents}
        wins = sum(a > b for a, b in zip(out["svd"]["rewards"], out["random"]["rewards"]))
        ok = ok and mean["svd"] >= mean["random"]
        parts.append(f"d={d}: {len(seeds)} seeds SVD {rows['svd'][i][0]:.0f} vs RND {rows['random'][i][0]:.0f}; "
                     f"{n_trials} seeds SVD {mean['svd']:.0f} vs RND {mean['random']:.0f} (SVD ahead in {wins} of the "
                     f"{len(extra)} new seeds)")
    return explanation(
        "setup", f"number of trials: the paper averages {n_trials} random trials, the sweep {len(seeds)}; at small d "
        "the reward varies by tens between seeds, more than the SVD-RND difference, and over the paper's number of "
        "trials SVD is not behind (a near tie here, not the paper's 'much better')", "; ".join(parts), ok)


def timing(quick, outdir):
    """Seconds per step (choose + update) on random contexts, after a short warm-up."""
    plt = _pyplot()
    rng = np.random.default_rng(0)
    env = sklearn_bandit("digits", rng, n_steps=400)
    n_steps = 20 if quick else 40

    def per_step(agent, env, n_w=5, n_steps=n_steps):
        state = agent.init(env.warmup(n_w), np.random.default_rng(1))
        r = np.random.default_rng(2)
        t0 = time.perf_counter()
        for t in range(n_w * env.n_arms, n_w * env.n_arms + n_steps):
            a = agent.choose(state, env.contexts[t], r)
            state = agent.update(state, env.contexts[t], a, env.reward(t, a), r)
        return (time.perf_counter() - t0) / n_steps

    net = rb.MLP([env.n_features, 50, env.n_arms], activation="relu")
    dims = [10, 40] if quick else [25, 50, 100, 200, 400]
    by_d = {cov: [per_step(SubspaceAgent(net, d=d, cov=cov, n_warmup_steps=d + 10, thin=1, n_keep=None), env)
                  for d in dims]
            for cov in ("full", "diag")}
    widths = [5, 10] if quick else [5, 10, 20]
    Ps, by_P = [], {"EKF-Orig-Full": [], "EKF-Orig-Diag": [], "EKF-Sub-SVD (d=20)": []}
    for w in widths:
        net_w = rb.MLP([env.n_features, w, env.n_arms], activation="relu")
        Ps.append(net_w.n_params)
        by_P["EKF-Orig-Full"].append(per_step(OrigEKFAgent(net_w, cov="full", n_warmup_steps=10), env, n_steps=15))
        by_P["EKF-Orig-Diag"].append(per_step(OrigEKFAgent(net_w, cov="diag", n_warmup_steps=10), env))
        by_P["EKF-Sub-SVD (d=20)"].append(per_step(SubspaceAgent(net_w, d=20, n_warmup_steps=60), env))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for cov, v in by_d.items():
        axes[0].loglog(dims, 1e3 * np.array(v), "o-", label=f"EKF-Sub {cov}")
    axes[0].set(xlabel="d", ylabel="ms per step", title=f"P = {net.n_params}")
    axes[0].set_xticks(dims, [str(v) for v in dims], minor=False)
    axes[0].xaxis.set_minor_formatter(_ticker().NullFormatter())
    axes[0].legend()
    for name, v in by_P.items():
        axes[1].loglog(Ps, 1e3 * np.array(v), "o-", label=name)
    axes[1].set(xlabel="P", ylabel="ms per step", title="time against P")
    axes[1].legend(fontsize=7)
    fname = savefig(fig, outdir, "timing.png")
    slope = lambda x, y: float(np.polyfit(np.log(x), np.log(y), 1)[0])
    s_full = slope(Ps, by_P["EKF-Orig-Full"])
    checks = []
    if not quick:  # at the quick sizes fixed overheads dominate, so no timing claim is checked
        checks.append(check("V5 timing: diagonal subspace EKF faster than full at the largest d",
                            "O(Pd) vs O(Pd + d^3) per step (Table 1)",
                            f"d={dims[-1]}: full {1e3 * by_d['full'][-1]:.2f} ms, diag {1e3 * by_d['diag'][-1]:.2f} ms",
                            by_d["diag"][-1] < by_d["full"][-1]))
        checks.append(check("V5 timing: EKF-Orig-Full grows at least quadratically in P",
                            "O(P^2) update + O(P^3) Thompson draw (Table 1)",
                            f"log-log slope {s_full:.2f} over P = {Ps}", s_full >= 1.8))
    return {"dims": dims, "by_d": by_d, "P": Ps, "by_P": by_P, "orig_full_slope": s_full}, checks, [fname]


def run(quick=False, outdir="."):
    """Run the bandit experiments; write bandits.json and PNGs to ``outdir``; return the summary."""
    os.makedirs(outdir, exist_ok=True)
    results, checks, figures = {}, [], []
    with _one_thread():
        # full mode: the d sweep first, as the evidence of V1's SVD ~ RND check; the report keeps V1 ... V5 order
        sweep = d_sweep(outdir) if not quick else None
        res, c, f = digits_bandit(quick, outdir, sweep=sweep[0] if sweep else None)
        results["digits"], checks, figures = res, checks + c, figures + f
        if not quick:
            for key, fn in (("tabular", tabular), ("ratings", ratings), ("d_sweep", lambda outdir: sweep)):
                res, c, f = fn(outdir)
                results[key], checks, figures = res, checks + c, figures + f
        res, c, f = timing(quick, outdir)
        results["timing"], checks, figures = res, checks + c, figures + f
    summary = {"quick": bool(quick), "checks": checks, "figures": figures, "results": results, "defaults": DEFAULTS,
               "notes": [
                   "Contexts are z-scored (digits: /16) with a constant-1 column; digits uses one permutation "
                   "of the 1797 images per seed, the tabular sets T draws with replacement.",
                   "Subspace EKF: library defaults (obs_var 1e-3, prior_var 1e-4, q 0, bandit-feedback "
                   "warm-up, 1000 momentum-GD steps, lr 0.05); EKF-Orig: tabular column (100 steps, "
                   "prior_var 1e-3, obs_var 0.01).",
                   "LiM2 takes one SGD step per bandit step with a FIFO of 20 N_a rows (not one epoch over "
                   "100 N_a rows), Neural-TS refits every 100 steps with a diagonal B, to keep the run short.",
                   "'(full warm-up)' fits every head on the warm-up contexts with all arms' rewards, as the "
                   "authors' code does; this is information a bandit never sees, and no other agent gets it.",
               ]}
    with open(os.path.join(outdir, "bandits.json"), "w") as fh:
        json.dump(summary, fh, indent=2, default=float)
    return summary


if __name__ == "__main__":  # pragma: no cover
    import sys

    s = run(quick="--quick" in sys.argv, outdir=sys.argv[-1] if len(sys.argv) > 1 and not sys.argv[-1].startswith("-")
            else "validation-results/bandits")
    for c in s["checks"]:
        print(("ok  " if c["passed"] else "NO  ") + c["name"] + ": " + c["measured"])
