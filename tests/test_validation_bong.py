"""The BONG validation's explanations and timing checks follow their numbers (no filter runs)."""

import numpy as np

from refbayes.validation import bong


def _rows(ms):
    """B4 rows for DLR at two sizes and FC at two sizes; ms: {(P, algo, est, n_iter): ms}."""
    rows = []
    for (P, algo, est, n_iter), v in ms.items():
        rows.append({"family": "dlr", "P": P, "algo": algo, "est": est, "n_iter": n_iter, "ms_per_step": v,
                     "error": None})
    for P, v in ((61, 1.0), (241, 10.0)):
        rows.append({"family": "full", "P": P, "algo": "blr", "est": "lin-hess", "n_iter": 1, "ms_per_step": v,
                     "error": None})
    return rows


def _ms(bong_big):
    ms = {}
    for P, scale in ((1201, 1.0), (12001, 5.0)):
        for est, k in (("lin-hess", 1.0), ("mc-ef", 3.0)):
            ms[(P, "bong", est, 1)] = (bong_big if P == 12001 else 1.0) * k
            ms[(P, "bog", est, 1)] = 0.6 * scale * k
            ms[(P, "blr", est, 1)] = 1.5 * scale * k
            ms[(P, "blr", est, 10)] = 15 * scale * k
            ms[(P, "bbb", est, 10)] = 18 * scale * k
    return ms


def _verdicts(checks):
    return {c["name"].split(": ", 1)[1]: c["passed"] for c in checks if "P = 12001" in c["name"]}


def test_single_step_timing_checks_use_the_interleaved_times_when_given():
    # a BONG step slowed by load (4x) makes BLR (I = 1) look faster than BONG in the per-step minimum ...
    rows = _rows(_ms(bong_big=20.0))
    loaded = [c for c in bong._timing_checks(rows, ("lin-hess",)) if "BLR (I = 1)" in c["name"]]
    assert not any(c["passed"] for c in loaded)
    # ... the interleaved measurement decides the single-step comparisons, and nothing else changes
    clean = {(a, e): v for e in ("lin-hess", "mc-ef")
             for a, v in (("bong", 5.0 * (1 if e == "lin-hess" else 3)), ("bog", 3.0 * (1 if e == "lin-hess" else 3)),
                          ("blr", 7.5 * (1 if e == "lin-hess" else 3)))}
    checks = bong._timing_checks(rows, ("lin-hess",), clean)
    one_step = [c for c in checks if "BLR (I = 1)" in c["name"] or "BOG faster" in c["name"]]
    assert len(one_step) == 4 and all(c["passed"] for c in one_step)
    assert all("interleaved" in c["measured"] for c in one_step)
    # a clean time that says BOG is slower fails the check: the interleaved number is the verdict
    clean[("bog", "lin-hess")] = 6.0
    bog = [c for c in bong._timing_checks(rows, ("lin-hess",), clean)
           if "LIN-HESS" in c["name"] and "BOG faster" in c["name"]]
    assert not bog[0]["passed"]


def test_bbb_i10_explanation_follows_the_grid():
    cfg = {"n_samples": 10}
    lrs = bong.GRIDS["reg"]["lr"]

    def table(finals):
        return {("bbb", "lin-hess", lr, 10, "dlr", 10): {"final": f} for lr, f in zip(lrs, finals)}

    nan = np.nan
    # no alpha closes half of the gap (BONG 0.2, BBB I=1 0.75: half-way is 0.475)
    e = bong._bbb_i10_grid(cfg, table([0.85, 0.88, 0.99, nan, nan, nan, nan]), 0.2, 0.75)
    assert e["supported"] and e["cause"] == "does-not-carry-over" and "0.850" in e["evidence"]
    # one alpha of the grid closes it: the explanation is rejected
    assert not bong._bbb_i10_grid(cfg, table([0.85, 0.40, 0.99, nan, nan, nan, nan]), 0.2, 0.75)["supported"]


