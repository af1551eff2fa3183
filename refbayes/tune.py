"""Hyper-parameters chosen from the data: prior variance, observation noise, q and gamma.

Each candidate runs the filter over the stream once and is scored by

- ``criterion="evidence"`` (default): the prequential log evidence, sum_t log p(y_t | x_t,
  y_{1:t-1}), from the one-step-ahead linearised predictive (``scan(...,
  predictive="linearized")``). For a linear-Gaussian model it is the exact log marginal
  likelihood of the stream, so maximising it is type-II maximum likelihood.
- ``criterion="holdout"``: the mean log predictive density of held-out data
  (``X_val``, ``Y_val``) under the final belief (the negative NLPD).

The search is a grid (every combination of the values given), optionally followed by a
bounded search in log space over one or two hyper-parameters around the best grid point.
A candidate whose run diverges (DivergenceError, NotPositiveDefiniteError) is kept in the
table with score -inf and its error, never silently dropped.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from .errors import DivergenceError, NotPositiveDefiniteError
from .parallel import TrialFailure, run_trials

if TYPE_CHECKING:
    from .filters.base import Filter

__all__ = ["tune", "TuneResult", "HYPERPARAMETERS"]

#: the hyper-parameters ``tune`` can choose, and the range each may take
HYPERPARAMETERS = {"prior_var": (0.0, math.inf), "obs_var": (0.0, math.inf), "q": (0.0, math.inf), "gamma": (0.0, 1.0)}


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` found.

    best: the chosen values (dict); score: its criterion value; filter: the filter with the
    chosen gamma, q and obs_var (``filt.with_noise``); prior_var: the chosen prior variance
    (pass it to ``filter.init``); table: one dict per candidate tried (its values, score and,
    for a failed run, the error), in the order tried; criterion: "evidence" or "holdout".
    """

    best: dict
    score: float
    filter: object
    prior_var: float
    table: list
    criterion: str


def _candidates(grid):
    names = list(grid)
    for values in itertools.product(*(grid[n] for n in names)):
        yield dict(zip(names, values))


def _check_grid(grid, filt, prior_var):
    if not isinstance(grid, dict) or not grid:
        raise ValueError("grid must be a non-empty dict of hyper-parameter name -> list of values")
    out = {}
    for name, values in grid.items():
        if name not in HYPERPARAMETERS:
            raise ValueError(f"grid: unknown hyper-parameter {name!r}; choose from {sorted(HYPERPARAMETERS)}")
        vals = np.atleast_1d(np.asarray(values, dtype=np.float64))
        lo, hi = HYPERPARAMETERS[name]
        if vals.ndim != 1 or vals.size == 0 or not np.all(np.isfinite(vals)):
            raise ValueError(f"grid[{name!r}] must be a non-empty list of finite numbers; got {values!r}")
        if np.any(vals < lo) or np.any(vals > hi) or (name != "q" and np.any(vals <= 0)):
            raise ValueError(f"grid[{name!r}] must lie in {'[' if name == 'q' else '('}{lo}, {hi}]; got {values!r}")
        out[name] = [float(v) for v in vals]
    if "obs_var" in out and type(filt.likelihood).__name__ != "Gaussian":
        raise ValueError(f"obs_var can be tuned for a Gaussian likelihood only; the filter's is "
                         f"{type(filt.likelihood).__name__}")
    return out


def _score(filt, mean, prior_var, X, Y, criterion, X_val, Y_val, values):
    from .results import log_density

    noise = {k: v for k, v in values.items() if k != "prior_var"}
    f = filt.with_noise(**noise)
    bel = f.init(mean, values.get("prior_var", prior_var))
    if criterion == "evidence":
        _, res = f.scan(bel, X, Y, predictive="linearized")
        return f, res.total_log_evidence
    bel, _ = f.scan(bel, X, Y)
    means, covs = f.predict_obs(bel, X_val, method="linearized")
    return f, float(np.mean([log_density(f.likelihood, y, m, c) for y, m, c in zip(Y_val, means, covs)]))


def _trial(filt, mean, prior_var, X, Y, criterion, X_val, Y_val, key):
    """One candidate: {"score": ...} or {"score": -inf, "error": ...} for key = ((name, value), ...)."""
    try:
        score = _score(filt, mean, prior_var, X, Y, criterion, X_val, Y_val, dict(key))[1]
    except (DivergenceError, NotPositiveDefiniteError) as exc:
        return {"score": -math.inf, "error": f"{type(exc).__name__}: {exc}"}
    if not math.isfinite(score):
        return {"score": -math.inf, "error": "non-finite score"}
    return {"score": score}


