"""The bandit validation's explanations follow their numbers (agent runs replaced by fixed rewards)."""

import numpy as np

from refbayes.validation import bandits as bv

VARIANTS = list(bv.SUBSPACE_VARIANTS)


def test_warmup_explanation_needs_every_variant_above_every_rival():
    bandit = dict.fromkeys(VARIANTS, 1100.0)
    full = {k: 1500.0 + i for i, k in enumerate(VARIANTS)}
    e = bv._warmup_explanation(full, bandit, {"NL-Unlim": 1189.0}, "MNIST rewards")
    assert e["supported"] and e["cause"] == "setup" and "EKF-Sub-RND 1100 -> 1502" in e["evidence"]
    # one variant still below a rival with the full warm-up: rejected
    full["EKF-Sub-Diag-RND"] = 1150.0
    assert not bv._warmup_explanation(full, bandit, {"NL-Unlim": 1189.0, "Linear": 1000.0}, "x")["supported"]


def test_d_explanation_needs_the_gap_to_close_beyond_the_run_dimension():
    sweep = {"dims": [5, 100, 200], "seeds": [0, 1], "svd": [[1000, 0], [1200, 0], [1240, 0]],
             "random": [[990, 0], [1130, 0], [1200, 0]]}
    e = bv._d_explanation(sweep, 100, 1188.0, 1102.0)
    assert e["supported"] and "d=200 3.2%" in e["evidence"]
    # a gap still above 5% at the largest d: rejected
    sweep["random"][2] = [1150, 0]
    assert not bv._d_explanation(sweep, 100, 1188.0, 1102.0)["supported"]
    # a sweep that does not go beyond the run's d proves nothing about larger d
    assert not bv._d_explanation({**sweep, "dims": [5, 50, 100]}, 100, 1188.0, 1102.0)["supported"]
    assert bv._d_explanation(None, 100, 1188.0, 1102.0) is None


def _fake_compare(rewards):
    """compare_agents returning ``rewards[name]`` (a list per seed) for each agent asked for."""
    def compare(make_env, agents, seeds, n_warmup_per_arm=20):
        return {k: {"rewards": list(rewards[k]), "reward_mean": float(np.mean(rewards[k]))} for k in agents}
    return compare


def test_nl_lim_explanation_needs_nl_lim_alone_far_below_on_every_seed(monkeypatch):
    summ = {"A": {"rewards": [1400, 1410, 1420]}, "B": {"rewards": [1390, 1430, 1400]},
            "NL-Lim": {"rewards": [850, 830, 910]}}
    monkeypatch.setattr(bv, "compare_agents", _fake_compare({"NL-Lim": [1030, 990, 1046]}))
    e = bv._nl_lim_memory(None, bv.rb.MLP([3, 4, 2]), summ, ["A", "B", "NL-Lim"], [0, 1, 2], 1500)
    assert e["supported"] and e["cause"] == "does-not-carry-over" and "1030 (M = 100)" in e["evidence"]
    # with the paper's memory NL-Lim joins the others on one seed: the explanation is rejected
    monkeypatch.setattr(bv, "compare_agents", _fake_compare({"NL-Lim": [1030, 1380, 1046]}))
    assert not bv._nl_lim_memory(None, bv.rb.MLP([3, 4, 2]), summ, ["A", "B", "NL-Lim"], [0, 1, 2], 1500)["supported"]


def test_more_trials_averages_the_old_and_the_new_seeds(monkeypatch):
    rows = {"svd": [[1034.0, 0], [1100.0, 0]], "random": [[1052.0, 0], [1050.0, 0]]}
    net = bv.rb.MLP([3, 4, 2])
    monkeypatch.setattr(bv, "compare_agents", _fake_compare({"svd": [960] * 8, "random": [950] * 8}))
    e = bv._more_trials(None, net, [5], rows, [5, 10], [0, 1])
    # (2 * 1034 + 8 * 960) / 10 = 974.8 against (2 * 1052 + 8 * 950) / 10 = 970.4
    assert e["supported"] and "SVD 975 vs RND 970" in e["evidence"]
    monkeypatch.setattr(bv, "compare_agents", _fake_compare({"svd": [950] * 8, "random": [955] * 8}))
    assert not bv._more_trials(None, net, [5], rows, [5, 10], [0, 1])["supported"]


def test_full_warmup_runs_only_the_variants_not_measured(monkeypatch):
    asked = []

    def compare(make_env, agents, seeds, n_warmup_per_arm=20):
        asked.extend(agents)
        return {k: {"rewards": [1500.0], "reward_mean": 1500.0} for k in agents}

    monkeypatch.setattr(bv, "compare_agents", compare)
    net = bv.rb.MLP([3, 4, 2])
    full = bv._full_warmup_rewards(None, net, VARIANTS, 5, 10, [0], 2, have={"EKF-Sub-SVD": 1514.0})
    assert asked == VARIANTS[1:] and full["EKF-Sub-SVD"] == 1514.0
    # quick mode has no full-warm-up run of its own (None): every variant is run
    asked.clear()
    full = bv._full_warmup_rewards(None, net, VARIANTS[:3], 5, 10, [0], 2, have={"EKF-Sub-SVD": None})
    assert asked == VARIANTS[:3] and all(v == 1500.0 for v in full.values())
