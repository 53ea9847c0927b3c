"""Command-line interface: ``gaussian-pde [--quiet] [SUBCOMMAND] [options]``.

With no subcommand it runs the main job (:mod:`gaussian_pde.cli._main_job`). Each subcommand
lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``; the
table below is the one place that lists them, and modules are imported only when used
(so ``gaussian-pde --help`` stays fast and imports neither matplotlib nor dask).

Conventions shared by every subcommand:

* output goes to a default folder below ``./gaussian_pde_output`` (see
  :mod:`gaussian_pde.cli._options`); ``--out`` chooses another;
* long steps report progress on stderr (:mod:`gaussian_pde.cli._progress`), and a run
  that compiles Numba kernels (the first on a machine) says so in one line there;
  ``--quiet`` (``-q``), accepted before or after the subcommand, turns both off;
* bad input (an unknown flag, a bad value, an unusable ``--out``) gives one line on
  stderr, ``gaussian-pde SUBCOMMAND: error: ...``, and exit status 2, no traceback; so
  does a :class:`MemoryError`, naming the size asked for where it is known
  (:func:`out_of_memory`). A problem whose size is known up front is refused before any
  work (e.g. the sweep's memory check, :func:`gaussian_pde.sweep._run.check_resources`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ._progress import compile_notice

#: subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "run": ("gaussian_pde.cli._main_job", "the main job (the default): the reproduction report"),
    "compare": ("gaussian_pde.cli._compare", "moment ODEs against particle Monte Carlo"),
    "reproduce": ("gaussian_pde.cli._reproduce", "reproduce the paper's Gaussian figures"),
    "sweep": ("gaussian_pde.cli._sweep", "resumable parameter sweeps (local or Dask cluster)"),
    "stabilizers": ("gaussian_pde.cli._stabilizers", "residual / normalisation stabiliser study"),
    "clusters": ("gaussian_pde.cli._clusters", "Gaussian-mixture closure against particles"),
    "train": ("gaussian_pde.cli._train", "train the paper's models beside the PDE simulator"),
}

#: options of the bare command that may come before the subcommand
_GLOBAL_FLAGS = ("-q", "--quiet")
_QUIET_HELP = "no progress lines on stderr (errors are still reported)"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (exit status 2)."""

    def error(self, message):
        message = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _available():
    out = {}
    for name, (module, help_) in SUBCOMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            out[name] = (module, help_)
    return out


def _add_quiet(parser):
    """``--quiet`` on ``parser`` and on every parser nested below it (``sweep run``, ...).

    The subcommands' copies default to "not given" (``SUPPRESS``), so that
    ``gaussian-pde --quiet compare`` is not undone by the subcommand's default.
    """
    parser.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help=_QUIET_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _add_quiet(sub)


def build_parser():
    """The argument parser with every available subcommand."""
    parser = _Parser(
        prog="gaussian-pde",
        description="Gaussian solutions of the Transformer PDE. "
                    "Without a subcommand, runs the main job on built-in defaults.",
        epilog="Every subcommand writes into a default folder below ./gaussian_pde_output "
               "(see its --help; --out chooses another) and reports the progress of its "
               "long steps on stderr (--quiet turns this off).")
    parser.add_argument("-q", "--quiet", action="store_true", default=False,
                        help=_QUIET_HELP)
    sub = parser.add_subparsers(dest="command")
    for name, (module, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        importlib.import_module(module).add_arguments(p)
        _add_quiet(p)
    return parser


def _with_default_command(argv, commands):
    """``argv`` with ``run`` inserted after the global flags when no subcommand is named."""
    i = 0
    while i < len(argv) and argv[i] in _GLOBAL_FLAGS:
        i += 1
    if i < len(argv) and (argv[i] in commands or argv[i] in ("-h", "--help")
                          or not argv[i].startswith("-")):
        return argv   # a subcommand, help, or a misspelt subcommand (the parser says so)
    return argv[:i] + ["run"] + argv[i:]


#: what Numba's compiled code says when an allocation fails (no size)
_COMPILED_ALLOCATION = "Allocation failed (probably too large)"


def out_of_memory(exc):
    """One line for a :class:`MemoryError`, with the size asked for where it is known.

    NumPy's message names it ("Unable to allocate 3.2 GiB for an array with shape ...");
    an allocation in compiled code does not, and the line says so.
    """
    message = " ".join(str(exc).split())
    if not message or message == _COMPILED_ALLOCATION:
        return ("out of memory: an allocation in compiled code failed (the size asked for "
                "is not known); lower the problem's size (dimension, settings, particles) "
                "or raise the memory limit")
    return f"out of memory: {message}"


def _os_error(exc):
    """One line for an :class:`OSError`: what failed, and on which file."""
    what = exc.strerror or " ".join(str(exc).split()) or type(exc).__name__
    names = [n for n in (exc.filename, exc.filename2) if n is not None]
    return what + (f": {' -> '.join(map(str, names))}" if names else "")


def main(argv=None):
    """Entry point of the ``gaussian-pde`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _available()
    argv = _with_default_command(argv, commands)
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(commands[args.command][0])
    prog = f"gaussian-pde {args.command}"
    try:
        with compile_notice(not getattr(args, "quiet", False)):
            return int(module.run(args) or 0)
    except (ValueError, TypeError) as exc:
        message = " ".join(str(exc).split())
        parser.exit(2, f"{prog}: error: {message}\n")
    except MemoryError as exc:
        parser.exit(2, f"{prog}: error: {out_of_memory(exc)}\n")
    except OSError as exc:   # a file or folder that cannot be read or written
        parser.exit(2, f"{prog}: error: {_os_error(exc)}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"{prog}: interrupted\n")


if __name__ == "__main__":
    raise SystemExit(main())
