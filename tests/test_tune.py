"""Hyper-parameters from the evidence: refbayes.tune against the exact marginal likelihood."""

import math

import numpy as np
import pytest

import refbayes as rb
from refbayes import exact
from refbayes.tune import tune


def test_reported_evidence_of_a_linear_gaussian_model_is_the_exact_one():
    rng = np.random.default_rng(0)
    model = rb.Linear(3, 1)
    P = model.n_params
    X = rng.standard_normal((40, 3))
    Y = X @ rng.standard_normal((3, 1)) + 0.3 * rng.standard_normal((40, 1))
    filt = rb.FullEKF(model, rb.Gaussian(1.0))
    mu0 = np.zeros(P)
    res = tune(filt, mu0, X, Y, grid={"prior_var": [0.5, 2.0], "obs_var": [0.05, 0.09, 0.3], "q": [0.0, 1e-3]})
    assert len(res.table) == 12
    Hs = np.array([model.jacobian(mu0, x) for x in X])
    for row in res.table:
        kf = exact.kalman_filter(mu0, row["prior_var"] * np.eye(P), Hs, Y, row["obs_var"] * np.eye(1), q=row["q"])
        np.testing.assert_allclose(row["score"], kf.log_evidence, rtol=1e-10)
    assert res.score == max(r["score"] for r in res.table)
    assert res.best["obs_var"] == 0.09  # the noise the data were drawn with
    assert float(res.filter.likelihood.obs_var) == 0.09 and res.prior_var == res.best["prior_var"]


def test_refined_search_improves_on_the_grid_and_stays_within_its_bounds():
    rng = np.random.default_rng(1)
    model = rb.Linear(2, 1)
    X = rng.standard_normal((60, 2))
    Y = X @ np.array([[1.0], [-2.0]]) + 0.25 * rng.standard_normal((60, 1))
    filt = rb.FullEKF(model, rb.Gaussian(1.0))
    grid = {"obs_var": [0.01, 0.1, 1.0]}
    coarse = tune(filt, np.zeros(3), X, Y, grid=grid)
    fine = tune(filt, np.zeros(3), X, Y, grid=grid, refine="obs_var", n_refine=15)
    assert fine.score >= coarse.score
    assert 0.01 <= fine.best["obs_var"] <= 1.0 and len(fine.table) <= 3 + 15


def test_tune_on_the_readme_data_fits_at_least_as_well_as_the_readme_settings():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(200, 1))
    Y = np.sin(2 * X) + 0.1 * rng.standard_normal((200, 1))
    model = rb.MLP([1, 16, 1], activation="tanh")
    theta = model.init_params(rng)
    grid_x = np.linspace(-2, 2, 101)[:, None]

    def rmse(filt, prior_var):
        bel, _ = filt.scan(filt.init(theta, prior_var), X, Y)
        return np.sqrt(np.mean((filt.predict_obs(bel, grid_x)[0][:, 0] - np.sin(2 * grid_x[:, 0])) ** 2))

    filt = rb.LoFi(model, rb.Gaussian(obs_var=0.01), rank=10)
    res = tune(filt, theta, X, Y, grid={"prior_var": [0.3, 1.0, 3.0], "obs_var": [0.003, 0.01, 0.03, 0.1]})
    assert rmse(res.filter, res.prior_var) <= rmse(filt, 1.0) * 1.05


def test_a_diverging_candidate_is_reported_not_dropped():
    rng = np.random.default_rng(2)
    model = rb.MLP([3, 4, 1])
    X = rng.standard_normal((10, 3))
    Y = rng.poisson(2.0, (10, 1)).astype(float)
    Y[4] = 1e4  # a spike that a confident prior absorbs and a vague one runs away with
    filt = rb.FullEKF(model, rb.Poisson())
    with np.errstate(all="ignore"):
        res = tune(filt, model.init_params(np.random.default_rng(5)), X, Y, grid={"prior_var": [1e-10, 1e-4, 1.0, 100.0]})
    assert [r["prior_var"] for r in res.table] == [1e-10, 1e-4, 1.0, 100.0]
    bad = [r for r in res.table if r["score"] == -math.inf]
    assert len(bad) == 2 and all("step" in r["error"] for r in bad)
    assert res.best["prior_var"] == 1e-10 and math.isfinite(res.score)


