"""Golden trajectories: file round trip, crosscheck localisation, and an independent dense EKF that passes."""

import json

import numpy as np
import pytest

from refbayes import golden
from refbayes.cli import main


@pytest.fixture(scope="module")
def ekf_golden():
    return golden.make("full-ekf")


@pytest.fixture(scope="module")
def lofi_golden():
    return golden.make("lofi", problems=["linear-reg-dynamic", "mlp-reg-dynamic"])


def _copy(g):
    return {"meta": json.loads(json.dumps(g["meta"])), "arrays": {k: v.copy() for k, v in g["arrays"].items()}}


@pytest.mark.parametrize("which", ["ekf_golden", "lofi_golden"])
def test_round_trip_is_bit_for_bit(which, request, tmp_path):
    g = request.getfixturevalue(which)
    path = tmp_path / "g.npz"
    golden.write(g, path, sidecar=True)
    back = golden.read(path)
    assert back["meta"] == g["meta"]
    assert json.loads((tmp_path / "g.npz.json").read_text()) == g["meta"]
    assert set(back["arrays"]) == set(g["arrays"])
    for k, v in g["arrays"].items():
        assert back["arrays"][k].dtype == v.dtype == np.float64, k
        assert back["arrays"][k].tobytes() == v.tobytes(), k
    assert golden.compare(back, g, rtol=0.0, atol=0.0).passed


def test_file_holds_documented_arrays(ekf_golden, lofi_golden):
    meta, a = ekf_golden["meta"], ekf_golden["arrays"]
    assert meta["format"] == "refbayes-golden" and meta["format_version"] == 1
    for name, p in meta["problems"].items():
        T, P = p["T"], p["n_params"]
        assert a[f"{name}.X"].shape[0] == T
        assert a[f"{name}.mean"].shape == (T, P)
        assert a[f"{name}.cov"].shape == (T, P, P)
        assert a[f"{name}.init_cov"].shape == (P, P)
        assert a[f"{name}.pred_cov"].shape == (T, 1, 1)
        assert p["layout"][-1]["stop"] == P
    assert {p["gamma"] < 1 for p in meta["problems"].values()} == {True, False}
    assert {p["likelihood"]["type"] for p in meta["problems"].values()} == {"gaussian", "bernoulli"}
    assert {p["model"]["type"] for p in meta["problems"].values()} == {"linear", "mlp"}
    la = lofi_golden["arrays"]
    assert la["mlp-reg-dynamic.W"].shape == (30, 25, golden.LOFI_RANK)
    assert la["mlp-reg-dynamic.ups"].shape == (30, 25)


def test_documented_mlp_layout_matches_model():
    import refbayes as rb

    model = rb.MLP([2, 6, 1], activation="tanh")
    layout = golden.model_layout({"type": "mlp", "layer_sizes": [2, 6, 1], "activation": "tanh"})
    theta = np.arange(model.n_params, dtype=float)
    layers = model.unflatten(theta)
    blocks = {b["name"]: theta[b["start"]:b["stop"]].reshape(b["shape"]) for b in layout}
    for l, (W, b) in enumerate(layers):
        np.testing.assert_array_equal(blocks[f"W{l}"], W)
        np.testing.assert_array_equal(blocks[f"b{l}"], b)


@pytest.mark.parametrize("k", [0, 11, 29])
def test_crosscheck_finds_perturbed_mean(ekf_golden, k):
    theirs = _copy(ekf_golden)
    theirs["arrays"]["mlp-reg-dynamic.mean"][k, 7] += 1e-4
    rep = golden.compare(theirs, ekf_golden, rtol=1e-6, atol=1e-9)
    assert not rep.passed
    assert set(rep.first) == {"mlp-reg-dynamic"}
    d = rep.first["mlp-reg-dynamic"]
    assert (d.step, d.quantity, d.index) == (k, "mean", (7,))
    assert np.argmax(rep.ratio["mlp-reg-dynamic"] > 1) == k


