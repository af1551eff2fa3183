"""Golden trajectories: refbayes' step-by-step filter output in a file other implementations can read.

A golden file holds, for a fixed set of small problems (see ``PROBLEMS``), the data, the initial
belief, and after every step t = 1..T the filtered belief's mean and factors and the one-step-ahead
linearised predictive of y_t. The format is specified in ``docs/golden-format.md``; it is plain NPZ
(arrays named ``"<problem>.<quantity>"``) plus one JSON description stored in the array ``"meta"``.

Each step t (0-based in the arrays) is, with b_{-1} the initial belief:

    b_pred = filt.predict(b_{t-1})                       # theta_t = gamma theta_{t-1} + N(0, q I)
    pred_mean[t], pred_cov[t] = filt.predict_obs(b_pred, X[t], method="linearized")
    b_t = filt.update(b_pred, X[t], Y[t])                # stored: mean[t] and the factors of b_t

``compare(theirs, ours, rtol, atol)`` checks another implementation's file against refbayes'.
Low-rank factors are compared through invariants only (W W^T, or the implied covariance), since
W is defined up to an orthogonal rotation of its columns.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["FORMAT", "FORMAT_VERSION", "PROBLEMS", "METHODS", "make", "write", "read", "recompute", "compare",
           "GoldenReport", "Divergence", "plot_report", "model_layout"]

FORMAT = "refbayes-golden"
FORMAT_VERSION = 1
PREDICTIVE = "linearized"

# name -> description; data are drawn from numpy's default_rng(seed) as documented in docs/golden-format.md
PROBLEMS = {
    "linear-reg-static": dict(model=dict(type="linear", in_dim=5, out_dim=1, bias=True),
                              likelihood=dict(type="gaussian", obs_var=0.25), gamma=1.0, q=0.0, prior_var=1.0,
                              T=30, seed=101),
    "linear-reg-dynamic": dict(model=dict(type="linear", in_dim=5, out_dim=1, bias=True),
                               likelihood=dict(type="gaussian", obs_var=0.25), gamma=0.98, q=1e-3, prior_var=1.0,
                               T=30, seed=102),
    "linear-cls-static": dict(model=dict(type="linear", in_dim=5, out_dim=1, bias=True),
                              likelihood=dict(type="bernoulli"), gamma=1.0, q=0.0, prior_var=1.0, T=30, seed=103),
    "mlp-reg-static": dict(model=dict(type="mlp", layer_sizes=[2, 6, 1], activation="tanh"),
                           likelihood=dict(type="gaussian", obs_var=0.1), gamma=1.0, q=0.0, prior_var=0.5,
                           T=30, seed=104),
    "mlp-reg-dynamic": dict(model=dict(type="mlp", layer_sizes=[2, 6, 1], activation="tanh"),
                            likelihood=dict(type="gaussian", obs_var=0.1), gamma=0.99, q=1e-4, prior_var=0.5,
                            T=30, seed=105),
    "mlp-cls-dynamic": dict(model=dict(type="mlp", layer_sizes=[2, 6, 1], activation="tanh"),
                            likelihood=dict(type="bernoulli"), gamma=0.99, q=1e-4, prior_var=0.5, T=30, seed=106),
}

# method name -> (constructor description, problems it applies to or None for all)
METHODS = {
    "full-ekf": "FullEKF (full covariance, Puskorius & Feldkamp)",
    "fd-ekf": "FDEKF (fully decoupled diagonal EKF)",
    "vd-ekf": "VDEKF (variational diagonal EKF)",
    "lofi": "LoFi(rank=3) (diagonal LO-FI)",
    "rvga": "RVGA (implicit R-VGA, cubature); linear-model problems only",
    "bong-*, blr-*, bog-*, bbb-*": "Bong.from_name(NAME), e.g. bong-dlr3-hess_lin, blr-diag-ef_lin, bog-fc-hess_lin",
}
LOFI_RANK = 3
BONG_LR = 0.5  # learning rate of BLR, BOG and BBB (BONG takes none)


def _needs_lr(method):
    from refbayes.filters.bong.names import parse_name

    return parse_name(method)["algorithm"] != "bong"


# -- problems and filters ---------------------------------------------------------------------------

def _build_model(desc):
    import refbayes as rb

    if desc["type"] == "linear":
        return rb.Linear(desc["in_dim"], desc["out_dim"], bias=desc.get("bias", True))
    if desc["type"] == "mlp":
        return rb.MLP(desc["layer_sizes"], activation=desc["activation"])
    raise ValueError(f"model type must be 'linear' or 'mlp'; got {desc['type']!r}")


def _build_likelihood(desc):
    import refbayes as rb

    if desc["type"] == "gaussian":
        return rb.Gaussian(obs_var=desc["obs_var"])
    if desc["type"] == "bernoulli":
        return rb.Bernoulli()
    raise ValueError(f"likelihood type must be 'gaussian' or 'bernoulli'; got {desc['type']!r}")


def model_layout(model_desc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The flat parameter layout of a model description: a list of blocks
    ``{"name", "shape", "start", "stop", "order"}``; theta[start:stop].reshape(shape, order="C")."""
    blocks, pos = [], 0
    if model_desc["type"] == "linear":
        sizes = [(model_desc["in_dim"], model_desc["out_dim"], model_desc.get("bias", True))]
        names = [("W", "b")]
    else:
        ls = model_desc["layer_sizes"]
        sizes = [(ls[l], ls[l + 1], True) for l in range(len(ls) - 1)]
        names = [(f"W{l}", f"b{l}") for l in range(len(ls) - 1)]
    for (n_in, n_out, bias), (wn, bn) in zip(sizes, names):
        blocks.append(dict(name=wn, shape=[n_out, n_in], start=pos, stop=pos + n_out * n_in, order="C"))
        pos += n_out * n_in
        if bias:
            blocks.append(dict(name=bn, shape=[n_out], start=pos, stop=pos + n_out, order="C"))
            pos += n_out
    return blocks