class _FakeAblation(bong._Ablation):
    """An _Ablation whose runs are a table {(algo, est, family, rank, prior_var, lr): final NLL or error}."""

    def __init__(self, table, lr=0.3, prior_var=0.3):
        cfg = {"n_stream": 800, "tune_stream": 300, "seeds": 2, "n_samples": 10, "n_iter": 3}
        self.cfg, self.cache, self.seed, self.table = cfg, {}, 2, table
        self.hps = {"bong": {"prior_var": prior_var}, "bbb": {"prior_var": 1.0, "lr": lr}}

    def final_nll(self, method, prior_var=None, seed=None, n_stream=None):
        algo, est, family, rank = (tuple(method) + ("dlr", bong.RANK))[:4]
        v = self.table[(algo, est, family, prior_var, self.hps["bbb"]["lr"])]
        return (np.inf, v) if isinstance(v, str) else (v, None)

    def final_metrics(self, method, seed=None, n_stream=None):
        algo, est = method[:2]
        p, lm, mc = self.table[("metrics", algo, est, self.hps["bbb"]["lr"])]
        return {"plugin": {"nll": p}, "linmc": {"nll": lm}, "mc": {"nll": mc}}

    def _sibling(self, algo, lr):
        sib = _FakeAblation(self.table, lr=lr)
        return sib


def test_moment_prior_var_needs_a_gap_at_the_tuned_variance_and_agreement_below():
    t = {("bong", "lin-hess", "diag", 0.3, 0.3): 1.07, ("bong", "lin-hess", "diag-moment", 0.3, 0.3): 1.44,
         ("bong", "lin-hess", "diag", 0.1, 0.3): 0.347, ("bong", "lin-hess", "diag-moment", 0.1, 0.3): 0.328,
         ("bong", "lin-hess", "diag", 0.03, 0.3): 0.672, ("bong", "lin-hess", "diag-moment", 0.03, 0.3): 0.669}
    e = _FakeAblation(t).moment_prior_var("lin-hess", 0.3)
    assert e["supported"] and "natural 1.070, moment 1.440" in e["evidence"]
    # a failed moment run at the tuned variance is a gap too
    t[("bong", "lin-hess", "diag-moment", 0.3, 0.3)] = "step 3: NotPositiveDefiniteError: x"
    assert _FakeAblation(t).moment_prior_var("lin-hess", 0.3)["supported"]
    # disagreement at a smaller prior variance: rejected
    t[("bong", "lin-hess", "diag-moment", 0.1, 0.3)] = 0.5
    assert not _FakeAblation(t).moment_prior_var("lin-hess", 0.3)["supported"]


def test_bbb_lr_explanations_use_the_next_smaller_alpha():
    t = {("bbb", "mc-ef", "dlr", None, 0.1): 2.37, ("bbb", "lin-hess", "dlr", None, 0.1): 0.49,
         ("bbb", "lin-ef", "dlr", None, 0.1): 0.40,
         ("metrics", "bbb", "lin-hess", 0.1): (0.49, 1.1, 1.45), ("metrics", "bbb", "lin-ef", 0.1): (0.40, 1.09, 1.45)}
    abl = _FakeAblation(t)
    diverged = {"lin-hess": ["step 351: NotPositiveDefiniteError: R"], "lin-ef": []}
    e = abl.bbb_lr(diverged)
    assert e["supported"] and "alpha 0.1: MC-EF 2.370, LIN-HESS 0.490, LIN-EF 0.400" in e["evidence"]
    # no reported run diverged: the learning rate is not what failed the claim
    assert not abl.bbb_lr({"lin-hess": [], "lin-ef": []})["supported"]
    e = abl.mc_worse_with_bbb_lr(8, [("bbb", "lin-hess"), ("bbb", "lin-ef")])
    assert e["supported"] and "-> 10/12" in e["evidence"]
    assert abl.mc_worse_with_bbb_lr(8, [("blr", "lin-hess")]) is None  # only BBB runs are explained this way
    t[("metrics", "bbb", "lin-ef", 0.1)] = (0.40, 1.09, 1.0)  # MC not the worst for one: 9/12 still reaches 9
    assert abl.mc_worse_with_bbb_lr(8, [("bbb", "lin-hess"), ("bbb", "lin-ef")])["supported"]
    t[("metrics", "bbb", "lin-hess", 0.1)] = (0.49, 1.1, 1.0)
    assert not abl.mc_worse_with_bbb_lr(8, [("bbb", "lin-hess"), ("bbb", "lin-ef")])["supported"]