def test_crosscheck_finds_perturbed_covariance(ekf_golden):
    theirs = _copy(ekf_golden)
    c = theirs["arrays"]["linear-cls-static.cov"]
    c[17, 2, 4] += 1e-5
    c[17, 4, 2] += 1e-5
    d = golden.compare(theirs, ekf_golden).first["linear-cls-static"]
    assert (d.step, d.quantity, d.index) == (17, "cov", (2, 4))


def test_dlr_compared_up_to_rotation(lofi_golden):
    rng = np.random.default_rng(3)
    theirs = _copy(lofi_golden)
    W = theirs["arrays"]["mlp-reg-dynamic.W"]
    for t in range(W.shape[0]):
        Q, _ = np.linalg.qr(rng.normal(size=(W.shape[2], W.shape[2])))
        W[t] = W[t] @ Q
    assert not np.allclose(W, lofi_golden["arrays"]["mlp-reg-dynamic.W"])
    assert golden.compare(theirs, lofi_golden, rtol=1e-9, atol=1e-12).passed
    W[5] *= 1.001
    d = golden.compare(theirs, lofi_golden).first["mlp-reg-dynamic"]
    assert (d.step, d.quantity) == (5, "WWt")


def test_missing_problem_fails(ekf_golden):
    theirs = _copy(ekf_golden)
    del theirs["meta"]["problems"]["mlp-cls-dynamic"]
    rep = golden.compare(theirs, ekf_golden)
    assert not rep.passed and rep.missing == ("mlp-cls-dynamic",)


# -- an independent dense EKF, written from the equations over the documented layout ----------------

def _f_and_jac(desc, theta, x):
    """Model output f (scalar) and its gradient (P,) from the layout in docs/golden-format.md."""
    blocks = {b["name"]: theta[b["start"]:b["stop"]].reshape(b["shape"]) for b in desc["layout"]}
    if desc["model"]["type"] == "linear":
        return blocks["W"][0] @ x + blocks["b"][0], np.concatenate([x, [1.0]])
    W0, b0, W1, b1 = blocks["W0"], blocks["b0"], blocks["W1"], blocks["b1"]
    h = np.tanh(W0 @ x + b0)
    dh = W1[0] * (1.0 - h**2)
    return W1[0] @ h + b1[0], np.concatenate([np.outer(dh, x).ravel(), dh, h, [1.0]])


def _dense_ekf(desc, X, Y, m, S):
    gauss = desc["likelihood"]["type"] == "gaussian"
    out = {k: [] for k in ("mean", "cov", "pred_mean", "pred_cov")}
    for x, y in zip(X, Y):
        m, S = desc["gamma"] * m, desc["gamma"] ** 2 * S + desc["q"] * np.eye(len(m))
        f, J = _f_and_jac(desc, m, x)
        mu = f if gauss else 1.0 / (1.0 + np.exp(-f))
        R = desc["likelihood"]["obs_var"] if gauss else mu * (1.0 - mu)
        H = J if gauss else R * J
        s = H @ S @ H + R
        K = S @ H / s
        m = m + K * (float(np.ravel(y)[0]) - mu)
        S = S - np.outer(K, K) * s
        S = 0.5 * (S + S.T)
        out["mean"].append(m); out["cov"].append(S)
        out["pred_mean"].append([mu]); out["pred_cov"].append([[s]])
    return {k: np.array(v, dtype=np.float64) for k, v in out.items()}


