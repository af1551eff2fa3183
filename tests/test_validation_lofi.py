"""The LO-FI validation's explanations follow their numbers (filter runs replaced where they would be slow)."""

import numpy as np
from sklearn.datasets import load_diabetes

import refbayes as rb
from refbayes.validation import lofi as lv

METHODS = [lv.FC, lv.LOFI, lv.SPH, lv.FD, lv.VD]


def _fake_fit(base, spread=0.02):
    """_regression_fit whose NLPD is base[m] plus split noise that differs between methods (so paired
    differences have a standard error), best at obs_var 0.4."""
    def fit(m, model, hp, theta0, Xtr, Ytr, Xte, Yte):
        noise = spread * np.random.default_rng([int(abs(Xte[0, 0]) * 1e6), METHODS.index(m)]).standard_normal()
        return 0.7, base[m] + noise + (hp["obs_var"] - 0.4) ** 2
    return fit


def _reported(base, splits, spread=0.02, obs_var=0.3):
    X, y = load_diabetes(return_X_y=True)
    n_train = int(round(0.9 * len(y)))
    model = rb.MLP([10, 4, 1], activation="relu")
    fit = _fake_fit(base, spread)
    sc = {m: [] for m in METHODS}
    for s in range(splits):
        Xtr, Ytr, Xte, Yte = lv._diabetes_split(X, y, n_train, np.random.default_rng([2023, 5, s]))
        for m in METHODS:
            sc[m].append(fit(m, None, {"obs_var": obs_var}, None, Xtr, Ytr, Xte, Yte))
    return model, X, y, n_train, {m: np.array(v) for m, v in sc.items()}


def test_diabetes_nlpd_tie_needs_every_rival_within_two_standard_errors(monkeypatch):
    hps = {m: {"prior_var": 0.03, "obs_var": 0.3} for m in METHODS}
    cfg = {"splits": 6}
    # LO-FI 0.003 below FCEKF, well inside the split noise: a tie in both settings
    base = {lv.FC: 1.140, lv.LOFI: 1.137, lv.SPH: 1.150, lv.FD: 1.16, lv.VD: 1.16}
    monkeypatch.setattr(lv, "_regression_fit", _fake_fit(base))
    model, X, y, n_train, sc = _reported(base, cfg["splits"])
    e = lv._diabetes_nlpd_tie(model, X, y, n_train, hps, sc, cfg)
    assert e["supported"] and e["cause"] == "does-not-carry-over"
    assert "FCEKF 0.4, LO-FI 0.4" in e["evidence"] and "LO-FI - FCEKF (finer obs_var)" in e["evidence"]
    # LO-FI clearly below FCEKF (0.1 nats, noise 0.02): not a tie, the explanation is rejected
    base[lv.LOFI] = 1.04
    monkeypatch.setattr(lv, "_regression_fit", _fake_fit(base))
    model, X, y, n_train, sc = _reported(base, cfg["splits"])
    assert not lv._diabetes_nlpd_tie(model, X, y, n_train, hps, sc, cfg)["supported"]


def test_probit_explanation_rejects_a_filter_whose_predictive_beats_its_plugin():
    model, lik = rb.MLP([4, 3, 3], activation="tanh"), rb.Categorical(3)
    rng = np.random.default_rng(0)
    theta0 = model.init_params(rng)
    finals = {}
    for m in (lv.LOFI, lv.VD):
        learner, pv = lv._build(m, model, lik, {"prior_var": 0.1}, rank=1)
        finals[m] = (learner, learner.init(theta0, pv))
    Xte, yte = rng.standard_normal((20, 4)), rng.integers(0, 3, 20)
    curve = [np.array([[10, 0.50, 0.2]])]
    curves = {m: curve for m in (lv.LOFI, lv.FD, lv.VD)}
    # FDEKF's probit NLPD below its plugin NLL on the one seed: the gaps need not widen
    probit = {lv.LOFI: [(0.60, 0.2)], lv.FD: [(0.45, 0.2)], lv.VD: [(0.70, 0.2)]}
    e = lv._probit_explanation(curves, probit, finals, lv.VD, model, Xte, yte, n_points=20, n_samples=20)
    assert not e["supported"]
    assert "FDEKF -0.050" in e["evidence"] and "linearised MC (20 draws)" in e["evidence"]


def test_run_hands_the_stationary_digits_results_to_the_rank_ablation_and_permuted_parts(monkeypatch, tmp_path):
    """run() through the shared runner: L3 and L4 get L2's tuned hyper-parameters and ablation stream,
    every part's checks and figures are collected and lofi.json holds each part, its time and the mode."""
    import json

    seen = {}

    def part(name):
        def fn(*args):
            seen[name] = args
            return {"part": name}, [{"name": name}], [f"{name}.png"]
        return fn

    def digits_stationary(*args):
        seen["L2"] = args
        return {"part": "L2", "hparams": {"tuned": 1}}, [{"name": "L2"}], ["L2.png"], ("X", "Y", "theta0")

    monkeypatch.setattr(lv, "drift", part("L1"))
    monkeypatch.setattr(lv, "digits_stationary", digits_stationary)
    monkeypatch.setattr(lv, "rank_ablation", part("L3"))
    monkeypatch.setattr(lv, "permuted", part("L4"))
    monkeypatch.setattr(lv, "diabetes", part("L5"))
    out = lv.run(quick=True, outdir=str(tmp_path), tune=False)
    assert seen["L3"][1] == {"tuned": 1} and seen["L3"][3] == ("X", "Y", "theta0")
    assert seen["L4"][1] == {"tuned": 1}
    assert [c["name"] for c in out["checks"]] == ["L1", "L2", "L3", "L4", "L5"]
    assert out["figures"] == ["L1.png", "L2.png", "L3.png", "L4.png", "L5.png"] and out["defaults"] is lv.DEFAULTS
    saved = json.loads((tmp_path / "lofi.json").read_text())
    assert saved["L3_rank_ablation"] == {"part": "L3"} and saved["mode"] == "quick" and saved["tuned"] is False
    assert set(saved["seconds"]) == {"L1_drift_1d", "L2_digits_stationary", "L3_rank_ablation",
                                     "L4_permuted_digits", "L5_diabetes"}
