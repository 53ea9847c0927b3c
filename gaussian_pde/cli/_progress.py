"""Progress lines on stderr for the long steps of the command line.

The studies take an optional ``progress`` callback (a callable taking a short string,
called once per finished step; ``None`` means silent). The command line passes a
:class:`Progress`, which numbers the steps and adds the time since the command started::

    [ 3/18] regimes: blowup (2.1 s)

Each line is flushed at once, so progress shows up in a log or behind a pipe too.
``--quiet`` passes ``None`` instead (:func:`progress_for`): nothing is printed.

The first run on a machine compiles the Numba kernels before its first result (Numba
keeps them in its disk cache for the next runs, ``NUMBA_CACHE_DIR`` where set):
:func:`compile_notice` says so in one line when that happens.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time

__all__ = ["COMPILING", "Progress", "compile_notice", "progress_for"]

#: the line :func:`compile_notice` writes
COMPILING = ("gaussian-pde: compiling the solver kernels with Numba (first run on this "
             "machine only: later runs load them from the cache)...")


class Progress:
    """A step counter that writes one line per finished step to ``stream`` (stderr).

    Parameters
    ----------
    total : int or None
        Number of steps the command expects to report (shown as ``[k/total]``); ``None``
        shows the count alone. A run that reports more steps than expected raises the
        total to the count instead of printing ``[13/12]``.
    stream : file-like, optional
        Where the lines go (default: ``sys.stderr`` at the time of each call).
    """

    def __init__(self, total=None, stream=None):
        self.total = total
        self.count = 0
        self.stream = stream
        self.start = time.perf_counter()

    def __call__(self, message):
        """Report one finished step, described by ``message`` (a short string)."""
        self.count += 1
        if self.total is not None and self.count > self.total:
            self.total = self.count
        width = len(str(self.total if self.total is not None else self.count))
        count = f"{self.count:>{width}}" + (f"/{self.total}" if self.total is not None else "")
        line = f"[{count}] {message} ({time.perf_counter() - self.start:.1f} s)\n"
        stream = self.stream if self.stream is not None else sys.stderr
        try:
            stream.write(line)
            stream.flush()
        except (OSError, ValueError):   # stderr closed or a broken pipe: progress is optional
            pass


def progress_for(args, total=None):
    """The progress callback for parsed ``args``: a :class:`Progress`, or ``None`` with ``--quiet``."""
    if getattr(args, "quiet", False):
        return None
    return Progress(total)


@contextlib.contextmanager
def compile_notice(enabled=True, stream=None):
    """Write :data:`COMPILING` to ``stream`` (stderr) once, where Numba compiles in the block.

    A listener on Numba's ``numba:compile`` event, which Numba raises only where a
    function is not in its disk cache, and on
    :data:`~gaussian_pde.integrate._precompile.COMPILE_ASIDE` (a child process compiling
    the integrator): a run that loads every kernel says nothing. Off
    where ``enabled`` is false or Numba is missing.
    """
    if not enabled or importlib.util.find_spec("numba") is None:
        yield
        return
    from numba.core import event

    pid = os.getpid()

    class _Notice(event.Listener):
        said = False

        def on_start(self, ev):
            if self.said or os.getpid() != pid:     # (a forked worker inherits it)
                return
            self.said = True
            out = stream if stream is not None else sys.stderr
            try:
                out.write(COMPILING + "\n")
                out.flush()
            except (OSError, ValueError):
                pass

        def on_end(self, ev):
            pass

    from ..integrate import COMPILE_ASIDE

    notice = _Notice()
    kinds = ("numba:compile", COMPILE_ASIDE)   # (the second: a child process compiling)
    for kind in kinds:
        event.register(kind, notice)
    try:
        yield
    finally:
        for kind in kinds:
            event.unregister(kind, notice)
