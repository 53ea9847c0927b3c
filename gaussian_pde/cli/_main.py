"""Command-line interface: ``gaussian-pde [SUBCOMMAND] [options]``.

With no subcommand it runs the main job (:mod:`gaussian_pde.cli._main_job`). Each subcommand
lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``; the
table below is the one place that lists them, and modules are imported only when used
(so ``gaussian-pde --help`` stays fast and imports neither matplotlib nor dask).
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "run": ("gaussian_pde.cli._main_job", "the main job (the default): the reproduction report"),
    "compare": ("gaussian_pde.cli._compare", "moment ODEs against particle Monte Carlo"),
    "reproduce": ("gaussian_pde.cli._reproduce", "reproduce the paper's Gaussian figures"),
    "sweep": ("gaussian_pde.cli._sweep", "resumable parameter sweeps (local or Dask cluster)"),
    "stabilizers": ("gaussian_pde.cli._stabilizers", "residual / normalisation stabiliser study"),
}


def _available():
    out = {}
    for name, (module, help_) in SUBCOMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            out[name] = (module, help_)
    return out


def build_parser():
    """The argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="gaussian-pde",
        description="Gaussian solutions of the Transformer PDE. "
                    "Without a subcommand, runs the main job on built-in defaults.")
    sub = parser.add_subparsers(dest="command")
    for name, (module, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv=None):
    """Entry point of the ``gaussian-pde`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _available()
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["run"] + argv
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(commands[args.command][0])
    try:
        return int(module.run(args) or 0)
    except (ValueError, TypeError) as exc:
        parser.exit(2, f"gaussian-pde {args.command}: error: {exc}\n")


if __name__ == "__main__":
    raise SystemExit(main())
