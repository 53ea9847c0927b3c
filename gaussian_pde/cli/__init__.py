"""The command line: ``gaussian-pde`` and its subcommands."""

from ._main import main

__all__ = ["main"]
