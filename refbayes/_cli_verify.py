"""``refbayes verify``: run the exact identities between the filters and print a table."""

__all__ = ["add_arguments", "run"]


def add_arguments(parser, name):
    """Options of ``refbayes verify [METHOD ...] [--seed S] [--json FILE] [--thorough]``."""
    from refbayes.verify import METHODS

    parser.add_argument("methods", nargs="*", metavar="METHOD",
                        help=f"only the identities concerning these methods (of: {', '.join(METHODS)}); default all")
    parser.add_argument("--seed", type=int, default=0, help="base seed of the random instances (default 0)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--thorough", action="store_true", help="many more random instances per identity")


def run(args):
    """Print the table; exit status 1 if any identity fails, 0 otherwise."""
    import json

    from refbayes.errors import UsageError
    from refbayes.verify import METHODS, format_table, run_checks, select

    try:
        select(args.methods or None)
    except ValueError:
        bad = [m for m in args.methods if m.lower() not in METHODS]
        raise UsageError(f"unknown method(s) {', '.join(map(repr, bad))}; choose from {', '.join(METHODS)}") from None
    results = run_checks(args.methods or None, seed=args.seed, thorough=args.thorough)
    print(format_table(results))
    failed = [r.name for r in results if not r.passed]
    print(f"\n{len(results) - len(failed)}/{len(results)} identities hold"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seed": args.seed, "thorough": args.thorough, "results": [r.as_dict() for r in results]},
                      fh, indent=2)
    return 1 if failed else 0
