"""``refbayes validate`` and ``refbayes bench``: the papers' experiments and the backend timings."""

__all__ = ["add_arguments", "run"]


def add_arguments(parser, name):
    """Options of ``refbayes validate`` (``name == "validate"``) or ``refbayes bench``."""
    parser.add_argument("--quick", action="store_true", help="small sizes; minutes on a laptop")
    parser.add_argument("--out", default="validation-results", help="output folder (default: validation-results)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="run independent trials on N local worker processes (needs dask.distributed)")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="run independent trials on the dask scheduler at ADDRESS (e.g. tcp://host:8786)")
    if name == "validate":
        from refbayes.validation import EXPERIMENTS

        parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                            help=f"run only these experiments (of: {', '.join(EXPERIMENTS)})")
    else:
        parser.add_argument("--gpu", action="store_true",
                            help="only the GPU steps against numba: LO-FI in float64 and float32, spherical LO-FI "
                                 "and FD-EKF (needs an NVIDIA GPU; docs/gpu.md)")
    # bench: the CPU timings, then the GPU step where a GPU is present (it reports itself skipped otherwise)
    parser.set_defaults(_experiments=None if name == "validate" else ["bench", "bench_gpu"])


def run(args):
    from refbayes.errors import UsageError
    from refbayes.validation import EXPERIMENTS, run_all

    only = ["bench_gpu"] if getattr(args, "gpu", False) else (args._experiments or args.only)
    unknown = [n for n in (only or ()) if n not in EXPERIMENTS]
    if unknown:
        raise UsageError(f"unknown experiment(s) {', '.join(map(repr, unknown))}; choose from {', '.join(EXPERIMENTS)}")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be >= 1; got {args.workers}")
    if (args.workers or 1) > 1 or args.scheduler:
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise UsageError('--workers and --scheduler need dask.distributed: pip install "refbayes[parallel]"') from None
    from refbayes import parallel

    parallel.configure(workers=args.workers, scheduler=args.scheduler, progress=not args.no_progress)
    report = run_all(quick=args.quick, outdir=args.out, only=only, progress=not args.no_progress)
    print(f"report: {report}")
    return 0
