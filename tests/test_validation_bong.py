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