def tune(filt: Filter, mean: ArrayLike, X: ArrayLike, Y: ArrayLike, grid: Mapping[str, Sequence[float]], *,
         prior_var: float = 1.0, criterion: str = "evidence", X_val: ArrayLike | None = None,
         Y_val: ArrayLike | None = None, refine: str | Sequence[str] | None = None, n_refine: int = 20,
         workers: int | None = None, scheduler: str | None = None, progress: bool = False) -> TuneResult:
    """Choose hyper-parameters of ``filt`` by the prequential log evidence or a held-out NLPD.

    filt: any refbayes filter (its gamma, q and Gaussian obs_var are replaced per candidate
        through ``filt.with_noise``); mean (P,): the prior mean for ``filt.init``;
    X (T, in_dim), Y (T observations): the stream;
    grid: {name: values} over "prior_var", "obs_var", "q", "gamma"; every combination is tried;
    prior_var: used when the grid does not set it;
    criterion: "evidence" (default) or "holdout" (needs X_val, Y_val);
    refine: None, or one or two names from the grid: after the grid, a bounded search in log
        space (gamma: in log(1 - gamma)) around the best grid value, between its grid
        neighbours, with at most ``n_refine`` more runs;
    workers, scheduler: run the grid's candidates on local dask worker processes or on a dask
        scheduler (``refbayes.parallel``; in this process by default);
    progress: one line per candidate.

    Returns a :class:`TuneResult`. Raises ValueError for a bad grid before any run.
    """
    if criterion not in ("evidence", "holdout"):
        raise ValueError(f"criterion must be 'evidence' or 'holdout'; got {criterion!r}")
    if criterion == "holdout" and (X_val is None or Y_val is None):
        raise ValueError("criterion='holdout' needs X_val and Y_val")
    grid = _check_grid(grid, filt, prior_var)
    refine = [refine] if isinstance(refine, str) else list(refine or [])
    for name in refine:
        if name not in grid or len(grid[name]) < 2:
            raise ValueError(f"refine: {name!r} must be a grid entry with at least two values")
    if len(refine) > 2:
        raise ValueError("refine: at most two hyper-parameters")
    filt._check_belief(filt.init(mean, prior_var))  # a bad mean or prior_var fails here, before any run
    table = []

    def run(values):
        row = dict(values, **_trial(filt, mean, prior_var, X, Y, criterion, X_val, Y_val, tuple(values.items())))
        f = filt.with_noise(**{k: v for k, v in values.items() if k != "prior_var"}) if "error" not in row else None
        table.append(row)
        if progress:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in values.items())
            print(f"[refbayes tune] refine {len(table)}: {shown}: {row['score']:.6g}", flush=True)
        return row["score"], f

    best_score, best, best_filter = -math.inf, None, None
    candidates = list(_candidates(grid))
    keys = [tuple(sorted(values.items())) for values in candidates]
    scored = run_trials(functools.partial(_trial, filt, mean, prior_var, X, Y, criterion, X_val, Y_val), keys,
                        workers=workers, scheduler=scheduler, label="refbayes tune", progress=progress)
    for values, key in zip(candidates, keys):
        out = scored[key]
        row = dict(values, **out) if not isinstance(out, TrialFailure) else dict(values, score=-math.inf, error=out.error)
        table.append(row)
        if row["score"] > best_score or best is None:
            best_score, best = row["score"], values
    if math.isfinite(best_score):
        best_filter = filt.with_noise(**{k: v for k, v in best.items() if k != "prior_var"})
    if refine and math.isfinite(best_score):
        best_score, best, best_filter = _refine(run, grid, refine, best, best_score, best_filter, n_refine)
    if best_filter is None:
        raise DivergenceError(f"every candidate failed; the first error: {table[0].get('error')}")
    return TuneResult(best=dict(best), score=best_score, filter=best_filter,
                      prior_var=best.get("prior_var", prior_var), table=table, criterion=criterion)


def _to_log(name, v):
    return math.log1p(-v) if name == "gamma" else math.log(v)


def _from_log(name, u):
    return -math.expm1(u) if name == "gamma" else math.exp(u)


def _refine(run, grid, names, best, best_score, best_filter, n_refine):
    """Bounded search (Nelder-Mead in log space, clipped to the best point's grid neighbours)."""
    from scipy.optimize import minimize

    bounds = []
    for name in names:
        vals = sorted(grid[name])
        i = vals.index(best[name])
        lo, hi = vals[max(i - 1, 0)], vals[min(i + 1, len(vals) - 1)]
        if name == "q" and lo == 0.0:
            lo = min(v for v in vals if v > 0) * 1e-3 if any(v > 0 for v in vals) else 1e-12
        if name == "q" and best[name] == 0.0:
            continue
        bounds.append((name, sorted((_to_log(name, lo), _to_log(name, hi)))))
    if not bounds:
        return best_score, best, best_filter
    state = {"score": best_score, "values": best, "filter": best_filter}

    def objective(u):
        values = dict(best)
        for (name, (a, b)), ui in zip(bounds, u):
            values[name] = _from_log(name, float(np.clip(ui, a, b)))
        score, f = run(values)
        if score > state["score"]:
            state.update(score=score, values=values, filter=f)
        return -score if math.isfinite(score) else 1e300

    u0 = [_to_log(name, best[name]) for name, _ in bounds]
    minimize(objective, u0, method="Nelder-Mead", options={"maxfev": n_refine, "xatol": 1e-3, "fatol": 1e-6})
    return state["score"], state["values"], state["filter"]