def test_bad_grids_fail_before_any_run():
    model = rb.Linear(2, 1)
    filt = rb.FDEKF(model, rb.Gaussian(1.0))
    X, Y = np.zeros((3, 2)), np.zeros((3, 1))
    for grid, word in [({}, "grid"), ({"lr": [1.0]}, "unknown"), ({"gamma": [1.5]}, "gamma"),
                       ({"obs_var": [0.0]}, "obs_var"), ({"q": [np.nan]}, "q")]:
        with pytest.raises(ValueError, match=word):
            tune(filt, np.zeros(3), X, Y, grid=grid)
    with pytest.raises(ValueError, match="Gaussian"):
        tune(rb.FDEKF(model, rb.Bernoulli()), np.zeros(3), X, Y, grid={"obs_var": [1.0]})
    with pytest.raises(ValueError, match="holdout"):
        tune(filt, np.zeros(3), X, Y, grid={"q": [0.0]}, criterion="holdout")


def test_holdout_criterion_scores_the_final_belief_on_held_out_data():
    rng = np.random.default_rng(3)
    model = rb.Linear(2, 1)
    X = rng.standard_normal((80, 2))
    Y = X @ np.array([[0.5], [1.5]]) + 0.2 * rng.standard_normal((80, 1))
    filt = rb.FullEKF(model, rb.Gaussian(1.0))
    res = tune(filt, np.zeros(3), X[:60], Y[:60], grid={"obs_var": [0.004, 0.04, 0.4]}, criterion="holdout",
               X_val=X[60:], Y_val=Y[60:])
    bel, _ = res.filter.scan(res.filter.init(np.zeros(3), 1.0), X[:60], Y[:60])
    m, c = res.filter.predict_obs(bel, X[60:])
    lpd = np.mean([-0.5 * (y[0] - mi[0]) ** 2 / ci[0, 0] - 0.5 * np.log(2 * np.pi * ci[0, 0]) for y, mi, ci in zip(Y[60:], m, c)])
    np.testing.assert_allclose(res.score, lpd, rtol=1e-12)
    assert res.best["obs_var"] == 0.04


def test_refbayes_tune_command_on_a_csv_stream(tmp_path):
    import json
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(150, 1))
    Y = np.sin(2 * X) + 0.1 * rng.standard_normal((150, 1))
    data = tmp_path / "stream.csv"
    np.savetxt(data, np.hstack([X, Y]), delimiter=",")
    out = tmp_path / "tune.json"
    cmd = [sys.executable, "-m", "refbayes.cli", "tune", str(data), "--grid", "obs_var=0.001,0.01,0.1",
           "--hidden", "8", "--no-progress", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert len(result["table"]) == 3 and result["best"]["obs_var"] == 0.01  # the noise the data were drawn with
    assert "chosen (evidence): obs_var=0.01" in done.stdout
    bad = subprocess.run(cmd[:5] + ["--grid", "lr=1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "unknown hyper-parameter" in bad.stderr


def test_the_grid_on_three_workers_gives_the_same_table():
    pytest.importorskip("distributed")
    rng = np.random.default_rng(4)
    model = rb.Linear(2, 1)
    X = rng.standard_normal((30, 2))
    Y = X @ np.array([[0.5], [1.5]]) + 0.2 * rng.standard_normal((30, 1))
    filt = rb.FullEKF(model, rb.Gaussian(1.0))
    grid = {"obs_var": [0.01, 0.04, 0.2], "prior_var": [0.5, 2.0]}
    serial = tune(filt, np.zeros(3), X, Y, grid=grid)
    parallel = tune(filt, np.zeros(3), X, Y, grid=grid, workers=3)
    assert parallel.table == serial.table and parallel.best == serial.best
