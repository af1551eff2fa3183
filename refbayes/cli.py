"""The ``refbayes`` command: ``refbayes validate`` and ``refbayes bench``."""

import argparse
import sys

__all__ = ["main"]


def _validate(args):
    from refbayes.validation import run_all

    report = run_all(quick=args.quick, outdir=args.out, only=args.only, progress=not args.no_progress)
    print(f"report: {report}")
    return 0


def _bench(args):
    from refbayes.validation import run_all

    report = run_all(quick=args.quick, outdir=args.out, only=["bench"], progress=not args.no_progress)
    print(f"report: {report}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="refbayes", description="Reference online Gaussian filters for neural networks.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_ in (("validate", _validate, "reproduce the papers' experiments on offline data"),
                              ("bench", _bench, "time the backends side by side")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--quick", action="store_true", help="small sizes; minutes on a laptop")
        p.add_argument("--out", default="validation-results", help="output folder (default: validation-results)")
        p.add_argument("--no-progress", action="store_true", help="no progress bars")
        if name == "validate":
            p.add_argument("--only", nargs="+", default=None, help="run only these experiments")
        p.set_defaults(func=func)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
