"""Options shared by the subcommands: the output folder and its checks.

Every subcommand writes into a folder under the current directory unless ``--out`` says
otherwise: the main job and ``reproduce`` into ``gaussian_pde_output/``, the others into
a folder of their own below it (``gaussian_pde_output/compare/``,
``gaussian_pde_output/stabilizers/``, ``gaussian_pde_output/sweep/<spec name>/``), so
that no subcommand overwrites another's ``report.md``.

An ``--out`` that cannot be used (an existing file, a path below a file, a folder without
write permission, a folder that does not take files such as ``/proc`` or a read-only mount)
is refused before any work starts, with one line naming ``--out``
(:class:`OutputFolderError`, exit status 2). The check writes and deletes a probe file:
``os.access`` says yes to root whatever the file system would do.

Counts (numbers of tokens, seeds, output times, workers) are parsed by :func:`whole_number`:
``1e8`` is the count it writes, ``2.5``, ``nan`` and ``inf`` are refused by the parser.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib

from .._common.io import write_probe

__all__ = ["OUTPUT_ROOT", "OutputFolderError", "add_out_argument", "default_out",
           "output_dir", "check_output_dir", "whole_number"]

#: the folder (relative to the current directory) that holds every default output
OUTPUT_ROOT = "gaussian_pde_output"


class OutputFolderError(ValueError):
    """``--out`` names something that cannot be used as an output folder."""


def default_out(subcommand=None):
    """The default output folder of ``subcommand`` (``None``: the main job's)."""
    if subcommand is None:
        return OUTPUT_ROOT
    return str(pathlib.Path(OUTPUT_ROOT) / subcommand)


def add_out_argument(parser, default, what="output folder"):
    """Add ``--out`` with ``default`` (shown in ``--help``)."""
    parser.add_argument("--out", default=default, metavar="FOLDER",
                        help=f"{what}, created if needed (default: %(default)s)")


def whole_number(text):
    """An ``argparse`` type for counts: an integer, also written as ``1e8`` or ``2000.0``.

    Refuses (one line, through the parser) a value that is not a whole number: ``2.5``,
    ``nan``, ``inf``, text, or one past the 64-bit integers (``1e308``). The range (at
    least 1, not too large for the memory) is checked by the subcommand, which knows
    what the count multiplies.
    """
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    if abs(value) >= 2**63:
        raise argparse.ArgumentTypeError(f"expected a whole number below 2**63, got {text!r}")
    return int(value)


def _nearest_existing(path):
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output_dir(path, flag="--out"):
    """Check, without creating anything, that ``path`` can be (or is) a writable folder.

    Returns the path. Raises :class:`OutputFolderError` with a one-line message naming
    ``flag`` otherwise.
    """
    path = pathlib.Path(path)
    if path.exists():
        if not path.is_dir():
            raise OutputFolderError(f"`{flag}` is an existing file, not a folder: {path}.")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputFolderError(f"`{flag}` is a folder without write permission: {path}.")
        reason = write_probe(path)
        if reason is not None:
            raise OutputFolderError(f"`{flag}` is a folder that does not take files: {path} "
                                    f"({reason}).")
        return path
    base = _nearest_existing(path)
    if not base.is_dir():
        raise OutputFolderError(f"`{flag}` cannot be created: {base} is a file, not a folder "
                                f"({path}).")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputFolderError(f"`{flag}` cannot be created: no write permission in {base} "
                                f"({path}).")
    reason = write_probe(base)
    if reason is not None:
        raise OutputFolderError(f"`{flag}` cannot be created: {base} does not take files "
                                f"({reason}; {path}).")
    return path


def output_dir(path, flag="--out"):
    """Create ``path`` if needed and check that it is a writable folder; returns it.

    Raises :class:`OutputFolderError` (one line, naming ``flag``) when it cannot be used.
    """
    path = check_output_dir(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputFolderError(f"`{flag}` cannot be created as a folder: {path} "
                                f"({exc.strerror or exc}).") from None
    reason = write_probe(path)
    if reason is not None:
        raise OutputFolderError(f"`{flag}` is a folder that does not take files: {path} "
                                f"({reason}).")
    return path
