"""``refbayes golden`` and ``refbayes crosscheck``: write refbayes' step-by-step trajectories, and
compare another implementation's trajectories with them (format: docs/golden-format.md)."""

__all__ = ["add_arguments", "run"]


def add_arguments(parser, name):
    """Options of ``refbayes golden`` (``name == "golden"``) or ``refbayes crosscheck``."""
    if name == "golden":
        parser.add_argument("method", help="full-ekf, fd-ekf, vd-ekf, lofi, rvga, or a BONG name such as "
                            "bong-dlr3-hess_lin, blr-diag-hess_lin")
        parser.add_argument("--out", required=True, metavar="FILE", help="golden file to write (.npz)")
        parser.add_argument("--problems", nargs="+", default=None, metavar="NAME",
                            help="run only these problems (default: all the method applies to)")
        parser.add_argument("--json", action="store_true", help="also write the description to FILE.json")
        parser.set_defaults(_golden_command="golden")
    else:
        parser.add_argument("theirs", metavar="THEIRS.npz", help="the other implementation's golden file")
        src = parser.add_mutually_exclusive_group(required=True)
        src.add_argument("--against", metavar="OURS.npz", help="compare with this golden file")
        src.add_argument("--method", metavar="M", help="recompute refbayes' method M on THEIRS' data and description")
        parser.add_argument("--rtol", type=float, default=1e-6, help="relative tolerance (default 1e-6)")
        parser.add_argument("--atol", type=float, default=1e-9, help="absolute tolerance (default 1e-9)")
        parser.add_argument("--plot", metavar="FILE", default=None, help="write a PNG of max error against step")
        parser.set_defaults(_golden_command="crosscheck")


def _read(path, what):
    from refbayes import golden
    from refbayes.errors import UsageError

    try:
        return golden.read(path)
    except FileNotFoundError:
        raise UsageError(f"{what} file {path!r} does not exist") from None
    except (ValueError, KeyError, OSError) as exc:
        raise UsageError(f"{what} file {path!r} is not a readable golden file: {exc}") from None


def run(args):
    from refbayes import golden
    from refbayes.errors import ConvergenceError, DivergenceError, NotPositiveDefiniteError, UsageError

    if args._golden_command == "golden":
        try:
            g = golden.make(args.method, problems=args.problems)
        except (DivergenceError, NotPositiveDefiniteError, ConvergenceError) as exc:
            print(f"refbayes golden: {args.method} failed on the golden problems: {type(exc).__name__}: {exc}")
            return 1
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None
        if not g["meta"]["problems"]:
            raise UsageError(f"method {args.method!r} applies to none of the problems {args.problems}")
        golden.write(g, args.out, sidecar=args.json)
        n = len(g["meta"]["problems"])
        print(f"wrote {args.out}: {args.method} on {n} problems ({', '.join(g['meta']['problems'])})")
        return 0

    if not (args.rtol >= 0 and args.atol >= 0):
        raise UsageError(f"--rtol and --atol must be >= 0; got {args.rtol}, {args.atol}")
    theirs = _read(args.theirs, "THEIRS")
    if args.against is not None:
        ours = _read(args.against, "--against")
    else:
        try:
            ours = golden.recompute(theirs, args.method)
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None
    try:
        report = golden.compare(theirs, ours, rtol=args.rtol, atol=args.atol)
    except ValueError as exc:
        raise UsageError(f"cannot compare: {exc}") from None
    print(report.summary())
    if args.plot:
        golden.plot_report(report, args.plot)
        print(f"plot: {args.plot}")
    return 0 if report.passed else 1
