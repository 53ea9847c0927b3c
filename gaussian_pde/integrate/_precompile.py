"""Compiling on two cores: the integrator in a second process, the fields in this one.

On a machine whose Numba disk cache is empty (a fresh machine: ``NUMBA_CACHE_DIR``
pointing at an empty folder), the compiled integrator (:func:`._compiled_engine._core`)
and the attention types' field kernels (:func:`gaussian_pde.attention.compiled_field_kernels`)
are compiled at their first use, one after the other, each on one core. They do not
depend on each other (the integrator takes the fields as first-class functions of
fixed signatures), so :func:`compile_on_two_cores` compiles them side by side: a child
Python process compiles the integrator into the disk cache while this process compiles
the fields; this process then loads the integrator from the cache.

Numba writes each cache file to a temporary name and renames it into place
(``numba.core.caching``), so two processes filling one cache folder never leave a file
half written; they compile different functions here in any case.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

__all__ = ["COMPILE_ASIDE", "compile_on_two_cores"]

#: the Numba event (``numba.core.event``) raised while a child process compiles: a
#: listener of ``numba:compile`` learns nothing of the child's compilations
COMPILE_ASIDE = "gaussian_pde:compile_aside"

#: run by the child: the integrator, into Numba's disk cache (argv[1]: this package's
#: root), then each function named in argv[2:] (``"module:function"``)
_CHILD = """
import importlib, sys
sys.path.insert(0, sys.argv[1])
from gaussian_pde.integrate._compiled_engine import _core
_core()
for target in sys.argv[2:]:
    module, name = target.split(":")
    getattr(importlib.import_module(module), name)()
"""


def _engine_cached():
    """Whether Numba's disk cache holds the integrator's driver for these sources.

    Numba's cache index of :func:`._compiled_engine._drive` under its stamped name
    (:func:`._compiled_engine.engine_stamp`; an index written for other sources reads as
    empty). True where that cannot be read (then nothing runs aside).
    """
    try:
        import numba

        from .._common.compiled import stamped
        from . import _compiled_engine

        if numba.config.DISABLE_JIT:
            return True
        probe = numba.njit(cache=True)(stamped(_compiled_engine._drive,
                                               _compiled_engine.engine_stamp()))
        return bool(probe._cache._cache_file._load_index())
    except Exception:       # a Numba whose cache reads otherwise: do nothing aside
        return True


def _call(target):
    """Call the function named ``"module:function"``."""
    module, name = target.split(":")
    getattr(importlib.import_module(module), name)()


def compile_on_two_cores(here=(), aside=(), fields=True):
    """Compile the integrator and the fields' kernels now, side by side where that pays.

    Where the integrator is not in Numba's disk cache and the machine has two cores or
    more, a child process compiles it into the cache while this process compiles the
    field kernels of every type of this package (``fields``; a caller that needs none of
    them passes False) and calls each of ``here`` (functions without arguments that
    compile what the caller will need: call them in this order);
    this process then waits for the child and loads the integrator from the cache.
    ``aside``: functions the child calls after the integrator, named
    ``"module:function"`` (without arguments; what they compile must not depend on the
    fields: those the child would compile again). Otherwise (or where the child fails)
    all of it here, one after the other. Returns whether a child compiled the integrator.

    The child writes nothing to the terminal; while it runs, this process raises the
    Numba event :data:`COMPILE_ASIDE` (the command line's one line on stderr listens to
    it as to Numba's own ``numba:compile``).
    """
    from ..attention import compiled_field_kernels  # (every type of this package)
    from . import _compiled_engine

    child = None
    loaded = _compiled_engine._core.cache_info().currsize > 0    # here already
    if (os.cpu_count() or 1) >= 2 and not loaded and not _engine_cached():
        root = pathlib.Path(__file__).resolve().parent.parent.parent
        try:
            child = subprocess.Popen([sys.executable, "-c", _CHILD, str(root), *aside],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        except OSError:                # no second process: all of it here
            child = None
    if child is not None:
        from numba.core import event

        event.start_event(COMPILE_ASIDE)
    try:
        # None without Numba: nothing to compile
        kernels = compiled_field_kernels() if fields else ()
        for compile_it in here:
            compile_it()
    except BaseException:
        if child is not None:          # (an interrupt): the child is of no use any more
            child.kill()
            child.wait()
            event.end_event(COMPILE_ASIDE)
        raise
    ok = child is not None and child.wait() == 0
    if child is not None:
        event.end_event(COMPILE_ASIDE)
    if kernels is not None:            # loaded from the cache the child filled, or compiled
        _compiled_engine._core()
    for target in aside:               # loaded, or (without a child) compiled here
        _call(target)
    return ok