def test_independent_dense_ekf_passes_crosscheck(ekf_golden, tmp_path):
    ours_path = tmp_path / "ours.npz"
    golden.write(ekf_golden, ours_path)
    given = golden.read(ours_path)
    arrays = {}
    meta = {"format": "refbayes-golden", "format_version": 1, "library": "numpy-dense-ekf", "dtype": "float64",
            "method": "full-ekf", "problems": {}}
    for name, desc in given["meta"]["problems"].items():
        a = {k: given["arrays"][f"{name}.{k}"] for k in ("X", "Y", "init_mean", "prior_var")}
        traj = _dense_ekf(desc, a["X"], a["Y"], a["init_mean"].copy(), np.diag(a["prior_var"]))
        arrays.update({f"{name}.{k}": v for k, v in {**a, **traj}.items()})
        meta["problems"][name] = {k: desc[k] for k in ("model", "likelihood", "gamma", "q", "T", "layout")}
        meta["problems"][name]["belief"] = "full"
    theirs_path = tmp_path / "theirs.npz"
    golden.write({"meta": meta, "arrays": arrays}, theirs_path)
    rep = golden.compare(golden.read(theirs_path), given, rtol=1e-8, atol=1e-10)
    assert rep.passed, rep.summary()
    assert set(rep.ratio) == set(given["meta"]["problems"])
    assert main(["crosscheck", str(theirs_path), "--against", str(ours_path)]) == 0
    assert main(["crosscheck", str(theirs_path), "--method", "full-ekf"]) == 0
    # the dense EKF is not a diagonal filter: crosscheck against FD-EKF must fail
    assert not golden.compare(golden.read(theirs_path), golden.make("fd-ekf")).passed


def test_cli_golden_and_crosscheck(tmp_path, capsys):
    path = tmp_path / "lofi.npz"
    assert main(["golden", "lofi", "--out", str(path), "--problems", "linear-reg-dynamic", "mlp-cls-dynamic"]) == 0
    assert main(["crosscheck", str(path), "--method", "bong-dlr3-hess_lin"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["crosscheck", str(path), "--method", "full-ekf"]) == 1
    out = capsys.readouterr().out
    assert "first divergence" in out and "FAIL" in out


def test_cli_usage_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["golden", "no-such-method", "--out", str(tmp_path / "x.npz")])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["crosscheck", str(tmp_path / "absent.npz"), "--method", "full-ekf"])
    assert exc.value.code == 2
    assert "absent.npz" in capsys.readouterr().err


def test_read_rejects_other_versions(ekf_golden, tmp_path):
    g = _copy(ekf_golden)
    g["meta"]["format_version"] = 99
    golden.write(g, tmp_path / "v.npz")
    with pytest.raises(ValueError, match="format_version"):
        golden.read(tmp_path / "v.npz")


def test_plot(ekf_golden, tmp_path):
    pytest.importorskip("matplotlib")
    theirs = _copy(ekf_golden)
    theirs["arrays"]["linear-reg-static.mean"][4, 0] += 1.0
    rep = golden.compare(theirs, ekf_golden)
    path = golden.plot_report(rep, tmp_path / "err.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_belief_array_is_named(ekf_golden, tmp_path):
    theirs = _copy(ekf_golden)
    del theirs["arrays"]["mlp-reg-static.cov"]
    with pytest.raises(ValueError, match="mlp-reg-static.cov"):
        golden.compare(theirs, ekf_golden)


@pytest.mark.parametrize("method, kind, n_problems", [("fd-ekf", "diag", 6), ("vd-ekf", "diag", 6),
                                                      ("rvga", "full", 3), ("blr-diag-hess_lin", "diag", 6)])
def test_methods_and_kinds(method, kind, n_problems, ekf_golden):
    g = golden.make(method)
    assert len(g["meta"]["problems"]) == n_problems
    assert {p["belief"] for p in g["meta"]["problems"].values()} == {kind}
    # different belief kinds are compared through the dense covariance
    rep = golden.compare(g, ekf_golden)
    assert all("cov" in q for q in rep.quantities.values()) or kind == "full"
    if method == "rvga":
        # on a linear-Gaussian model R-VGA and the EKF are both the exact Kalman posterior
        assert "linear-reg-dynamic" not in rep.first and "linear-reg-static" not in rep.first
        assert rep.missing  # the MLP problems are not run by R-VGA
    else:
        assert not rep.passed  # a diagonal filter is not the full EKF