def method_applies(method: str, problem_desc: Mapping[str, Any]) -> bool:
    """True when ``method`` is run on a problem (R-VGA only on linear models, where it is stable)."""
    return method != "rvga" or problem_desc["model"]["type"] == "linear"


def _is_mc(method):
    if method in ("full-ekf", "fd-ekf", "vd-ekf", "lofi", "rvga"):
        return False
    from refbayes.filters.bong.names import parse_name

    return parse_name(method)["estimator"].startswith("mc")


def _check_method(method):
    if not isinstance(method, str):
        raise TypeError(f"method must be a string; got {method!r}")
    if method in ("full-ekf", "fd-ekf", "vd-ekf", "lofi", "rvga"):
        return
    from refbayes.filters.bong.names import parse_name

    try:
        parse_name(method)
    except ValueError as exc:
        raise ValueError(f"method must be one of full-ekf, fd-ekf, vd-ekf, lofi, rvga or a BONG name "
                         f"(e.g. bong-dlr3-hess_lin); got {method!r} ({exc})") from None


def _build_filter(method, model, lik, gamma, q, seed):
    import refbayes as rb

    if method == "full-ekf":
        return rb.FullEKF(model, lik, gamma=gamma, q=q)
    if method == "fd-ekf":
        return rb.FDEKF(model, lik, gamma=gamma, q=q)
    if method == "vd-ekf":
        return rb.VDEKF(model, lik, gamma=gamma, q=q)
    if method == "lofi":
        return rb.LoFi(model, lik, rank=LOFI_RANK, gamma=gamma, q=q)
    if method == "rvga":
        return rb.RVGA(model, lik, gamma=gamma, q=q)
    extra = {"lr": BONG_LR} if _needs_lr(method) else {}
    return rb.Bong.from_name(model, lik, method, gamma=gamma, q=q, **extra)


def _method_options(method):
    if method == "lofi":
        return dict(rank=LOFI_RANK, variant="diagonal")
    if method == "rvga":
        return dict(scheme="implicit", expectation="quadrature", quadrature="cubature")
    if method in ("full-ekf", "fd-ekf", "vd-ekf"):
        return {}
    from refbayes.filters.bong.names import parse_name

    opts = dict(parse_name(method))
    if _needs_lr(method):
        opts["lr"] = BONG_LR
    return opts


def _make_data(desc):
    """X (T, D), Y and the initial mean, drawn from default_rng(seed) in a documented order."""
    rng = np.random.default_rng(desc["seed"])
    model = _build_model(desc["model"])
    T, D = desc["T"], model.in_dim
    theta_true = rng.normal(size=model.n_params)
    init_mean = 0.1 * rng.normal(size=model.n_params)
    X = rng.normal(size=(T, D))
    f = np.stack([np.asarray(model.apply(theta_true, x), dtype=float) for x in X])  # (T, C)
    if desc["likelihood"]["type"] == "gaussian":
        Y = f + np.sqrt(desc["likelihood"]["obs_var"]) * rng.normal(size=f.shape)
    else:
        Y = (rng.uniform(size=T) < 1.0 / (1.0 + np.exp(-f[:, 0]))).astype(np.float64)
    return X, Y, init_mean