def test_mc_worse_by_estimator_needs_every_linearised_run_worse_and_no_mc_ef_run():
    # (plugin, Lin-MC, MC) final NLL per DLR-10 method on the new trial; None: diverged
    lin = {"plugin": 0.5, "linmc": 1.1, "mc": 1.4}
    table = {}
    for a in bong.ALGOS:
        for e in bong.ESTS:
            table[("metrics", a, e, 0.3)] = (2.0, 2.01, 1.99) if e == "mc-ef" else tuple(lin.values())

    class Abl(_FakeAblation):
        def final_metrics(self, method, seed=None, n_stream=None):
            v = self.table[("metrics", method[0], method[1], self.hps["bbb"]["lr"])]
            return None if v is None else {"plugin": {"nll": v[0]}, "linmc": {"nll": v[1]}, "mc": {"nll": v[2]}}

    e = Abl(table).mc_worse_by_estimator()
    assert e["supported"] and e["cause"] == "does-not-carry-over"
    assert "8/12 with MC worse than both; linearised 8/8 finished runs, MC-EF 0/4" in e["evidence"]
    table[("metrics", "bbb", "lin-hess", 0.3)] = None  # a diverged linearised run leaves the pattern
    assert Abl(table).mc_worse_by_estimator()["supported"]
    table[("metrics", "blr", "lin-ef", 0.3)] = (0.5, 1.1, 1.0)  # a linearised run with MC not the worst
    assert not Abl(table).mc_worse_by_estimator()["supported"]
    table[("metrics", "blr", "lin-ef", 0.3)] = tuple(lin.values())
    table[("metrics", "bog", "mc-ef", 0.3)] = (2.0, 2.01, 2.2)  # an MC-EF run with MC the worst
    assert not Abl(table).mc_worse_by_estimator()["supported"]
    for a in bong.ALGOS:  # the claim reached on the new trial: nothing to explain this way
        table[("metrics", a, "mc-ef", 0.3)] = (2.0, 2.01, 2.2)
    table[("metrics", "bbb", "lin-hess", 0.3)] = tuple(lin.values())
    assert not Abl(table).mc_worse_by_estimator()["supported"]


def _fake_reg_runs(finals):
    """_reg_runs returning one trial per config whose curve ends at finals[(algo, est)] ({T: value} or a value)."""
    def runs(cfg, configs, n_stream=None, seeds=None):
        out = {}
        for c in configs:
            v = finals[c[:2]]
            curve = np.array([[t, x] for t, x in v.items()]) if isinstance(v, dict) else np.array([[1, v]])
            out[c] = [{"curve": curve}]
        return out
    return runs


def test_mc_ef_explanations_follow_the_new_trial(monkeypatch):
    cfg = {"n_samples": 10, "seeds": 2, "n_stream": 300, "every": 20, "mc_big": 100}
    sel = {f"{a} mc-ef I=1": {"lr": None if a == "bong" else 5e-4} for a in bong.ALGOS}
    monkeypatch.setattr(bong, "_reg_runs", _fake_reg_runs(
        {("bong", "mc-ef"): 6.3, ("blr", "mc-ef"): 6.3, ("bog", "mc-ef"): 3.1, ("bbb", "mc-ef"): 3.1}))
    assert bong._mc_ef_other_trial(cfg, sel)["supported"]
    monkeypatch.setattr(bong, "_reg_runs", _fake_reg_runs(
        {("bong", "mc-ef"): 0.3, ("blr", "mc-ef"): 0.4, ("bog", "mc-ef"): 3.1, ("bbb", "mc-ef"): 3.0}))
    assert not bong._mc_ef_other_trial(cfg, sel)["supported"]  # the paper's order on the new trial
    monkeypatch.setattr(bong, "_reg_runs", _fake_reg_runs(
        {("bong", "lin-hess"): {300: 0.17, 600: 0.14}, ("bong", "mc-ef"): {300: 6.5, 600: 5.5},
         ("bong", "lin-ef"): {300: 2.0, 600: 0.6}}))
    e = bong._mc_ef_longer(cfg)
    assert e["supported"] and "T = 600: LIN-HESS 0.140, MC-EF (M = 100) 5.500, LIN-EF 0.600" in e["evidence"]
    monkeypatch.setattr(bong, "_reg_runs", _fake_reg_runs(
        {("bong", "lin-hess"): {300: 0.17, 600: 0.14}, ("bong", "mc-ef"): {300: 6.5, 600: 0.5},
         ("bong", "lin-ef"): {300: 2.0, 600: 0.6}}))
    assert not bong._mc_ef_longer(cfg)["supported"]  # within 0.5 nats on the longer stream
