"""`refbayes warmup` compiles what real filters then call: after it, filters of other sizes compile nothing."""

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest

import refbayes as rb

numba = pytest.importorskip("numba")

from refbayes import _cli_warmup  # noqa: E402
from refbayes.cli import main  # noqa: E402


def _signature_counts():
    """{dispatcher name: number of compiled signatures} over every refbayes CPU kernel module."""
    from numba.core.registry import CPUDispatcher

    importlib.import_module("refbayes.kernels.cpu")
    out = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith("refbayes.kernels.cpu") and mod is not None:
            for key, obj in vars(mod).items():
                if isinstance(obj, CPUDispatcher):
                    out[f"{name}.{key}"] = len(obj.signatures)
    return out


def _real_filters(group, model, lik):
    """Filters of ``group`` as a user would build them (other ranks, sample counts, iterations)."""
    if group == "lofi":
        return [rb.LoFi(model, lik, rank=5, gamma=0.999, q=1e-6, backend="numba", dtype=dt)
                for dt in (np.float64, np.float32)]
    if group in ("fdekf", "vdekf"):
        return [(rb.FDEKF if group == "fdekf" else rb.VDEKF)(model, lik, q=1e-6, backend="numba", dtype=dt)
                for dt in (np.float64, np.float32)]
    if group == "full":  # every filter with a compiled update pass over the full families
        return ([rb.FullEKF(model, lik, q=1e-6, form=form, backend="numba") for form in ("covariance", "joseph")]
                + [rb.Bong(model, lik, algorithm=alg, family=fam, estimator=est, backend="numba",
                           **({"lr": 1e-6} if alg == "bog" else {}))
                   for alg in ("bong", "bog") for fam in ("full", "full-moment") for est in ("lin-hess", "lin-ef")
                   if (alg, fam) != ("bong", "full-moment")])  # (its moment downdate loses definiteness here)
    out = []
    for family in ("diag", "diag-moment", "dlr"):
        for estimator in ("lin-hess", "lin-ef", "mc-ef", "mc-hess"):
            if (family, estimator) == ("dlr", "mc-hess"):
                continue
            kw = dict(algorithm=group, family=family, estimator=estimator, backend="numba")
            if family == "dlr":
                kw["rank"] = 4
            if estimator == "mc-ef":
                kw["n_samples"] = 5
            if estimator == "mc-hess":
                kw.update(n_samples=2, n_probes=3)
            if group != "bong":
                kw["lr"] = 1e-6 if family.endswith("-moment") else 1e-3
            if group in ("blr", "bbb"):
                kw["n_iter"] = 3
            out.append(rb.Bong(model, lik, **kw))
    if group == "bog":  # the NumPy full-moment step, whose definiteness certificate is compiled
        out += [rb.Bong(model, lik, algorithm="bog", family="full-moment", estimator=est, lr=1e-6)
                for est in ("lin-hess", "lin-ef")]
    return out


@pytest.mark.parametrize("group", list(_cli_warmup.GROUPS))
def test_after_warmup_filters_of_other_sizes_compile_nothing(group):
    _cli_warmup.warm([group])
    before = _signature_counts()
    rng = np.random.default_rng(1)
    problems = [(rb.MLP([7, 9, 6, 4], activation="tanh"), rb.Gaussian(0.5), rng.normal(size=(4, 7)),
                 rng.normal(size=(4, 4))),
                (rb.MLP([7, 5, 3]), rb.Categorical(3), rng.normal(size=(4, 7)),
                 rng.integers(0, 3, size=(4, 1)).astype(float)),
                (rb.Linear(7, 4, bias=False), rb.Gaussian(0.5), rng.normal(size=(4, 7)), rng.normal(size=(4, 4)))]
    for model, lik, X, Y in problems:
        for filt in _real_filters(group, model, lik):
            kw = {"rng": np.random.default_rng(0)} if str(getattr(filt, "estimator", "")).startswith("mc-") else {}
            bel = filt.init(model.init_params(rng), 0.01)
            bel = filt.predict_update(bel, X[0], Y[0], **kw)
            filt.scan(bel, X, Y, **kw)
    after = _signature_counts()
    new = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert not new, f"compiled after `refbayes warmup --only {group}`: {new}"


def test_warmup_rejects_unknown_groups_and_job_counts(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["warmup", "--only", "lofi,kalman"])
    assert exc.value.code == 2 and "--only takes groups among" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["warmup", "--jobs", "0"])
    assert exc.value.code == 2 and "--jobs must be at least 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown warmup group"):
        _cli_warmup.warm(["nope"])


def test_warmup_split_deals_every_group_once():
    groups = list(_cli_warmup.GROUPS)
    for jobs in (1, 2, 3, 10):
        parts = _cli_warmup._split(groups, jobs)
        assert len(parts) == min(jobs, len(groups))
        assert sorted(g for p in parts for g in p) == sorted(groups)


def test_warmup_in_two_processes_reports_each_group():
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-m", "refbayes.cli", "warmup", "--only", "vdekf,fdekf", "--jobs", "2"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = sorted(ln.split(":")[1].split()[0] for ln in out.stdout.splitlines() if ln.startswith("refbayes warmup:"))
    assert lines == ["fdekf", "vdekf"], out.stdout