def _belief_kind(bel):
    from refbayes.beliefs import DLR, Diag, FullCov

    if isinstance(bel, FullCov):
        return "full"
    if isinstance(bel, Diag):
        return "diag"
    if isinstance(bel, DLR):
        return "dlr"
    raise TypeError(f"golden files store FullCov, Diag or DLR beliefs; got {type(bel).__name__}")


def _factors(bel, kind):
    if kind == "full":
        return {"cov": np.asarray(bel.cov)}
    if kind == "diag":
        return {"var": np.asarray(bel.var)}
    return {"ups": np.asarray(bel.ups), "W": np.asarray(bel.W)}


def run_problem(method: str, desc: Mapping[str, Any], X: NDArray[np.float64], Y: NDArray[np.float64], init_mean: NDArray[np.float64],
                init_var: NDArray[np.float64]) -> tuple[dict[str, NDArray[np.float64]], str, int | None]:
    """Run ``method`` step by step on one problem; returns (arrays dict, belief kind, rank)."""
    model, lik = _build_model(desc["model"]), _build_likelihood(desc["likelihood"])
    filt = _build_filter(method, model, lik, desc["gamma"], desc["q"], desc.get("seed", 0))
    # Monte Carlo BONG estimators draw from default_rng(seed); other methods are deterministic
    upd_kw = {"rng": np.random.default_rng(desc.get("seed", 0))} if _is_mc(method) else {}
    bel = filt.init(np.asarray(init_mean, dtype=np.float64), prior_var=np.asarray(init_var, dtype=np.float64))
    kind = _belief_kind(bel)
    out = {"init_" + k: v.copy() for k, v in _factors(bel, kind).items()}
    steps = {k: [] for k in ["mean", "pred_mean", "pred_cov", *_factors(bel, kind)]}
    for x, y in zip(X, Y):
        bel = filt.predict(bel)
        mu, S = filt.predict_obs(bel, x, method=PREDICTIVE)
        steps["pred_mean"].append(np.atleast_1d(np.asarray(mu, dtype=np.float64)))
        steps["pred_cov"].append(np.atleast_2d(np.asarray(S, dtype=np.float64)))
        bel = filt.update(bel, x, y, **upd_kw)
        steps["mean"].append(np.asarray(bel.mean))
        for k, v in _factors(bel, kind).items():
            steps[k].append(v)
    out.update({k: np.stack(v) for k, v in steps.items()})
    rank = int(bel.W.shape[1]) if kind == "dlr" else None
    return out, kind, rank


def _describe(method, problems):
    import refbayes as rb

    return {"format": FORMAT, "format_version": FORMAT_VERSION, "library": "refbayes",
            "library_version": rb.__version__, "dtype": "float64", "method": method,
            "method_options": _method_options(method) if method is not None else {},
            "predictive": PREDICTIVE, "problems": problems}


def make(method: str, problems: Iterable[str] | None = None) -> dict[str, Any]:
    """Run ``method`` on the golden problems; returns a golden dict ``{"meta": dict, "arrays": dict}``.

    method: "full-ekf" | "fd-ekf" | "vd-ekf" | "lofi" | "rvga" | a BONG name (``Bong.from_name``).
    problems: names from ``PROBLEMS`` (default: all that the method applies to).
    """
    _check_method(method)
    names = list(PROBLEMS) if problems is None else list(problems)
    for n in names:
        if n not in PROBLEMS:
            raise ValueError(f"problems must be names from {list(PROBLEMS)}; got {n!r}")
    names = [n for n in names if method_applies(method, PROBLEMS[n])]
    arrays, meta_problems = {}, {}
    for name in names:
        desc = PROBLEMS[name]
        X, Y, init_mean = _make_data(desc)
        P = init_mean.shape[0]
        init_var = np.full(P, float(desc["prior_var"]))
        out, kind, rank = run_problem(method, desc, X, Y, init_mean, init_var)
        arrays.update({f"{name}.{k}": v for k, v in
                       dict(X=X, Y=Y, init_mean=init_mean, prior_var=init_var, **out).items()})
        meta_problems[name] = dict(desc, n_params=P, layout=model_layout(desc["model"]), belief=kind, rank=rank)
    return {"meta": _describe(method, meta_problems), "arrays": arrays}


