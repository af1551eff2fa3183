"""Validation runs: the papers' experiments on offline data, with plots and a report.

Imported as ``refbayes.validation``. Each experiment is a module with a
function ``run(quick, outdir) -> dict`` that writes its JSON and PNG files
into ``outdir`` and returns a summary with a list of ``checks``: each check is
a dict with ``name``, ``expected`` (the paper's claim or target), ``measured``,
``passed`` and, for a claim that fails with a cause found, ``explanation``
(see ``common.check``); its status is "holds", "explained" or "fails". A
summary may list ``defaults`` (setting, text, code, follows): where the paper's
text and its authors' code differ, which one the default follows. ``run_all`` runs the chosen experiments and writes
``report.md``.
"""

import importlib
import json
import os
import time
import traceback

from threadpoolctl import threadpool_limits

from .common import CAUSES, STATUSES, count_statuses, status_of

__all__ = ["EXPERIMENTS", "run_all"]

# name -> module inside refbayes.validation
EXPERIMENTS = {
    "diagonal_ekf": "diagonal_ekf",
    "lofi": "lofi",
    "bong": "bong",
    "rvga": "rvga_logistic",
    "bandits": "bandits",
    "bench": "bench",
    "bench_gpu": "bench_gpu",
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
        for c in summary.get("checks", []):
            c["status"] = status_of(c)
        if progress:
            n = count_statuses(summary.get("checks", []))
            print(f"[refbayes validate] {name}: {_counts(n)}, {summary['seconds']:.1f} s", flush=True)
    return _write_report(summaries, outdir, quick)


def _counts(n):
    return f"{n['holds']} hold, {n['explained']} explained, {n['fails']} fail"


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _status_cell(c):
    """The status column: "yes", "explained (cause): text; evidence: numbers", or "NO"."""
    status, e = status_of(c), c.get("explanation")
    if status == "holds":
        return "yes"
    if status == "explained":
        return f"**explained** ({CAUSES[e['cause']]}): {_cell(e['text'])} *Evidence:* {_cell(e['evidence'])}"
    if e:  # an explanation whose evidence did not support it, or an open bug
        why = "open bug" if e["cause"] == "open-bug" else "proposed explanation not supported by its evidence"
        return f"**NO** ({why}): {_cell(e['text'])} *Evidence:* {_cell(e['evidence'])}"
    return "**NO**"


def _write_report(summaries, outdir, quick):
    lines = ["# refbayes validation report", "", f"mode: {'quick' if quick else 'full'}", "",
             "Each check is a claim of a paper. It *holds*, is *explained* (it fails here, and a cause is given "
             "with evidence computed in the same run: a setup difference with the claim moving towards the "
             "paper's setting, a claim that does not carry over across seeds or sizes, or a fixed bug), or "
             "*fails* (**NO**).", "",
             "| experiment | holds | explained | fails | time |", "|---|---|---|---|---|"]
    total = dict.fromkeys(STATUSES, 0)
    for name, s in summaries.items():
        n = count_statuses(s.get("checks", []))
        for k in total:
            total[k] += n[k]
        err = " (failed to run)" if "error" in s else ""
        lines.append(f"| [{name}](#{name}) | {n['holds']} | {n['explained']} | {n['fails']}{err} | {s['seconds']:.1f} s |")
    lines += [f"| all | {total['holds']} | {total['explained']} | {total['fails']} | "
              f"{sum(s['seconds'] for s in summaries.values()):.1f} s |", ""]
    for name, s in summaries.items():
        n = count_statuses(s.get("checks", []))
        lines += [f"## {name}", "", f"time: {s['seconds']:.1f} s; checks: {_counts(n)}", ""]
        if "error" in s:
            lines += ["**failed to run:**", "", "```", s["error"], "```", ""]
        if s.get("skipped"):
            lines += [f"skipped: {s['skipped']}", ""]
        if isinstance(s.get("table"), dict) and "header" in s["table"]:  # {"header": [...], "rows": [[...], ...]}
            head = s["table"]["header"]
            lines += ["| " + " | ".join(map(_cell, head)) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(_cell(str(v)) for v in row) + " |" for row in s["table"]["rows"]] + [""]
        if s.get("checks"):
            lines += ["| check | paper / target | measured | status |", "|---|---|---|---|"]
            for c in s["checks"]:
                lines.append(f"| {_cell(c['name'])} | {_cell(c['expected'])} | {_cell(c['measured'])} | {_status_cell(c)} |")
            lines.append("")
        if s.get("defaults"):
            lines += ["Where the paper's text and its authors' code differ, which one each default follows:", "",
                      "| setting | paper's text | authors' code | default here follows |", "|---|---|---|---|"]
            for d in s["defaults"]:
                lines.append(f"| {_cell(d['setting'])} | {_cell(d['text'])} | {_cell(d['code'])} | {_cell(d['follows'])} |")
            lines.append("")
        for fig in s.get("figures", []):
            lines += [f"![{fig}]({name}/{fig})", ""]
    path = os.path.join(outdir, "report.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines))
    return path
