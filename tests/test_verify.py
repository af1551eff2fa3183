"""refbayes.verify and ``refbayes verify``: every registered identity holds, and breaking an
equation in a copy of the package makes the command fail and name the identity."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import refbayes
from refbayes import verify
from refbayes.cli import main

# ------------------------------------------------------------------------------------------------
# the registry is the list of cross-method identities: each check is one test


@pytest.mark.parametrize("name", sorted(verify.CHECKS))
def test_identity_holds(name):
    check = verify.CHECKS[name]
    result = verify.run_check(check, seed=1)
    assert result.error == ""
    assert result.passed, f"{name}: worst error {result.worst_error:.3e} > {check.tolerance:.0e} ({check.identity})"
    assert result.instances == check.instances


@pytest.mark.slow
def test_thorough_run_holds_for_every_identity():
    results = verify.run_checks(seed=5, thorough=True)
    assert [r.name for r in results] == list(verify.CHECKS)
    for r in results:
        assert r.instances == verify.CHECKS[r.name].thorough_instances > verify.CHECKS[r.name].instances
        assert r.passed, f"{r.name}: {r.worst_error:.3e} {r.error}"


def test_registry_covers_every_method_family_and_cites_papers():
    assert 12 <= len(verify.CHECKS) <= 30
    covered = {m for c in verify.CHECKS.values() for m in c.methods}
    assert covered == set(verify.METHODS)
    authors = ("Chang 2022", "Chang 2023", "Jones 2024", "Lambert 2022", "Duran-Martin 2022")
    for c in verify.CHECKS.values():
        assert any(a in c.equation for a in authors), c.name
        assert 0 < c.tolerance <= 1e-8 and c.why
    for author in authors:
        assert any(author in c.equation for c in verify.CHECKS.values()), author


def test_select_by_method_and_unknown_name():
    lofi = {c.name for c in verify.select(["lofi"])}
    assert {"lofi-full-rank-ekf", "lofi-rank0-vdekf", "lofi-predict-exact", "bong-dlr-lofi"} <= lofi
    assert "rvga-kalman" not in lofi
    with pytest.raises(ValueError, match="choose from ekf"):
        verify.select(["lofi", "kalman"])


def test_relerr_scales_by_the_reference_and_flags_non_finite():
    assert verify.relerr([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert verify.relerr([0.0, 4.0 + 4e-3], [0.0, 4.0]) == pytest.approx(1e-3)
    assert verify.relerr([1e-3], [0.0]) == pytest.approx(1e-3)  # absolute below 1
    assert verify.relerr([np.nan], [0.0]) == math.inf


def test_a_check_that_raises_or_returns_nan_fails():
    def boom(rng):
        raise np.linalg.LinAlgError("singular")

    bad = verify.Check("boom", ("ekf",), "x = y", "Chang 2022 eq 0", 1e-9, "round-off", boom, instances=2)
    res = verify.run_check(bad)
    assert not res.passed and res.worst_error == math.inf and "LinAlgError: singular" in res.error
    nan = verify.Check("nan", ("ekf",), "x = y", "Chang 2022 eq 0", 1e-9, "round-off", lambda rng: float("nan"))
    assert not verify.run_check(nan).passed
    big = verify.Check("big", ("ekf",), "x = y", "Chang 2022 eq 0", 1e-9, "round-off", lambda rng: 2e-9)
    assert not verify.run_check(big).passed


def test_instances_are_reproducible_and_depend_on_the_seed():
    check = verify.CHECKS["lofi-full-rank-ekf"]
    draws = []
    for seed in (3, 3, 4):
        seen = []
        wrapped = verify.Check(check.name, check.methods, check.identity, check.equation, check.tolerance,
                               check.why, lambda rng: seen.append(rng.random()) or 0.0, instances=2)
        verify.run_check(wrapped, seed=seed)
        draws.append(seen)
    assert draws[0] == draws[1] != draws[2]


# ------------------------------------------------------------------------------------------------
# the command


def test_cli_prints_a_table_writes_json_and_exits_0(tmp_path, capsys):
    out = tmp_path / "verify.json"
    assert main(["verify", "bong", "--seed", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for name in ("bong-lin-hess-ekf", "bong-kalman", "bong-diag-vdekf", "bong-dlr-lofi"):
        assert name in text
    assert "rvga-kalman" not in text
    data = json.loads(out.read_text())
    assert data["seed"] == 2 and not data["thorough"]
    assert {r["name"] for r in data["results"]} == {c.name for c in verify.select(["bong"])}
    assert all(r["passed"] and r["worst_error"] <= r["tolerance"] for r in data["results"])


def test_cli_unknown_method_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["verify", "lofi", "kalman"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'kalman'" in err and "lofi" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------------
# breaking an equation in a copy of the package is caught by the command

BREAKS = [
    # (file, text, replacement, method, identity that must fail)
    ("filters/lofi.py", "    return mean + Dg - DWtil @ linalg.psd_solve(", "    return mean + Dg + DWtil @ linalg.psd_solve(",
     "lofi", "lofi-full-rank-ekf"),  # sign of the Woodbury correction in the mean (Chang 2023 eq 38)
    ("filters/lofi.py", "        ups = ups + linalg.rowsumsq(B[:, L:])", "        ups = ups",
     "lofi", "lofi-rank0-vdekf"),  # drop the discarded directions from the diagonal (eqs 41-42)
    ("filters/diagonal.py", "    mean = bel.mean + v * (SinvH.T @ e)", "    mean = bel.mean - v * (SinvH.T @ e)",
     "fdekf", "diag-one-step-projections"),  # sign of the FD-EKF gain (Chang 2022 eq 10)
]


@pytest.mark.parametrize("path, old, new, method, identity", BREAKS, ids=[b[4] for b in BREAKS])
def test_a_broken_equation_in_a_copy_fails_verify(tmp_path, path, old, new, method, identity):
    src = Path(refbayes.__file__).parent
    copy = tmp_path / "site" / "refbayes"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / path
    text = target.read_text()
    assert text.count(old) == 1, f"{path} no longer contains {old!r}; update BREAKS"
    target.write_text(text.replace(old, new))
    env = dict(os.environ, PYTHONPATH=str(copy.parent))
    env.pop("PYTHONSAFEPATH", None)
    module = "refbayes.filters." + Path(path).stem
    where = subprocess.run([sys.executable, "-c", f"import {module} as m; print(m.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()) == target  # the copy is what runs
    proc = subprocess.run([sys.executable, "-m", "refbayes.cli", "verify", method], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failing = [line.split()[0] for line in proc.stdout.splitlines() if line.rstrip().endswith("FAIL")]
    assert identity in failing, proc.stdout
    assert "FAILED: " in proc.stdout and identity in proc.stdout.split("FAILED: ")[1]
    # and the intact package passes the same command
    env["PYTHONPATH"] = str(src.parent)
    ok = subprocess.run([sys.executable, "-m", "refbayes.cli", "verify", method], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
