"""The ``refbayes`` command.

Each subcommand lives in its own module, which defines ``add_arguments(parser)``
and ``run(args) -> int``; ``COMMANDS`` maps the subcommand's name to that module
and a one-line help. A module is imported only when its command runs, so
``refbayes --help`` stays fast.
"""

import argparse
import importlib
import sys

from refbayes.errors import UsageError

__all__ = ["main", "COMMANDS"]

# name -> (module implementing add_arguments/run, one-line help)
COMMANDS = {
    "validate": ("refbayes._cli_validate", "reproduce the papers' experiments on offline data"),
    "bench": ("refbayes._cli_validate", "time the backends side by side"),
    "verify": ("refbayes._cli_verify", "check the exact identities between the methods on random instances"),
    "golden": ("refbayes._cli_golden", "write a method's step-by-step trajectories on fixed small problems (docs/golden-format.md)"),
    "crosscheck": ("refbayes._cli_golden", "compare another implementation's golden trajectories with refbayes', step by step"),
    "tune": ("refbayes._cli_tune", "choose prior variance, noise, q and gamma for a data stream by its evidence"),
    "warmup": ("refbayes._cli_warmup", "compile and cache the numba kernels ahead of first use (docs/threads.md)"),
}


def build_parser():
    """The argument parser of the ``refbayes`` command, every subcommand included."""
    parser = argparse.ArgumentParser(prog="refbayes", description="Reference online Gaussian filters for neural networks.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_) in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(p, name)
        p.set_defaults(_module=module)
    return parser


def main(argv=None):
    """Run ``refbayes COMMAND ...``; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args._module.run(args)
    except UsageError as exc:
        parser.exit(2, f"refbayes {args.command}: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