def recompute(theirs: Mapping[str, Any], method: str) -> dict[str, Any]:
    """Rerun refbayes' ``method`` on the data, initial mean/variance and description of ``theirs``."""
    _check_method(method)
    arrays, meta_problems = {}, {}
    for name, pdesc in theirs["meta"]["problems"].items():
        a = theirs["arrays"]
        X, Y, m0, v0 = (a[f"{name}.{k}"] for k in ("X", "Y", "init_mean", "prior_var"))
        out, kind, rank = run_problem(method, pdesc, X, Y, m0, v0)
        arrays.update({f"{name}.{k}": v for k, v in dict(X=X, Y=Y, init_mean=m0, prior_var=v0, **out).items()})
        meta_problems[name] = dict(pdesc, belief=kind, rank=rank)
    return {"meta": _describe(method, meta_problems), "arrays": arrays}


# -- file I/O ---------------------------------------------------------------------------------------

def write(golden: Mapping[str, Any], path: str | os.PathLike[str], sidecar: bool = False) -> str | os.PathLike[str]:
    """Write a golden dict to ``path`` (.npz, uncompressed); the JSON description goes into the array
    ``"meta"`` (0-d unicode string) and, with ``sidecar=True``, also to ``path`` + ".json"."""
    text = json.dumps(golden["meta"], indent=1, sort_keys=True)
    arrays = dict(golden["arrays"])
    if "meta" in arrays:
        raise ValueError("golden arrays must not use the name 'meta'")
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, meta=np.array(text), **arrays)
    os.replace(tmp, path)
    if sidecar:
        with open(str(path) + ".json", "w") as fh:
            fh.write(text + "\n")
    return path


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a golden file; returns ``{"meta": dict, "arrays": dict}``. Raises ValueError on an unknown format."""
    with np.load(path, allow_pickle=False) as z:
        if "meta" not in z.files:
            raise ValueError(f"{path}: not a golden file (no 'meta' array)")
        meta = json.loads(str(z["meta"][()]))
        arrays = {k: z[k] for k in z.files if k != "meta"}
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT!r}; got {meta.get('format')!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version must be {FORMAT_VERSION}; got {meta.get('format_version')!r}")
    for name, p in meta["problems"].items():
        for k in ("X", "Y", "init_mean", "prior_var", "mean", "pred_mean", "pred_cov"):
            if f"{name}.{k}" not in arrays:
                raise ValueError(f"{path}: problem {name!r} lacks array {name}.{k}")
    return {"meta": meta, "arrays": arrays}


# -- comparison -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first element beyond tolerance: problem, step (0-based), quantity, index into it, values."""

    problem: str
    step: int
    quantity: str
    index: tuple
    theirs: float
    ours: float

    def __str__(self):
        return (f"{self.problem}: step {self.step}, {self.quantity}{list(self.index)}: theirs {self.theirs!r}, "
                f"ours {self.ours!r}, |diff| {abs(self.theirs - self.ours):.3g}")


@dataclasses.dataclass(frozen=True)
class GoldenReport:
    """Result of ``compare``.

    passed: bool; first: the first Divergence per problem that has one ({} when passed);
    ratio: {problem: (T,) max over quantities of |theirs - ours| / (atol + rtol |ours|)} (> 1 fails);
    quantities: {problem: list of compared quantity names}; missing: problems in ours absent in theirs.
    """

    passed: bool
    first: dict
    ratio: dict
    quantities: dict
    missing: tuple
    rtol: float
    atol: float

    def summary(self) -> str:
        """One line per compared array (ok/FAIL, steps, quantities, worst error / tolerance), as a string."""
        lines = []
        for name, r in self.ratio.items():
            status = "FAIL" if name in self.first else "ok"
            lines.append(f"{status:4s} {name}: {len(r)} steps, {', '.join(self.quantities[name])}; "
                         f"max error / tolerance {np.max(r, initial=0.0):.3g}")
            if name in self.first:
                lines.append(f"     first divergence: {self.first[name]}")
        for name in self.missing:
            lines.append(f"FAIL {name}: missing from theirs")
        verdict = "PASS" if self.passed else "FAIL"
        lines.append(f"{verdict} (rtol={self.rtol:g}, atol={self.atol:g})")
        return "\n".join(lines)


def _step_quantities(arrays, name, kind, target):
    """{quantity: (T, ...) array} describing the belief; ``target`` picks the common representation."""
    def g(k):
        if f"{name}.{k}" not in arrays:
            raise ValueError(f"problem {name!r} has belief {kind!r} but no array {name}.{k}")
        return arrays[f"{name}.{k}"]

    if target == kind == "full":
        return {"cov": g("cov")}
    if target == kind == "diag":
        return {"var": g("var")}
    if target == kind == "dlr":
        W = g("W")
        return {"ups": g("ups"), "WWt": np.einsum("tpl,tql->tpq", W, W)}
    # different kinds: compare the dense covariance
    if kind == "full":
        return {"cov": g("cov")}
    if kind == "diag":
        return {"cov": np.stack([np.diag(v) for v in g("var")])}
    W, ups = g("W"), g("ups")
    return {"cov": np.stack([np.linalg.inv(np.diag(u) + w @ w.T) for u, w in zip(ups, W)])}


