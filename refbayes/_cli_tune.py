"""``refbayes tune``: choose a filter's hyper-parameters for a data stream from a CSV or NPZ file."""

import json

import numpy as np

__all__ = ["add_arguments", "run"]

FILTERS = ("lofi", "full-ekf", "fd-ekf", "vd-ekf")
LIKELIHOODS = ("gaussian", "bernoulli", "poisson", "categorical")


def add_arguments(parser, name):
    """Options of ``refbayes tune``."""
    parser.add_argument("data", help="CSV (inputs, then the target columns) or NPZ (arrays X and Y), one row per step")
    parser.add_argument("--targets", type=int, default=1, help="CSV: how many trailing columns are targets (default 1)")
    parser.add_argument("--hidden", default="16", help="hidden layer sizes, comma separated ('' for a linear model; default 16)")
    parser.add_argument("--activation", default="tanh", help="hidden activation (default tanh)")
    parser.add_argument("--likelihood", default="gaussian", choices=LIKELIHOODS)
    parser.add_argument("--classes", type=int, default=None, help="number of classes (categorical; default: max label + 1)")
    parser.add_argument("--filter", default="lofi", choices=FILTERS, help="the filter to tune (default lofi)")
    parser.add_argument("--rank", type=int, default=10, help="LO-FI rank (default 10)")
    parser.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...",
                        help="values to try for prior_var, obs_var, q or gamma (repeat for several)")
    parser.add_argument("--refine", action="append", default=[], metavar="NAME",
                        help="after the grid, a bounded search over NAME (at most two)")
    parser.add_argument("--criterion", default="evidence", choices=("evidence", "holdout"),
                        help="prequential log evidence, or the NLPD of the last --holdout fraction of the rows")
    parser.add_argument("--holdout", type=float, default=0.2, help="fraction held out for --criterion holdout")
    parser.add_argument("--seed", type=int, default=0, help="seed of the network's initial weights")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="try the grid on N local worker processes (needs dask.distributed)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write every trial and the choice as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no line per trial")


def _load(args):
    from refbayes.errors import UsageError

    path = args.data
    try:
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as data:
                if "X" not in data or "Y" not in data:
                    raise UsageError(f"{path}: an NPZ stream needs arrays named X and Y; found {sorted(data.files)}")
                X, Y = np.asarray(data["X"], dtype=np.float64), np.asarray(data["Y"], dtype=np.float64)
        else:
            table = np.loadtxt(path, delimiter=",", ndmin=2, dtype=np.float64)
            if not 1 <= args.targets < table.shape[1]:
                raise UsageError(f"--targets must be between 1 and {table.shape[1] - 1} for {table.shape[1]} columns")
            X, Y = table[:, :-args.targets], table[:, -args.targets:]
    except (OSError, ValueError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"cannot read {path}: {exc}") from None
    if X.ndim == 1:
        X = X[:, None]
    if Y.ndim == 1:
        Y = Y[:, None]
    return X, Y


def _grid(specs):
    from refbayes.errors import UsageError

    grid = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        try:
            grid[name.strip()] = [float(v) for v in values.split(",")] if sep else None
        except ValueError:
            grid[name.strip()] = None
        if grid[name.strip()] is None:
            raise UsageError(f"--grid {spec!r}: expected NAME=V1,V2,... with numbers")
    if not grid:
        raise UsageError("give at least one --grid NAME=V1,V2,... (prior_var, obs_var, q or gamma)")
    return grid


def run(args):
    import refbayes as rb
    from refbayes.errors import UsageError
    from refbayes.tune import tune

    X, Y = _load(args)
    grid = _grid(args.grid)
    if args.likelihood == "categorical":
        labels = Y[:, 0]
        K = args.classes or int(np.nanmax(labels)) + 1
        lik, out_dim, Y = rb.Categorical(K), K, labels
    else:
        lik = {"gaussian": rb.Gaussian, "bernoulli": rb.Bernoulli, "poisson": rb.Poisson}[args.likelihood]()
        out_dim = Y.shape[1]
    try:
        hidden = [int(h) for h in args.hidden.split(",") if h.strip()]
    except ValueError:
        raise UsageError(f"--hidden must be comma-separated integers; got {args.hidden!r}") from None
    model = rb.MLP([X.shape[1], *hidden, out_dim], activation=args.activation)
    make = {"lofi": lambda: rb.LoFi(model, lik, rank=args.rank), "full-ekf": lambda: rb.FullEKF(model, lik),
            "fd-ekf": lambda: rb.FDEKF(model, lik), "vd-ekf": lambda: rb.VDEKF(model, lik)}[args.filter]
    try:
        filt = make()
        theta = model.init_params(np.random.default_rng(args.seed))
        kw = {}
        if args.criterion == "holdout":
            n = int(round(len(X) * (1 - args.holdout)))
            X, Y, kw = X[:n], Y[:n], {"X_val": X[n:], "Y_val": Y[n:]}
        res = tune(filt, theta, X, Y, grid, criterion=args.criterion, refine=args.refine or None,
                   workers=args.workers, progress=not args.no_progress, **kw)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    names = list(grid)
    print(" ".join(f"{n:>10}" for n in names) + f" {'score':>14}")
    for row in res.table:
        print(" ".join(f"{row[n]:10.4g}" for n in names) + f" {row['score']:14.6g}" + (f"  {row['error']}" if "error" in row else ""))
    chosen = ", ".join(f"{k}={v:.6g}" for k, v in res.best.items())
    print(f"chosen ({res.criterion}): {chosen}; score {res.score:.6g}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"criterion": res.criterion, "best": res.best, "score": res.score, "table": res.table,
                       "filter": args.filter, "data": args.data}, fh, indent=2, default=float)
    return 0
