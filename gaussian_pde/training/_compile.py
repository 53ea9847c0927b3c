r"""Compiling the training programs once: XLA options and a cache of executables.

XLA's CPU backend spends seconds optimising even a tiny training program (a few hundred
operations). :func:`compile_options` gives the options of a *fast* compile (no backend
optimisation, no fusion emitters, no expensive LLVM passes): three to six times quicker
to build, slower to run, and equal to the optimised program up to float rounding. That
is the right trade for short runs (``--quick``, tests); long runs keep the optimised
build. :func:`compiled` lowers a function for example arguments and keeps the
executable, so a second call with the same key and argument shapes runs at once.
"""

from __future__ import annotations

import collections

import jax

__all__ = ["FAST_OPTIONS", "compile_options", "compiled", "clear_cache"]

#: XLA debug options of a fast build, tried in this order (older XLA lacks some)
FAST_OPTIONS = (
    {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False,
     "xla_llvm_disable_expensive_passes": True},
    {"xla_backend_optimization_level": 0},
)

_CACHE: collections.OrderedDict = collections.OrderedDict()
_CACHE_SIZE = 64


def compile_options(optimize):
    """The option sets to try for a build: ``(None,)`` when optimising, else the fast ones."""
    return (None,) if optimize else FAST_OPTIONS + (None,)


def _signature(args):
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple((getattr(a, "shape", ()), str(getattr(a, "dtype", type(a))))
                       for a in leaves), bool(jax.config.jax_enable_x64)


def compiled(key, fn, *args, optimize=True):
    """An executable of ``fn`` for ``args`` (arrays or pytrees of arrays), built once.

    ``key`` names what ``fn`` computes (hashable; two calls with equal keys and argument
    shapes share the executable, so the key must include everything ``fn`` closes over).
    Options XLA does not know are dropped in turn (:data:`FAST_OPTIONS`).
    """
    full = (key, _signature(args), bool(optimize))
    if full in _CACHE:
        _CACHE.move_to_end(full)
        return _CACHE[full]
    lowered = jax.jit(fn).lower(*args)
    error = None
    for opts in compile_options(optimize):
        try:
            exe = lowered.compile(compiler_options=opts)
            break
        except Exception as exc:  # an option this XLA does not have: try the next set
            error = exc
    else:
        raise error
    _CACHE[full] = exe
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return exe


def clear_cache():
    """Forget every kept executable."""
    _CACHE.clear()