def compare(theirs: Mapping[str, Any], ours: Mapping[str, Any], rtol: float = 1e-6,
            atol: float = 1e-9) -> GoldenReport:
    """Compare two golden dicts step by step: mean, belief (covariance, diagonal, or DLR through
    ups and W W^T), pred_mean and pred_cov. An element fails when |theirs - ours| > atol + rtol |ours|.

    Returns a GoldenReport; ``report.first[problem]`` is the first failing step, quantity and element.
    Data (X, Y, initial mean) that differ are reported as step -1 divergences.
    """
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"rtol and atol must be >= 0; got rtol={rtol!r}, atol={atol!r}")
    tp, op = theirs["meta"]["problems"], ours["meta"]["problems"]
    first, ratios, quants = {}, {}, {}
    missing = tuple(n for n in op if n not in tp)
    for name in op:
        if name not in tp:
            continue
        ta, oa = theirs["arrays"], ours["arrays"]
        kt, ko = tp[name].get("belief"), op[name].get("belief")
        if kt not in ("full", "diag", "dlr"):
            raise ValueError(f"problem {name!r} of theirs: belief must be 'full', 'diag' or 'dlr'; got {kt!r}")
        target = ko if kt == ko else "cov"
        # inputs first (step -1)
        for k in ("X", "Y", "init_mean"):
            a, b = np.asarray(ta[f"{name}.{k}"], float), np.asarray(oa[f"{name}.{k}"], float)
            if a.shape != b.shape:
                first[name] = Divergence(name, -1, f"{k} shape", (), float(a.size), float(b.size))
                break
            bad = np.argwhere(~(np.abs(a - b) <= atol + rtol * np.abs(b)))
            if len(bad):
                idx = tuple(int(i) for i in bad[0])
                first[name] = Divergence(name, -1, k, idx, float(a[idx]), float(b[idx]))
                break
        qt = {"mean": ta[f"{name}.mean"], **_step_quantities(ta, name, kt, target),
              "pred_mean": ta[f"{name}.pred_mean"], "pred_cov": ta[f"{name}.pred_cov"]}
        qo = {"mean": oa[f"{name}.mean"], **_step_quantities(oa, name, ko, target),
              "pred_mean": oa[f"{name}.pred_mean"], "pred_cov": oa[f"{name}.pred_cov"]}
        quants[name] = list(qo)
        T = qo["mean"].shape[0]
        ratio = np.zeros(T)
        for q in qo:
            a, b = np.asarray(qt[q], float), np.asarray(qo[q], float)
            if a.shape != b.shape:
                first.setdefault(name, Divergence(name, 0, f"{q} shape {a.shape} vs {b.shape}", (), np.nan, np.nan))
                ratio[:] = np.inf
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.abs(a - b) / (atol + rtol * np.abs(b))
            r = np.where(a == b, 0.0, np.where(np.isnan(r), np.inf, r))
            ratio = np.maximum(ratio, r.reshape(T, -1).max(axis=1, initial=0.0))
        bad_steps = np.flatnonzero(ratio > 1.0)
        if len(bad_steps) and name not in first:
            t = int(bad_steps[0])
            for q in qo:  # quantities in a fixed order: mean, belief, pred_mean, pred_cov
                a, b = np.asarray(qt[q][t], float), np.asarray(qo[q][t], float)
                bad = np.argwhere(~(np.abs(a - b) <= atol + rtol * np.abs(b)))
                if len(bad):
                    idx = tuple(int(i) for i in bad[0])
                    first[name] = Divergence(name, t, q, idx, float(a[idx]), float(b[idx]))
                    break
        ratios[name] = ratio
    passed = not first and not missing and bool(ratios)
    return GoldenReport(passed, first, ratios, quants, missing, float(rtol), float(atol))


def plot_report(report: GoldenReport, path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """PNG of max error / tolerance against the step, one line per problem (matplotlib, Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, r in report.ratio.items():
        ax.semilogy(np.arange(len(r)), np.maximum(r, 1e-20), marker=".", label=name)
    ax.axhline(1.0, color="k", linestyle="--", linewidth=1, label="tolerance")
    ax.set_xlabel("step t")
    ax.set_ylabel("max |theirs - ours| / (atol + rtol |ours|)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
