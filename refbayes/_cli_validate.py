"""``refbayes validate`` and ``refbayes bench``: the papers' experiments and the backend timings."""

__all__ = ["add_arguments", "run"]


def add_arguments(parser, name):
    """Options of ``refbayes validate`` (``name == "validate"``) or ``refbayes bench``."""
    parser.add_argument("--quick", action="store_true", help="small sizes; minutes on a laptop")
    parser.add_argument("--out", default="validation-results", help="output folder (default: validation-results)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    if name == "validate":
        from refbayes.validation import EXPERIMENTS

        parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                            help=f"run only these experiments (of: {', '.join(EXPERIMENTS)})")
    parser.set_defaults(_experiments=None if name == "validate" else ["bench"])


def run(args):
    from refbayes.errors import UsageError
    from refbayes.validation import EXPERIMENTS, run_all

    only = args._experiments or args.only
    unknown = [n for n in (only or ()) if n not in EXPERIMENTS]
    if unknown:
        raise UsageError(f"unknown experiment(s) {', '.join(map(repr, unknown))}; choose from {', '.join(EXPERIMENTS)}")
    report = run_all(quick=args.quick, outdir=args.out, only=only, progress=not args.no_progress)
    print(f"report: {report}")
    return 0
