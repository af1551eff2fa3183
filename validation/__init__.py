"""Validation runs: the papers' experiments on offline data, with plots and a report.

Imported as ``refbayes.validation``. Each experiment is a module with a
function ``run(quick, outdir) -> dict`` that writes its JSON and PNG files
into ``outdir`` and returns a summary with a list of ``checks``: each check is
a dict with ``name``, ``expected`` (the paper's claim or target), ``measured``
and ``passed``. ``run_all`` runs the chosen experiments and writes
``report.md``.
"""

import importlib
import json
import os
import time
import traceback

from threadpoolctl import threadpool_limits

__all__ = ["EXPERIMENTS", "run_all"]

# name -> module inside refbayes.validation
EXPERIMENTS = {
    "diagonal_ekf": "diagonal_ekf",
    "lofi": "lofi",
    "bong": "bong",
    "rvga": "rvga_logistic",
    "bandits": "bandits",
    "bench": "bench",
}
DEFAULT = ("diagonal_ekf", "lofi", "bong", "rvga", "bandits")


def _available(name):
    try:
        importlib.import_module(f"{__name__}.{EXPERIMENTS[name]}")
        return True
    except ModuleNotFoundError as exc:
        if exc.name == f"{__name__}.{EXPERIMENTS[name]}":
            return False
        raise


def run_all(quick=False, outdir="validation-results", only=None, progress=True):
    """Run the experiments (all default ones, or ``only``) and write ``outdir/report.md``."""
    names = list(only) if only else [n for n in DEFAULT if _available(n)]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"unknown experiment(s) {unknown}; choose from {sorted(EXPERIMENTS)}")
    os.makedirs(outdir, exist_ok=True)
    summaries = {}
    for name in names:
        sub = os.path.join(outdir, name)
        os.makedirs(sub, exist_ok=True)
        if progress:
            print(f"[refbayes validate] {name} ...", flush=True)
        start = time.perf_counter()
        module = importlib.import_module(f"{__name__}.{EXPERIMENTS[name]}")
        try:
            # small dense algebra throughout: one BLAS thread is faster and repeatable
            with threadpool_limits(limits=1, user_api="blas"):
                summary = module.run(quick=quick, outdir=sub)
        except Exception:  # report the failure, keep going with the others
            summary = {"error": traceback.format_exc(), "checks": []}
        summary["seconds"] = time.perf_counter() - start
        summaries[name] = summary
        with open(os.path.join(sub, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=2, default=float)
        if progress:
            n_ok = sum(bool(c.get("passed")) for c in summary.get("checks", []))
            print(f"[refbayes validate] {name}: {n_ok}/{len(summary.get('checks', []))} checks hold, "
                  f"{summary['seconds']:.1f} s", flush=True)
    return _write_report(summaries, outdir, quick)


def _write_report(summaries, outdir, quick):
    lines = ["# refbayes validation report", "", f"mode: {'quick' if quick else 'full'}", ""]
    for name, s in summaries.items():
        lines += [f"## {name}", "", f"time: {s['seconds']:.1f} s", ""]
        if "error" in s:
            lines += ["**failed to run:**", "", "```", s["error"], "```", ""]
        if s.get("checks"):
            lines += ["| check | paper / target | measured | holds |", "|---|---|---|---|"]
            for c in s["checks"]:
                lines.append(f"| {c['name']} | {c['expected']} | {c['measured']} | {'yes' if c.get('passed') else 'NO'} |")
            lines.append("")
        for fig in s.get("figures", []):
            lines += [f"![{fig}]({name}/{fig})", ""]
    path = os.path.join(outdir, "report.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines))
    return path
